"""A process ends promptly with a member call in flight (p, cookbook hunt): after Ctrl-C during a long prompt's
prefill in an in-process llama.cpp server the process took 158 s to exit. Two waits: the members' worker thread,
joined at exit (``concurrent.futures``), stayed blocked reading the server's answer (no deadline on a local
server); then stopping the server waited for its loop's turn, up to 2,048 prompt tokens of prefill."""

from __future__ import annotations

import socket
import subprocess
import sys
import textwrap
import time
from typing import Any

import pytest

import shared_engine.members.llamacpp as llamacpp
from shared_engine.errors import InvalidRequestError


def test_a_process_exits_with_a_member_call_blocked_on_a_silent_server() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # accepts (the kernel does), never answers
    port = listener.getsockname()[1]
    child = textwrap.dedent(f"""
        import time
        from shared_engine.members.http import HttpSettings, JsonClient
        from shared_engine.members.remote import member_executor
        client = JsonClient("m", "http://127.0.0.1:{port}", HttpSettings(timeout_s=float("inf")))
        member_executor("m", 1).submit(client.post, "/completion", {{}})
        time.sleep(1.0)  # the call is blocked reading; the main thread ends (as after Ctrl-C)
        print("main done", flush=True)
        raise KeyboardInterrupt  # the main thread ends as after Ctrl-C
    """)
    start = time.monotonic()
    try:
        done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=60)
    finally:
        listener.close()
    assert "main done" in done.stdout, done.stderr
    assert time.monotonic() - start < 30, "the exit waited for the blocked call"  # before: until the timeout


def test_the_in_process_server_turns_its_loop_every_physical_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # a stop (close, the process ending) or a cancel is seen between turns of the server's loop: with
    # llama.cpp's logical batch of 2,048 one turn was up to 2,048 prompt tokens (77 s on this machine)
    seen: dict[str, Any] = {}

    class Server:
        def __init__(self, params: Any) -> None:
            seen.update(n_batch=params.n_batch, n_ubatch=params.n_ubatch)
            raise RuntimeError("not started in this test")

    import xllamacpp
    monkeypatch.setattr(xllamacpp, "Server", Server)
    with pytest.raises(InvalidRequestError):  # the missing file named
        llamacpp.LocalLlamaServer("missing.gguf")
    assert seen["n_batch"] == seen["n_ubatch"] == 512  # the same ubatches as before: the same numbers


def _slow(_number: int) -> tuple[int, dict[str, str], bytes] | None:
    time.sleep(1.5)
    return 200, {}, b'{"ok": 1}'


def _child(port: int, body: str) -> subprocess.CompletedProcess[str]:
    """A script run as its own process against a server at ``port``: its output, within a generous bound."""
    script = textwrap.dedent(f"""
        import threading, time
        from shared_engine.members.http import Call, HttpSettings, JsonClient, in_call
        from shared_engine.members.remote import member_executor
        client = JsonClient("m", "http://127.0.0.1:{port}", HttpSettings(timeout_s=float("inf"), retries=0))
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


def test_a_normal_end_waits_for_a_threads_call_but_not_for_an_orphaned_one() -> None:
    # review of c9c1bee: the exit hook gave up every call, so a non-daemon thread's call failed 'the process is
    # exiting' at a script's normal end (Python waits for such threads). Only a call nobody awaits (a cancelled
    # request's llama.cpp call, orphaned) is given up then: a Ctrl-C the script caught and went on from
    from tests.test_remote_close_p import serving

    with serving(_slow) as (url, _state):
        port = int(url.rsplit(":", 1)[1])
        waited = _child(port, """
            out = []
            threading.Thread(target=lambda: out.append(client.get("/x")) or print(out, flush=True)).start()
            time.sleep(0.3)
        """)
        assert "{'ok': 1}" in waited.stdout, waited.stderr
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()  # never answers
    try:
        start = time.monotonic()
        orphaned = _child(listener.getsockname()[1], """
            call = Call()
            member_executor("m", 1).submit(in_call, call, client.post, "/completion", {})
            time.sleep(1.0)
            call.orphaned = True  # as RemoteMember.run marks a cancelled llama.cpp call
            print("main done", flush=True)
        """)
    finally:
        listener.close()
    assert "main done" in orphaned.stdout, orphaned.stderr
    assert time.monotonic() - start < 30


def test_a_forked_child_ending_leaves_the_parents_call_alone() -> None:
    # review of c9c1bee: a child forked while the parent's call was in flight ran the exit hook over its copies
    # of the parent's clients, and shutting an inherited socket ended the parent's request
    from tests.test_remote_close_p import serving

    with serving(_slow) as (url, state):
        port = int(url.rsplit(":", 1)[1])
        done = _child(port, """
            import multiprocessing
            out = []
            worker = threading.Thread(target=lambda: out.append(client.get("/x")))
            worker.start()
            time.sleep(0.5)
            child = multiprocessing.get_context("fork").Process(target=lambda: None)
            child.start()
            child.join()
            worker.join()
            print(out, flush=True)
        """)
        assert "{'ok': 1}" in done.stdout, done.stderr
        assert len(state.arrived) == 1
