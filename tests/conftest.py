"""Shared test fixtures: real PostgreSQL databases and an ODBC setup that writes no log files.

PostgreSQL comes from SFBRIDGE_TEST_PG (an ODBC connection string prefix without a
database, e.g. "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=postgres;"),
defaulting to the server on 127.0.0.1:5432. Every test session creates its own databases
and drops them at the end.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support import (
    SPARK_ENV,
    SQLSERVER_VARIABLE,
    DaemonProcess,
    PgPair,
    SqlServerTestServer,
    make_pg_pair,
)
from support.pairs import pg_pair_config
from support.pgbouncer import PgBouncer, pgbouncer_binary, server_address

DEFAULT_PG = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Uid=postgres;"
PSQLODBC_CANDIDATES = [
    "/usr/lib/x86_64-linux-gnu/odbc/psqlodbcw.so",
    "/usr/lib/aarch64-linux-gnu/odbc/psqlodbcw.so",
    "/usr/lib/odbc/psqlodbcw.so",
    "/usr/lib64/psqlodbcw.so",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Longest first, so the parallel run (pytest-xdist hands tests out in this order) does
    not end with one worker on a long test while the others idle: the Spark groups (one worker
    runs each), then tests marked slow, then the rest of the integration tier, then the unit
    tier, which fills the gaps."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("xdist_group"):
            return 0
        if item.get_closest_marker("slow"):
            return 1
        return 2 if "integration" in item.path.parts else 3

    items.sort(key=rank)


@pytest.fixture(scope="session", autouse=True)
def odbc_driver_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A project-local odbcinst.ini with CommLog off (Debian's default writes a log per process).

    Set in the environment, so subprocesses (the CLI, the daemon) inherit it.
    """
    driver = next((p for p in PSQLODBC_CANDIDATES if Path(p).exists()), None)
    if driver is None:
        yield
        return
    folder = tmp_path_factory.mktemp("odbc")
    (folder / "odbcinst.ini").write_text(
        f"[PostgreSQL Unicode]\nDriver={driver}\nDebug=0\nCommLog=0\n"
    )
    (folder / "odbc.ini").write_text("")
    previous = os.environ.get("ODBCSYSINI")
    os.environ["ODBCSYSINI"] = str(folder)
    yield
    if previous is None:
        os.environ.pop("ODBCSYSINI", None)
    else:
        os.environ["ODBCSYSINI"] = previous


