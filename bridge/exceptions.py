"""Every exception the bridge raises, and the exit codes of the `sfbridge` command.

One module, imported by every layer and importing none of them, so that a caller can catch
what a lower layer raises without reaching into it. Every error a person may see derives from
`SfbridgeError`, which carries what to do about it (`advice`) and what `sfbridge` exits with
(`exit_code`); `bridge.commands.cli.main` reports it, once, for every verb. The data path's
own control-flow signals, which never reach a person, live beside the code that raises and
catches them (`bridge.forwarding.writes`, `bridge.forwarding.transactions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

from bridge.secrets import mask_secrets


class ExitCode(IntEnum):
    """What `sfbridge` exits with; docs/cli.md says which verb uses which."""

    OK = 0
    # `check` found problems, some of the work failed, a message would go to the error queue
    # (`route`), or the daemon cannot start (its metrics port is taken, say).
    FAILED = 1
    USAGE = 2  # the configuration or the command line is invalid
    UNAVAILABLE = 3  # a database the command needs cannot be reached
    SPARK_FAILED = 4  # a Spark job failed or could not run


class SfbridgeError(Exception):
    """An error a person acts on: the root of every one `sfbridge` reports.

    `advice` says what to do ("" when the message says it all) and `exit_code` what the command
    exits with; both are class-level defaults that a subclass or one instance (the keywords)
    overrides. `report` gives the lines `main` prints.
    """

    advice: str = ""
    exit_code: ExitCode = ExitCode.FAILED

    def __init__(
        self, *args: object, advice: str | None = None, exit_code: ExitCode | None = None
    ) -> None:
        super().__init__(*args)
        if advice is not None:
            self.advice = advice
        if exit_code is not None:
            self.exit_code = exit_code

    def report(self, verb: str) -> list[str]:
        """What `sfbridge` prints for it: the message after the command as typed (`verb`, e.g.
        `errors replay`), then the advice on a line of its own."""
        return [f"sfbridge {verb}: {self}", *([f"  {self.advice}"] if self.advice else [])]


# -- input that cannot be parsed ------------------------------------------------------------


class AddressError(SfbridgeError, ValueError):
    """An address string that cannot be parsed in the given grammar."""

    exit_code = ExitCode.USAGE


class TypeNameError(SfbridgeError, ValueError):
    """Text that is not a .NET type name."""


class PoisonHeaders(SfbridgeError, ValueError):
    """The Headers column is not a JSON object of strings."""


Severity = Literal["error", "warning"]

# The Problem message of a configuration file that is not there.
MISSING_FILE = "configuration file not found"


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a configuration.

    `path` locates it: a key path such as `routes[2].database`, `<file>:line:col` for YAML
    syntax errors, the file name for unreadable files, or "" for the document as a whole.
    Secrets in `path` and `message` are masked on construction, so a Problem is always safe to
    print or log.
    """

    path: str
    message: str
    severity: Severity = "error"

    def __post_init__(self) -> None:
        # Frozen, so bypass __setattr__; masking here protects every producer of Problems,
        # including future ones that forget to mask.
        object.__setattr__(self, "path", mask_secrets(self.path))
        object.__setattr__(self, "message", mask_secrets(self.message))

    def __str__(self) -> str:
        prefix = f"{self.path}: " if self.path else ""
        label = "warning: " if self.severity == "warning" else ""
        return f"{prefix}{label}{self.message}"


class ConfigError(SfbridgeError):
    """The configuration cannot be used. `problems` holds every problem found (warnings too);
    `str()` lists the errors, one per line. `source` is the file, where known."""

    exit_code = ExitCode.USAGE

    def __init__(
        self, problems: Iterable[Problem], *, source: str = "", advice: str | None = None
    ) -> None:
        self.problems: list[Problem] = list(problems)
        self.source = source
        # args = (problems,) so that the exception pickles and copies like any other.
        super().__init__(self.problems, advice=advice)

    @property
    def missing_file(self) -> bool:
        """Whether the file is not there at all (rather than unreadable or invalid)."""
        return len(self.problems) == 1 and self.problems[0].message == MISSING_FILE

    def report(self, verb: str) -> list[str]:
        if self.missing_file:
            also = f"; {self.advice}" if self.advice else ""
            return [f"sfbridge: configuration file {self.source} not found{also}"]
        return [f"sfbridge: invalid configuration {self.source}:", *str(self).splitlines()]

    @property
    def errors(self) -> list[Problem]:
        """The problems of severity "error"."""
        return [problem for problem in self.problems if problem.severity == "error"]

    @property
    def warnings(self) -> list[Problem]:
        """The problems of severity "warning"."""
        return [problem for problem in self.problems if problem.severity == "warning"]

    def __str__(self) -> str:
        return "\n".join(str(problem) for problem in self.errors or self.problems)


