"""An in-process llama.cpp server closed right after it was created: its constructor returns once the
server's task loop runs, since a stop sent before that was lost and closing hung for good."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from shared_engine.errors import MemberError
from shared_engine.members import llamacpp
from shared_engine.members.llamacpp import LocalLlamaServer

ROOT = Path(__file__).resolve().parent.parent

CREATE_AND_CLOSE = """
import sys
from shared_engine.members.llamacpp import LocalLlamaServer
from shared_engine.zoo import gguf_path

gguf = gguf_path("gemma-3-270m", progress=False)
for _ in range(int(sys.argv[1])):
    LocalLlamaServer(gguf, n_ctx=256, threads=2, slots=1).close()
print("closed")
"""


@pytest.mark.zoo
def test_a_server_closed_right_after_its_creation_closes() -> None:
    """xllamacpp's destructor joined the init thread, which went on into a task loop the stop had missed:
    create-then-close hung in 2 of 2 runs on a loaded machine (racy: a subprocess, so a hang fails)."""
    done = subprocess.run([sys.executable, "-c", CREATE_AND_CLOSE, "4"], cwd=ROOT, capture_output=True, text=True,
                          timeout=90)
    assert done.returncode == 0 and "closed" in done.stdout, done.stderr[-2000:]


def test_a_server_whose_loop_never_answers_is_a_readable_error_and_is_never_stopped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing answers at the server's address: a MemberError naming the file, and the server is kept
    (dropping it would join a thread that never ends)."""
    import xllamacpp

    from tests.fixture_server import free_port

    class Silent:
        listening_address = f"127.0.0.1:{free_port()}"

        def __init__(self, params: Any) -> None:
            pass

    monkeypatch.setattr(xllamacpp, "Server", Silent)
    monkeypatch.setattr(llamacpp, "_NEVER_STOPPED", [])
    with pytest.raises(MemberError, match=r"x\.gguf.*did not start serving within 2 s"):
        LocalLlamaServer("x.gguf", n_ctx=64, threads=1, start_timeout_s=2)
    assert [type(s) for s in llamacpp._NEVER_STOPPED] == [Silent]
