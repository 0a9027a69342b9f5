"""The daemon's HTTP listener (`metrics.listen`): `/metrics` for Prometheus, `/healthz` and
`/readyz` for probes (`bridge.daemon.readiness`), 404 for any other path.

A small server of the standard library's, a thread per request: every answer is built from
memory (the metrics registry, the daemon's states), never from a database, so a request
never waits on the data path and the data path never waits on a request. A client that
sends nothing is dropped after `REQUEST_TIMEOUT`.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger(__name__)

# (ok, JSON body): what `/healthz` and `/readyz` ask.
Check = Callable[[], tuple[bool, dict[str, Any]]]

REQUEST_TIMEOUT = 10.0


class Listener:
    """Serves `registry` and the two checks on (host, port) from background threads."""

    def __init__(
        self, host: str, port: int, registry: CollectorRegistry, healthz: Check, readyz: Check
    ) -> None:
        """Raises OSError when the address cannot be bound."""
        routes: dict[str, Callable[[], tuple[int, str, bytes]]] = {
            "/metrics": lambda: (200, CONTENT_TYPE_LATEST, generate_latest(registry)),
            "/healthz": lambda: _json(healthz),
            "/readyz": lambda: _json(readyz),
        }
        handler = type("Handler", (_Handler,), {"routes": routes})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics listener", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _json(check: Check) -> tuple[int, str, bytes]:
    ok, body = check()
    return 200 if ok else 503, "application/json", json.dumps(body, indent=1).encode() + b"\n"


class _Handler(BaseHTTPRequestHandler):
    routes: ClassVar[dict[str, Callable[[], tuple[int, str, bytes]]]] = {}
    timeout = REQUEST_TIMEOUT

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        route = self.routes.get(self.path.split("?", 1)[0])
        if route is None:
            status, content_type = 404, "text/plain; charset=utf-8"
            body = b"not found: the paths are /metrics, /healthz and /readyz\n"
        else:
            try:
                status, content_type, body = route()
            except Exception:  # a failing check must answer, and never stop the listener
                log.exception("metrics listener: answering %s failed", self.path)
                status, content_type, body = 500, "text/plain; charset=utf-8", b"failed\n"
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        """Requests are not logged: a probe every few seconds would fill the journal."""