class RequestError(SfbridgeError, ValueError):
    """A command's request names something the config does not have, or asks for something
    that cannot be (an unknown forwarder, a `--since` that is no time, a `--count` of 0): a
    person's mistake, said as such."""

    exit_code = ExitCode.USAGE


class DottedQueueName(SfbridgeError):
    """A configured queue's unquoted dot reads as a table in another schema that is missing,
    while the table of the whole name exists (`bridge.storage.dotted_names`): `install` will
    not create the wrong table (and its schema)."""

    exit_code = ExitCode.USAGE


# -- databases ------------------------------------------------------------------------------


class DatabaseError(SfbridgeError):
    """A database operation failed. The message never contains connection secrets.

    `native_error` is the server's own error number where the driver reports one that means
    something (SQL Server's, e.g. 207 invalid column name), else None. `advice`, when set,
    says what a person should do; it is part of the text too. `outcome_unknown` is set by a
    driver's `commit` when the COMMIT was sent and no answer came back: the transaction may
    have committed or not (any other failure of a commit means it did not).
    """

    native_error: int | None = None
    outcome_unknown: bool = False
    exit_code = ExitCode.UNAVAILABLE

    def __init__(self, database: str, message: str, *, advice: str | None = None) -> None:
        super().__init__(
            f"database '{database}': {message}" + (f"; {advice}" if advice else ""), advice=advice
        )
        self.database = database
        self.detail = f"{message}; {advice}" if advice else message

    def report(self, verb: str) -> list[str]:
        return [f"sfbridge: {self}"]  # the advice is in the text


class DatabaseUnavailable(DatabaseError):
    """The database cannot be reached (it is down, or the network is)."""


class ConnectionFailed(DatabaseUnavailable):
    """Opening a connection failed. Not retried in-process: the database is probably down."""


class AuthenticationFailed(ConnectionFailed):
    """The server refused the login: a wrong password, a role that does not exist or may not
    log in, pg_hba.conf, SQL Server's "login failed" (18456). Not an outage that passes by
    itself: a person ends it by fixing the login and reloading, and every attempt counts
    against an account lock-out policy, so it is tried again rarely (`bridge.outages`).
    `login` is the user name, where known; never the password."""

    def __init__(
        self, database: str, message: str, *, login: str | None = None, advice: str | None = None
    ) -> None:
        super().__init__(database, message, advice=advice)
        self.login = login


class ConnectionLost(DatabaseUnavailable):
    """An open connection broke mid-session. Worth one immediate retry on a new connection."""


class DatabaseReadOnly(DatabaseUnavailable):
    """The database answers but does not take writes: a hot standby (what a failover leaves a
    client connected to the old primary), `default_transaction_read_only` on, or a SQL Server
    database that is read-only, restoring, or an availability group's secondary. An outage of
    that database like any other, not a failure of each message; the session that said so is
    closed, as one opened while it lasted stays read-only after it (PostgreSQL fixes
    `transaction_read_only` when a session starts)."""


class TransientDatabaseError(DatabaseError):
    """Deadlock, serialization failure, lock timeout: retrying the transaction will likely work."""


class QueryTimeout(DatabaseUnavailable):
    """The database did not answer within the connection's deadline (`query_timeout`): the
    server is silent (a partition, a frozen host) or too slow. The connection is closed; what it
    was doing is unknown, as after a lost connection, but it is not worth an immediate retry."""


class NoAnswer(QueryTimeout):
    """Not even the server's own timeout error came back within the deadline (psycopg's wait
    gave up): the server or the network is silent, not merely slow with one statement."""


class LockTimeout(DatabaseError):
    """A statement waited longer than the connection's deadline for a lock someone else holds
    on a table (an `ALTER TABLE`, a `VACUUM FULL`, a migration): the table is busy, not the
    database. Not worth an immediate retry either: the wait was already the whole deadline."""


class ValueNotConvertible(DatabaseError):
    """The server could not send a value in the client's encoding (PostgreSQL: text of a
    `SQL_ASCII` database that is not valid UTF-8, read through psqlODBC). The same rows can be
    read as raw bytes (the dialects' `*_raw` claim statements)."""


class MalformedValue(DatabaseError):
    """The server could not read a text as the type a statement casts it to (PostgreSQL
    22P02: an error queue's Headers column that is not JSON, cast to `jsonb`). The statement
    failed as a whole; a form that checks each row first can be asked instead."""


class TableNotFound(DatabaseError):
    """A table the statement needs does not exist (a queue, a ledger, any table)."""


class UndefinedObject(DatabaseError):
    """A named object other than a table does not exist (e.g. a prepared transaction that was
    committed or rolled back meanwhile)."""


class NotSupported(DatabaseError):
    """The object does not take this kind of statement (PostgreSQL: `COPY` into a view, or into
    a table with row-level security): the same rows go in another way."""


class DuplicateKey(DatabaseError):
    """A unique key or primary key was violated."""


