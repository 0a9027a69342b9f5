"""Spark jobs that end, one way or another, and their failures told as one sentence.

Three ways a Spark command used to hang or end in a traceback, and what is done about each:
- The driver's JVM runs out of memory in a scheduler thread and lives on, idle, with the job
  waiting for ever: the JVM is started with `-XX:+ExitOnOutOfMemoryError`
  (`bridge.spark.session`), so the Python side sees the connection go and says why.
- The cluster goes away (the master, the workers): Spark waits for executors that never come.
  `watched` runs a watchdog beside the jobs that cancels them once no executor has been there
  for `--wait-for-executors`, and says so.
- A task fails (a database unreachable, the executors' Python without sfbridge, a variable
  missing from their environment) until Spark gives up: the Python exception at the bottom of
  Spark's report is what the user reads, with what to do about it.
"""

from __future__ import annotations

import re
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from bridge.exceptions import ExitCode, SparkFailed
from bridge.secrets import mask_secrets
from bridge.spark.session import SparkSettings

# `-XX:+ExitOnOutOfMemoryError` ends the JVM with this status.
JVM_OUT_OF_MEMORY = 3
STOP_TIMEOUT = 30.0
JVM_EXIT_WAIT = 5.0

# The bridge's database errors (bridge.drivers.base): a task that raised one could not reach
# or use a database.
_DATABASE_ERRORS = re.compile(
    r"\b(?:DatabaseError|DatabaseUnavailable|ConnectionFailed|ConnectionLost|"
    r"TransientDatabaseError|TableNotFound|PermissionDenied)\b"
)
_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Failed|Lost|NotFound|Denied|"
                             r"Unavailable|Headers|UnsetVariables?)): (.*)$")  # fmt: skip
_TASK_FAILED = re.compile(r"failed (\d+) times?")


@contextmanager
def watched(spark: Any, settings: SparkSettings) -> Iterator[None]:
    """Run Spark jobs inside: on a cluster they are cancelled once no executor has been there
    for `settings.executor_wait` seconds; a failure of Spark's (or of a task) leaves as
    SparkFailed. Other exceptions pass unchanged."""
    watchdog = None if settings.local else _Watchdog(spark, settings)
    if watchdog is not None:
        watchdog.start()
    try:
        yield
    except SparkFailed:
        raise
    except Exception as error:
        if not is_spark_error(error):
            raise
        verdict = watchdog.verdict if watchdog is not None else None
        # A JVM that ended closes the connection before its process is gone: wait for its
        # status a moment, which says whether it ran out of memory.
        wait = JVM_EXIT_WAIT if _connection_lost(error) else 0.0
        status = jvm_status(spark, wait)
        raise SparkFailed(*explain(str(error), settings, verdict, status)) from error
    finally:
        if watchdog is not None:
            watchdog.stop()


def _connection_lost(error: BaseException) -> bool:
    return isinstance(error, (ConnectionError, EOFError)) or "Network" in type(error).__name__


def is_spark_error(error: BaseException) -> bool:
    """Whether `error` came from Spark or the connection to its JVM."""
    if isinstance(error, (ConnectionError, EOFError)):
        return True
    module = type(error).__module__ or ""
    return module.startswith(("py4j", "pyspark"))


def explain(
    text: str, settings: SparkSettings, verdict: str | None, jvm_exit: int | None
) -> tuple[str, ExitCode]:
    """(sentence, exit code) for a failure whose Spark-side text is `text`. `verdict` is the
    watchdog's, `jvm_exit` the driver JVM's exit status if it has ended."""
    if verdict:
        return verdict, ExitCode.SPARK_FAILED
    if jvm_exit is not None:
        if jvm_exit == JVM_OUT_OF_MEMORY:
            memory = dict(settings.conf).get("spark.driver.memory") or settings.driver_memory
            return (
                f"the Spark driver ran out of memory (spark.driver.memory "
                f"{memory or '1g, the default'}): give it more with --driver-memory",
                ExitCode.SPARK_FAILED,
            )
        return f"the Spark driver's JVM ended (exit status {jvm_exit})", ExitCode.SPARK_FAILED
    python = _python_exception(text)
    attempts = _TASK_FAILED.search(text)
    tried = f" (a task failed {attempts.group(1)} time(s))" if attempts else ""
    if python is not None:
        return _explain_task(python, tried)
    program = re.search(r'Cannot run program "([^"]*)"', text)
    if program:
        return (
            f"the executors cannot run the Python {program.group(1)!r}: point "
            "spark.pyspark.python (--conf) at an interpreter that exists on every worker, or "
            "ship one with --python-env ARCHIVE",
            ExitCode.USAGE,
        )
    for clue in ("All masters are unresponsive", "Master removed our application",
                 "SparkContext was shut down", "SparkContext has been shutdown",
                 "stopped SparkContext"):  # fmt: skip
        if clue in text:
            return (
                f"the Spark cluster was lost or never reached (master {settings.master}: "
                f"{clue}; Spark's log above says more)",
                ExitCode.SPARK_FAILED,
            )
    if "Py4JNetworkError" in text or "Connection refused" in text or not text.strip():
        return "lost the connection to the Spark driver's JVM", ExitCode.SPARK_FAILED
    return f"Spark failed: {_first_line(text)}{tried}", ExitCode.SPARK_FAILED


