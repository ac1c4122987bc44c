"""A loopback HTTP server that replays request/response fixtures (for the remote-member contract
tests) or misbehaves on purpose (for the fault tests). Standard library only.

A fixture file is ``{"exchanges": [{"method", "path", "request", "status", "response"}, ...]}``.
A request is answered only if its method, path and JSON body equal a recorded exchange exactly, so
a member that sends a different request than the documented one fails the test (HTTP 418 with the
body it sent, which the member reports as a MemberError).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures"

Handler = Callable[[str, str, Any], tuple[int, bytes]]


def load_exchanges(*names: str) -> list[dict[str, Any]]:
    exchanges = []
    for name in names:
        exchanges += json.loads((FIXTURES / name).read_text())["exchanges"]
    return exchanges


def replay(exchanges: list[dict[str, Any]]) -> Handler:
    def handle(method: str, path: str, body: Any) -> tuple[int, bytes]:
        for exchange in exchanges:
            if exchange["method"] == method and exchange["path"] == path and exchange.get("request") == body:
                return exchange.get("status", 200), json.dumps(exchange["response"]).encode()
        return 418, json.dumps({"unmatched": {"method": method, "path": path, "request": body}}).encode()
    return handle


@contextmanager
def serve(handler: Handler) -> Iterator[tuple[str, list[tuple[str, str, Any]]]]:
    """Serve ``handler`` on a free loopback port; yields (base URL, log of requests received)."""
    log: list[tuple[str, str, Any]] = []

    class _Handler(BaseHTTPRequestHandler):
        def _serve(self, method: str) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            body = json.loads(raw) if raw else None
            log.append((method, self.path, body))
            status, payload = handler(method, self.path, body)
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def do_GET(self) -> None:  # noqa: N802
            self._serve("GET")

        def do_POST(self) -> None:  # noqa: N802
            self._serve("POST")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", log
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def silent_socket() -> Iterator[str]:
    """A server that accepts connections (and reads requests) but never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    accepted: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
                accepted.append(conn)
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join()
        for conn in accepted:
            conn.close()
        listener.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