class AlreadyExists(DatabaseError):
    """CREATE found the table, index or schema already there (a racing creator made it)."""


class PermissionDenied(DatabaseError):
    """The login may not do this (e.g. create a table): a DBA's decision, not an outage."""


class DatabaseNotWritable(DatabaseError):
    """The connection landed where writes are refused (a standby, a read-only database) while
    the command must write there (`install`); `advice` says how to reach the primary."""


class BridgeTableMissing(TableNotFound):
    """A table the bridge owns is missing: not a destination queue, and the bridge can heal it.

    `description` says which of the bridge's tables it is ("dedup ledger", "retry storage");
    `advice`, when given, what a person should do about it.
    """

    def __init__(
        self, error: DatabaseError, description: str, table: str, advice: str | None = None
    ) -> None:
        super().__init__(
            error.database, f"the bridge's {description} {table} does not exist", advice=advice
        )
        self.error = error
        self.description = description
        self.table = table
        # With advice, healing was tried or is not allowed: what is left is for a person.
        self.healable = advice is None

    def with_advice(self, advice: str) -> BridgeTableMissing:
        return BridgeTableMissing(self.error, self.description, self.table, advice)


class LedgerDenied(PermissionDenied):
    """The login may not write the ledger: the whole database is not ready, not one message."""


class LedgerLocked(LockTimeout):
    """Someone holds a lock on the ledger: every message of the database waits, not one."""


class UnsetVariable(DatabaseError):
    """A database cannot be opened (or its catalog read, `doing`) because its `connection` or
    `path` (`key_path`) names environment variables that are not set: a person's omission,
    told with where the service gets them (`advice`); exit code USAGE. Raised only where the
    database is used, so a command runs with the secrets of the databases it touches."""

    def __init__(
        self,
        database: str,
        variables: tuple[str, ...],
        key_path: str,
        *,
        advice: str,
        doing: str = "cannot connect",
    ) -> None:
        names = ", ".join(variables)
        unset = (
            f"environment variable {names} is not set ({key_path} names it)"
            if len(variables) == 1
            else f"environment variables {names} are not set ({key_path} names them)"
        )
        super().__init__(database, f"{doing}: {unset}", advice=advice)
        self.variables = variables
        self.key_path = key_path
        self.problem = f"{doing}: {unset}"  # the text without the advice

    exit_code = ExitCode.USAGE

    def report(self, verb: str) -> list[str]:
        return [f"sfbridge {verb}: database '{self.database}': {self.problem}", f"  {self.advice}"]


# Why each verb that opens every database at once (`BridgeConfig.require_environment`) refuses
# to start rather than stop halfway for a variable that is not set; every other verb opens a
# database when it comes to it, and needs its variables then (`UnsetVariable`).
OPENS_EVERY_DATABASE = {
    "run": "the daemon opens every database when it starts, so it needs every variable the "
    "configuration names",
    "install": "install opens every database it creates tables in, and touches none until "
    "their variables are set",
    "spark": "Spark jobs do the daemon's work in bulk and need every database's variables",
}


class UnsetVariables(SfbridgeError):
    """`run` or `install`, which open every database at once, found values that name unset
    environment variables (`unset`: key path -> the variables); refused before anything
    starts, with `advice`, exit code USAGE."""

    exit_code = ExitCode.USAGE

    def __init__(self, verb: str, unset: Iterable[tuple[str, tuple[str, ...]]], advice: str):
        self.verb = verb
        self.unset = tuple(unset)
        lines = [f"{path}: {' and '.join(names)} not set" for path, names in self.unset]
        super().__init__("\n".join([*lines, advice]), advice=advice)

    def report(self, verb: str) -> list[str]:
        why = OPENS_EVERY_DATABASE.get(self.verb, f"{self.verb} opens every database")
        return [
            f"sfbridge {self.verb}: {why}; not set:",
            *(f"  {path}: {', '.join(names)}" for path, names in self.unset),
            f"  {self.advice}",
        ]


# -- the daemon and Spark -------------------------------------------------------------------


class MetricsStartError(SfbridgeError):
    """The metrics server cannot listen where the config says (port in use, no such host):
    the daemon does not start."""


class TracingUnavailable(SfbridgeError):
    """`tracing.enabled` is set but OpenTelemetry cannot be loaded (the `otel` extra is not
    installed): the daemon does not start."""


class SparkUnavailable(SfbridgeError):
    """PySpark or Java is missing, or the settings cannot work; the message says what to do."""

    exit_code = ExitCode.USAGE

    def report(self, verb: str) -> list[str]:
        return [f"sfbridge: {self}"]


class SparkFailed(SfbridgeError):
    """A Spark job failed or could not run; the message says what happened and what to do."""

    exit_code = ExitCode.SPARK_FAILED

    def __init__(self, message: str, exit_code: ExitCode = ExitCode.SPARK_FAILED) -> None:
        super().__init__(message, exit_code=exit_code)
