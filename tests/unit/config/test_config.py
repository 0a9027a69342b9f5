"""Configuration: schema, validation, loading, durations and the example files."""

from __future__ import annotations

import copy
import dataclasses
import math
import pickle
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml
from support import REPO

from bridge.config import (
    BridgeConfig,
    DatabaseConfig,
    ForwarderConfig,
    LedgerConfig,
    LoggingConfig,
    Problem,
    RetryConfig,
    RouteConfig,
    SentryConfig,
    load_config,
    parse_duration,
    validate,
)
from bridge.config import load as config_load
from bridge.config.durations import format_duration
from bridge.config.environment import expand_env
from bridge.config.keys import Key, Section
from bridge.config.reference import render_reference_markdown
from bridge.config.schema import SCHEMA
from bridge.exceptions import ConfigError, UnsetVariable, UnsetVariables

REPO = REPO
# Example bridge configs; config/ also holds Prometheus rules
# (tests/unit/daemon/test_monitoring_files.py).
EXAMPLES = sorted((REPO / "config").glob("*.example.yaml"))

PASSWORD = "hunter2-Sup3rSecret"
RECEIVER_ODBC = (
    f"Driver={{PostgreSQL Unicode}};Server=db2;Database=receiver;Uid=bridge;PWD={PASSWORD}"
)
ENV = {"RECEIVER_ODBC": RECEIVER_ODBC}
SENDER_ODBC = "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Database=sender;Uid=postgres"

_DELETE = object()


def minimal() -> dict[str, Any]:
    """A small valid document: two postgresql databases, one sqlite, one forwarder, two routes."""
    return {
        "databases": {
            "sender": {"dialect": "postgresql", "connection": SENDER_ODBC},
            "receiver": {"dialect": "postgresql", "connection": "${RECEIVER_ODBC}"},
            "edge": {"dialect": "sqlite", "path": "/var/lib/sfbridge/edge.db"},
        },
        "forwarders": [{"name": "sender", "database": "sender", "queue": "sfbridge.forward"}],
        "routes": [
            {"match": "Samples.Receiver*", "database": "receiver"},
            {"match": "*", "database": "sender"},
        ],
    }


def with_entries() -> dict[str, Any]:
    """`minimal()` plus one entry, of required keys only, in every list section it lacks, and
    the mapping sections that are off without their required keys (`servicecontrol`)."""
    raw = minimal()
    for section in SCHEMA:
        required = {k.name: k.example for k in section.keys if k.required}
        if section.shape == "list" and section.name not in raw:
            raw[section.name] = [required]
        elif section.shape == "mapping" and required:
            raw[section.name] = required
    return raw


def _tokens(path: str) -> list[str | int]:
    return [
        int(token[1:-1]) if token.startswith("[") else token
        for token in re.findall(r"\[\d+\]|[^.\[\]]+", path)
    ]


def with_(raw: dict[str, Any], path: str, value: object) -> dict[str, Any]:
    """A deep copy of `raw` with the value at `path` (e.g. `forwarders[0].queue`) replaced,
    created (intermediate mappings included) or, for `_DELETE`, removed."""
    result = copy.deepcopy(raw)
    *parents, last = _tokens(path)
    node: Any = result
    for token in parents:
        if isinstance(token, str) and token not in node:
            node[token] = {}
        node = node[token]
    if value is _DELETE:
        del node[last]
    else:
        node[last] = value
    return result


def run(raw: object, env: Mapping[str, str] = ENV) -> tuple[BridgeConfig | None, list[Problem]]:
    return validate(raw, env)


def errors(raw: object, env: Mapping[str, str] = ENV) -> list[str]:
    return [str(p) for p in run(raw, env)[1] if p.severity == "error"]


def warnings(raw: object, env: Mapping[str, str] = ENV) -> list[str]:
    return [str(p) for p in run(raw, env)[1] if p.severity == "warning"]


def build(raw: object, env: Mapping[str, str] = ENV) -> BridgeConfig:
    config, problems = run(raw, env)
    assert config is not None, [str(p) for p in problems]
    return config


def the_error(raw: object, env: Mapping[str, str] = ENV) -> str:
    found = errors(raw, env)
    assert len(found) == 1, found
    return found[0]


# --------------------------------------------------------------------------------------------
# Problem and ConfigError
# --------------------------------------------------------------------------------------------


def test_problem_reads_path_colon_message() -> None:
    problem = Problem("routes[2].database", "no database named 'recever'", "error")
    assert str(problem) == "routes[2].database: no database named 'recever'"


def test_problem_marks_warnings_as_such() -> None:
    problem = Problem("forwarders[0].peek_interval", "50ms is outside", "warning")
    assert str(problem) == "forwarders[0].peek_interval: warning: 50ms is outside"


def test_problem_without_path_is_just_its_message() -> None:
    assert str(Problem("", "the configuration is empty", "error")) == "the configuration is empty"


def test_problem_masks_passwords_in_message_and_path_on_construction() -> None:
    problem = Problem("x.PWD=abc", f"bad: {RECEIVER_ODBC}", "error")
    assert PASSWORD not in problem.message
    assert "abc" not in problem.path
    assert PASSWORD not in str(problem)


def test_problem_is_frozen() -> None:
    problem = Problem("a", "b", "error")
    with pytest.raises(dataclasses.FrozenInstanceError):
        problem.path = "c"  # type: ignore[misc]


def test_config_error_lists_every_error_one_per_line_and_leaves_out_warnings() -> None:
    problems = [
        Problem("a", "first", "error"),
        Problem("b", "careful", "warning"),
        Problem("c", "second", "error"),
    ]
    error = ConfigError(problems)
    assert str(error).splitlines() == ["a: first", "c: second"]
    assert error.problems == problems
    assert error.errors == [problems[0], problems[2]]
    assert error.warnings == [problems[1]]


def test_config_error_survives_pickling() -> None:
    error = ConfigError([Problem("a", "first", "error")])
    copy_ = pickle.loads(pickle.dumps(error))
    assert copy_.problems == error.problems
    assert str(copy_) == "a: first"


# --------------------------------------------------------------------------------------------
# Valid documents
# --------------------------------------------------------------------------------------------

CONTRACT_YAML = """
databases:
  sender:   {dialect: postgresql, connection: "Driver={PostgreSQL Unicode};Server=127.0.0.1;Port=5432;Database=sender;Uid=postgres"}
  receiver: {dialect: postgresql, connection: "${RECEIVER_ODBC}"}
  edge:     {dialect: sqlite, path: /var/lib/sfbridge/edge.db}
forwarders:
  - name: sender
    database: sender
    queue: sfbridge.forward
    error_queue: error
    batch_size: 1000
    batch_bytes: 8MiB
    concurrency: 2
    peek_interval: 50ms
routes:
  - {match: "Samples.Receiver*", database: receiver, schema: optional}
  - {match: "*", database: sender}
retries: {delay: 10s, max_attempts: 100, backoff: constant, max_delay: 1h, immediate_attempts: 3, missing_queue: retry}
ledger: {retention: 7d, cleanup_interval: 1m, cleanup: true}
logging: {level: INFO}
sentry: {dsn: "${SENTRY_DSN}", environment: production}
"""  # noqa: E501


def test_the_contract_example_builds_the_expected_config() -> None:
    env = {**ENV, "SENTRY_DSN": "https://0123456789abcdef@o1.ingest.sentry.io/42"}
    config, problems = validate(yaml.safe_load(CONTRACT_YAML), env, "/etc/sfbridge/sfbridge.yaml")
    assert problems == []
    assert config == BridgeConfig(
        databases={
            "sender": DatabaseConfig("sender", "postgresql", connection=SENDER_ODBC),
            "receiver": DatabaseConfig("receiver", "postgresql", connection=RECEIVER_ODBC),
            "edge": DatabaseConfig("edge", "sqlite", path="/var/lib/sfbridge/edge.db"),
        },
        forwarders=(ForwarderConfig("sender", "sender", "sfbridge.forward"),),
        routes=(
            RouteConfig("Samples.Receiver*", "receiver", "optional"),
            RouteConfig("*", "sender"),
        ),
        retries=RetryConfig(),
        ledger=LedgerConfig(),
        logging=LoggingConfig("INFO"),
        sentry=SentryConfig(env["SENTRY_DSN"], "production"),
        source_path="/etc/sfbridge/sfbridge.yaml",
    )


def test_a_minimal_document_gets_every_default() -> None:
    config = build(minimal())
    assert config.forwarders == (ForwarderConfig("sender", "sender", "sfbridge.forward"),)
    assert config.databases["sender"] == DatabaseConfig("sender", "postgresql", SENDER_ODBC)
    assert config.retries == RetryConfig()
    assert config.ledger == LedgerConfig()
    assert config.logging == LoggingConfig()
    assert config.sentry == SentryConfig()
    assert config.source_path is None


