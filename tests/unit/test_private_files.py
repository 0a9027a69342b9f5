"""Files the bridge creates are readable by its user only (0600), whatever the umask: SQLite
databases with their WAL files (`sfbridge install`, a real subprocess), Spark reports, and the
helpers they are written with."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from bridge.secrets import create_private, open_private
from bridge.spark.report import write_report


def mode(path: Path | str) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_spark_reports_are_written_0600_also_over_an_existing_readable_file(
    tmp_path: Path,
) -> None:
    empty: list[list[object]] = []
    report = {
        "generated_at": "2026-11-23T12:00:00Z",
        "error_queue": {
            "messages": 0,
            **{key: empty for key in ("by_reason", "by_destination", "by_exception_type")},
            **{key: empty for key in ("by_age", "by_attempts", "by_hour", "by_forwarder")},
        },
        "retry_storage": {
            "messages": 0,
            **{k: empty for k in ("by_destination", "by_last_error", "by_age", "by_attempts")},
        },
        "problems": [],
    }
    (tmp_path / "report.html").write_text("old")
    os.chmod(tmp_path / "report.html", 0o644)
    old = os.umask(0o022)
    try:
        written = write_report(report, str(tmp_path / "report"))
    finally:
        os.umask(old)
    assert [mode(path) for path in written] == [0o600, 0o600]


def test_create_private_leaves_an_existing_file_alone(tmp_path: Path) -> None:
    path = tmp_path / "there.db"
    path.write_bytes(b"data")
    os.chmod(path, 0o640)
    create_private(path)
    assert path.read_bytes() == b"data" and mode(path) == 0o640
    create_private(tmp_path / "new.db")
    assert mode(tmp_path / "new.db") == 0o600
    with open_private(tmp_path / "new.db") as handle:
        handle.write("text")
    assert (tmp_path / "new.db").read_text() == "text" and mode(tmp_path / "new.db") == 0o600
