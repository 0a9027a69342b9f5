"""`sfbridge route` in a subprocess, as an operator runs it: where a message would go, or why
it would go to the error queue, without connecting to any database unless a subscription table
must be read."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support import REPO, pg_connect, sfbridge, write_config

pytestmark = pytest.mark.integration

NSB_PG_CREATE_SUBSCRIPTIONS = """CREATE TABLE IF NOT EXISTS "public"."SubscriptionRouting" (
    QueueAddress VARCHAR(200) NOT NULL, Endpoint VARCHAR(200) NOT NULL,
    Topic VARCHAR(200) NOT NULL, PRIMARY KEY (Endpoint, Topic)) WITH (fillfactor=100)"""
NSB_PG_SUBSCRIBE = (
    'INSERT INTO "public"."SubscriptionRouting" (QueueAddress, Topic, Endpoint) VALUES (?, ?, ?)'
)


@pytest.fixture
def silent_server() -> Iterator[socket.socket]:
    """A port that accepts connections and never answers: a driver connecting to it would
    hang until its connect timeout, and the connection would wait in the backlog."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        yield server


def _nobody_connected(server: socket.socket) -> bool:
    server.settimeout(0)
    try:
        connection, _ = server.accept()
    except BlockingIOError:
        return True
    connection.close()
    return False


def _two_sqlserver_databases(tmp_path: Path, port: int) -> Path:
    """The sample's Sender and Receiver, each in its own SQL Server database."""

    def connection(catalog: str) -> str:
        return (
            f"Driver={{FreeTDS}};Server=127.0.0.1;Port={port};Database={catalog};"
            "Uid=bridge;Pwd=${SQL_PASSWORD}"
        )

    return write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {
                    "dialect": "sqlserver",
                    "connection": connection("SenderDb"),
                    "connect_timeout": "60s",
                },
                "receiver": {
                    "dialect": "sqlserver",
                    "connection": connection("ReceiverDb"),
                    "connect_timeout": "60s",
                },
            },
            "forwarders": [
                {"name": "sender", "database": "sender", "queue": "Samples.Sender.Forward"},
                {
                    "name": "to-sender",
                    "database": "receiver",
                    "queue": "Samples.Sender",
                    "destination": {"database": "sender"},
                },
            ],
            "routes": [{"match": "Samples.Receiver*", "database": "receiver"}],
        },
    )


def _route(config: Path, *args: str) -> Any:
    return sfbridge("-c", str(config), "route", *args, env={"SQL_PASSWORD": "pw"}, timeout=30)


@pytest.mark.parametrize(
    ("address", "catalog_line"),
    [
        pytest.param(
            "Samples.Receiver@[dbo]@[SenderDb]",
            "catalog [SenderDb] is the forwarding database 'sender' itself, which endpoints "
            "write by default: the route decides",
            id="the-senders-own-catalog",
        ),
        pytest.param("Samples.Receiver@[dbo]", None, id="schema-no-catalog"),
        pytest.param("Samples.Receiver", None, id="table-only"),
        pytest.param(
            "[Samples.Receiver]@[dbo]@[ReceiverDb]",
            "catalog [ReceiverDb] is database 'receiver': a route to it decides",
            id="the-receivers-catalog-table-in-brackets",
        ),
    ],
)
def test_every_form_of_the_receivers_address_resolves_to_its_database_and_table(
    tmp_path: Path, silent_server: socket.socket, address: str, catalog_line: str | None
) -> None:
    config = _two_sqlserver_databases(tmp_path, silent_server.getsockname()[1])
    result = _route(config, address)
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == (
        f"a message with destination {address!r} in forwarder 'sender' (database 'sender', "
        "sqlserver):"
    )
    assert lines[1] == (
        "  -> database 'receiver' (sqlserver): queue Samples.Receiver@[dbo], "
        "table [dbo].[Samples.Receiver] in catalog ReceiverDb"
    )
    assert lines[2] == "     by routes[0] (match 'Samples.Receiver*'), transaction ledger"
    assert lines[3:] == ([f"     {catalog_line}"] if catalog_line else [])
    assert _nobody_connected(silent_server)


def test_an_unroutable_destination_goes_to_the_error_queue_with_the_daemons_suggestion(
    tmp_path: Path, silent_server: socket.socket
) -> None:
    config = _two_sqlserver_databases(tmp_path, silent_server.getsockname()[1])
    result = _route(config, "Samples.Reciever@[dbo]@[SenderDb]")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines()[1] == (
        "  -> the error queue error@[dbo] in database 'sender' (reason unroutable): no route "
        "matches destination table 'Samples.Reciever' (did you mean a destination matching "
        "'Samples.Receiver*'?); routes: 'Samples.Receiver*'. Add a route for it in the config, "
        "or fix the destination header."
    )
    broken = _route(config, "Samples.Receiver@[dbo")
    assert broken.returncode == 1
    assert "is not a valid sqlserver address (unterminated '['" in broken.stdout
    assert _nobody_connected(silent_server)


def test_a_proxy_delivers_a_plain_send_and_a_routing_forwarder_refuses_one(
    tmp_path: Path, silent_server: socket.socket
) -> None:
    config = _two_sqlserver_databases(tmp_path, silent_server.getsockname()[1])
    proxy = _route(config, "--forwarder", "to-sender")
    assert proxy.returncode == 0, proxy.stdout + proxy.stderr
    assert proxy.stdout.splitlines()[1:] == [
        "  -> database 'sender' (sqlserver): queue Samples.Sender@[dbo], "
        "table [dbo].[Samples.Sender] in catalog SenderDb",
        "     the proxy's destination (forwarders[].destination), transaction ledger",
    ]
    plain = _route(config)
    assert plain.returncode == 1
    assert "(reason no-routing-header)" in plain.stdout
    unknown = _route(config, "--forwarder", "to-sendr", "x")
    assert unknown.returncode == 2
    assert "no forwarder named 'to-sendr' (did you mean 'to-sender'?)" in unknown.stderr
    assert _nobody_connected(silent_server)


