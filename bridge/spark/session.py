"""Starting Spark for sfbridge, or saying exactly what is missing.

The driver is this process (client mode): PySpark launches the driver's JVM with the settings
below. Whatever master it is given, the executors must run a Python that has sfbridge:
- `--python-env ARCHIVE` ships a packed environment (venv-pack, conda-pack) with the job and
  runs `sfbridge-env/bin/python` from it on every executor;
- else `spark.pyspark.python` (`--conf`) or `PYSPARK_PYTHON`, as the user set them;
- else this interpreter's own path, right wherever sfbridge is installed in the same place on
  every worker (one machine, or hosts set up alike).
Before the real work a one-task job checks that the executors can import sfbridge, so a wrong
interpreter is a sentence, not a traceback from inside a task.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from bridge.exceptions import SparkUnavailable

# Where `--python-env`'s archive is unpacked in each executor's working folder.
PYTHON_ENV_LINK = "sfbridge-env"
# The driver's JVM exits at its first OutOfMemoryError instead of living on with a dead
# scheduler thread, which leaves a job waiting for ever; the command then says so and exits.
EXIT_ON_OOM = "-XX:+ExitOnOutOfMemoryError"


@dataclass(frozen=True)
class SparkSettings:
    """How to run Spark, from the command line.

    `conf` holds `--conf KEY=VALUE` pairs, passed to Spark as they are; `driver_memory` is
    `spark.driver.memory`; `python_env` a packed environment for the executors;
    `executor_wait` how long (seconds) a job may have no executor at all on a cluster before
    the command gives up.
    """

    master: str = "local[*]"
    conf: tuple[tuple[str, str], ...] = ()
    driver_memory: str | None = None
    python_env: str | None = None
    executor_wait: float = 120.0

    @property
    def local(self) -> bool:
        return self.master.startswith("local")


def parse_conf(items: Sequence[str]) -> tuple[tuple[str, str], ...]:
    """`KEY=VALUE` strings as pairs. Raises ValueError naming the first one without a `=`."""
    pairs = []
    for item in items:
        key, separator, value = item.partition("=")
        if not separator or not key.strip():
            raise ValueError(f"--conf wants KEY=VALUE, got {item!r}")
        pairs.append((key.strip(), value))
    return tuple(pairs)


def executor_python(settings: SparkSettings, environ: dict[str, str]) -> str:
    """The interpreter the executors run (see the module docstring)."""
    if settings.python_env:
        return f"./{PYTHON_ENV_LINK}/bin/python"
    given = dict(settings.conf).get("spark.pyspark.python") or environ.get("PYSPARK_PYTHON")
    return given or sys.executable


def session_conf(settings: SparkSettings, environ: dict[str, str]) -> dict[str, str]:
    """Every setting the session is built with: sfbridge's, then the user's `--conf` (which win,
    but for the JVM option that ends the driver on out-of-memory, which is always added)."""
    conf = {
        "spark.speculation": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.pyspark.python": executor_python(settings, environ),
    }
    if settings.local:
        conf["spark.ui.enabled"] = "false"
    if settings.driver_memory:
        conf["spark.driver.memory"] = settings.driver_memory
    user = dict(settings.conf)
    if settings.python_env:
        archive = f"{os.path.abspath(settings.python_env)}#{PYTHON_ENV_LINK}"
        given = user.get("spark.archives")
        user["spark.archives"] = f"{given},{archive}" if given else archive
    conf.update(user)
    options = conf.get("spark.driver.extraJavaOptions", "")
    if EXIT_ON_OOM not in options.split():
        conf["spark.driver.extraJavaOptions"] = f"{options} {EXIT_ON_OOM}".strip()
    return conf


def spark_session(settings: SparkSettings, app_name: str) -> Any:
    """A SparkSession for `settings.master` (`local[*]`, `spark://...`, `yarn`, `k8s://...`).

    Local masters bind to loopback. Speculative execution is always off: a speculative copy
    of a drain task would only compete for the same rows. Raises SparkUnavailable.
    """
    try:
        from pyspark.sql import SparkSession
    except ImportError:
        raise SparkUnavailable(
            "PySpark is not installed: pip install 'sfbridge[spark]' (PySpark 4 needs Java 17 "
            "or later too)"
        ) from None
    java_home = os.environ.get("JAVA_HOME")
    if not (java_home and os.path.exists(os.path.join(java_home, "bin", "java"))) and not (
        shutil.which("java")
    ):
        raise SparkUnavailable(
            "Spark needs Java 17 or later and none was found: install it (Debian: apt-get "
            "install openjdk-17-jre-headless) or set JAVA_HOME"
        )
    if settings.python_env:
        if settings.local:
            raise SparkUnavailable(
                "--python-env is for cluster masters; a local master runs this interpreter"
            )
        if not os.path.isfile(settings.python_env):
            raise SparkUnavailable(f"--python-env {settings.python_env}: no such file")
    if settings.local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    conf = session_conf(settings, dict(os.environ))
    # What PySpark sends with each task as the interpreter to run it (it reads the variable,
    # not the setting).
    os.environ["PYSPARK_PYTHON"] = conf["spark.pyspark.python"]
    # py4j logs every closed gateway connection at INFO.
    logging.getLogger("py4j").setLevel(logging.WARNING)
    builder = SparkSession.builder.master(settings.master).appName(app_name)
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    _quiet_python_side(session.sparkContext)
    return session


def _quiet_python_side(context: Any) -> None:
    """PySpark's Python side reports a JVM that went away in tracebacks of its own: py4j logs
    every failed command through the root logger, the accumulator server prints the EOFError
    of its closed socket. The command says in one sentence what happened instead (a traceback
    with -v)."""
    root = logging.getLogger()
    if not any(isinstance(f, _Py4jRecords) for f in root.filters):
        root.addFilter(_Py4jRecords())
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, client_address: None


class _Py4jRecords(logging.Filter):
    """Drops what py4j logs through the root logger, unless debugging."""

    def filter(self, record: logging.LogRecord) -> bool:
        from_py4j = f"{os.sep}py4j{os.sep}" in record.pathname
        return not from_py4j or logging.getLogger().isEnabledFor(logging.DEBUG)


def submitted_file(path: str) -> str | None:
    """Under spark-submit, the local file given with `--files` that has `path`'s name; None
    elsewhere or when there is none.

    `--files` puts a file in the executors' working folders (and a cluster-mode driver's), not
    where a client-mode driver runs: there, `-c sfbridge.yaml` means the file it was given as.
    """
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        return None
    try:
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()
        files = SparkConf().get("spark.files") or ""
    except Exception:
        return None
    name = os.path.basename(path)
    for uri in files.split(","):
        parsed = urlparse(uri.strip())
        local = parsed.scheme in ("", "file") and os.path.isfile(parsed.path)
        if local and os.path.basename(parsed.path) == name:
            return parsed.path
    return None


def executor_check() -> str:
    """Runs on an executor: that it imported sfbridge is the check; says which Python."""
    import bridge

    return f"sfbridge {bridge.__version__} on {sys.executable}"


def check_executors(spark: Any, settings: SparkSettings) -> None:
    """On a cluster, a one-task job that imports sfbridge on an executor. Raises the job's
    failure (see `bridge.spark.guard`, which turns it into a sentence)."""
    if settings.local:
        return
    context = spark.sparkContext
    context.setJobGroup("sfbridge-check", "sfbridge: can the executors import sfbridge?")
    context.parallelize([0], 1).map(lambda _: executor_check()).collect()
