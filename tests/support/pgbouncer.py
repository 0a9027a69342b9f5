"""PgBouncer in front of a test PostgreSQL server: Debian's `pgbouncer` binary (`./dev.sh test`
puts it in `.venv/bin`), started on loopback with an ini file of its own, in session or
transaction pooling mode, trusting every login (the server behind it decides).

Use the `pgbouncer` fixture (tests/conftest.py); `PgBouncer.connection_string` is what a
config's `connection` says to reach a database through it.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

from support import REPO

# Where the binary is looked for, after SFBRIDGE_TEST_PGBOUNCER and the PATH.
CANDIDATES = (REPO / ".venv" / "bin" / "pgbouncer", Path("/usr/sbin/pgbouncer"))


def pgbouncer_binary() -> str | None:
    """The pgbouncer program the tests start, or None where there is none."""
    given = os.environ.get("SFBRIDGE_TEST_PGBOUNCER")
    if given:
        return given
    found = shutil.which("pgbouncer")
    if found:
        return found
    return next((str(path) for path in CANDIDATES if path.is_file()), None)


def server_address(odbc_prefix: str) -> tuple[str, int]:
    """(host, port) of the server an ODBC connection string prefix names."""
    host = re.search(r"(?i)(?:^|;)\s*server\s*=\s*([^;]+)", odbc_prefix)
    port = re.search(r"(?i)(?:^|;)\s*port\s*=\s*(\d+)", odbc_prefix)
    return (host.group(1).strip() if host else "127.0.0.1", int(port.group(1)) if port else 5432)


class PgBouncer:
    """One pgbouncer process: every database name goes to the server at `server` (host, port)
    with at most `pool_size` server connections per database and user."""

    def __init__(
        self,
        binary: str,
        folder: Path,
        server: tuple[str, int],
        *,
        pool_mode: str,
        pool_size: int,
    ) -> None:
        self.folder = folder
        self.pool_mode = pool_mode
        self.port = _free_port()
        self.log = folder / "pgbouncer.log"
        (folder / "userlist.txt").write_text('"postgres" ""\n')
        ini = folder / "pgbouncer.ini"
        ini.write_text(
            "[databases]\n"
            f"* = host={server[0]} port={server[1]}\n"
            "[pgbouncer]\n"
            "listen_addr = 127.0.0.1\n"
            f"listen_port = {self.port}\n"
            "unix_socket_dir =\n"
            "auth_type = trust\n"
            f"auth_file = {folder / 'userlist.txt'}\n"
            f"pool_mode = {pool_mode}\n"
            f"default_pool_size = {pool_size}\n"
            "max_client_conn = 200\n"
            # psqlODBC (the tests' own connections) sends these at login.
            "ignore_startup_parameters = extra_float_digits,geqo\n"
            f"logfile = {self.log}\n"
        )
        # PgBouncer refuses to run as root: it runs as postgres, as the private clusters do,
        # from a copy in its folder (postgres may not enter the checkout's .venv, under /root).
        prefix: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            assert runuser is not None, "running as root without runuser"
            prefix = [runuser, "-u", "postgres", "--"]
            binary = shutil.copy(binary, str(folder / "pgbouncer"))
            for path in (folder, *folder.iterdir()):
                shutil.chown(path, "postgres", "postgres")
        self.process = subprocess.Popen(
            [*prefix, str(binary), str(ini)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._wait_listening(timeout=15)

    def connection_string(self, database: str) -> str:
        """An ODBC-style connection string to `database` through this pgbouncer."""
        return (
            f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={self.port};Uid=postgres;"
            f"Database={database};"
        )

    def output(self) -> str:
        return self.log.read_text() if self.log.exists() else ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def _wait_listening(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"pgbouncer exited ({self.process.returncode}):\n{self.output()}"
                )
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise AssertionError(f"pgbouncer did not listen within {timeout} s:\n{self.output()}")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
