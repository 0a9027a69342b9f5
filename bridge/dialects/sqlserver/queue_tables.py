"""What SQL Server queue tables need looked at: the optional `Recoverable` column (which
statement variants a table takes) and what `check` reports about a table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bridge.addressing import TableAddress
from bridge.dialects.sqlserver.grammar import GRAMMAR
from bridge.dialects.sqlserver.statements import WITHOUT_RECOVERABLE
from bridge.drivers.base import Connection, Row
from bridge.exceptions import DatabaseError

RECOVERABLE_LOOKUP = """
    SELECT CASE WHEN OBJECT_ID(?, N'U') IS NULL THEN -1 ELSE (
        SELECT COUNT(*) FROM {catalog}sys.columns
        WHERE object_id = OBJECT_ID(?, N'U') AND name = N'Recoverable') END"""

# Parameters: the qualified name, three times.
PERMISSIONS_QUERY = """
    SELECT HAS_PERMS_BY_NAME(?, N'OBJECT', N'SELECT'), HAS_PERMS_BY_NAME(?, N'OBJECT', N'INSERT'),
           HAS_PERMS_BY_NAME(?, N'OBJECT', N'DELETE')"""

# Errors that show a remembered queue shape is stale: 207 invalid column name (Recoverable was
# dropped), 515 NULL into a NOT NULL column (Recoverable was added).
_STALE_SHAPE_ERRORS = frozenset({207, 515})


def _catalog_prefix(address: TableAddress) -> str:
    return GRAMMAR.quote_identifier(address.catalog) + "." if address.catalog else ""


class RecoverableColumn:
    """Whether a queue table still has the legacy `Recoverable` column: the variants to use.

    The transport looks this up once per table since 7.0: an endpoint may have dropped the
    column, and an INSERT naming it would then fail. A send that fails with error 207 or 515
    about `Recoverable` means the table changed since. Pure: the data path's QueueWriter runs
    the lookup and remembers the answer.
    """

    def lookup(self, queue: TableAddress) -> tuple[str, tuple[Any, ...]]:
        qualified = GRAMMAR.qualified_name(queue)
        return RECOVERABLE_LOOKUP.format(catalog=_catalog_prefix(queue)), (qualified, qualified)

    def variants(self, rows: Sequence[Row]) -> Mapping[str, str] | None:
        found = int(rows[0][0]) if rows and rows[0][0] is not None else -1
        if found < 0:
            return None  # no such table (yet): the INSERT itself reports it
        return {} if found > 0 else WITHOUT_RECOVERABLE

    def is_stale(self, error: DatabaseError) -> bool:
        return error.native_error in _STALE_SHAPE_ERRORS and "recoverable" in error.detail.lower()


def inspect_queue_table(
    connection: Connection,
    queue: TableAddress,
    columns: Mapping[str, str],
    indexes: Sequence[str],
) -> list[str]:
    """What the transport warns about at startup (a CLUSTERED RowVersion index, no index on
    Expires, a non-Unicode Headers column), plus missing permissions."""
    problems: list[str] = []
    qualified = GRAMMAR.qualified_name(queue)
    definitions = [definition.lower() for definition in indexes]
    clustered = any(d.startswith("clustered (rowversion") for d in definitions)
    nonclustered = any(d.startswith("nonclustered (rowversion") for d in definitions)
    if clustered and not nonclustered:
        problems.append(
            "its RowVersion index is CLUSTERED, so every receiver contends for the same page "
            "(PAGELATCH_EX); since transport 6.0.1 it is NONCLUSTERED: re-create Index_RowVersion "
            "as in NServiceBus's 'non-clustered index' upgrade guide"
        )
    if not any(d.split(" (", 1)[-1].startswith("expires") for d in definitions):
        problems.append(
            "it has no index on Expires, so purging expired messages scans the table: "
            f"CREATE NONCLUSTERED INDEX [Index_Expires] ON {qualified} (Expires) "
            "INCLUDE (Id, RowVersion) WHERE Expires IS NOT NULL"
        )
    if columns.get("headers") in ("varchar", "text", "char"):
        problems.append(
            f"its Headers column is {columns['headers']}, which loses header text outside the "
            f"database's code page: ALTER TABLE {qualified} ALTER COLUMN Headers "
            "nvarchar(max) NOT NULL"
        )
    rows = connection.query(PERMISSIONS_QUERY, (qualified, qualified, qualified))
    connection.commit()
    granted = rows[0] if rows else (None, None, None)
    missing = [
        permission
        for permission, allowed in zip(("SELECT", "INSERT", "DELETE"), granted, strict=True)
        if allowed != 1
    ]
    if missing:
        problems.append(
            f"the bridge's login lacks {', '.join(missing)} permission on it: "
            f"GRANT {', '.join(missing)} ON {qualified} TO <the bridge's user>"
        )
    return problems
