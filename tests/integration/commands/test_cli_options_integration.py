"""Command-line conveniences a new user runs into first."""

from __future__ import annotations

import subprocess
import sys


def test_the_schema_module_runs_without_warnings() -> None:
    result = subprocess.run(
        [sys.executable, "-W", "error", "-m", "bridge.config.schema"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.startswith("## Configuration reference\n")


# A command that writes far more than a pipe holds, as `errors list` on a big error queue does.
_FLOODS_STDOUT = """
import sys
import bridge.commands.demo
from bridge.commands.cli import main
def flood(**kwargs):
    for _ in range(100_000):
        print("x" * 100)
    return 0
bridge.commands.demo.run_demo = flood
sys.exit(main(["demo"]))
"""


def test_a_reader_that_goes_away_is_not_a_traceback() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", _FLOODS_STDOUT], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdout is not None
    process.stdout.read(10)
    process.stdout.close()  # `| head -c 10`: the reader is gone while sfbridge still writes
    _, stderr = process.communicate(timeout=60)
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr
    assert process.returncode == 0


# Which of the bridge's command modules a command line imports.
_COMMANDS_IMPORTED = """
import sys
from bridge.commands.cli import parse
parse(sys.argv[1:])
print(" ".join(sorted(name for name in sys.modules if name.startswith("bridge.commands."))))
"""


def test_a_command_imports_its_own_verb_and_no_other() -> None:
    def imported(*argv: str) -> set[str]:
        result = subprocess.run(
            [sys.executable, "-c", _COMMANDS_IMPORTED, *argv],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        return set(result.stdout.split())

    where = imported("-c", "x.yaml", "where", "some-id")
    assert "bridge.commands.where" in where
    assert not {"bridge.commands.check", "bridge.commands.spark.drain"} & where, where
    summary = imported("errors", "summary", "--by", "type", "-c", "x.yaml")
    assert "bridge.commands.errors.summary" in summary
    assert "bridge.commands.errors.purge" not in summary and "bridge.commands.where" not in summary
    assert "bridge.commands.errors.listing" in imported("errors", "-c", "x.yaml", "list")
    # Short options run together (`-vc FILE`) are not read ahead: the whole table parses them.
    assert "bridge.commands.where" in imported("-vc", "x.yaml", "where", "some-id")
