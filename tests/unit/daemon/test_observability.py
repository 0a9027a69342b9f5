"""Logs and crash reports never carry passwords."""

from __future__ import annotations

import gzip
import http.server
import io
import logging
import threading
from collections.abc import Iterator
from typing import ClassVar

import pytest

from bridge.config.model import SentryConfig
from bridge.daemon.observability import SecretMaskingFilter, scrub_event, setup_sentry

SECRET = "hunter2-Secret"
CONNECTION = f"Driver={{PostgreSQL Unicode}};Server=db;Uid=bridge;Pwd={SECRET};Database=x"


def formatted(record_logger: logging.Logger, stream: io.StringIO) -> str:
    return stream.getvalue()


@pytest.fixture
def captured_log() -> Iterator[tuple[logging.Logger, io.StringIO]]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretMaskingFilter())
    logger = logging.getLogger("test.secrets")
    logger.addHandler(handler)
    logger.propagate = False
    yield logger, stream
    logger.removeHandler(handler)


def test_a_password_in_log_arguments_is_masked(
    captured_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured_log
    logger.error("cannot connect with %s", CONNECTION)
    assert SECRET not in stream.getvalue()
    assert "Pwd=***" in stream.getvalue()


def test_control_characters_in_log_arguments_are_escaped_and_the_format_keeps_its_lines(
    captured_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured_log
    logger.warning("queue:\n%s, %d message(s)", "Q\x1b]0;pwned\x07\r\nFAKE LINE", 3)
    assert stream.getvalue() == "queue:\nQ\\x1b]0;pwned\\x07\\x0d\\x0aFAKE LINE, 3 message(s)\n"


def test_a_password_in_a_logged_traceback_is_masked(
    captured_log: tuple[logging.Logger, io.StringIO],
) -> None:
    logger, stream = captured_log
    try:
        raise RuntimeError(f"driver said: {CONNECTION}")
    except RuntimeError:
        logger.exception("unexpected")
    assert "RuntimeError" in stream.getvalue()
    assert SECRET not in stream.getvalue()


def test_scrub_event_masks_every_string_in_nested_structures() -> None:
    event = {"message": CONNECTION, "extra": {"list": [CONNECTION, ("x", CONNECTION)], "n": 1}}
    scrubbed = scrub_event(event)
    assert SECRET not in repr(scrubbed)
    assert scrubbed["extra"]["n"] == 1


class _Collector(http.server.BaseHTTPRequestHandler):
    bodies: ClassVar[list[bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        _Collector.bodies.append(body)
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def test_crash_reports_sent_to_sentry_carry_no_password() -> None:
    import sentry_sdk

    server = http.server.HTTPServer(("127.0.0.1", 0), _Collector)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        assert setup_sentry(SentryConfig(dsn=f"http://publickey@127.0.0.1:{port}/42"))
        connection_string = CONNECTION  # a local variable Sentry could otherwise send
        try:
            raise ConnectionError(f"cannot connect: {connection_string}")
        except ConnectionError as error:
            sentry_sdk.capture_exception(error)
        sentry_sdk.flush(timeout=5)
    finally:
        sentry_sdk.get_client().close()
        server.shutdown()
        server.server_close()
    payload = b"".join(_Collector.bodies)
    assert b"ConnectionError" in payload
    assert SECRET.encode() not in payload


def test_sentry_stays_off_without_a_dsn() -> None:
    assert setup_sentry(SentryConfig(dsn=None)) is False