def test_the_config_is_immutable_all_the_way_down() -> None:
    config = build(minimal())
    with pytest.raises(TypeError):
        config.databases["new"] = config.databases["sender"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.forwarders[0].batch_size = 5  # type: ignore[misc]
    assert isinstance(config.forwarders, tuple)
    assert isinstance(config.routes, tuple)


def test_databases_keep_the_order_of_the_file() -> None:
    assert list(build(minimal()).databases) == ["sender", "receiver", "edge"]


@pytest.mark.parametrize(
    "section", ["retries", "ledger", "logging", "sentry", "metrics", "tracing"]
)
def test_an_optional_section_that_is_null_means_all_defaults(section: str) -> None:
    config = build(with_(minimal(), section, None))
    assert config == build(minimal())


# --------------------------------------------------------------------------------------------
# The schema itself
# --------------------------------------------------------------------------------------------


def _sections_and_keys() -> list[tuple[Section, Key]]:
    return [(section, key) for section in SCHEMA for key in section.keys]


def _key_id(item: tuple[Section, Key]) -> str:
    return f"{item[0].name}.{item[1].name}"


def test_schema_sections_are_the_top_level_keys_of_the_contract() -> None:
    assert [section.name for section in SCHEMA] == [
        "databases",
        "forwarders",
        "routes",
        "subscriptions",
        "subscription_tables",
        "publish",
        "retries",
        "delivery",
        "install",
        "ledger",
        "error_archive",
        "daemon",
        "logging",
        "sentry",
        "metrics",
        "servicecontrol",
        "tracing",
    ]


def test_every_schema_section_is_a_field_of_the_bridge_config() -> None:
    fields = {f.name for f in dataclasses.fields(BridgeConfig)}
    assert {section.name for section in SCHEMA} == fields - {"source_path"}


@pytest.mark.parametrize(
    "section", [s for s in SCHEMA if s.shape != "multimap"], ids=lambda s: s.name
)
def test_schema_keys_are_exactly_the_model_fields(section: Section) -> None:
    fields = {f.name for f in dataclasses.fields(section.model)}
    from_file = set(section.key_names) | ({"name"} if section.shape == "named" else set())
    # `unresolved`: which key named an environment variable that was not set (not a key).
    assert from_file == fields - {"unresolved"}


@pytest.mark.parametrize("item", _sections_and_keys(), ids=_key_id)
def test_schema_defaults_equal_the_model_defaults(item: tuple[Section, Key]) -> None:
    section, key = item
    field = {f.name: f for f in dataclasses.fields(section.model)}[key.name]
    if key.required:
        # Only dialect-specific keys may be required by the schema yet optional in the model.
        assert field.default is dataclasses.MISSING or key.dialects
    else:
        assert key.default == field.default


@pytest.mark.parametrize("item", _sections_and_keys(), ids=_key_id)
def test_every_key_has_a_one_line_description_and_an_example(item: tuple[Section, Key]) -> None:
    _, key = item
    assert key.description and "\n" not in key.description
    assert key.description.endswith(".")
    assert key.example is not None


def _place_example(section: Section, key: Key) -> dict[str, Any]:
    if section.name == "databases":
        database = "edge" if key.name == "path" else "sender"
        raw = minimal()
        if key.name == "catalog":  # sqlserver only; the connection names no database
            sqlserver = {"dialect": "sqlserver", "connection": "Driver={FreeTDS};Server=h"}
            raw = with_(raw, "databases.sender", sqlserver)
        return with_(raw, f"databases.{database}.{key.name}", key.example)
    if section.shape == "list":
        return with_(with_entries(), f"{section.name}[0].{key.name}", key.example)
    if any(other.required for other in section.keys):
        return with_(with_entries(), f"{section.name}.{key.name}", key.example)
    return with_(minimal(), f"{section.name}.{key.name}", key.example)


@pytest.mark.parametrize("item", _sections_and_keys(), ids=_key_id)
def test_every_key_example_is_a_valid_value(item: tuple[Section, Key]) -> None:
    config, problems = run(_place_example(*item))
    assert problems == []
    assert config is not None


def test_reference_markdown_has_a_table_per_section_and_a_row_per_key() -> None:
    markdown = render_reference_markdown()
    assert markdown.startswith("## Configuration reference\n")
    for section in SCHEMA:
        assert f"### `{section.name}" in markdown
        for key in section.keys:
            assert re.search(rf"^\| `{key.name}` \|", markdown, re.M), key.name
    assert markdown.count("| Key | Type | Default | Description | Example |") == len(SCHEMA)


def test_reference_markdown_rows_have_five_cells_even_with_pipes_in_text() -> None:
    for line in render_reference_markdown().splitlines():
        if line.startswith("| `"):
            assert len(re.split(r"(?<!\\)\|", line)) == 7, line


@pytest.mark.parametrize(
    "row",
    [
        "| `retention` | duration > 0 | `7d` |",
        "| `delay` | duration > 0 | `10s` |",
        "| `max_delay` | duration > 0 | `1h` |",
        "| `batch_size` | integer, 1..10000 | `1000` |",
        "| `batch_bytes` | size (B, KiB, MiB, GiB), 64KiB..1GiB | `8MiB` |",
        "| `concurrency` | integer, 1..64 | `2` |",
        "| `max_attempts` | integer ≥ 1 | `100` |",
        "| `cleanup` | boolean | `true` |",
        "| `error_queue` | queue address | `error` |",
        "| `queue` | queue address | **required** |",
        "| `path` | string | required for sqlite |",
        "| `backoff` | one of `constant`, `linear`, `exponential` | `constant` |",
    ],
)
def test_reference_markdown_shows_types_ranges_and_defaults_in_file_syntax(row: str) -> None:
    assert row in render_reference_markdown()


def test_reference_markdown_heading_level_is_adjustable() -> None:
    markdown = render_reference_markdown(heading_level=3)
    assert markdown.startswith("### Configuration reference")
    assert "#### `databases.<name>`" in markdown


# --------------------------------------------------------------------------------------------
# Top level
# --------------------------------------------------------------------------------------------


def test_an_empty_document_is_reported_as_empty() -> None:
    config, problems = run(None)
    assert config is None
    assert [str(p) for p in problems] == [
        "the configuration is empty; expected a mapping with at least the keys databases, "
        "forwarders and routes"
    ]


@pytest.mark.parametrize(
    ("raw", "described"),
    [(["a"], "a list"), ("text", "a string ('text')"), (3, "an integer (3)")],
)
def test_a_document_that_is_not_a_mapping_is_reported(raw: object, described: str) -> None:
    assert errors(raw) == [f"expected a mapping at the top level, got {described}"]


def test_every_missing_required_section_is_reported() -> None:
    assert errors({}) == [
        "databases: required key is missing; expected a mapping of database name to database "
        "settings",
        "forwarders: required key is missing; expected a list of forwarders",
        "routes: required key is missing; expected a list of routes (only a config whose "
        "forwarders all have a 'destination' needs none)",
    ]


def test_unknown_top_level_key_is_reported_with_nearest_match() -> None:
    assert the_error(with_(minimal(), "forwarder", [])) == (
        "forwarder: unknown key (did you mean 'forwarders'?)"
    )


def test_unknown_key_without_a_near_match_lists_the_expected_keys() -> None:
    assert the_error(with_(minimal(), "zzz", 1)) == (
        "zzz: unknown key (expected one of: databases, forwarders, routes, subscriptions, "
        "subscription_tables, publish, retries, delivery, install, ledger, error_archive, daemon, "
        "logging, sentry, metrics, servicecontrol, tracing)"
    )


def test_non_string_keys_are_reported() -> None:
    raw = minimal()
    raw["retries"] = {1: "x"}
    assert the_error(raw) == "retries: keys must be strings, got an integer (1)"


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        (
            "databases",
            [],
            "databases: expected a mapping of database name to database settings, got a list",
        ),
        ("forwarders", {"a": 1}, "forwarders: expected a list of forwarders, got a mapping"),
        ("routes", "*", "routes: expected a list of routes, got a string ('*')"),
        ("retries", [], "retries: expected a mapping of settings, got a list"),
        ("databases", {}, "databases: at least 1 database is required"),
        ("forwarders", [], "forwarders: at least 1 forwarder is required"),
        (
            "routes",
            [],
            "routes: at least 1 route is required: forwarders[0] has no 'destination', so its "
            "messages go where routes send them",
        ),
    ],
)
def test_a_section_of_the_wrong_shape_or_empty_is_reported(
    section: str, value: object, message: str
) -> None:
    assert message in errors(with_(minimal(), section, value))


def test_every_problem_in_the_document_is_reported_at_once() -> None:
    raw = minimal()
    raw = with_(raw, "databases.sender.dialect", "postgres")
    raw = with_(raw, "forwarders[0].batch_size", "100")
    raw = with_(raw, "routes[0].databse", "receiver")
    raw = with_(raw, "retries.backoff", "exponentail")
    raw = with_(raw, "ledger.retention", "7 days")
    raw = with_(raw, "logging.level", "LOUD")
    found = errors(raw)
    assert [line.split(":")[0] for line in found] == [
        "databases.sender.dialect",
        "forwarders[0].batch_size",
        "routes[0].databse",
        "retries.backoff",
        "ledger.retention",
        "logging.level",
    ]


def test_cross_field_checks_run_even_when_keys_have_errors() -> None:
    raw = with_(minimal(), "forwarders[0].batch_size", 0)
    raw = with_(raw, "routes[0].database", "recever")
    assert errors(raw) == [
        "forwarders[0].batch_size: must be between 1 and 10000, got 0",
        "routes[0].database: no database named 'recever' (did you mean 'receiver'?)",
    ]


def test_validate_returns_the_config_when_there_are_only_warnings() -> None:
    config, problems = run(with_(minimal(), "forwarders[0].peek_interval", "30s"))
    assert config is not None
    assert [p.severity for p in problems] == ["warning"]


def test_validate_returns_no_config_when_there_is_an_error() -> None:
    config, problems = run(with_(minimal(), "forwarders[0].batch_size", 0))
    assert config is None
    assert [p.severity for p in problems] == ["error"]


_GARBAGE: list[object] = [
    None,
    True,
    0,
    -1,
    10**30,
    1.5,
    float("nan"),
    "",
    "$",
    "${",
    "x" * 500,
    [],
    [1, [2]],
    {},
    {"a": {"b": None}},
    {1: 2},
]


def _every_path() -> list[str]:
    paths = ["databases", "forwarders", "routes", "forwarders[0]", "routes[0]", "databases.sender"]
    for section, key in _sections_and_keys():
        if section.name == "databases":
            paths += [f"databases.sender.{key.name}", f"databases.edge.{key.name}"]
        elif section.shape == "list":
            paths += [section.name, f"{section.name}[0]", f"{section.name}[0].{key.name}"]
        else:
            paths += [section.name, f"{section.name}.{key.name}"]
    paths += ["subscriptions", "subscriptions.OrderSubmitted", "subscriptions.OrderSubmitted[0]"]
    return sorted(set(paths))


@pytest.mark.parametrize("path", _every_path())
def test_validate_never_raises_whatever_a_key_holds(path: str) -> None:
    raw = with_(with_entries(), "subscriptions", {"OrderSubmitted": ["Samples.Billing"]})
    for value in _GARBAGE:
        config, problems = run(with_(raw, path, value))
        assert (config is None) == any(p.severity == "error" for p in problems)