def test_a_published_events_subscribers_are_read_from_the_subscription_table(
    tmp_path: Path, new_pg_database: Any
) -> None:
    sender, shipping = new_pg_database(), new_pg_database()
    with pg_connect(shipping) as connection:
        connection.execute(NSB_PG_CREATE_SUBSCRIPTIONS)
        for address, endpoint in (('"public"."Shipping"', "Shipping"), ("Nowhere", "Nowhere")):
            connection.execute(NSB_PG_SUBSCRIBE, address, "Shared.OrderSubmitted", endpoint)
        connection.commit()
    config = write_config(
        tmp_path / "sfbridge.yaml",
        {
            "databases": {
                "sender": {"dialect": "postgresql", "connection": sender},
                "shipping": {"dialect": "postgresql", "connection": shipping},
            },
            "forwarders": [{"name": "orders", "database": "sender", "queue": "forward"}],
            "routes": [{"match": "Shipping", "database": "shipping"}],
            "subscriptions": {"Shared.OrderSubmitted": ['"public"."Shipping"']},
            "subscription_tables": [{"database": "shipping"}],
        },
    )
    result = sfbridge("-c", str(config), "route", "--event-type", "Shared.OrderSubmitted, Shared")
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stdout.splitlines() == [
        "a message with event type 'Shared.OrderSubmitted, Shared' in forwarder 'orders' "
        "(database 'sender', postgresql):",
        "  subscribers are looked up for the topics 'Shared.OrderSubmitted', 'System.Object'",
        '  subscriber \'"public"."Shipping"\' (config); \'"public"."Shipping"\' (table '
        "SubscriptionRouting in database 'shipping'):",
        '    -> database \'shipping\' (postgresql): queue "public"."Shipping", '
        'table "public"."Shipping" in the database its connection opens',
        "       by routes[0] (match 'Shipping'), transaction ledger",
        "  subscriber 'Nowhere' (table SubscriptionRouting in database 'shipping'):",
        '    -> the error queue "public"."error" in database \'sender\' (reason unroutable): '
        "subscriber 'Nowhere' (table SubscriptionRouting in database 'shipping') of "
        "'Shared.OrderSubmitted, Shared': no route matches destination table 'Nowhere'; "
        "routes: 'Shipping'. Add a route for it in the config, or fix the destination header.",
    ]


SQLSERVER_PAGE = REPO / "docs" / "sqlserver.md"


def _catalogs_section() -> str:
    text = SQLSERVER_PAGE.read_text(encoding="utf-8")
    start = text.index("## SQL Server catalogs\n")
    return text[start : text.index("\n## ", start + 1)]


def test_the_docs_catalog_examples_are_what_sfbridge_route_says(tmp_path: Path) -> None:
    section = _catalogs_section()
    config_text = section.split("```yaml\n", 1)[1].split("```", 1)[0]
    config = tmp_path / "sfbridge.yaml"
    config.write_text(config_text, encoding="utf-8")
    env = {"SENDER_PASSWORD": "s", "RECEIVER_PASSWORD": "r", "BILLING_PASSWORD": "b"}
    rows = re.findall(r"^\| `([^`]+)` \| ([^|]+) \|", section, re.M)
    assert len(rows) == 7
    where = table_text = ""
    for header, goes_to in rows:
        result = sfbridge("-c", str(config), "route", header, env=env)
        if goes_to.startswith("the error queue"):
            assert result.returncode == 1, (header, result.stdout + result.stderr)
            assert "-> the error queue error@[dbo] in database 'sender'" in result.stdout
            continue
        if goes_to.strip() != "the same":
            found = re.fullmatch(r"database `(\w+)`, table `([^`]+)`", goes_to.strip())
            assert found is not None, goes_to
            database, table = found.groups()
            where = f"-> database '{database}' (sqlserver): "
            table_text = f"table {table} "
        assert result.returncode == 0, (header, result.stdout + result.stderr)
        assert where in result.stdout and table_text in result.stdout, (header, result.stdout)
    # The console example, line for line.
    console = section.split("```console\n", 1)[1].split("```", 1)[0]
    example = re.compile(r"^\$ sfbridge route '([^']+)'[^\n]*\n((?:[a ].*\n)+)", re.M)
    examples = example.findall(console)
    assert len(examples) == 2
    for command, output in examples:
        result = sfbridge("-c", str(config), "route", command, env=env)
        assert result.stdout == output, command


def test_the_address_is_echoed_as_given_between_quotes_not_as_python_repr(
    tmp_path: Path, silent_server: socket.socket
) -> None:
    # A quote and a backslash as they are (repr would switch to double quotes and double the
    # backslash); a control character inert, as everywhere else.
    config = _two_sqlserver_databases(tmp_path, silent_server.getsockname()[1])
    result = _route(config, "O'Brien\\Q\x1b[2J")
    heading = result.stdout.splitlines()[0]
    assert heading.startswith("a message with destination 'O'Brien\\Q\\x1b[2J' in forwarder"), (
        result.stdout
    )
