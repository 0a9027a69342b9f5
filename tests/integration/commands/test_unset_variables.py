"""Each command resolves only the databases it touches: with the secrets of the sender alone,
the verbs that read the sender run, and a verb that opens the receiver says which variable it
lacks and where the service gets it."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import (
    SENDER_FORWARD,
    DaemonProcess,
    PgPair,
    pg_count,
    sfbridge,
    wait_until,
    write_config,
)

pytestmark = pytest.mark.integration

SENDER_SECRET = "sender-Sup3rSecret"
RECEIVER_SECRET = "receiver-Sup3rSecret"
SENDER_ONLY = {"SENDER_PASSWORD": SENDER_SECRET}
BOTH = {**SENDER_ONLY, "RECEIVER_PASSWORD": RECEIVER_SECRET}
ENVIRONMENT_FILE = "/etc/sfbridge/sfbridge.env"
# A forwarder of the receiver's own (its replies go back): what opens the receiver lazily.
BACK = {"name": "back", "database": "receiver", "queue": '"public"."Samples.Receiver.Forward"'}


@pytest.fixture
def pair(pg_pair_factory: Any, monkeypatch: pytest.MonkeyPatch) -> PgPair:
    """The installed PostgreSQL pair, its connection strings then reading their passwords
    from ${SENDER_PASSWORD} and ${RECEIVER_PASSWORD} (the test server trusts any)."""
    monkeypatch.delenv("RECEIVER_PASSWORD", raising=False)
    monkeypatch.delenv("SENDER_PASSWORD", raising=False)
    pair: PgPair = pg_pair_factory()
    raw = yaml.safe_load(pair.config.read_text())
    raw["databases"]["sender"]["connection"] += "Pwd=${SENDER_PASSWORD};"
    raw["databases"]["receiver"]["connection"] += "Pwd=${RECEIVER_PASSWORD};"
    write_config(pair.config, raw)
    return pair


def with_back_forwarder(pair: PgPair) -> None:
    raw = yaml.safe_load(pair.config.read_text())
    raw["forwarders"].append(BACK)
    write_config(pair.config, raw)


def cli(pair: PgPair, *args: str, env: dict[str, str] = SENDER_ONLY) -> Any:
    return sfbridge("-c", str(pair.config), *args, env=env)


def no_secret_in(*texts: str) -> None:
    for text in texts:
        assert SENDER_SECRET not in text and RECEIVER_SECRET not in text


@pytest.mark.parametrize(
    ("args", "code"),
    [
        pytest.param(("status",), 1, id="status"),  # 1: no daemon runs
        pytest.param(("status", "--json"), 1, id="status-json"),
        pytest.param(("status", "--audit"), 0, id="audit"),
        pytest.param(("send", '"Samples.Receiver"'), 0, id="send"),
        pytest.param(("errors", "list"), 0, id="errors-list"),
        pytest.param(("retries", "list"), 0, id="retries-list"),
        pytest.param(("pause", "sender", "--destination", "receiver"), 0, id="pause"),
        pytest.param(("resume", "sender"), 0, id="resume"),
        pytest.param(("route", '"Samples.Receiver"'), 0, id="route"),
    ],
)
def test_a_verb_that_reads_only_the_sender_runs_with_only_the_senders_secret(
    pair: PgPair, args: tuple[str, ...], code: int
) -> None:
    result = cli(pair, *args)
    assert result.returncode == code, result.stdout + result.stderr
    assert "RECEIVER_PASSWORD" not in result.stdout + result.stderr
    no_secret_in(result.stdout, result.stderr)


def test_status_and_send_work_on_the_sender_without_the_receivers_secret(pair: PgPair) -> None:
    sent = cli(pair, "send", '"Samples.Receiver"', "--count", "3")
    assert sent.returncode == 0, sent.stderr
    assert pg_count(pair.sender, SENDER_FORWARD) == 3
    status = cli(pair, "status", "--json")
    [forwarder] = json.loads(status.stdout)["forwarders"]
    assert "error" not in forwarder, forwarder
    assert forwarder["queued"] == 3


def test_a_verb_that_opens_the_receiver_names_the_variable_the_database_and_the_file(
    pair: PgPair,
) -> None:
    with_back_forwarder(pair)
    result = cli(pair, "send", "--forwarder", "back", '"Samples.Sender"')
    assert result.returncode == 2, result.stdout + result.stderr
    first, second = result.stderr.splitlines()
    assert first == (
        "sfbridge send: database 'receiver': cannot connect: environment variable "
        "RECEIVER_PASSWORD is not set (databases.receiver.connection names it)"
    )
    assert f"reads it from {ENVIRONMENT_FILE} (EnvironmentFile=; add it there if missing)" in second
    assert f"(set -a; . {ENVIRONMENT_FILE}; set +a; sfbridge ...)" in second
    no_secret_in(result.stdout, result.stderr)


def test_errors_on_the_receiver_say_what_is_missing_and_exit_as_for_a_config_error(
    pair: PgPair,
) -> None:
    with_back_forwarder(pair)
    result = cli(pair, "errors", "list", "--forwarder", "back")
    assert result.returncode == 2, result.stdout + result.stderr
    assert (
        "sfbridge errors list: database 'receiver': cannot connect: environment variable "
        "RECEIVER_PASSWORD is not set" in result.stderr
    )
    assert ENVIRONMENT_FILE in result.stderr


def test_status_shows_the_sender_and_says_why_the_receivers_forwarder_is_unknown(
    pair: PgPair,
) -> None:
    with_back_forwarder(pair)
    result = cli(pair, "status", "--json")
    sender, back = json.loads(result.stdout)["forwarders"]
    assert "error" not in sender and sender["queued"] == 0
    assert "environment variable RECEIVER_PASSWORD is not set" in back["error"]
    assert ENVIRONMENT_FILE in back["error"]
    no_secret_in(result.stdout, result.stderr)


def test_check_reports_the_receiver_without_its_variable_and_checks_the_rest(
    pair: PgPair,
) -> None:
    result = cli(pair, "check")
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert any(line.startswith("ok") and "database 'sender'" in line for line in lines)
    [receiver] = [line for line in lines if "database 'receiver'" in line and "not set" in line]
    assert "environment variable RECEIVER_PASSWORD is not set" in receiver
    assert ENVIRONMENT_FILE in receiver
    assert cli(pair, "check", env=BOTH).returncode == 0


@pytest.mark.parametrize("verb", ["run", "install"])
def test_the_daemon_and_install_refuse_to_start_without_every_variable(
    pair: PgPair, verb: str
) -> None:
    result = cli(pair, verb)
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stdout == ""  # install created nothing, the daemon did not start
    lines = result.stderr.splitlines()
    assert lines[0].startswith(f"sfbridge {verb}: ") and lines[0].endswith("; not set:")
    assert "  databases.receiver.connection: RECEIVER_PASSWORD" in lines
    assert ENVIRONMENT_FILE in lines[-1]
    no_secret_in(result.stdout, result.stderr)


def test_a_reload_that_names_an_unset_variable_keeps_the_running_configuration(
    pair: PgPair, tmp_path: Path
) -> None:
    with DaemonProcess(pair.config, tmp_path / "daemon.log", env=BOTH) as daemon:
        daemon.wait_for_output(DaemonProcess.STARTED)
        raw = yaml.safe_load(pair.config.read_text())
        raw["databases"]["receiver"]["connection"] += "Application Name=${RECEIVER_APP};"
        write_config(pair.config, raw)
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_for_output("reload failed, keeping the running configuration")
        daemon.wait_for_output("databases.receiver.connection: RECEIVER_APP not set")
        daemon.wait_for_output("systemctl restart sfbridge")
        ids = pair.send(5)
        wait_until(lambda: pair.delivered() == 5, 30, "delivery with the old configuration")
        assert daemon.stop() == 0, daemon.output()
        assert set(pair.received()) == ids
        no_secret_in(daemon.output())


def test_run_names_every_value_it_lacks_the_sentry_dsn_too(
    pair: PgPair, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("SENTRY_DSN", raising=False)
    raw = yaml.safe_load(pair.config.read_text())
    raw["sentry"] = {"dsn": "${SENTRY_DSN}"}
    write_config(pair.config, raw)
    result = cli(pair, "run", env=SENDER_ONLY)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.splitlines()
    assert lines[1:3] == [
        "  databases.receiver.connection: RECEIVER_PASSWORD",
        "  sentry.dsn: SENTRY_DSN",
    ]
    assert "reads them from" in lines[-1]
    assert cli(pair, "status", env=SENDER_ONLY).returncode == 1  # 1: no daemon; Sentry unused