# --------------------------------------------------------------------------------------------
# Databases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        pytest.param(
            "databases.sender.dialect",
            "postgres",
            "databases.sender.dialect: 'postgres' is not one of postgresql, sqlite, sqlserver "
            "(did you mean 'postgresql'?)",
            id="unknown-dialect-with-suggestion",
        ),
        pytest.param(
            "databases.sender.dialect",
            "oracle",
            "databases.sender.dialect: 'oracle' is not one of postgresql, sqlite, sqlserver",
            id="unknown-dialect",
        ),
        pytest.param(
            "databases.sender.dialect",
            _DELETE,
            "databases.sender.dialect: required key is missing",
            id="missing-dialect",
        ),
        pytest.param(
            "databases.sender.connection",
            _DELETE,
            "databases.sender.connection: required key is missing for postgresql databases",
            id="postgresql-needs-connection",
        ),
        pytest.param(
            "databases.edge.path",
            _DELETE,
            "databases.edge.path: required key is missing for sqlite databases",
            id="sqlite-needs-path",
        ),
        pytest.param(
            "databases.edge.connection",
            "Driver=x",
            "databases.edge.connection: not used by sqlite databases; sqlite databases take "
            "'path' instead",
            id="sqlite-has-no-connection",
        ),
        pytest.param(
            "databases.sender.path",
            "/tmp/x.db",
            "databases.sender.path: not used by postgresql databases; postgresql and sqlserver "
            "databases take 'connection' instead",
            id="postgresql-has-no-path",
        ),
        pytest.param(
            "databases.edge.schema",
            "nsb",
            "databases.edge.schema: not used by sqlite databases; sqlite has no schemas",
            id="sqlite-has-no-schema",
        ),
        pytest.param(
            "databases.sender.connection",
            "  ",
            "databases.sender.connection: must not be empty",
            id="blank-connection",
        ),
        pytest.param(
            "databases.sender.connection",
            None,
            "databases.sender.connection: required key has no value (null)",
            id="null-connection",
        ),
        pytest.param(
            "databases.sender.connection",
            ["Driver=x"],
            "databases.sender.connection: expected a string, got a list",
            id="connection-not-a-string",
        ),
        pytest.param(
            "databases.sender.connection",
            12345,
            "databases.sender.connection: expected a string, got an integer; quote the value if "
            "it is meant as text",
            id="connection-number-not-echoed",
        ),
        pytest.param(
            "databases.sender.schema",
            "",
            "databases.sender.schema: must not be empty",
            id="empty-schema",
        ),
        pytest.param(
            "databases.sender.connect_timeout",
            0,
            "databases.sender.connect_timeout: must be greater than 0s, got 0s",
            id="zero-timeout",
        ),
        pytest.param(
            "databases.sender.connection_timeout",
            "5s",
            "databases.sender.connection_timeout: unknown key (did you mean 'connect_timeout'?)",
            id="misspelt-key",
        ),
        pytest.param(
            "databases.sender",
            "postgresql",
            "databases.sender: expected a mapping of database settings, got a string "
            "('postgresql')",
            id="entry-not-a-mapping",
        ),
        pytest.param(
            "databases.bad name",
            {"dialect": "sqlite", "path": "x.db"},
            "databases[\"bad name\"]: invalid database name: use only letters, digits, '_', '.' "
            "and '-'",
            id="bad-name",
        ),
    ],
)
def test_database_entry_rules(path: str, value: object, message: str) -> None:
    assert the_error(with_(minimal(), path, value)) == message


def test_unknown_dialect_does_not_cascade_into_connection_or_path_errors() -> None:
    raw = with_(minimal(), "databases.sender.dialect", "mysql")
    raw = with_(raw, "databases.sender.connection", _DELETE)
    assert errors(raw) == [
        "databases.sender.dialect: 'mysql' is not one of postgresql, sqlite, sqlserver"
    ]


def test_database_name_that_is_not_a_string_is_reported() -> None:
    raw = minimal()
    raw["databases"][7] = {"dialect": "sqlite", "path": "x.db"}
    assert the_error(raw) == "databases: database names must be strings, got an integer (7)"


def test_database_names_with_dots_are_quoted_in_paths() -> None:
    raw = with_(minimal(), "databases", {"a.b": {"dialect": "sqlite"}})
    raw["forwarders"] = [{"name": "f", "database": "a.b", "queue": "q"}]
    raw["routes"] = [{"match": "*", "database": "a.b"}]
    assert errors(raw) == ['databases["a.b"].path: required key is missing for sqlite databases']


def test_connect_timeout_is_converted_to_seconds() -> None:
    config = build(with_(minimal(), "databases.sender.connect_timeout", "1m30s"))
    assert config.databases["sender"].connect_timeout == 90.0


def test_database_schema_is_kept() -> None:
    config = build(with_(minimal(), "databases.sender.schema", "nsb"))
    assert config.databases["sender"].schema == "nsb"


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        pytest.param("edge.db", "/etc/sfbridge/bridge.yaml", "/etc/sfbridge/edge.db", id="rel"),
        pytest.param("../data/e.db", "/etc/sfbridge/b.yaml", "/etc/data/e.db", id="parent"),
        pytest.param("/var/e.db", "/etc/sfbridge/b.yaml", "/var/e.db", id="absolute"),
        pytest.param(":memory:", "/etc/sfbridge/b.yaml", ":memory:", id="memory"),
        pytest.param("file:e.db?mode=ro", "/etc/b.yaml", "file:e.db?mode=ro", id="uri"),
        pytest.param("edge.db", None, "edge.db", id="no-source-file"),
    ],
)
def test_relative_sqlite_paths_are_taken_from_the_config_files_folder(
    path: str, source: str | None, expected: str
) -> None:
    config, problems = validate(with_(minimal(), "databases.edge.path", path), ENV, source)
    assert problems == []
    assert config is not None
    assert config.databases["edge"].path == expected


def test_a_literal_password_in_a_connection_string_draws_a_warning_without_the_password() -> None:
    raw = with_(minimal(), "databases.sender.connection", f"Uid=sa;Pwd={PASSWORD};Server=db")
    assert warnings(raw) == [
        "databases.sender.connection: warning: contains a password in plain text; put it in "
        "the environment and write ${VARIABLE} instead"
    ]


@pytest.mark.parametrize(
    "connection",
    [
        f"postgresql://bridge:{PASSWORD}@db:5432/sender",
        f"postgres://bridge:{PASSWORD}@db/sender?sslmode=require",
        f"postgresql://bridge@db/sender?sslmode=require&password={PASSWORD}",
    ],
)
def test_a_literal_password_in_a_postgresql_url_draws_the_same_warning(connection: str) -> None:
    raw = with_(minimal(), "databases.sender.connection", connection)
    assert warnings(raw) == [
        "databases.sender.connection: warning: contains a password in plain text; put it in "
        "the environment and write ${VARIABLE} instead"
    ]


@pytest.mark.parametrize(
    "connection",
    [
        "postgresql://bridge:${SENDER_PWD}@db:5432/sender",
        "postgresql://bridge@db:5432/sender",
        "postgresql://db:5432/sender?sslmode=require",
        "postgresql://bridge@db/sender?password=${SENDER_PWD}",
    ],
)
def test_a_postgresql_url_without_a_literal_password_draws_no_warning(connection: str) -> None:
    raw = with_(minimal(), "databases.sender.connection", connection)
    assert warnings(raw) == []


def test_a_password_from_the_environment_draws_no_warning() -> None:
    raw = with_(minimal(), "databases.sender.connection", "Uid=sa;PWD=${SENDER_PWD};Server=db")
    config, problems = run(raw, {**ENV, "SENDER_PWD": PASSWORD})
    assert problems == []
    assert config is not None
    assert config.databases["sender"].connection == f"Uid=sa;PWD={PASSWORD};Server=db"


# --------------------------------------------------------------------------------------------
# Environment variables
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "environ", "expected"),
    [
        pytest.param("${A}", {"A": "x"}, "x", id="plain"),
        pytest.param("pre-${A}-post", {"A": "x"}, "pre-x-post", id="embedded"),
        pytest.param("${A}${B}", {"A": "1", "B": "2"}, "12", id="adjacent"),
        pytest.param("${A}", {"A": ""}, "", id="set-but-empty"),
        pytest.param("${A:-dflt}", {}, "dflt", id="default-when-unset"),
        pytest.param("${A:-dflt}", {"A": ""}, "dflt", id="default-when-empty"),
        pytest.param("${A:-dflt}", {"A": "x"}, "x", id="default-not-used-when-set"),
        pytest.param("${A:-}", {}, "", id="empty-default"),
        pytest.param("${A:-a:-b=c;d}", {}, "a:-b=c;d", id="default-taken-literally"),
        pytest.param("$$", {}, "$", id="double-dollar"),
        pytest.param("$${A}", {"A": "x"}, "${A}", id="escaped-reference"),
        pytest.param("a$$$${A}", {"A": "x"}, "a$${A}", id="two-escapes"),
        pytest.param("no refs", {}, "no refs", id="nothing-to-do"),
    ],
)
def test_environment_expansion(text: str, environ: dict[str, str], expected: str) -> None:
    assert expand_env(text, environ) == (expected, [])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param("${NOPE}", "environment variable NOPE is not set", id="unset"),
        pytest.param(
            "x$y",
            "'$' at character 2 does not start ${VAR} or ${VAR:-default}; write $$ for a "
            "literal '$'",
            id="lone-dollar",
        ),
        pytest.param(
            "$",
            "'$' at character 1 does not start ${VAR} or ${VAR:-default}; write $$ for a "
            "literal '$'",
            id="trailing-dollar",
        ),
        pytest.param("ab${X", "unterminated '${' at character 3", id="unterminated"),
        pytest.param(
            "${1X}",
            "invalid environment variable reference at character 1; expected ${NAME} or "
            "${NAME:-default} with NAME made of letters, digits and '_'",
            id="bad-name",
        ),
    ],
)
def test_environment_expansion_errors(text: str, message: str) -> None:
    assert expand_env(text, {})[1] == [message]


