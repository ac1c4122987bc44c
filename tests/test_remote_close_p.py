"""A remote call ends when its member is closed or its await is cancelled, and waits as the server asks.

Hunt 242 F2: ``JsonClient.close()`` (and Ctrl-C, a cancelled task) left a request in flight running to
its deadline, retries included, and the process could not exit before: closing a socket does not wake a
thread blocked reading it. F3: ``Retry-After`` and llama.cpp's "Loading model" 503 were ignored (three
attempts in under a second, then a failure). Every bound here is generous (seconds where the old code
took the 30 s deadline, or never waited): a loaded machine cannot make them fail.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import SimpleNamespace
from typing import Any

import pytest

from shared_engine.errors import MemberError
from shared_engine.members.http import HttpSettings, JsonClient, _retry_after
from shared_engine.members.remote import RemoteMember, member_executor

Answer = tuple[int, dict[str, str], bytes] | None
"""(status, headers, body), or None: never answer, wait for the client to go away."""

LOADING = json.dumps({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}).encode()


class Server:
    """A loopback server answering each request with ``answer(number)``; records when each came and
    when a client it never answered went away."""

    def __init__(self, answer: Callable[[int], Answer]) -> None:
        self.answer = answer
        self.arrived: list[float] = []
        self.gone = threading.Event()
        self.stop = threading.Event()

    def hang(self, connection: socket.socket) -> None:
        while not self.stop.is_set():
            readable, _, _ = select.select([connection], [], [], 0.1)
            if readable and not connection.recv(1, socket.MSG_PEEK):
                self.gone.set()
                return


@contextmanager
def serving(answer: Callable[[int], Answer]) -> Iterator[tuple[str, Server]]:
    state = Server(answer)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _serve(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            if length:
                self.rfile.read(length)
            state.arrived.append(time.monotonic())
            answered = state.answer(len(state.arrived))
            if answered is None:
                state.hang(self.connection)
                self.close_connection = True
                return
            status, headers, payload = answered
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            for key, value in headers.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(payload)

        do_GET = do_POST = _serve  # noqa: N815

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        state.stop.set()
        server.shutdown()
        server.server_close()


def in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def wait_for(condition: Callable[[], bool], seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < end, "the server never got the request"
        time.sleep(0.02)


def test_close_ends_a_request_in_flight_at_once_and_it_is_not_retried() -> None:
    with serving(lambda n: None) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=30, retries=2, backoff_s=0.01))
        thread, out = in_thread(lambda: client.post("/v1/completions", {}))
        wait_for(lambda: bool(server.arrived))
        client.close()
        thread.join(10)  # the deadline is 30 s: the old code ran to it (and retried)
        assert not thread.is_alive()
        assert server.gone.wait(10)
        assert isinstance(out[0], MemberError) and "the member is closed" in str(out[0])
        assert len(server.arrived) == 1


def test_cancelling_a_member_call_ends_its_request() -> None:
    """``RemoteMember.run`` cancelled (a cancelled task, Ctrl-C): the server sees the client go away."""
    with serving(lambda n: None) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=30, retries=2, backoff_s=0.01))
        member = SimpleNamespace(forked_away=lambda: False, executor=member_executor("m", 2), client=client,
                                 cancel_ends_call=True)  # a vLLM or SGLang member: not llama.cpp
        finished: list[Any] = []

        def post() -> Any:
            try:
                return client.post("/v1/completions", {})
            finally:
                finished.append(time.monotonic())

        async def cancel() -> None:
            task = asyncio.ensure_future(RemoteMember.run(member, post))  # type: ignore[arg-type]
            while not server.arrived:
                await asyncio.sleep(0.02)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        try:
            asyncio.run(asyncio.wait_for(cancel(), 20))
            assert server.gone.wait(10)  # the old code kept the request open until its 30 s deadline
            wait_for(lambda: bool(finished), 10)
            assert len(server.arrived) == 1  # not sent again
        finally:
            member.executor.shutdown(wait=False)
            client.close()


@pytest.mark.parametrize(("asked", "least_gap"), [
    ("2", 1.9),  # the old code came back after its 0.01 s backoff
    # review of 7614110: a wait of no time (or a date already past: a server's clock a little behind) read as
    # a deadline of waiting spent: one attempt, then the failure
    ("0", 0.0), ("-5", 0.0), ("Thu, 01 Jan 2026 00:00:00 GMT", 0.0),
])
def test_retry_after_is_waited_for(asked: str, least_gap: float) -> None:
    def answer(n: int) -> Answer:
        return (503, {"Retry-After": asked}, b"busy") if n == 1 else (200, {}, b'{"ok": true}')

    with serving(answer) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=30, retries=2, backoff_s=0.01))
        try:
            assert client.get("/props") == {"ok": True}
        finally:
            client.close()
    assert len(server.arrived) == 2 and server.arrived[1] - server.arrived[0] >= least_gap


def test_retry_after_is_cut_to_the_deadline_and_the_error_says_how_long_it_waited() -> None:
    with serving(lambda n: (429, {"Retry-After": "3600"}, b"slow down")) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=1.5, retries=5, backoff_s=0.01))
        thread, out = in_thread(lambda: client.get("/props"))
        thread.join(30)
        client.close()
    assert not thread.is_alive()
    assert isinstance(out[0], MemberError)
    assert "waited 1.5 s as the server asked" in str(out[0]) and "HTTP 429: slow down" in str(out[0])


def test_closing_ends_a_wait_the_server_asked_for() -> None:
    with serving(lambda n: (503, {"Retry-After": "3600"}, b"busy")) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=60, retries=2, backoff_s=0.01))
        thread, out = in_thread(lambda: client.get("/props"))
        wait_for(lambda: bool(server.arrived))
        time.sleep(0.2)
        client.close()
        thread.join(10)
    assert not thread.is_alive()
    assert isinstance(out[0], MemberError) and "the member is closed" in str(out[0])
    assert len(server.arrived) == 1


def test_a_llamacpp_server_loading_its_model_is_asked_again_until_it_answers() -> None:
    """llama.cpp answers 503 "Loading model" while it loads (seconds to minutes): not a retry to spend."""
    with serving(lambda n: (503, {}, LOADING) if n <= 2 else (200, {}, b'{"ok": true}')) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=30, retries=0))
        try:
            assert client.get("/props") == {"ok": True}
        finally:
            client.close()
    assert len(server.arrived) == 3


def test_a_model_that_never_loads_fails_after_a_deadline_of_waiting() -> None:
    with serving(lambda n: (503, {}, LOADING)) as (url, server):
        client = JsonClient("m", url, HttpSettings(timeout_s=2, retries=0))
        thread, out = in_thread(lambda: client.get("/props"))
        thread.join(30)
        client.close()
    assert not thread.is_alive()
    assert isinstance(out[0], MemberError) and "member 'm'" in str(out[0])
    assert "waited 2.0 s as the server asked" in str(out[0]) and "Loading model" in str(out[0])


def test_retry_after_reads_seconds_and_http_dates() -> None:
    assert _retry_after("3") == 3.0
    assert _retry_after(None) is None and _retry_after("soon") is None
    ahead = _retry_after(formatdate(time.time() + 30, usegmt=True))
    assert ahead is not None and 20 < ahead <= 31
    assert _retry_after(formatdate(time.time() - 30, usegmt=True)) == 0.0
