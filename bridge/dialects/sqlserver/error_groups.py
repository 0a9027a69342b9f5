"""SQL Server's statements for `sfbridge errors summary` and `errors list` (what each returns:
bridge/dialects/postgresql/error_groups.py).

T-SQL has no FILTER clause and no DISTINCT in STRING_AGG: the aggregates choose their rows
with CASE, and the other time-of-failure texts come back as a JSON array that may repeat one.
ISJSON and OPENJSON read the headers without failing the statement, so one form does; the
CASEs are nested because T-SQL does not promise to stop at the first false AND, and OPENJSON
fails on text that is not JSON. A row is grouped when its Headers are a JSON object of
distinct keys with string (type 1) or null (type 0) values; JSON_VALUE returns NULL for a
value over 4,000 characters, which no header the grouping reads comes near.
"""

from __future__ import annotations

_READABLE = """CASE
    WHEN ISJSON(Headers) = 0 OR LEFT(LTRIM(Headers), 1) <> NCHAR(123) THEN 0
    WHEN EXISTS (SELECT 1 FROM OPENJSON(Headers) WHERE type NOT IN (0, 1)) THEN 0
    WHEN (SELECT COUNT(*) - COUNT(DISTINCT [key]) FROM OPENJSON(Headers)) <> 0 THEN 0
    ELSE 1 END"""

_GROUPS = f"""
    DECLARE @value nvarchar(4000) = N'$."' + ? + N'"';
    DECLARE @other nvarchar(4000) = N'$."' + ? + N'"';
    SELECT CAST(readable AS bit) AS readable, failed_queue, value, other_value,
           COUNT_BIG(*) AS messages,
           MIN(CASE WHEN wire = 1 THEN tof END) AS first_failure,
           MAX(CASE WHEN wire = 1 THEN tof END) AS last_failure,
           N'[' + STRING_AGG(CASE WHEN wire = 0
                                  THEN CAST(N'"' + STRING_ESCAPE(tof, 'json') + N'"'
                                            AS nvarchar(max)) END, N',') + N']'
               AS other_times,
           N'[' + STRING_AGG(CASE WHEN readable = 0 THEN CAST(seq AS nvarchar(max)) END, N',')
               + N']' AS unreadable
    FROM (
        SELECT seq, readable, failed_queue, value, other_value, tof,
               CASE WHEN LEN(tof) = 28 AND RIGHT(tof, 2) = N' Z' THEN 1
                    WHEN tof IS NOT NULL THEN 0 END AS wire
        FROM (
            SELECT seq, readable,
                   CASE WHEN readable = 1
                        THEN JSON_VALUE(Headers, '$."NServiceBus.FailedQ"') END AS failed_queue,
                   CASE WHEN readable = 1 THEN JSON_VALUE(Headers, @value) END AS value,
                   CASE WHEN readable = 1 THEN JSON_VALUE(Headers, @other) END AS other_value,
                   CASE WHEN readable = 1
                        THEN JSON_VALUE(Headers, '$."NServiceBus.TimeOfFailure"') END
                       COLLATE Latin1_General_BIN2 AS tof
            FROM (SELECT RowVersion AS seq, Headers, {_READABLE} AS readable
                  FROM {{queue}} WITH (READPAST)) AS checked) AS row_values) AS grouped
    GROUP BY readable, failed_queue, value, other_value"""

ERROR_GROUP_STATEMENTS: dict[str, str] = {
    "error_queue_groups": _GROUPS,
    "error_queue_groups_checked": _GROUPS,
    "error_queue_read_many": """
        SELECT Id AS id, Headers AS headers, RowVersion AS seq
        FROM {queue} WITH (READPAST) WHERE RowVersion IN ({rows})""",
    "error_queue_count": "SELECT COUNT_BIG(*) AS messages FROM {queue} WITH (READPAST)",
}
