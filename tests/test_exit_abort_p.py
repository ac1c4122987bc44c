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