def test_an_unset_variable_leaves_its_database_unresolved_not_the_configuration() -> None:
    config = build(minimal(), env={})
    receiver = config.databases["receiver"]
    assert receiver.connection is None
    assert receiver.unresolved is not None
    assert (receiver.unresolved.key_path, receiver.unresolved.variables) == (
        "databases.receiver.connection",
        ("RECEIVER_ODBC",),
    )
    assert config.databases["sender"].unresolved is None
    with pytest.raises(UnsetVariable, match="environment variable RECEIVER_ODBC is not set"):
        receiver.require_environment()


def test_every_unset_variable_is_named_once() -> None:
    raw = with_(minimal(), "databases.sender.connection", "Uid=${U};Pwd=${P};X=${U}")
    unresolved = build(raw).databases["sender"].unresolved
    assert unresolved is not None and unresolved.variables == ("U", "P")


def test_a_bad_reference_is_an_error_at_load_also_beside_an_unset_variable() -> None:
    raw = with_(minimal(), "databases.receiver.connection", "Pwd=${P};Uid=$U")
    assert the_error(raw, env={}) == (
        "databases.receiver.connection: '$' at character 14 does not start ${VAR} or "
        "${VAR:-default}; write $$ for a literal '$'"
    )


def test_connection_that_is_empty_after_expansion_is_an_error() -> None:
    assert the_error(minimal(), env={"RECEIVER_ODBC": ""}) == (
        "databases.receiver.connection: must not be empty after expanding environment variables"
    )


def test_sqlite_path_is_expanded() -> None:
    raw = with_(minimal(), "databases.edge.path", "${STATE_DIRECTORY}/edge.db")
    config = build(raw, {**ENV, "STATE_DIRECTORY": "/var/lib/sfbridge"})
    assert config.databases["edge"].path == "/var/lib/sfbridge/edge.db"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("forwarders[0].queue", "${QUEUE}"),
        ("routes[0].match", "${MATCH}*"),
        ("databases.sender.schema", "${SCHEMA}"),
        ("sentry.environment", "${ENVIRONMENT}"),
    ],
)
def test_only_connection_path_and_dsn_are_expanded(path: str, value: str) -> None:
    env = {**ENV, "QUEUE": "q", "MATCH": "m", "SCHEMA": "s", "ENVIRONMENT": "e"}
    config = build(with_(minimal(), path, value), env)
    built = {
        "forwarders[0].queue": config.forwarders[0].queue,
        "routes[0].match": config.routes[0].match,
        "databases.sender.schema": config.databases["sender"].schema,
        "sentry.environment": config.sentry.environment,
    }
    assert built[path] == value


# --------------------------------------------------------------------------------------------
# Secrets never reach a message
# --------------------------------------------------------------------------------------------

SECRET_CONNECTION = f"Driver={{PostgreSQL Unicode}};Uid=sa;PWD={{{PASSWORD};x}};Server=db"


@pytest.mark.parametrize(
    ("path", "value"),
    [
        pytest.param("databases.edge.connection", SECRET_CONNECTION, id="connection-on-sqlite"),
        pytest.param("databases.sender.connection", SECRET_CONNECTION + "$", id="bad-dollar"),
        pytest.param("databases.sender.connection", SECRET_CONNECTION + "${", id="unterminated"),
        pytest.param("databases.sender.conection", SECRET_CONNECTION, id="misspelt-key"),
        pytest.param("databases.sender.schema", SECRET_CONNECTION, id="in-a-plain-string-key"),
        pytest.param("forwarders[0].queue", f'"{SECRET_CONNECTION}', id="in-a-queue-address"),
        pytest.param("forwarders[0].name", SECRET_CONNECTION, id="in-a-name"),
        pytest.param("forwarders[0].batch_size", SECRET_CONNECTION, id="in-an-integer-key"),
        pytest.param("retries.delay", SECRET_CONNECTION, id="in-a-duration"),
        pytest.param("retries.backoff", SECRET_CONNECTION, id="in-a-choice"),
        pytest.param("routes[0].database", SECRET_CONNECTION, id="as-a-database-name"),
        pytest.param(
            "sentry.dsn", f"https://key:{PASSWORD}@sentry.example.com", id="malformed-dsn"
        ),
        pytest.param(f"databases.PWD={PASSWORD}", {"dialect": "x"}, id="as-a-database-name-key"),
    ],
)
def test_no_problem_message_ever_contains_a_password(path: str, value: object) -> None:
    _, problems = run(with_(minimal(), path, value))
    assert problems, "the case must produce at least one problem"
    for problem in problems:
        assert PASSWORD not in str(problem)
        assert PASSWORD[:8] not in str(problem)


def test_config_error_for_a_bad_connection_does_not_contain_the_password(tmp_path: Path) -> None:
    path = tmp_path / "bridge.yaml"
    raw = with_(minimal(), "databases.edge.connection", SECRET_CONNECTION)
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    assert PASSWORD not in str(caught.value)
    assert all(PASSWORD not in repr(p) for p in caught.value.problems)


# --------------------------------------------------------------------------------------------
# Forwarders
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        pytest.param("name", _DELETE, "required key is missing", id="missing-name"),
        pytest.param("database", _DELETE, "required key is missing", id="missing-database"),
        pytest.param("queue", _DELETE, "required key is missing", id="missing-queue"),
        pytest.param("queue", "", "must not be empty", id="empty-queue"),
        pytest.param(
            "name",
            "my forwarder",
            "'my forwarder' is not a valid name: use only letters, digits, '_', '.' and '-'",
            id="name-with-space",
        ),
        pytest.param(
            "name",
            7,
            "expected a string, got an integer (7); quote the value if it is meant as text",
            id="name-number",
        ),
        pytest.param(
            "batch_size",
            "100",
            "expected an integer, got a string ('100'); remove the quotes",
            id="quoted-integer",
        ),
        pytest.param(
            "batch_size", True, "expected an integer, got a boolean (true)", id="boolean-integer"
        ),
        pytest.param(
            "batch_size", 10.5, "expected an integer, got a number (10.5)", id="float-integer"
        ),
        pytest.param("batch_size", 0, "must be between 1 and 10000, got 0", id="batch-zero"),
        pytest.param(
            "batch_size", 10001, "must be between 1 and 10000, got 10001", id="batch-too-big"
        ),
        pytest.param("concurrency", 0, "must be between 1 and 64, got 0", id="concurrency-0"),
        pytest.param("concurrency", 65, "must be between 1 and 64, got 65", id="concurrency-65"),
        pytest.param(
            "peek_interval", 0, "must be greater than 0s, got 0s", id="peek-interval-zero"
        ),
        pytest.param(
            "peek_interval",
            "-1s",
            "invalid duration '-1s': expected a number of seconds",
            id="peek-interval-negative",
        ),
        pytest.param(
            "peek_interval",
            True,
            "expected a duration such as '10s' or a number of seconds, got a boolean (true)",
            id="peek-interval-boolean",
        ),
        pytest.param(
            "batchsize", 5, "unknown key (did you mean 'batch_size'?)", id="misspelt-batch-size"
        ),
    ],
)
def test_forwarder_key_rules(key: str, value: object, message: str) -> None:
    error = the_error(with_(minimal(), f"forwarders[0].{key}", value))
    assert error.startswith(f"forwarders[0].{key}: {message}")


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("batch_size", 1, 1),
        ("batch_size", 10000, 10000),
        ("concurrency", 1, 1),
        ("concurrency", 64, 64),
        ("peek_interval", "100ms", 0.1),
        ("peek_interval", "10s", 10.0),
        ("peek_interval", 2, 2.0),
        ("error_queue", "failed", "failed"),
        ("error_queue", None, "error"),
    ],
)
def test_forwarder_values_at_the_limits_are_accepted(
    key: str, value: object, expected: object
) -> None:
    config, problems = run(with_(minimal(), f"forwarders[0].{key}", value))
    assert problems == []
    assert config is not None
    assert getattr(config.forwarders[0], key) == expected


@pytest.mark.parametrize(("value", "shown"), [("5ms", "5ms"), ("11s", "11s"), ("1m", "1m")])
def test_peek_interval_outside_10ms_to_10s_is_a_warning_not_an_error(
    value: str, shown: str
) -> None:
    config, problems = run(with_(minimal(), "forwarders[0].peek_interval", value))
    assert config is not None
    assert [str(p) for p in problems] == [
        f"forwarders[0].peek_interval: warning: {shown} is outside the usual range 10ms..10s"
    ]


def test_a_forwarder_that_is_not_a_mapping_is_reported() -> None:
    raw = with_(minimal(), "forwarders[0]", "sender")
    assert the_error(raw) == (
        "forwarders[0]: expected a mapping of forwarder settings, got a string ('sender')"
    )


def test_unknown_forwarder_database_is_reported_with_nearest_match() -> None:
    assert the_error(with_(minimal(), "forwarders[0].database", "sendr")) == (
        "forwarders[0].database: no database named 'sendr' (did you mean 'sender'?)"
    )


def test_unknown_database_without_near_match_lists_the_databases() -> None:
    assert the_error(with_(minimal(), "forwarders[0].database", "zzz")) == (
        "forwarders[0].database: no database named 'zzz' (databases: edge, receiver, sender)"
    )


def test_a_database_entry_with_errors_still_counts_as_defined_for_references() -> None:
    raw = with_(minimal(), "databases.sender.batch", 1)
    assert the_error(raw) == "databases.sender.batch: unknown key (did you mean 'path'?)"


def test_queue_is_parsed_in_the_grammar_of_its_database() -> None:
    raw = with_(minimal(), "forwarders[0].queue", '"sfbridge.forward')
    assert the_error(raw) == (
        "forwarders[0].queue: invalid postgresql queue address: unbalanced double quotes in "
        "address '\"sfbridge.forward'"
    )


def test_error_queue_is_parsed_in_the_grammar_of_its_database() -> None:
    raw = with_(minimal(), "forwarders[0].error_queue", "Sales.")
    assert the_error(raw).startswith(
        "forwarders[0].error_queue: invalid postgresql queue address: empty table"
    )


def test_sqlite_forwarders_accept_sqlserver_style_addresses() -> None:
    raw = with_(minimal(), "forwarders[0].database", "edge")
    raw = with_(raw, "forwarders[0].queue", "sfbridge.forward@[dbo]")
    config = build(raw)
    assert config.forwarders[0].queue == "sfbridge.forward@[dbo]"