class PostgresServer:
    """Creates and drops databases on one PostgreSQL server through psqlODBC."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix if prefix.endswith(";") else prefix + ";"
        self.created: list[str] = []

    def connection_string(self, database: str) -> str:
        return f"{self.prefix}Database={database};"

    def admin(self):  # type: ignore[no-untyped-def]
        import pyodbc

        return pyodbc.connect(self.connection_string("postgres"), autocommit=True, timeout=5)

    def create_database(self, template: str | None = None) -> str:
        """A new database (a copy of `template` if given); its name."""
        name = f"sfbtest_{uuid.uuid4().hex[:10]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with self.admin() as admin:
            admin.execute(f'CREATE DATABASE "{name}"{copy}')
        self.created.append(name)
        return name

    def drop_all(self) -> None:
        """Drop every database this session created, eight at a time: each DROP DATABASE
        waits for a checkpoint, and drops waiting together share one."""
        from concurrent.futures import ThreadPoolExecutor

        def drop(names: list[str]) -> None:
            with self.admin() as admin:
                for name in names:
                    admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(drop, [self.created[index::8] for index in range(8)]))


@pytest.fixture(scope="session")
def postgres(odbc_driver_registry: None) -> Iterator[PostgresServer]:
    try:
        import pyodbc
    except ImportError as error:  # pragma: no cover - the README's test command installs it
        pytest.fail(f"pyodbc is not importable ({error}); run the README's test command")
    server = PostgresServer(os.environ.get("SFBRIDGE_TEST_PG", DEFAULT_PG))
    try:
        server.admin().close()
    except pyodbc.Error as error:
        pytest.fail(
            f"PostgreSQL is not reachable through psqlODBC ({error}); start it or set "
            "SFBRIDGE_TEST_PG to an ODBC connection string prefix"
        )
    yield server
    server.drop_all()


@pytest.fixture
def new_pg_database(postgres: PostgresServer) -> Callable[[], str]:
    """Creates a fresh database and returns its ODBC connection string."""

    def create() -> str:
        return postgres.connection_string(postgres.create_database())

    return create


class PairTemplates:
    """Installed pairs to clone: the first pair of each config is installed as today (two
    databases, `sfbridge install` in a subprocess, the receiver's queue), as templates; every
    pair of the same config after it is two `CREATE DATABASE ... TEMPLATE`, which costs a
    tenth of that. The templates are never connected to, so nothing of a test is in them
    (the store id of two-phase gids, for one, is made on first use, not by the installer)."""

    def __init__(self, server: PostgresServer, folder: Path) -> None:
        self.server = server
        self.folder = folder
        self.templates: dict[str, tuple[str, str]] = {}

    def pair(self, tmp_path: Path, **options: Any) -> PgPair:
        if "databases" in options:  # other databases would need their own templates
            return make_pg_pair(tmp_path, self._database(), self._database(), **options)
        config = {k: v for k, v in options.items() if k not in ("queue", "create_queue")}
        shape = json.dumps(
            [pg_pair_config("{sender}", "{receiver}", **config), options.get("queue"),
             options.get("create_queue")],
            sort_keys=True,
            default=str,
        )  # fmt: skip
        if shape not in self.templates:
            sender, receiver = self.server.create_database(), self.server.create_database()
            make_pg_pair(
                self.folder / uuid.uuid4().hex,
                self.server.connection_string(sender),
                self.server.connection_string(receiver),
                **options,
            )
            self.templates[shape] = (sender, receiver)
        sender, receiver = (self.server.create_database(t) for t in self.templates[shape])
        pair = make_pg_pair(
            tmp_path,
            self.server.connection_string(sender),
            self.server.connection_string(receiver),
            installed=True,
            **options,
        )
        return pair

    def _database(self) -> str:
        return self.server.connection_string(self.server.create_database())


@pytest.fixture(scope="session")
def pair_templates(
    postgres: PostgresServer, tmp_path_factory: pytest.TempPathFactory
) -> PairTemplates:
    return PairTemplates(postgres, tmp_path_factory.mktemp("pair-templates"))


@pytest.fixture
def pg_pair_factory(tmp_path: Path, pair_templates: PairTemplates) -> Callable[..., PgPair]:
    """Makes a PostgreSQL pair on two fresh databases: `make_pg_pair(tmp_path, sender,
    receiver, **options)` (tests/support/pairs.py), installed, the receiver's queue created
    (cloned from a pair installed once per config, `PairTemplates`)."""

    def make(**options: Any) -> PgPair:
        return pair_templates.pair(tmp_path, **options)

    return make


@pytest.fixture
def pg_pair(pg_pair_factory: Callable[..., PgPair]) -> PgPair:
    """A forwarding database and a receiver database, the forwarder `sender` on
    "Samples.Sender.Forward" routing everything to "Samples.Receiver" (peek every 200 ms, retry
    after 1 s), installed."""
    return pg_pair_factory()


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., DaemonProcess]]:
    """Starts `sfbridge -c CONFIG run` in a subprocess (log in tmp_path/NAME); every daemon
    still running at the end of the test is killed."""
    started: list[DaemonProcess] = []

    def start(
        config: Path, name: str = "daemon.log", env: dict[str, str] | None = None
    ) -> DaemonProcess:
        daemon = DaemonProcess(config, tmp_path / name, env)
        started.append(daemon)
        return daemon

    yield start
    for daemon in started:
        daemon.__exit__()


class PrivatePostgres:
    """A throwaway PostgreSQL cluster this test session owns, so it can be killed and restarted."""

    def __init__(
        self, folder: Path, port: int, options: str = "", standby_of: PrivatePostgres | None = None
    ) -> None:
        """Start a new cluster, or with `standby_of` a streaming standby of that one (a
        `pg_basebackup -R` of it, which replays its WAL and follows it until promoted)."""
        import shutil
        import subprocess

        self.folder = folder
        self.port = port
        self.options = options
        self.data = folder / "data"
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not binaries:
            pytest.skip("no PostgreSQL server binaries (initdb) to start a private cluster")
        self.bin = binaries[-1].parent
        self._as_postgres: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                pytest.skip("running as root without runuser; cannot start a private cluster")
            self._as_postgres = [runuser, "-u", "postgres", "--"]
            shutil.chown(folder, "postgres", "postgres")
        if standby_of is not None:
            subprocess.run(
                [
                    *self._as_postgres,
                    str(self.bin / "pg_basebackup"),
                    *("-h", "127.0.0.1", "-p", str(standby_of.port), "-U", "postgres"),
                    *("-D", str(self.data), "-R", "-X", "stream", "--no-sync"),
                ],
                check=True,
                capture_output=True,
                timeout=60,
            )
            self.start()
            return
        subprocess.run(
            [
                *self._as_postgres,
                str(self.bin / "initdb"),
                "-D",
                str(self.data),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
            ],
            check=True,
            capture_output=True,
        )
        self.start()

    def _ctl(self, *args: str) -> None:
        import subprocess

        subprocess.run(
            [*self._as_postgres, str(self.bin / "pg_ctl"), "-D", str(self.data), *args],
            check=True,
            capture_output=True,
            timeout=60,
        )

    def start(self) -> None:
        options = f"-h 127.0.0.1 -p {self.port} -k {self.folder} -c fsync=off {self.options}"
        self._ctl("-l", str(self.folder / "log"), "-w", "-o", options, "start")

    def kill(self) -> None:
        """Stop the server the hard way, like a crash or a pulled cable."""
        self._ctl("-m", "immediate", "-w", "stop")

    def promote(self) -> None:
        """Make a standby the primary (`pg_ctl promote`), waiting until it accepts writes."""
        self._ctl("-w", "promote")

    def stop(self) -> None:
        try:
            self._ctl("-m", "fast", "-w", "stop")
        except Exception:
            pass

    def connection_string(self, database: str = "postgres") -> str:
        return (
            f"Driver={{PostgreSQL Unicode}};Server=127.0.0.1;Port={self.port};Uid=postgres;"
            f"Database={database};"
        )


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def private_postgres() -> Iterator[PrivatePostgres]:
    import shutil
    import tempfile

    # Not under pytest's tmp folder: that is private to root, and the server runs as postgres.
    folder = Path(tempfile.mkdtemp(prefix="sfbridge-pg-"))
    folder.chmod(0o755)
    server = PrivatePostgres(folder, _free_port())
    yield server
    server.stop()
    shutil.rmtree(folder, ignore_errors=True)


@dataclass
class StreamingPair:
    """A primary and its streaming standby on loopback, replicating synchronously: a commit
    the primary acknowledged is on the standby too, so that a promotion loses none (with
    asynchronous replication, what the standby had not received when the primary died is lost
    by PostgreSQL itself). `failover_string` lists the standby first: only
    `target_session_attrs=read-write` sends a connection on to the primary."""

    primary: PrivatePostgres
    standby: PrivatePostgres

    def failover_string(self, database: str, form: str = "odbc") -> str:
        """A connection string to `database` on both servers, in the ODBC-style `form` or
        as a libpq URL (`url`)."""
        ports = (self.standby.port, self.primary.port)
        if form == "url":
            hosts = ",".join(f"127.0.0.1:{port}" for port in ports)
            return f"postgresql://postgres@{hosts}/{database}?target_session_attrs=read-write"
        return (
            "Driver={PostgreSQL Unicode};Server=127.0.0.1,127.0.0.1;"
            f"Port={ports[0]},{ports[1]};Uid=postgres;Database={database};"
            "target_session_attrs=read-write;"
        )

    def create_database(self, name: str) -> None:
        """Create `name` on the primary (and so on the standby)."""
        import pyodbc

        with pyodbc.connect(self.primary.connection_string(), autocommit=True) as admin:
            admin.execute(f'CREATE DATABASE "{name}"')


@pytest.fixture
def streaming_postgres() -> Iterator[StreamingPair]:
    """A fresh `StreamingPair` (two private clusters, a few seconds to make), stopped after."""
    import shutil
    import tempfile

    import pyodbc

    folders = [Path(tempfile.mkdtemp(prefix="sfbridge-pg-")) for _ in range(2)]
    servers: list[PrivatePostgres] = []
    try:
        for folder in folders:
            folder.chmod(0o755)
        # Prepared transactions allowed (a standby needs at least its primary's number), so
        # that a two-phase destination can fail over too.
        options = "-c max_connections=30 -c max_prepared_transactions=16"
        servers.append(PrivatePostgres(folders[0], _free_port(), options))
        servers.append(PrivatePostgres(folders[1], _free_port(), options, servers[0]))
        with pyodbc.connect(servers[0].connection_string(), autocommit=True) as admin:
            admin.execute("ALTER SYSTEM SET synchronous_standby_names = '*'")
            admin.execute("SELECT pg_reload_conf()")
        yield StreamingPair(*servers)
    finally:
        for server in servers:
            server.stop()
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


def _max_prepared_transactions(server: PostgresServer) -> int:
    with server.admin() as admin:
        return int(admin.execute("SHOW max_prepared_transactions").fetchone()[0])


@pytest.fixture(scope="session")
def two_phase_postgres(postgres: PostgresServer) -> Iterator[PostgresServer]:
    """A PostgreSQL server that allows prepared transactions (`transaction: two-phase`).

    The test server when its max_prepared_transactions is above 0 (the default is 0, and
    changing it takes a restart); otherwise a private cluster started with 64, for the session.
    """
    import shutil
    import tempfile

    if _max_prepared_transactions(postgres) > 0:
        yield postgres
        return
    folder = Path(tempfile.mkdtemp(prefix="sfbridge-pg-2pc-"))
    folder.chmod(0o755)
    private = PrivatePostgres(folder, _free_port(), "-c max_prepared_transactions=64")
    server = PostgresServer(private.connection_string().removesuffix("Database=postgres;"))
    try:
        yield server
    finally:
        server.drop_all()
        private.stop()
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def pgbouncer(postgres: PostgresServer) -> Iterator[Callable[..., PgBouncer]]:
    """Starts PgBouncer on loopback in front of the test server (or `server`, a
    PostgresServer): `start(pool_mode, pool_size=3)`; stopped after the test. Skips where
    there is no pgbouncer binary, but fails under CI, whose `./dev.sh test` installs it."""
    import shutil
    import tempfile

    binary = pgbouncer_binary()
    if binary is None:
        reason = (
            "no pgbouncer binary: ./dev.sh test puts Debian's into .venv/bin (or set "
            "SFBRIDGE_TEST_PGBOUNCER to one)"
        )
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    started: list[PgBouncer] = []

    def start(
        pool_mode: str, pool_size: int = 3, server: PostgresServer | None = None
    ) -> PgBouncer:
        # Not under pytest's tmp folder: that is private to root, and pgbouncer runs as postgres.
        folder = Path(tempfile.mkdtemp(prefix="sfbridge-pgbouncer-"))
        folder.chmod(0o755)
        address = server_address((server or postgres).prefix)
        bouncer = PgBouncer(binary, folder, address, pool_mode=pool_mode, pool_size=pool_size)
        started.append(bouncer)
        return bouncer

    yield start
    for bouncer in started:
        bouncer.stop()
        shutil.rmtree(bouncer.folder, ignore_errors=True)


class SparkStandalone:
    """A Spark standalone cluster on loopback: a master and one worker, started from the jars
    the PySpark package ships (`bin/spark-class`), each in a process group of its own so that
    the worker can be killed with its executors, as a lost machine would be."""

    def __init__(self, folder: Path, cores: int = 2, memory: str = "2g") -> None:
        import subprocess

        pyspark = pytest.importorskip("pyspark")
        home = Path(pyspark.__file__).parent
        spark_class = str(home / "bin" / "spark-class")
        folder.mkdir(parents=True, exist_ok=True)
        self.folder = folder
        self.port, self.ui_port = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        env = {**os.environ, "SPARK_HOME": str(home), "SPARK_LOCAL_IP": "127.0.0.1",
               "SPARK_LOG_DIR": str(folder), **SPARK_ENV}  # fmt: skip
        master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                  "--port", str(self.port), "--webui-port", str(self.ui_port)]  # fmt: skip
        worker = ["org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1",
                  "--cores", str(cores), "--memory", memory, "--webui-port", str(_free_port()),
                  "--work-dir", str(folder / "work")]  # fmt: skip
        processes = []
        for name, arguments in (("master", master), ("worker", worker)):
            with (folder / f"{name}.log").open("w") as log:
                started = subprocess.Popen(
                    [spark_class, *arguments], stdout=log, stderr=subprocess.STDOUT, env=env,
                    start_new_session=True,
                )  # fmt: skip
                processes.append(started)
        self.master, self.worker = processes
        self._wait_for_workers(1, timeout=90)

    def alive_workers(self) -> int:
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui_port}/json/", timeout=2) as r:
                return int(json.load(r).get("aliveworkers", 0))
        except OSError:
            return 0

    def _wait_for_workers(self, count: int, timeout: float) -> None:
        import time

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self.master.poll() is self.worker.poll() is None:
            if self.alive_workers() >= count:
                return
            time.sleep(0.5)
        logs = "".join(
            (self.folder / name).read_text()[-2000:] for name in ("master.log", "worker.log")
        )
        self.stop()
        raise AssertionError(f"the Spark standalone cluster did not start:\n{logs}")

    def kill_worker(self) -> None:
        """SIGKILL the worker, its executors and their Python workers (one process group)."""
        _kill_group(self.worker)

    def stop(self) -> None:
        _kill_group(self.worker)
        _kill_group(self.master)


def _kill_group(process: object) -> None:
    import signal
    import subprocess

    assert isinstance(process, subprocess.Popen)
    if process.poll() is None:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=30)


@pytest.fixture
def spark_standalone(tmp_path: Path) -> Iterator[SparkStandalone]:
    """A Spark standalone master and worker of this test's own, stopped after it."""
    cluster = SparkStandalone(tmp_path / "spark-standalone")
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def spark_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkStandalone]:
    """A Spark standalone master and worker shared by a module's tests that do not kill it."""
    cluster = SparkStandalone(tmp_path_factory.mktemp("spark-standalone"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="session")
def sqlserver_server() -> Iterator[SqlServerTestServer | None]:
    """The server SFBRIDGE_TEST_SQLSERVER names (its databases dropped after the session), or
    None when the variable is not set."""
    prefix = os.environ.get(SQLSERVER_VARIABLE)
    if not prefix:
        yield None
        return
    server = SqlServerTestServer(prefix)
    yield server
    server.drop_all()
