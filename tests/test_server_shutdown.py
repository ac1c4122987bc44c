"""Shutting `safe-ensemble serve` down (Ctrl+C, SIGTERM) with requests in flight, on tiny slowed
members in a subprocess: the queued request gets a 503 at once, the running stream its grace, then
a final chunk, an error saying it was cut short and [DONE]; the command exits 0 with no traceback."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.test_server import MODEL, USER, post, sse_payloads_iter, toy_engine

ROOT = Path(__file__).resolve().parents[1]

SERVE = """
import asyncio, sys
from shared_engine.cli import main
from shared_engine.server import command
from tests.test_server import toy_members
from tests.toy import registered_members

command.GRACE_S = 1
members = toy_members()
for member in members:  # a few rounds a second: a 400-token answer outlasts the grace
    async def slow(fn, *args, _original=member.run):
        await asyncio.sleep(0.05)
        return await _original(fn, *args)
    member.run = slow
with registered_members(members) as names:
    sys.exit(main(["serve", "--models", ",".join(names), "--method", "every-token", "--port", sys.argv[1],
                   "--max-active", "1", "--max-waiting", "2"]))
"""


def _wait_until(condition: Any, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@contextmanager
def serving(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str, Path]]:
    """``safe-ensemble serve`` over slow toy members in a child process, up and answering ``/health``:
    the process, its URL and its log file; killed at the end if it is still running."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("w") as out:
        server = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT)
    try:
        def up() -> bool:
            assert server.poll() is None, log.read_text()
            try:
                return httpx.get(f"{url}/health", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        _wait_until(up)
        yield server, url, log
    finally:
        if server.poll() is None:
            server.kill()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_shutdown_answers_queued_requests_and_ends_running_streams(tmp_path: Path, sig: signal.Signals) -> None:
    """Before: uvicorn waited its grace, then cancelled the request tasks: the stream was cut with no
    final chunk or [DONE], the queued request got a plain-text 500, the log a CancelledError traceback
    per request, and SIGTERM killed the process (-15)."""
    with serving(tmp_path) as (server, url, log):
        streamed: list[str] = []
        body = {"model": MODEL, "messages": USER, "max_tokens": 400, "stream": True}

        def stream() -> None:
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
                streamed.extend(sse_payloads_iter(response))

        queued: list[httpx.Response] = []
        running = threading.Thread(target=stream)
        running.start()
        _wait_until(lambda: len(streamed) >= 3)
        waiter = threading.Thread(target=lambda: queued.append(post(url, {"model": MODEL, "messages": USER})))
        waiter.start()
        _wait_until(lambda: httpx.get(f"{url}/health", timeout=5).json()["load"]["waiting"] == 1)
        server.send_signal(sig)
        waiter.join(timeout=60)
        running.join(timeout=60)
        assert server.wait(timeout=60) == 0, log.read_text()
    output = log.read_text()
    assert "Traceback" not in output and "Exception in ASGI" not in output, output
    assert queued and queued[0].status_code == 503, output
    assert queued[0].json()["error"]["code"] == "server_shutting_down"
    assert streamed[-1] == "[DONE]", streamed[-3:]
    final, cut = json.loads(streamed[-3]), json.loads(streamed[-2])
    assert final["choices"][0]["finish_reason"] == "stop" and "stats" in final["ensemble"]
    assert cut["error"] == {"message": "the server shut down before the answer was finished",
                            "type": "server_error", "param": None, "code": "server_shutting_down"}


def test_a_request_to_a_closed_engine_is_a_503_not_a_500() -> None:
    engine = toy_engine()
    with serve_in_background(create_app(engine)) as url:
        engine.close()
        response = post(url, {"model": MODEL, "messages": USER, "max_tokens": 4})
        streamed = httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "Sofia", "stream": True},
                              timeout=60)
    assert response.status_code == streamed.status_code == 503
    assert response.json()["error"] == {"message": "the engine is closed; retry later", "type": "server_error",
                                        "param": None, "code": "server_shutting_down"}


def test_a_whole_answer_the_closing_engine_cuts_short_is_a_503(monkeypatch: pytest.MonkeyPatch) -> None:
    """Not a 200 whose partial text says finish_reason "stop", as if it were the whole answer."""
    engine = toy_engine()
    for member in engine.members:
        original = member.run

        async def slow(fn: Any, *args: Any, _original: Any = original) -> Any:
            await asyncio.sleep(0.05)
            return await _original(fn, *args)

        monkeypatch.setattr(member, "run", slow)
    app = create_app(engine)
    with serve_in_background(app) as url:
        answers: list[httpx.Response] = []
        asking = threading.Thread(target=lambda: answers.append(
            post(url, {"model": MODEL, "messages": USER, "max_tokens": 400})))
        asking.start()
        _wait_until(lambda: engine.live_requests == 1)
        time.sleep(0.3)
        engine.close()
        asking.join(timeout=60)
    assert answers and answers[0].status_code == 503
    assert answers[0].json()["error"]["message"] == ("the server shut down before the answer was finished; "
                                                     "retry later")