def test_queue_addresses_are_stored_as_written() -> None:
    raw = with_(minimal(), "forwarders[0].queue", '"public"."Samples.Forward"')
    assert build(raw).forwarders[0].queue == '"public"."Samples.Forward"'


@pytest.mark.parametrize(
    ("queue", "error_queue"),
    [
        pytest.param("error", None, id="default-error-queue"),
        pytest.param("q", "q", id="identical"),
        pytest.param("q", "public.q", id="same-after-default-schema"),
        pytest.param('"q"', "q", id="same-after-unquoting"),
    ],
)
def test_a_forwarder_whose_queue_is_its_error_queue_is_an_error(
    queue: str, error_queue: str | None
) -> None:
    raw = with_(minimal(), "forwarders[0].queue", queue)
    raw = with_(raw, "forwarders[0].error_queue", error_queue)
    assert the_error(raw) == (
        "forwarders[0].error_queue: is the same queue as 'queue'; failed messages would be "
        "forwarded again"
    )


def test_queue_comparison_uses_the_database_default_schema() -> None:
    raw = with_(minimal(), "databases.sender.schema", "nsb")
    raw = with_(raw, "forwarders[0].queue", "q")
    raw = with_(raw, "forwarders[0].error_queue", "nsb.q")
    assert the_error(raw).startswith("forwarders[0].error_queue: is the same queue")


def test_duplicate_forwarder_names_are_an_error() -> None:
    raw = minimal()
    raw["forwarders"].append({"name": "sender", "database": "receiver", "queue": "other"})
    assert the_error(raw) == (
        "forwarders[1].name: duplicate forwarder name 'sender' (already used by forwarders[0])"
    )


def test_two_forwarders_draining_the_same_queue_of_the_same_database_is_an_error() -> None:
    raw = minimal()
    raw["forwarders"].append({"name": "second", "database": "sender", "queue": "sfbridge.forward"})
    assert the_error(raw) == (
        "forwarders[1].queue: forwarders[0] already drains this queue in database 'sender'"
    )


def test_the_same_queue_name_in_different_databases_is_fine() -> None:
    raw = minimal()
    raw["forwarders"].append(
        {"name": "second", "database": "receiver", "queue": "sfbridge.forward"}
    )
    assert len(build(raw).forwarders) == 2


def test_sqlite_forwarder_with_concurrency_above_one_is_a_warning_and_runs_one_worker() -> None:
    raw = with_(minimal(), "forwarders[0].database", "edge")
    raw = with_(raw, "forwarders[0].concurrency", 4)
    config, problems = run(raw)
    assert [str(p) for p in problems] == [
        "forwarders[0].concurrency: warning: SQLite serialises writers, so the bridge runs one "
        "worker for a sqlite database; concurrency 4 is ignored"
    ]
    assert config is not None
    assert config.forwarders[0].concurrency == 1


def test_sqlite_forwarder_with_the_default_concurrency_runs_one_worker_silently() -> None:
    config, problems = run(with_(minimal(), "forwarders[0].database", "edge"))
    assert problems == []
    assert config is not None
    assert config.forwarders[0].concurrency == 1


# --------------------------------------------------------------------------------------------
# Routes
# --------------------------------------------------------------------------------------------


def test_unknown_route_database_is_reported_with_nearest_match() -> None:
    raw = minimal()
    raw["routes"].insert(1, {"match": "Other*", "database": "sender"})
    raw["routes"].insert(2, {"match": "Billing*", "database": "recever"})
    assert the_error(raw) == (
        "routes[2].database: no database named 'recever' (did you mean 'receiver'?)"
    )


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        pytest.param("match", _DELETE, "required key is missing", id="missing-match"),
        pytest.param("database", _DELETE, "required key is missing", id="missing-database"),
        pytest.param("match", "", "must not be empty", id="empty-match"),
        pytest.param(
            "match",
            True,
            "expected a string, got a boolean (true); YAML reads unquoted "
            "yes/no/on/off/true/false as booleans, quote the value",
            id="yaml-boolean",
        ),
        pytest.param("schema", 5, "expected a string, got an integer (5)", id="schema-number"),
        pytest.param(
            "to",
            "x",
            "unknown key (expected one of: match, database, schema, transaction, schemas, "
            "catalogs)",
            id="k",
        ),
    ],
)
def test_route_key_rules(key: str, value: object, message: str) -> None:
    assert the_error(with_(minimal(), f"routes[0].{key}", value)).startswith(
        f"routes[0].{key}: {message}"
    )


def test_route_schema_is_kept_and_null_means_none() -> None:
    raw = with_(minimal(), "routes[0].schema", "nsb")
    raw = with_(raw, "routes[1].schema", None)
    config = build(raw)
    assert [r.schema for r in config.routes] == ["nsb", None]


def test_route_schema_on_a_sqlite_database_is_an_error() -> None:
    raw = with_(minimal(), "routes[1]", {"match": "*", "database": "edge", "schema": "x"})
    assert the_error(raw) == "routes[1].schema: sqlite has no schemas (database 'edge' is sqlite)"


@pytest.mark.parametrize("catch_all", ["*", "**"])
def test_routes_after_a_catch_all_are_reported_as_unreachable(catch_all: str) -> None:
    raw = minimal()
    raw["routes"] = [
        {"match": "A*", "database": "sender"},
        {"match": catch_all, "database": "sender"},
        {"match": "B*", "database": "receiver"},
        {"match": "C*", "database": "receiver"},
    ]
    config, problems = run(raw)
    assert config is not None
    assert [str(p) for p in problems] == [
        f"routes[2].match: warning: route 'B*' is unreachable: routes[1] (match {catch_all!r}) "
        "matches every destination first",
        f"routes[3].match: warning: route 'C*' is unreachable: routes[1] (match {catch_all!r}) "
        "matches every destination first",
    ]


def test_a_route_repeating_an_earlier_match_is_reported_as_unreachable() -> None:
    raw = minimal()
    raw["routes"].insert(1, {"match": "Samples.Receiver*", "database": "sender"})
    assert warnings(raw) == [
        "routes[1].match: warning: route 'Samples.Receiver*' is unreachable: routes[0] has the "
        "same match and comes first"
    ]


def test_a_catch_all_as_the_last_route_is_fine() -> None:
    assert run(minimal())[1] == []


# --------------------------------------------------------------------------------------------
# Retries, ledger, logging, sentry
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("retries.delay", 0, "must be greater than 0s, got 0s"),
        ("retries.delay", "soon", "invalid duration 'soon': expected a number of seconds"),
        ("retries.max_attempts", 0, "must be at least 1, got 0"),
        ("retries.max_attempts", "many", "expected an integer, got a string ('many')"),
        (
            "retries.backoff",
            "exponentail",
            "'exponentail' is not one of constant, linear, "
            "exponential (did you mean 'exponential'?)",
        ),
        (
            "retries.backoff",
            "Linear",
            "'Linear' is not one of constant, linear, exponential (did you mean 'linear'?)",
        ),
        ("retries.backoff", 1, "expected one of constant, linear, exponential, got an integer"),
        ("retries.immediate_attempts", 0, "must be between 1 and 10, got 0"),
        ("retries.immediate_attempts", 11, "must be between 1 and 10, got 11"),
        ("retries.missing_queue", "ignore", "'ignore' is not one of retry, error"),
        ("retries.max_delay", "10ms", "10ms is less than retries.delay 10s; it must be at least"),
        ("ledger.retention", "0s", "must be greater than 0s, got 0s"),
        ("ledger.cleanup_interval", -5, "invalid duration -5: must be a finite number"),
        ("ledger.cleanup", "yes", "expected true or false, got a string ('yes')"),
        ("ledger.cleanup", 1, "expected true or false, got an integer (1)"),
        (
            "logging.level",
            "warn",
            "'warn' is not one of DEBUG, INFO, WARNING, ERROR (did you mean 'WARNING'?)",
        ),
        ("logging.level", "TRACE", "'TRACE' is not one of DEBUG, INFO, WARNING, ERROR"),
        ("sentry.dsn", "not-a-dsn", "is not a Sentry DSN: expected https://<key>@<host>/<project>"),
        ("sentry.environment", ["prod"], "expected a string, got a list"),
        ("sentry.release", "1.0", "unknown key (expected one of: dsn, environment)"),
        ("retries", "10s", "expected a mapping of settings, got a string ('10s')"),
    ],
)
def test_settings_section_rules(path: str, value: object, message: str) -> None:
    assert the_error(with_(minimal(), path, value)).startswith(f"{path}: {message}")


def test_max_delay_below_the_default_is_reported_as_the_default() -> None:
    assert the_error(with_(minimal(), "retries.delay", "2h")) == (
        "retries.max_delay: 1h (the default) is less than retries.delay 2h; it must be at least "
        "the delay"
    )


def test_max_delay_equal_to_delay_is_fine() -> None:
    raw = with_(minimal(), "retries", {"delay": "1m", "max_delay": 60})
    assert build(raw).retries == RetryConfig(delay=60.0, max_delay=60.0)


def test_retries_are_converted() -> None:
    raw = with_(
        minimal(),
        "retries",
        {
            "delay": "500ms",
            "max_attempts": 5,
            "backoff": "exponential",
            "max_delay": "1h30m",
            "immediate_attempts": 10,
            "missing_queue": "error",
        },
    )
    assert build(raw).retries == RetryConfig(0.5, 5, "exponential", 5400.0, 10, "error")


@pytest.mark.parametrize("value", [True, False])
def test_cleanup_accepts_yaml_booleans_including_yes_and_no(value: bool) -> None:
    raw = yaml.safe_load(f"ledger: {{cleanup: {'yes' if value else 'no'}}}")
    assert build({**minimal(), **raw}).ledger.cleanup is value


@pytest.mark.parametrize(("given", "stored"), [("debug", "DEBUG"), ("Warning", "WARNING")])
def test_logging_level_is_case_insensitive_and_stored_upper_case(given: str, stored: str) -> None:
    assert build(with_(minimal(), "logging.level", given)).logging.level == stored


