"""The dotted-name trap: `queue: Samples.Sender.Forward` unquoted is table "Sender.Forward" in
schema "Samples", while the endpoints' queue is "public"."Samples.Sender.Forward". `check`
reports it with the line to write, `install` refuses to create the wrong table and schema, and
the daemon warns at its start and does not create them either: that forwarder fails alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from support import DaemonProcess, pg_rows, sfbridge, write_config
from support.pairs import PgPair

pytestmark = pytest.mark.integration

FIX = """queue: '"public"."Samples.Sender.Forward"'"""


def samples_schema(pair: PgPair) -> list[Any]:
    return pg_rows(pair.sender, "SELECT 1 FROM pg_namespace WHERE nspname = 'Samples'")


def test_an_unquoted_dotted_queue_is_caught_by_check_install_and_the_daemon(
    pg_pair: PgPair, tmp_path: Path
) -> None:
    config = yaml.safe_load(pg_pair.config.read_text())
    config["forwarders"][0]["queue"] = "Samples.Sender.Forward"  # as typed, unquoted
    trapped = write_config(tmp_path / "trapped.yaml", config)

    check = sfbridge("-c", str(trapped), "check")
    assert check.returncode != 0, check.stdout
    [line] = [line for line in check.stdout.splitlines() if "unquoted dot" in line]
    assert line.startswith("PROBLEM  forwarder 'sender' queue: Samples.Sender.Forward is table")
    assert '"Samples"."Sender.Forward"' in line and FIX in line

    install = sfbridge("-c", str(trapped), "install")
    assert install.returncode == 2, install.stdout + install.stderr
    assert install.stderr.startswith('sfbridge install: not creating "Samples"."Sender.Forward":')
    assert FIX in install.stderr and "nothing was created" in install.stderr
    assert samples_schema(pg_pair) == []

    pg_pair.send(3)  # in the endpoints' queue, which the trapped config does not read
    daemon_log = tmp_path / "daemon.log"
    with DaemonProcess(trapped, daemon_log) as daemon:
        daemon.wait_for_output("unquoted dot")
        assert FIX in daemon.output()
        # Its batches find the queue missing and do not create it (nor the schema).
        daemon.wait_for_output("not creating it: forwarder 'sender'")
        assert daemon.stop() == 0
    assert samples_schema(pg_pair) == []
    assert pg_pair.queued() == 3

    # Quoted either way, nothing is said: the whole name, or the schema-and-table reading.
    config["forwarders"][0]["queue"] = '"Samples"."Sender.Forward"'
    meant = write_config(tmp_path / "meant.yaml", config)
    assert "unquoted dot" not in sfbridge("-c", str(meant), "check").stdout
