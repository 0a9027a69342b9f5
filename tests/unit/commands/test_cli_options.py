"""Command-line conveniences a new user runs into first."""

from __future__ import annotations

import logging

import pytest

from bridge.commands.cli import build_parser, main


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["-c", "before.yaml", "status"], "before.yaml"),
        (["status", "-c", "after.yaml"], "after.yaml"),
        (["status", "--config", "after.yaml", "--json"], "after.yaml"),
        (["-c", "before.yaml", "status", "-c", "after.yaml"], "after.yaml"),
        (["spark", "report", "-c", "after.yaml"], "after.yaml"),
        (["errors", "list", "-c", "after.yaml"], "after.yaml"),
        (["errors", "-c", "after.yaml", "replay", "--dry-run"], "after.yaml"),
        (["-c", "before.yaml", "errors", "show", "x", "--config", "after.yaml"], "after.yaml"),
    ],
)
def test_the_config_option_works_before_and_after_the_command(
    argv: list[str], expected: str
) -> None:
    assert build_parser().parse_args(argv).config == expected


def test_without_the_option_the_environment_then_the_default_applies(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SFBRIDGE_CONFIG", "/srv/bridge.yaml")
    assert build_parser().parse_args(["status"]).config == "/srv/bridge.yaml"
    monkeypatch.delenv("SFBRIDGE_CONFIG")
    assert build_parser().parse_args(["check"]).config == "/etc/sfbridge/sfbridge.yaml"
    monkeypatch.setenv("SFBRIDGE_CONFIG", "")  # set but empty, as unit files can leave it
    assert build_parser().parse_args(["check"]).config == "/etc/sfbridge/sfbridge.yaml"


def test_a_missing_config_file_says_how_to_point_at_one(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # main() points the root logger at this test's captured stderr, closed once the test ends:
    # later tests' log lines must not go there.
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    monkeypatch.setattr(logging.getLogger(), "level", logging.getLogger().level)
    assert main(["status", "-c", "/nonexistent/sfbridge.yaml"]) == 2
    assert capsys.readouterr().err == (
        "sfbridge: configuration file /nonexistent/sfbridge.yaml not found; point at one with "
        "-c FILE (before or after the command) or SFBRIDGE_CONFIG=FILE (default "
        "/etc/sfbridge/sfbridge.yaml); `sfbridge demo` needs none\n"
    )