@pytest.mark.parametrize(
    ("dsn", "env", "expected"),
    [
        pytest.param("", {}, None, id="empty"),
        pytest.param("${SENTRY_DSN:-}", {}, None, id="unset-with-empty-default"),
        pytest.param("${SENTRY_DSN}", {"SENTRY_DSN": ""}, None, id="set-but-empty"),
        pytest.param(
            "${SENTRY_DSN}",
            {"SENTRY_DSN": "https://k@o1.ingest.sentry.io/42"},
            "https://k@o1.ingest.sentry.io/42",
            id="from-environment",
        ),
        pytest.param(
            "https://k@sentry.example.com/3", {}, "https://k@sentry.example.com/3", id="literal"
        ),
    ],
)
def test_sentry_dsn(dsn: str, env: dict[str, str], expected: str | None) -> None:
    config = build(with_(minimal(), "sentry.dsn", dsn), {**ENV, **env})
    assert config.sentry.dsn == expected


def test_sentry_dsn_variable_without_default_must_be_set_for_the_daemon() -> None:
    config = build(with_(minimal(), "sentry.dsn", "${SENTRY_DSN}"))
    assert config.sentry.dsn is None
    with pytest.raises(UnsetVariables) as raised:
        config.require_environment("run")
    assert raised.value.unset == (("sentry.dsn", ("SENTRY_DSN",)),)
    config.require_environment("install", ["sender", "receiver"])  # Sentry is the daemon's


def test_sentry_environment_empty_means_none() -> None:
    assert build(with_(minimal(), "sentry.environment", "")).sentry.environment is None


def _built(config: BridgeConfig, section: Section, key: Key) -> object:
    if section.name == "databases":
        return getattr(config.databases["sender"], key.name)
    if section.shape == "list":
        return getattr(getattr(config, section.name)[0], key.name)
    return getattr(getattr(config, section.name), key.name)


@pytest.mark.parametrize(
    "item", [item for item in _sections_and_keys() if not item[1].required], ids=_key_id
)
def test_null_for_an_optional_key_means_its_default(item: tuple[Section, Key]) -> None:
    section, key = item
    if section.name == "databases":
        path = f"databases.sender.{key.name}"
    elif section.shape == "list":
        path = f"{section.name}[0].{key.name}"
    else:
        path = f"{section.name}.{key.name}"
    config = build(with_(with_entries(), path, None))
    assert _built(config, section, key) == key.default


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (0, 0.0),
        (10, 10.0),
        (1.5, 1.5),
        ("500ms", 0.5),
        ("10s", 10.0),
        ("1.5s", 1.5),
        ("0.25s", 0.25),
        (".5s", 0.5),
        ("2m", 120.0),
        ("1h", 3600.0),
        ("7d", 604800.0),
        ("1h30m", 5400.0),
        ("1d2h3m4s5ms", 93784.005),
        ("1h 30m", 5400.0),
        (" 10s ", 10.0),
        ("0s", 0.0),
    ],
)
def test_parse_duration_accepts(value: object, seconds: float) -> None:
    assert math.isclose(parse_duration(value), seconds)


