"""Help that helps: every verb's `--help` says what it does and shows examples that parse, a
mistyped verb or option gets a did-you-mean, and a verb offers only options that do something
for it. A new verb in `VERBS` is held to the same by these loops."""

from __future__ import annotations

import shlex

import pytest

from bridge.commands.cli import VERBS, build_parser


def help_of(words: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*words, "--help"])
    assert exited.value.code == 0
    return " ".join(capsys.readouterr().out.split())


def error_of(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("verb", VERBS, ids=lambda verb: verb.name)
def test_every_verb_describes_itself_and_shows_examples(
    verb: object, capsys: pytest.CaptureFixture[str]
) -> None:
    assert hasattr(verb, "name") and hasattr(verb, "description")
    text = help_of(verb.name.split(), capsys)
    assert len(verb.description) >= 40, "a description says what the verb does, and when"
    assert " ".join(verb.description.split()) in text
    assert "examples:" in text
    own = [example for example in verb.examples if f"sfbridge {verb.name}" in example
           or f" {verb.name}" in example.split("#")[0]]  # fmt: skip
    assert own, f"no example runs 'sfbridge {verb.name}'"


@pytest.mark.parametrize("verb", VERBS, ids=lambda verb: verb.name)
def test_every_example_parses_as_written(verb: object) -> None:
    for example in verb.examples:  # type: ignore[attr-defined]
        if not example.startswith("sfbridge "):
            continue  # systemctl, say
        command = example.split(" #")[0].split(" >")[0]
        args = build_parser().parse_args(shlex.split(command)[1:])
        assert args.verb == verb.name  # type: ignore[attr-defined]


def test_run_help_tells_of_reload_and_stop(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_of(["run"], capsys)
    assert "SIGHUP reloads the configuration" in text
    assert "SIGTERM or SIGINT stops it" in text


@pytest.mark.parametrize(
    ("argv", "usage", "suggestion"),
    [
        (["stauts"], "sfbridge", "did you mean 'status'?"),
        (["errors", "lst"], "sfbridge errors", "did you mean 'list'?"),
        (["status", "--jsn"], "sfbridge status", "did you mean '--json'?"),
        (
            ["errors", "list", "--forwader", "o"],
            "sfbridge errors list",
            "did you mean '--forwarder'?",
        ),
        (["errors", "replay", "--dryrun"], "sfbridge errors replay", "did you mean '--dry-run'?"),
        (["install", "--print-sgl"], "sfbridge install", "did you mean '--print-sql'?"),
    ],
)
def test_a_mistyped_verb_or_option_gets_a_did_you_mean(
    argv: list[str], usage: str, suggestion: str, capsys: pytest.CaptureFixture[str]
) -> None:
    error = error_of(argv, capsys)
    assert error.rstrip().endswith(suggestion), error
    # With the usage of the verb whose options were mistyped.
    assert error.startswith(f"usage: {usage} [-h]"), error


def test_nothing_is_suggested_when_nothing_is_near(capsys: pytest.CaptureFixture[str]) -> None:
    assert "did you mean" not in error_of(["frobnicate"], capsys)
    assert "did you mean" not in error_of(["status", "--reason=unroutable"], capsys)


def test_demo_offers_no_config_option_and_the_others_take_it_after_the_verb(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "--config" not in help_of(["demo"], capsys)
    assert "unrecognized arguments: -c x.yaml" in error_of(["demo", "-c", "x.yaml"], capsys)
    for verb in VERBS:
        if verb.needs_config:
            args = build_parser().parse_args(
                [*verb.name.split(), "-c", "x.yaml", *_required(verb.name)]
            )
            assert args.config == "x.yaml"


def _required(verb: str) -> list[str]:
    """Arguments a verb cannot do without."""
    required = {"pause": ["orders"], "resume": ["orders"], "errors show": ["some-id"]}
    required["where"] = ["some-id"]
    return {**required, "daemons forget": ["--stale"]}.get(verb, [])
