"""The README stays true: its config reference is the schema's, its commands exist."""

from __future__ import annotations

import os

from support import REPO

from bridge.config.reference import render_reference_markdown

ROOT = REPO
README = (ROOT / "README.md").read_text()


def test_readme_config_reference_is_generated_from_the_current_schema() -> None:
    start = README.index("<!-- config-reference:start -->\n") + len(
        "<!-- config-reference:start -->\n"
    )
    block = README[start : README.index("<!-- config-reference:end -->")]
    lines = render_reference_markdown(heading_level=3).splitlines()
    expected = "\n".join(lines[1:] if lines[0].startswith("#") else lines).strip() + "\n"
    assert block == expected, (
        "README config reference is stale: replace the block between the config-reference "
        "markers with the output of `python -m bridge.config.reference` (minus its heading)"
    )


def test_quick_start_commands_exist_and_ci_runs_the_readme_test_command() -> None:
    assert "./dev.sh demo" in README and "./dev.sh test" in README
    assert os.access(ROOT / "dev.sh", os.X_OK)
    assert "./dev.sh test" in (ROOT / ".ci" / "run").read_text()