@pytest.mark.parametrize(
    "value",
    [
        "10",
        "",
        "  ",
        "s",
        "10 s",
        "10sec",
        "10S",
        "1x",
        "-5s",
        "+5s",
        "30m1h",
        "1m1m",
        "1.s",
        "1e3s",
        "10ms5m",
        -1,
        float("nan"),
        float("inf"),
        True,
        None,
        [10],
    ],
)
def test_parse_duration_rejects_and_lists_the_accepted_forms(value: object) -> None:
    with pytest.raises(ValueError) as caught:
        parse_duration(value)
    message = str(caught.value)
    if isinstance(value, str) or value is None or isinstance(value, bool | list):
        for form in ("500ms", "10s", "1.5s", "2m", "1h", "7d", "1h30m"):
            assert f"'{form}'" in message


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (0.5, "500ms"),
        (1, "1s"),
        (90, "1m30s"),
        (3600, "1h"),
        (5400, "1h30m"),
        (604800, "7d"),
        (93784.005, "1d2h3m4s5ms"),
        (0.0001, "0.0001s"),
    ],
)
def test_format_duration_writes_what_parse_duration_reads(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text
    assert math.isclose(parse_duration(text), seconds)


# --------------------------------------------------------------------------------------------
# load_config
# --------------------------------------------------------------------------------------------


def _write(tmp_path: Path, text: str, name: str = "bridge.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_load_config_returns_the_config_and_its_warnings(tmp_path: Path) -> None:
    raw = with_(minimal(), "forwarders[0].peek_interval", "20s")
    path = _write(tmp_path, yaml.safe_dump(raw))
    config, found = load_config(path, ENV)
    assert config.source_path == str(path)
    assert [str(w) for w in found] == [
        "forwarders[0].peek_interval: warning: 20s is outside the usual range 10ms..10s"
    ]


def test_load_config_accepts_a_string_path(tmp_path: Path) -> None:
    path = _write(tmp_path, yaml.safe_dump(minimal()))
    config, _ = load_config(str(path), ENV)
    assert config.source_path == str(path)


def test_load_config_uses_the_process_environment_by_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RECEIVER_ODBC", "Driver=x;Server=from-env")
    config, _ = load_config(_write(tmp_path, yaml.safe_dump(minimal())))
    assert config.databases["receiver"].connection == "Driver=x;Server=from-env"


def test_load_config_resolves_relative_sqlite_paths_against_the_file(tmp_path: Path) -> None:
    raw = with_(minimal(), "databases.edge.path", "state/edge.db")
    config, _ = load_config(_write(tmp_path, yaml.safe_dump(raw)), ENV)
    assert config.databases["edge"].path == str(tmp_path / "state" / "edge.db")


def test_a_missing_file_is_a_config_error_that_says_so(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    assert str(caught.value) == f"{path}: configuration file not found"


def test_a_directory_is_a_config_error_that_says_so(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path, ENV)
    assert str(caught.value) == f"{tmp_path}: is a directory, not a configuration file"


@pytest.mark.parametrize(
    ("exception", "message"),
    [
        (PermissionError(13, "Permission denied"), "permission denied"),
        (OSError(5, "Input/output error"), "Input/output error"),
    ],
)
def test_an_unreadable_file_is_a_config_error_that_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exception: OSError, message: str
) -> None:
    # Simulated: the tests may run as root, who can read a file whatever its mode.
    def refuse(*args: object, **kwargs: object) -> None:
        raise exception

    path = _write(tmp_path, yaml.safe_dump(minimal()))
    monkeypatch.setattr(config_load, "open", refuse, raising=False)
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    assert str(caught.value) == f"{path}: cannot read the configuration file: {message}"


def test_a_file_that_is_not_utf8_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"databases: {caf\xe9: 1}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    assert str(caught.value) == f"{path}: the configuration file is not valid UTF-8 (byte 15)"


def test_yaml_syntax_errors_point_at_file_line_and_column(tmp_path: Path) -> None:
    path = _write(tmp_path, "databases:\n  sender: {dialect: postgresql\nforwarders: []\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    [problem] = caught.value.problems
    assert problem.path == f"{path}:3:11"
    assert problem.message.startswith("invalid YAML: while parsing a flow mapping")
    assert str(caught.value) == f"{problem.path}: {problem.message}"


def test_yaml_tab_indentation_is_reported_with_its_position(tmp_path: Path) -> None:
    path = _write(tmp_path, "databases:\n\tsender: {}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    assert caught.value.problems[0].path == f"{path}:2:1"


def test_yaml_syntax_errors_do_not_quote_the_line_that_may_hold_a_password(
    tmp_path: Path,
) -> None:
    text = f'databases:\n  sender: {{connection: "Uid=sa;PWD={PASSWORD}\n'
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    assert PASSWORD not in str(caught.value)
    assert caught.value.problems[0].path.startswith(f"{path}:")


def test_validation_errors_raise_a_config_error_with_every_problem(tmp_path: Path) -> None:
    raw = with_(minimal(), "forwarders[0].batch_size", 0)
    raw = with_(raw, "routes[0].database", "recever")
    raw = with_(raw, "forwarders[0].peek_interval", "20s")
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, yaml.safe_dump(raw)), ENV)
    assert str(caught.value).splitlines() == [
        "forwarders[0].batch_size: must be between 1 and 10000, got 0",
        "routes[0].database: no database named 'recever' (did you mean 'receiver'?)",
    ]
    assert len(caught.value.warnings) == 1


def test_an_empty_file_is_reported_as_an_empty_configuration(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, "# nothing yet\n"), ENV)
    assert str(caught.value).startswith("the configuration is empty")


# Duplicated keys: YAML itself forbids them, but PyYAML keeps the last and drops the rest
# silently, so a second `routes:` block would throw away the first without a word.

DUPLICATE_ROUTES = """\
databases:
  sender: {dialect: postgresql, connection: "Driver=x;Server=db1"}
  receiver: {dialect: postgresql, connection: "${RECEIVER_ODBC}"}
forwarders:
  - {name: sender, database: sender, queue: sfbridge.forward}
routes:
  - {match: "Samples.Receiver*", database: receiver}
routes:
  - {match: "*", database: sender}
"""


def test_a_duplicated_top_level_key_is_an_error_naming_the_key_and_both_lines(
    tmp_path: Path,
) -> None:
    path = _write(tmp_path, DUPLICATE_ROUTES)
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    [problem] = caught.value.problems
    assert problem.path == f"{path}:8:1"
    assert problem.message == (
        "duplicate key 'routes' (first given on line 6); YAML would keep only the last one "
        "and silently drop the others, so merge them into one or delete the extra"
    )
    assert str(caught.value) == f"{problem.path}: {problem.message}"


def test_a_duplicated_key_inside_a_database_entry_is_an_error_with_its_key_path(
    tmp_path: Path,
) -> None:
    text = (
        "databases:\n"
        "  sender:\n"
        "    dialect: postgresql\n"
        '    connection: "Driver=x;Server=db1"\n'
        "    dialect: sqlite\n"
        "forwarders:\n"
        "  - {name: sender, database: sender, queue: sfbridge.forward}\n"
        "routes:\n"
        '  - {match: "*", database: sender}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), ENV)
    [problem] = caught.value.problems
    assert problem.path.endswith(":5:5")
    assert problem.message.startswith(
        "duplicate key 'databases.sender.dialect' (first given on line 3)"
    )


def test_a_duplicated_key_inside_a_forwarder_entry_is_an_error_with_its_key_path(
    tmp_path: Path,
) -> None:
    text = (
        "databases:\n"
        '  sender: {dialect: postgresql, connection: "Driver=x;Server=db1"}\n'
        "forwarders:\n"
        "  - name: sender\n"
        "    database: sender\n"
        "    queue: sfbridge.forward\n"
        "    queue: other.forward\n"
        "routes:\n"
        '  - {match: "*", database: sender}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), ENV)
    [problem] = caught.value.problems
    assert problem.path.endswith(":7:5")
    assert problem.message.startswith("duplicate key 'forwarders[0].queue' (first given on line 6)")


def test_a_duplicated_name_that_is_not_an_identifier_is_quoted_in_the_key_path(
    tmp_path: Path,
) -> None:
    text = (
        "databases:\n"
        "  edge.db: {dialect: sqlite, path: a.db}\n"
        "  edge.db: {dialect: sqlite, path: b.db}\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), ENV)
    [problem] = caught.value.problems
    assert problem.path.endswith(":3:3")
    assert problem.message.startswith("duplicate key 'databases[\"edge.db\"]' (first given")


def test_every_duplicated_key_is_reported_in_file_order(tmp_path: Path) -> None:
    text = (
        "databases:\n"  # 1
        "  sender:\n"  # 2
        "    dialect: postgresql\n"  # 3
        '    connection: "Driver=x;Server=db1"\n'  # 4
        '    connection: "Driver=x;Server=db2"\n'  # 5
        "forwarders:\n"  # 6
        "  - {name: sender, database: sender, queue: a, name: again}\n"  # 7
        "routes:\n"  # 8
        '  - {match: "*", database: sender}\n'  # 9
        "routes: []\n"  # 10
        "routes: []\n"  # 11
    )
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError) as caught:
        load_config(path, ENV)
    located = [(problem.path, problem.message.split(";")[0]) for problem in caught.value.problems]
    assert located == [
        (f"{path}:5:5", "duplicate key 'databases.sender.connection' (first given on line 4)"),
        (f"{path}:7:48", "duplicate key 'forwarders[0].name' (first given on line 7)"),
        (f"{path}:10:1", "duplicate key 'routes' (first given on line 8)"),
        (f"{path}:11:1", "duplicate key 'routes' (first given on line 8)"),
    ]


def test_a_duplicated_key_error_does_not_quote_the_values_that_may_hold_a_password(
    tmp_path: Path,
) -> None:
    text = (
        "databases:\n"
        f'  sender: {{dialect: postgresql, connection: "Uid=sa;PWD={PASSWORD}",\n'
        f'           connection: "Uid=sa;PWD={PASSWORD}x"}}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), ENV)
    assert "duplicate key 'databases.sender.connection'" in str(caught.value)
    assert PASSWORD not in str(caught.value)
    assert all(PASSWORD not in repr(p) for p in caught.value.problems)


def test_the_same_key_in_different_mappings_is_not_a_duplicate(tmp_path: Path) -> None:
    # Every database entry has a `dialect`, every route a `match` and a `database`.
    config, _ = load_config(_write(tmp_path, yaml.safe_dump(minimal(), sort_keys=False)), ENV)
    assert list(config.databases) == ["sender", "receiver", "edge"]


def test_a_duplicate_in_an_anchored_mapping_is_named_where_the_anchor_is_written(
    tmp_path: Path,
) -> None:
    text = "databases:\n  sender: &pg {dialect: postgresql, dialect: sqlite}\n  receiver: *pg\n"
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), ENV)
    [problem] = caught.value.problems
    assert problem.path.endswith(":2:37")
    assert problem.message.startswith("duplicate key 'databases.sender.dialect' (first given")


def test_a_key_that_overrides_a_yaml_merge_key_is_not_a_duplicate(tmp_path: Path) -> None:
    text = (
        "databases:\n"
        '  sender: &pg {dialect: postgresql, connection: "Driver=x;Server=db1"}\n'
        "  receiver:\n"
        "    <<: *pg\n"
        '    connection: "Driver=x;Server=db2"\n'
        "forwarders:\n"
        "  - {name: sender, database: sender, queue: sfbridge.forward}\n"
        "routes:\n"
        '  - {match: "*", database: receiver}\n'
    )
    config, _ = load_config(_write(tmp_path, text), ENV)
    assert config.databases["receiver"].connection == "Driver=x;Server=db2"
    assert config.databases["receiver"].dialect == "postgresql"


def test_yaml_tags_that_construct_python_objects_are_still_refused(tmp_path: Path) -> None:
    text = "databases: !!python/object/apply:os.getcwd []\n"
    with pytest.raises(ConfigError) as caught:
        load_config(_write(tmp_path, text), ENV)
    [problem] = caught.value.problems
    assert problem.path == f"{tmp_path / 'bridge.yaml'}:1:12"
    assert "could not determine a constructor" in problem.message


# --------------------------------------------------------------------------------------------
# The example files in config/
# --------------------------------------------------------------------------------------------


def _referenced_variables(text: str) -> dict[str, str]:
    """Plausible values for every ${VAR} without a default that `text` references."""
    return {
        name: "Driver={PostgreSQL Unicode};Server=db;Database=x;Uid=bridge"
        if name.endswith("ODBC")
        else "placeholder-secret"
        for name in re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}", text)
    }


def test_the_example_configs_exist() -> None:
    names = {path.name for path in EXAMPLES}
    assert {"sfbridge.example.yaml", "edge-sqlite.example.yaml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_config_validates_without_warnings(path: Path) -> None:
    env = _referenced_variables(path.read_text(encoding="utf-8"))
    config, found = load_config(path, env)
    assert found == []
    assert config.source_path == str(path)


def test_the_full_example_mentions_every_key() -> None:
    text = (REPO / "config" / "sfbridge.example.yaml").read_text(encoding="utf-8")
    for section in SCHEMA:
        assert re.search(rf"^{section.name}:", text, re.M), section.name
        for key in section.keys:
            assert re.search(rf"[\s{{-]{key.name}:", text), f"{section.name}.{key.name}"


def test_the_full_example_is_postgresql_to_postgresql() -> None:
    path = REPO / "config" / "sfbridge.example.yaml"
    config, _ = load_config(path, _referenced_variables(path.read_text(encoding="utf-8")))
    assert {db.dialect for db in config.databases.values()} == {"postgresql"}


def test_the_edge_example_forwards_from_sqlite_to_postgresql() -> None:
    path = REPO / "config" / "edge-sqlite.example.yaml"
    config, _ = load_config(path, _referenced_variables(path.read_text(encoding="utf-8")))
    [forwarder] = config.forwarders
    assert config.databases[forwarder.database].dialect == "sqlite"
    assert {config.databases[route.database].dialect for route in config.routes} == {"postgresql"}


# --------------------------------------------------------------------------------------------
# SQL Server databases
# --------------------------------------------------------------------------------------------

SQLSERVER_ODBC = (
    "Driver={ODBC Driver 18 for SQL Server};Server=db3;Database=sender;Uid=bridge;"
    "Pwd=${SQLSERVER_PASSWORD}"
)


def with_sqlserver_sender() -> dict[str, Any]:
    raw = with_(
        minimal(), "databases.sender", {"dialect": "sqlserver", "connection": SQLSERVER_ODBC}
    )
    return with_(raw, "forwarders[0].queue", "Samples.Sender.Forward@[nsb]@[sender]")


def test_a_sqlserver_database_takes_a_connection_string_and_a_default_schema() -> None:
    raw = with_(with_sqlserver_sender(), "databases.sender.schema", "nsb")
    config = build(raw, {**ENV, "SQLSERVER_PASSWORD": PASSWORD})
    sender = config.databases["sender"]
    assert (sender.dialect, sender.schema) == ("sqlserver", "nsb")
    assert sender.connection == SQLSERVER_ODBC.replace("${SQLSERVER_PASSWORD}", PASSWORD)
    assert config.forwarders[0].queue == "Samples.Sender.Forward@[nsb]@[sender]"


def test_a_sqlserver_database_needs_a_connection_and_takes_no_path() -> None:
    raw = with_(with_sqlserver_sender(), "databases.sender.connection", _DELETE)
    raw = with_(raw, "databases.sender.path", "x.db")
    assert errors(raw) == [
        "databases.sender.connection: required key is missing for sqlserver databases",
        "databases.sender.path: not used by sqlserver databases; postgresql and sqlserver "
        "databases take 'connection' instead",
    ]


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        pytest.param("q@[nsb", "unterminated '['", id="unterminated-bracket"),
        pytest.param("@[nsb]", "empty table name", id="empty-table"),
        pytest.param("q@[a]b", "after the closing ']'", id="junk-after-bracket"),
    ],
)
def test_sqlserver_queue_addresses_are_parsed_in_the_sqlserver_grammar(
    queue: str, message: str
) -> None:
    raw = with_(with_sqlserver_sender(), "forwarders[0].queue", queue)
    problem = the_error(raw, {**ENV, "SQLSERVER_PASSWORD": PASSWORD})
    assert problem.startswith("forwarders[0].queue: invalid sqlserver queue address: ")
    assert message in problem


# -- catalogs --------------------------------------------------------------------------------

SQLSERVER_ENV = {**ENV, "SQLSERVER_PASSWORD": PASSWORD}


def test_a_sqlserver_database_knows_its_catalog_from_its_connection_or_its_catalog_key() -> None:
    from bridge.config.catalogs import database_catalog

    config = build(with_sqlserver_sender(), SQLSERVER_ENV)
    assert config.databases["sender"].catalog is None
    assert database_catalog(config.databases["sender"]) == "sender"  # Database=sender
    raw = with_(with_sqlserver_sender(), "databases.sender.catalog", "SENDER")
    assert database_catalog(build(raw, SQLSERVER_ENV).databases["sender"]) == "SENDER"


