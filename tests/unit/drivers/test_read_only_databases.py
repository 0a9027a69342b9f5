"""A database that answers but takes no writes is an outage of that database (`read-only`),
told apart from a failure of one message: PostgreSQL's SQLSTATE 25006 (a hot standby after a
failover, `default_transaction_read_only`) and SQL Server's read-only, restoring and
availability-group-secondary errors, through every driver; the outage tracker names the state
and the probe's question (`require_writes`) says why."""

from __future__ import annotations

from pathlib import Path

import pyodbc
import pytest

from bridge.connections import require_writes
from bridge.dialects import dialect_for
from bridge.dialects.sqlserver import NATIVE_ERRORS
from bridge.drivers.odbc import _translate
from bridge.drivers.sqlite import SqliteConnection
from bridge.drivers.sqlstates import classify
from bridge.exceptions import DatabaseError, DatabaseReadOnly, DatabaseUnavailable
from bridge.outages import OutageTracker

MS = "[Microsoft][ODBC Driver 18 for SQL Server][SQL Server]"
STANDBY = "cannot execute INSERT in a read-only transaction"


def test_sqlstate_25006_is_a_read_only_database_an_outage_not_a_failed_message() -> None:
    error = classify("receiver", "25006", None, STANDBY, f"{STANDBY} (SQLSTATE 25006)")
    assert type(error) is DatabaseReadOnly
    assert isinstance(error, DatabaseUnavailable)  # the outage rule, and the session discarded
    assert str(error) == f"database 'receiver': {STANDBY} (SQLSTATE 25006)"


def test_psqlodbc_reports_25006_as_a_read_only_database() -> None:
    error = pyodbc.Error("25006", f"[25006] ERROR: {STANDBY};\nError while executing the query")
    assert type(_translate("receiver", error)) is DatabaseReadOnly


@pytest.mark.parametrize(
    ("native", "text"),
    [
        (3906, "Failed to update database \"receiver\" because the database is read-only."),
        (927, "Database 'receiver' cannot be opened. It is in the middle of a restore."),
        (976, "The target database, 'receiver', is participating in an availability group and "
              "is currently not accessible for queries."),
        (978, "The target database ('receiver') is in an availability group and is currently "
              "accessible for connections when the application intent is set to read only."),
        (983, "Unable to access availability database 'receiver' because the database replica "
              "is not in the PRIMARY or SECONDARY role."),
    ],
    ids=["3906-read-only", "927-restoring", "976-ag-not-readable", "978-ag-read-intent",
         "983-ag-resolving"],
)  # fmt: skip
def test_sql_server_databases_that_take_no_writes_are_read_only(native: int, text: str) -> None:
    error = pyodbc.Error("42000", f"[42000] {MS}{text} ({native}) (SQLExecDirectW)")
    translated = _translate("receiver", error, NATIVE_ERRORS)
    assert type(translated) is DatabaseReadOnly
    assert translated.native_error == native


@pytest.mark.parametrize("native", [942, 922], ids=["942-offline", "922-recovering"])
def test_an_offline_or_recovering_sql_server_database_is_unreachable(native: int) -> None:
    text = f"{MS}Database 'receiver' cannot be opened. ({native}) (SQLExecDirectW)"
    error = pyodbc.Error("42000", f"[42000] {text}")
    assert type(_translate("receiver", error, NATIVE_ERRORS)) is DatabaseUnavailable


@pytest.mark.parametrize("state", ["25001", "25P02", "42000"])
def test_other_transaction_states_stay_failures_of_the_statement(state: str) -> None:
    assert type(classify("receiver", state, None, "x", "x")) is DatabaseError


def test_the_tracker_holds_a_read_only_database_in_trouble_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    tracker = OutageTracker(10.0, external_probe=True)
    tracker.record_trouble("receiver", "read-only", f"database 'receiver': {STANDBY}")
    state = tracker.state("receiver")
    assert state is not None and state.state == "read-only" and state.in_trouble
    assert tracker.trouble("receiver") == state  # its messages wait; no attempt is made
    assert "database 'receiver' does not accept writes (read-only)" in caplog.text
    tracker.record_up("receiver")
    assert tracker.trouble("receiver") is None


def test_require_writes_names_why_a_database_takes_no_writes(tmp_path: Path) -> None:
    dialect = dialect_for("sqlite")
    connection = SqliteConnection("receiver", str(tmp_path / "receiver.db"), create=True)
    try:
        require_writes(connection, dialect, "receiver")  # writable: nothing raised
        connection.execute("PRAGMA query_only = ON")
        with pytest.raises(DatabaseReadOnly, match="does not accept writes: PRAGMA query_only"):
            require_writes(connection, dialect, "receiver")
    finally:
        connection.close()
