"""Every verb has one shape (a module with `add_arguments` and `run`, in the one table of
`bridge.commands.cli`), and `main` reports every `SfbridgeError` the same way: its message, its
advice, its exit code."""

from __future__ import annotations

import argparse
import logging
import uuid
from datetime import datetime
from pathlib import Path

import pytest

import bridge.commands.demo
from bridge.commands.cli import VERBS, build_parser, main, named_verb
from bridge.commands.selection import Selection
from bridge.config.environment import unset_variable_advice
from bridge.dialects import dialect_for
from bridge.exceptions import ExitCode, SfbridgeError
from bridge.storage.retries import WaitingMessage


@pytest.fixture(autouse=True)
def _own_log_handlers(monkeypatch: pytest.MonkeyPatch) -> None:
    # main() points the root logger at this test's captured stderr, closed once the test ends:
    # later tests' log lines must not go there.
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)


def _leaves(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> dict[str, object]:
    """Every command a person can type, with the parser that takes it."""
    found: dict[str, object] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for word, child in action.choices.items():
                found |= _leaves(child, (*words, word))
    if not found and words:
        found[" ".join(words)] = parser
    return found


def test_every_command_a_person_can_type_is_a_verb_module_of_the_table() -> None:
    leaves = _leaves(build_parser())
    assert sorted(leaves) == sorted(verb.name for verb in VERBS)
    for verb in VERBS:
        assert callable(verb.module.add_arguments), verb.name
        assert callable(verb.module.run), verb.name
        defaults = build_parser().parse_args([*verb.name.split(), *_required(verb.name)])
        assert defaults.run is verb.module.run and defaults.verb == verb.name


def _required(verb: str) -> list[str]:
    """The positional arguments a verb cannot be parsed without."""
    required = {"errors show": ["some-id"], "where": ["some-id"], "pause": ["f"], "resume": ["f"]}
    return {**required, "daemons forget": ["--stale"]}.get(verb, [])


class _Refused(SfbridgeError):
    advice = "do this instead"
    exit_code = ExitCode.UNAVAILABLE


def test_main_reports_a_raised_error_with_its_advice_and_exit_code(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def refuse(args: argparse.Namespace) -> int:
        raise _Refused("\x1b[2JServer=db;Pwd=hunter2;Uid=x is refused")

    monkeypatch.setattr(bridge.commands.demo, "run", refuse)
    assert main(["demo"]) == ExitCode.UNAVAILABLE
    assert capsys.readouterr().err == (
        "sfbridge demo: \\x1b[2JServer=db;Pwd=***;Uid=x is refused\n  do this instead\n"
    )

    def refuse_once(args: argparse.Namespace) -> int:
        raise _Refused("no", advice="ask the DBA", exit_code=ExitCode.USAGE)

    monkeypatch.setattr(bridge.commands.demo, "run", refuse_once)
    assert main(["demo"]) == ExitCode.USAGE
    assert capsys.readouterr().err == "sfbridge demo: no\n  ask the DBA\n"


def test_a_verb_that_opens_every_database_names_each_unset_variable_and_the_advice(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SFBRIDGE_TEST_UNSET_FOLDER", raising=False)
    config = tmp_path / "sfbridge.yaml"
    config.write_text(
        "databases:\n"
        "  edge: {dialect: sqlite, path: '${SFBRIDGE_TEST_UNSET_FOLDER}/edge.db'}\n"
        "forwarders:\n"
        "  - {name: edge, database: edge, queue: forward}\n"
        "routes:\n"
        "  - {match: '*', database: edge}\n"
    )
    assert main(["install", "-c", str(config)]) == ExitCode.USAGE
    err = capsys.readouterr().err.splitlines()
    assert err[0] == (
        "sfbridge install: install opens every database it creates tables in, and touches none "
        "until their variables are set; not set:"
    )
    assert err[1] == "  databases.edge.path: SFBRIDGE_TEST_UNSET_FOLDER"
    assert err[2] == f"  {unset_variable_advice(('SFBRIDGE_TEST_UNSET_FOLDER',))}"
    assert len(err) == 3


def test_a_request_that_cannot_be_served_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "sfbridge.yaml"
    config.write_text(
        f"databases:\n  edge: {{dialect: sqlite, path: '{tmp_path}/edge.db'}}\n"
        "forwarders:\n  - {name: edge, database: edge, queue: forward}\n"
        "routes:\n  - {match: '*', database: edge}\n"
    )
    assert main(["send", "-c", str(config), "--count", "0", "Samples.Receiver"]) == 2
    assert capsys.readouterr().err == "sfbridge send: --count must be at least 1\n"
    assert main(["errors", "list", "-c", str(config), "--forwarder", "egde"]) == 2
    assert capsys.readouterr().err == (
        "sfbridge errors list: no forwarder named 'egde' (did you mean 'edge'?)\n"
    )
    # The same option, the same answer, in every verb; before any Spark session starts.
    assert main(["spark", "drain", "-c", str(config), "--forwarder", "egde", "--dry-run"]) == 2
    assert capsys.readouterr().err == (
        "sfbridge spark drain: no forwarder named 'egde' (did you mean 'edge'?)\n"
    )
    assert main(["spark", "reconcile", "-c", str(config), "--since", "yesterday"]) == 2
    assert capsys.readouterr().err == (
        "sfbridge spark reconcile: --since wants an ISO time such as 2026-11-23T12:00:00 (UTC); "
        "got 'yesterday'\n"
    )


def test_the_old_spelling_of_id_still_selects_the_same_messages() -> None:
    parsed = build_parser().parse_args(
        ["retries", "fail", "--message-id", "a", "--id", "b", "--message-id", "c"]
    )
    assert parsed.id == ["a", "b", "c"]


def test_the_old_spelling_is_not_offered_in_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["retries", "list", "--help"])
    shown = capsys.readouterr().out
    assert "--id ID" in shown and "--message-id" not in shown


def _waiting(**given: object) -> WaitingMessage:
    row_id = str(uuid.UUID(int=7))
    fields: dict[str, object] = {
        "seq": 1,
        "row_id": row_id,
        "message_id": "B5D9A1C4-0000-4000-8000-000000000001",
        "forwarder": "edge",
        "destination": '"nsb"."Samples.Receiver"',
        "destination_database": "receiver",
        "attempts": 2,
        "first_failure_at": datetime(2026, 11, 27),
        "next_attempt_at": None,
        "last_error": "",
    }
    return WaitingMessage(**{**fields, **given})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("selection", "selected"),
    [
        (Selection(), True),
        (Selection(forwarder="edge"), True),
        (Selection(forwarder="other"), False),
        (Selection(destination="Samples.*"), True),  # the table name
        (Selection(destination='"nsb".*'), True),  # the whole address
        (Selection(destination="receiver"), True),  # the destination database
        (Selection(destination="Billing*"), False),
        # --id: the MessageId in any case, or the row Id, as `errors` takes them
        (Selection(ids=frozenset({"b5d9a1c4-0000-4000-8000-000000000001"})), True),
        (Selection(ids=frozenset({str(uuid.UUID(int=7))})), True),
        (Selection(ids=frozenset({str(uuid.UUID(int=8))})), False),
    ],
)
def test_a_waiting_message_is_selected_as_a_failed_one_is(
    selection: Selection, selected: bool
) -> None:
    grammar = dialect_for("postgresql").grammar
    assert selection.selects_waiting(_waiting(), grammar) is selected


@pytest.mark.parametrize(
    ("argv", "verb"),
    [
        (["where", "x"], "where"),
        (["-c", "errors", "status"], "status"),
        (["--config", "f.yaml", "-v", "errors", "list", "--limit", "5"], "errors list"),
        (["errors", "-c", "f.yaml", "summary"], "errors summary"),
        (["errors"], None),
        (["-vc", "f.yaml", "where", "x"], None),
        (["--version"], None),
        (["erors", "list"], None),
    ],
)
def test_the_verb_is_read_ahead_only_where_it_is_certain(argv: list[str], verb: str | None) -> None:
    assert named_verb(argv) == verb
    if verb is not None:
        parsed = build_parser(only=verb).parse_args(argv)
        assert parsed.verb == verb and callable(parsed.run)