def test_a_sqlserver_database_whose_catalog_is_unknown_is_refused_saying_what_to_set() -> None:
    raw = with_(
        with_sqlserver_sender(), "databases.sender.connection", "DSN=nsb;Uid=bridge;Pwd=secret"
    )
    assert the_error(raw) == (
        "databases.sender.catalog: required when 'connection' names no database (Database= or "
        "Initial Catalog=): the database's name on its server, which NServiceBus endpoints "
        "write in every address (table@[schema]@[catalog]) and the bridge reads to route them "
        "and writes in NServiceBus.FailedQ"
    )
    assert errors(with_(raw, "databases.sender.catalog", "SenderDb")) == []


def test_a_catalog_that_is_not_the_database_the_connection_opens_is_refused() -> None:
    raw = with_(with_sqlserver_sender(), "databases.sender.catalog", "Other")
    assert the_error(raw, SQLSERVER_ENV) == (
        "databases.sender.catalog: 'Other' is not the database the connection opens "
        "('sender'), which is where the bridge works: correct it, or leave it out"
    )


def test_only_sqlserver_databases_take_a_catalog() -> None:
    raw = with_(minimal(), "databases.receiver.catalog", "receiver")
    assert errors(raw) == [
        "databases.receiver.catalog: not used by postgresql databases; only sqlserver "
        "addresses name catalogs"
    ]


def test_a_proxy_destination_naming_another_configured_databases_catalog_is_refused() -> None:
    raw = with_(with_sqlserver_sender(), "databases.receiver", SQLSERVER_RECEIVER)
    raw = with_(
        raw,
        "forwarders[0].destination",
        {"database": "sender", "queue": "Samples.Receiver@[dbo]@[receiver]"},
    )
    assert the_error(raw, SQLSERVER_ENV) == (
        "forwarders[0].destination.queue: names catalog [receiver], which is database "
        "'receiver', but the proxy delivers into database 'sender': set "
        "'destination.database: receiver' and leave the catalog out"
    )
    # Its own catalog, or a catalog no database is configured for (on its server), is fine.
    for queue in ("Samples.Receiver@[dbo]@[receiver]", "Samples.Receiver@[dbo]@[Archive]"):
        fine = with_(raw, "forwarders[0].destination", {"database": "receiver", "queue": queue})
        assert errors(fine, SQLSERVER_ENV) == []


def test_a_subscriber_whose_catalog_names_a_configured_database_needs_no_route() -> None:
    raw = with_(with_sqlserver_sender(), "databases.receiver", SQLSERVER_RECEIVER)
    raw["routes"] = [{"match": "Samples.Receiver", "database": "receiver"}]
    raw["subscriptions"] = {"Shared.OrderSubmitted": ["Samples.Billing@[dbo]@[receiver]"]}
    assert errors(raw, SQLSERVER_ENV) == []
    # The forwarding database's own catalog is what endpoints write by default: routes decide.
    raw["subscriptions"] = {"Shared.OrderSubmitted": ["Samples.Billing@[dbo]@[sender]"]}
    assert the_error(raw, SQLSERVER_ENV).startswith(
        'subscriptions["Shared.OrderSubmitted"][0]: no route matches subscriber table '
        "'Samples.Billing'"
    )


def test_outages_wait_by_default_up_to_max_wait_and_can_count() -> None:
    retries = build(minimal()).retries
    assert (retries.during_outage, retries.max_wait) == ("wait", 7 * 86400.0)
    raw = with_(minimal(), "retries", {"max_wait": "2d"})
    retries = build(raw).retries
    assert (retries.during_outage, retries.max_wait) == ("wait", 2 * 86400.0)
    counting = with_(minimal(), "retries", {"during_outage": "count"})
    assert build(counting).retries.during_outage == "count"


def test_max_wait_shorter_than_the_delay_is_an_error_with_its_key_path() -> None:
    raw = with_(minimal(), "retries", {"delay": "1m", "during_outage": "wait", "max_wait": "30s"})
    assert the_error(raw) == (
        "retries.max_wait: 30s is less than retries.delay 1m; it must be at least the delay"
    )


def test_during_outage_takes_count_or_wait() -> None:
    assert the_error(with_(minimal(), "retries.during_outage", "pause")).startswith(
        "retries.during_outage: "
    )


def test_runtime_table_creation_is_on_unless_turned_off() -> None:
    assert build(minimal()).install.at_runtime is True
    assert build(with_(minimal(), "install", {"at_runtime": False})).install.at_runtime is False
    assert the_error(with_(minimal(), "install", {"at_runtim": False})).startswith(
        "install.at_runtim: unknown key"
    )


def test_waiting_longer_than_the_ledger_remembers_draws_a_warning() -> None:
    raw = with_(minimal(), "retries", {"during_outage": "wait", "max_wait": "30d"})
    _, problems = validate(raw, {})
    [warning] = [p for p in problems if p.severity == "warning"]
    assert warning.path == "retries.max_wait"
    assert "longer than ledger.retention 7d" in warning.message
    fine = with_(with_(raw, "ledger", {"retention": "30d"}), "retries.during_outage", "wait")
    assert [p for p in validate(fine, {})[1] if p.severity == "warning"] == []


def test_a_retention_shorter_than_the_default_wait_draws_the_warning_too() -> None:
    # during_outage: wait is the default, so a shorter ledger alone is enough to warn.
    raw = with_(minimal(), "ledger", {"retention": "1d"})
    [warning] = [p for p in validate(raw, {})[1] if p.severity == "warning"]
    assert warning.path == "retries.max_wait"
    assert warning.message.startswith("7d (the default) is longer than ledger.retention 1d")
    counting = with_(raw, "retries", {"during_outage": "count"})
    assert [p for p in validate(counting, {})[1] if p.severity == "warning"] == []


# --------------------------------------------------------------------------------------------
# Transaction modes
# --------------------------------------------------------------------------------------------

SQLSERVER_RECEIVER = {
    "dialect": "sqlserver",
    "connection": "Driver={FreeTDS};Server=h;Database=receiver",
}


def test_routes_take_their_transaction_mode_or_the_delivery_default() -> None:
    raw = with_(minimal(), "routes[0].transaction", "two-phase")
    config = build(with_(raw, "delivery.transaction", "at-least-once"))
    assert [config.route_transaction(route) for route in config.routes] == [
        "two-phase",
        "at-least-once",
    ]
    assert build(minimal()).route_transaction(build(minimal()).routes[0]) == "ledger"


def test_an_unknown_transaction_mode_lists_the_three() -> None:
    assert the_error(with_(minimal(), "routes[0].transaction", "xa")) == (
        "routes[0].transaction: 'xa' is not one of ledger, two-phase, at-least-once"
    )


def test_two_phase_into_sql_server_is_refused_with_the_reason() -> None:
    raw = with_(minimal(), "databases.receiver", SQLSERVER_RECEIVER)
    error = the_error(with_(raw, "routes[0].transaction", "two-phase"))
    assert error.startswith("routes[0].transaction: two-phase needs a destination that can ")
    assert "MSDTC" in error and "Use 'ledger'" in error


def test_two_phase_from_the_delivery_default_names_the_route_it_applies_to() -> None:
    raw = with_(minimal(), "databases.receiver", SQLSERVER_RECEIVER)
    error = the_error(with_(raw, "delivery.transaction", "two-phase"))
    assert error.startswith("routes[0].transaction (from delivery.transaction): two-phase")


def test_two_phase_from_a_sqlite_forwarding_database_is_refused() -> None:
    raw = minimal()
    raw["forwarders"].append({"name": "edge", "database": "edge", "queue": "fwd"})
    error = the_error(with_(raw, "routes[0].transaction", "two-phase"))
    assert "forwarders[1] forwards from 'edge', a sqlite database" in error


def test_two_phase_into_sqlite_is_refused() -> None:
    raw = with_(minimal(), "routes[0].database", "edge")
    error = the_error(with_(raw, "routes[0].transaction", "two-phase"))
    assert "SQLite has no prepared (two-phase) transactions" in error


def test_a_route_into_the_forwarding_database_itself_is_atomic_whatever_it_says() -> None:
    raw = with_(minimal(), "databases.sender", {"dialect": "sqlite", "path": "/x.db"})
    raw = with_(raw, "routes[1].transaction", "two-phase")
    assert errors(raw) == []  # SQLite cannot prepare, and need not: nothing crosses
    config = build(raw)
    # Only the route into the receiver crosses into another database; the route into the
    # sender is written in the forwarding transaction itself.
    assert config.crossings() == {("sender", "receiver", "ledger")}


def test_at_least_once_is_accepted_everywhere() -> None:
    raw = with_(minimal(), "databases.receiver", SQLSERVER_RECEIVER)
    raw = with_(raw, "delivery.transaction", "at-least-once")
    assert errors(raw) == []
    config = build(raw)
    assert config.route_transaction(config.routes[0]) == "at-least-once"
    assert config.crossings() == {("sender", "receiver", "at-least-once")}


def test_a_proxy_destination_takes_a_transaction_mode_and_is_checked_like_a_route() -> None:
    raw = with_(minimal(), "databases.receiver", SQLSERVER_RECEIVER)
    raw["forwarders"].append(
        {
            "name": "proxy",
            "database": "sender",
            "queue": "Samples.Receiver",
            "destination": {"database": "receiver", "transaction": "two-phase"},
        }
    )
    assert the_error(raw).startswith("forwarders[1].destination.transaction: two-phase needs")


@pytest.mark.parametrize("listen", ["0.0.0.0:9464", "[::]:9464"])
def test_metrics_on_every_interface_draw_a_warning_about_exposure(listen: str) -> None:
    raw = with_(minimal(), "metrics", {"listen": listen})
    [warning] = warnings(raw)
    assert warning.startswith("metrics.listen: warning: serves /metrics on every network")
    assert "Listen on 127.0.0.1:9464 or a management network's address" in warning


@pytest.mark.parametrize("listen", ["127.0.0.1:9464", "[::1]:9464", "10.1.2.3:9464"])
def test_metrics_on_one_address_draw_no_warning(listen: str) -> None:
    assert warnings(with_(minimal(), "metrics", {"listen": listen})) == []