def _explain_task(python: str, tried: str) -> tuple[str, ExitCode]:
    """(sentence, exit code) for a task that failed with the Python exception line `python`."""
    kind = python.split(":")[0]
    if "No module named 'bridge'" in python:
        return (
            "the executors' Python cannot import sfbridge: point spark.pyspark.python (--conf) "
            "at an interpreter that has it on every worker, or ship one with --python-env "
            "ARCHIVE" + tried,
            ExitCode.USAGE,
        )
    if "UnsetVariable" in kind:
        # Its advice (the systemd EnvironmentFile) is for this host, not for executors.
        unset = _message(python).split("; ", 1)[0]
        return (
            f"a Spark task lacks an environment variable: {unset} (give executors the "
            "variables the YAML reads with --conf spark.executorEnv.NAME=VALUE)" + tried,
            ExitCode.USAGE,
        )
    if "ConfigError" in kind:
        return (
            f"a Spark task could not load the configuration: {_message(python)} (give "
            "executors the variables the YAML reads with --conf spark.executorEnv.NAME=VALUE)"
            + tried,
            ExitCode.USAGE,
        )
    if _DATABASE_ERRORS.search(kind):
        return f"a Spark task failed: {_message(python)}{tried}", ExitCode.UNAVAILABLE
    return f"a Spark task failed: {python}{tried}", ExitCode.SPARK_FAILED


def _python_exception(text: str) -> str | None:
    """The last Python exception line (`module.Type: message`) of the last traceback in
    `text`, a Spark report that carries a task's Python traceback."""
    start = text.rfind("Traceback (most recent call last):")
    if start < 0:
        return None
    found = None
    for line in text[start:].splitlines()[1:]:
        if line.startswith(("\tat ", "\t")):
            break
        match = _EXCEPTION_LINE.match(line)
        if match:
            found = line
    return mask_secrets(found) if found else None


def _message(line: str) -> str:
    """`module.Type: message` -> message."""
    return line.split(": ", 1)[1] if ": " in line else line


def _first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip().removeprefix(": ")
        if line and not line.startswith("An error occurred while calling"):
            return mask_secrets(line[:500])
    return "(no message)"


def jvm_status(spark: Any, wait: float = 0.0) -> int | None:
    """The driver JVM's exit status once it has ended (waiting for that at most `wait`
    seconds); None while it runs, or when PySpark did not start it (under spark-submit)."""
    process = _jvm_process(spark)
    if process is None:
        return None
    try:
        return int(process.wait(timeout=wait)) if wait else process.poll()
    except subprocess.TimeoutExpired:
        return None


def _jvm_process(spark: Any) -> Any:
    gateway = getattr(spark.sparkContext, "_gateway", None)
    return getattr(gateway, "proc", None)


def stop_session(spark: Any, timeout: float = STOP_TIMEOUT) -> None:
    """Stop `spark` within `timeout` seconds: a JVM that has ended is left alone, one that does
    not stop in time is killed."""
    process = _jvm_process(spark)
    if process is not None and process.poll() is not None:
        return

    def stop() -> None:
        try:
            spark.stop()
        except Exception:
            pass  # the JVM went meanwhile: nothing left to stop

    stopping = threading.Thread(target=stop, name="sfbridge-spark-stop", daemon=True)
    stopping.start()
    stopping.join(timeout)
    if stopping.is_alive() and process is not None:
        process.kill()


class _Watchdog(threading.Thread):
    """Cancels the jobs once the application has had no executor for `executor_wait` s."""

    def __init__(self, spark: Any, settings: SparkSettings) -> None:
        super().__init__(name="sfbridge-spark-watchdog", daemon=True)
        self._context = spark.sparkContext
        self._settings = settings
        self._stopped = threading.Event()
        self.verdict: str | None = None

    def stop(self) -> None:
        self._stopped.set()
        self.join(timeout=5)

    def run(self) -> None:
        alone_since: float | None = None
        while not self._stopped.wait(1.0):
            try:
                executors = executor_count(self._context)
            except Exception:
                return  # the JVM is gone: the jobs' own calls say so
            now = time.monotonic()
            if executors:
                alone_since = None
                continue
            alone_since = alone_since if alone_since is not None else now
            waited = now - alone_since
            if waited >= self._settings.executor_wait:
                self.verdict = (
                    f"no Spark executor for {waited:.0f} s (master {self._settings.master}): "
                    "the cluster has no worker for this application or lost them all; the "
                    "jobs were cancelled (wait longer with --wait-for-executors)"
                )
                try:
                    self._context.cancelAllJobs()
                except Exception:
                    pass
                return


def executor_count(context: Any) -> int:
    """Executors the application has now, the driver not counted."""
    infos = context._jsc.sc().statusTracker().getExecutorInfos()
    return max(0, len(infos) - 1)
