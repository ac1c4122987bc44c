"""A loopback HTTP server that replays request/response fixtures (for the remote-member contract
tests) or misbehaves on purpose (for the fault tests). Standard library only.

A fixture file is ``{"exchanges": [{"method", "path", "request", "status", "response"}, ...]}``.
A request is answered only if its method, path and JSON body equal a recorded exchange exactly, so
a member that sends a different request than the documented one fails the test (HTTP 418 with the
body it sent, which the member reports as a MemberError).

``LlamaCppLike`` stands in for a llama.cpp server (answers computed by the test) and records the
``id_slot`` every call sends (tests/test_llamacpp_slots.py).
"""

from __future__ import annotations

import json
import socket
import threading
import time
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


NextLogprobs = Callable[[list[int]], list[tuple[int, float]]]
"""Top-K (id, logprob) pairs of the token after a prompt, best first."""


class LlamaCppLike:
    """A llama.cpp server stand-in (a ``serve`` handler): ``GET /props`` (``n_ctx``,
    ``total_slots``) and ``POST /completion`` with ``n_probs`` top-K answers from ``next_logprobs``,
    one per prompt of a multi-prompt request. It records the ``id_slot`` of every call, how many
    calls ran at once, and every time a slot was asked for while a call in it was still running
    (llama.cpp would queue it: two requests sharing a slot). ``fail_on_call`` answers that call
    (1-based) with an HTTP 400 (a member error, not retried)."""

    def __init__(self, next_logprobs: NextLogprobs, slots: int, n_ctx: int = 512, delay_s: float = 0.0,
                 fail_on_call: int | None = None, report_slots: bool = True) -> None:
        self.next_logprobs, self.slots, self.n_ctx, self.delay_s = next_logprobs, slots, n_ctx, delay_s
        self.fail_on_call, self.report_slots = fail_on_call, report_slots
        self.slot_of_call: list[int | None] = []  # id_slot of every /completion, None when not sent
        self.first_prompt_of_call: list[list[int]] = []
        self.prompts_and_cache_of_call: list[tuple[int, bool]] = []  # (number of prompts, cache_prompt)
        self.collisions = 0
        self.max_in_flight = 0
        self._busy: set[int] = set()
        self._in_flight = 0
        self._lock = threading.Lock()

    def __call__(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        if (method, path) == ("GET", "/props"):
            props: dict[str, Any] = {"default_generation_settings": {"n_ctx": self.n_ctx}}
            if self.report_slots:
                props["total_slots"] = self.slots
            return 200, json.dumps(props).encode()
        if (method, path) != ("POST", "/completion"):
            return 404, b'{"error": "not here"}'
        slot = body.get("id_slot")
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        with self._lock:
            self.slot_of_call.append(slot)
            self.first_prompt_of_call.append(prompts[0])
            self.prompts_and_cache_of_call.append((len(prompts), bool(body.get("cache_prompt", True))))
            number = len(self.slot_of_call)
            if slot is not None:
                self.collisions += slot in self._busy
                self._busy.add(slot)
            self._in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self._in_flight)
        try:
            if self.delay_s:
                time.sleep(self.delay_s)
            if number == self.fail_on_call:
                return 400, b'{"error": {"message": "the stand-in fails this call on purpose"}}'
            results = [{"index": i, "id_slot": slot if slot is not None else -1,
                        "completion_probabilities": [{"top_logprobs": [
                            {"id": t, "logprob": lp} for t, lp in self.next_logprobs(prompt)[:body["n_probs"]]]}]}
                       for i, prompt in enumerate(prompts)]
            return 200, json.dumps(results if len(results) > 1 else results[0]).encode()
        finally:
            with self._lock:
                self._in_flight -= 1
                self._busy.discard(slot)
