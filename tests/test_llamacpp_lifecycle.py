"""An in-process llama.cpp server's life: a GGUF it cannot load is refused by name, and closing a
member waits for its calls still running (a cancelled request's) instead of dropping the server
under them, off the event loop when an engine lets go of it."""

from __future__ import annotations

import asyncio
import struct
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from shared_engine import EnsembleEngine
from shared_engine.errors import InvalidRequestError, MemberError
from shared_engine.members import load_member, register_member, unregister_member
from shared_engine.members.llamacpp import LlamaCppMember, LocalLlamaServer
from shared_engine.members.remote import LocalTokenizer
from tests import toy
from tests.fixture_server import LlamaCppLike, serve
from tests.loop_watch import loop_gaps
from tests.test_llamacpp_slots import PROMPTS, _wait_for, toy_next_logprobs

# ------------------------------------------------------------------ a GGUF llama.cpp cannot load


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF garbage" * 10)
    return path


def test_a_gguf_llamacpp_cannot_read_is_refused_naming_the_file(tmp_path: Path) -> None:
    """llama.cpp's own error says only "Failed to init server, please check the input params"."""
    bad = _garbage(tmp_path)
    with pytest.raises(InvalidRequestError, match="is not a readable GGUF file") as raised:
        LocalLlamaServer(bad, n_ctx=64, threads=1, slots=1)
    assert str(bad) in str(raised.value) and "\n" not in str(raised.value)
    headless = tmp_path / "empty.gguf"
    headless.write_bytes(b"")
    with pytest.raises(InvalidRequestError, match="is not a readable GGUF file") as raised:
        LocalLlamaServer(headless, n_ctx=64, threads=1, slots=1)
    assert str(headless) in str(raised.value)


def test_a_gguf_whose_header_reads_but_llamacpp_cannot_load_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A header and nothing after it (no architecture, no tensors): the header check passes, llama.cpp fails."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 0))
    with pytest.raises(InvalidRequestError, match="could not load") as raised:
        LocalLlamaServer(cut, n_ctx=64, threads=1, slots=1)
    assert str(cut) in str(raised.value) and "xllamacpp" in str(raised.value)


def test_a_bad_gguf_with_an_explicit_tokenizer_is_one_error_naming_the_file(tmp_path: Path) -> None:
    """``llamacpp:/path/bad.gguf#TOKENIZER``: the tokenizer loads (it is not read from the GGUF), so
    only llama.cpp met the file: a 51-line traceback ending in ``RuntimeError: Failed to init server``.
    Without ``#TOKENIZER`` the same file was already refused by name (read for its tokenizer)."""
    bad = _garbage(tmp_path)
    folder = tmp_path / "tokenizer"
    toy.TOKENIZERS["byte_level"]().save_pretrained(folder)
    with pytest.raises(InvalidRequestError, match="is not a readable GGUF file") as raised:
        load_member(f"llamacpp:{bad}#{folder}", progress=False)
    assert str(bad) in str(raised.value)


# ------------------------------------------------------------------ closing with a call running


class InProcess:
    """Stands for a ``LocalLlamaServer`` in front of the stand-in: its ``close`` records how many
    calls the server was still answering (xllamacpp's server dropped under a running /completion
    stops answering it: the call, and whatever waits for it, waited the client's whole timeout)."""

    def __init__(self, stand_in: LlamaCppLike, url: str) -> None:
        self.stand_in, self.url, self.slots = stand_in, url, stand_in.slots
        self.gguf = Path("stand-in.gguf")
        self.running_at_close: list[int] = []

    def close(self) -> None:
        self.running_at_close.append(self.stand_in._in_flight)


@contextmanager
def in_process(delay_s: float) -> Iterator[tuple[LlamaCppMember, LlamaCppLike, InProcess]]:
    """A LlamaCppMember over an "in-process" server (the stand-in, answering after ``delay_s``)."""
    hf = toy.toy_member("llama-byte", "byte_level", "llama")
    stand_in = LlamaCppLike(toy_next_logprobs(hf), 2, delay_s=delay_s)
    with serve(stand_in) as (url, _):
        server = InProcess(stand_in, url)
        tokenizer = LocalTokenizer(hf.tokenizer, hf.table.vocab_size, frozenset(hf.table.eos_ids), 512)
        member = LlamaCppMember("toy-in-process", url, tokenizer, context_window=512, check_tokenizer=False,
                                server=server)  # type: ignore[arg-type]
        try:
            yield member, stand_in, server
        finally:
            member.close()


def test_closing_a_member_waits_for_its_running_call_before_dropping_its_server() -> None:
    with in_process(delay_s=0.5) as (member, stand_in, server):
        ids = member.prompt_ids([{"role": "user", "content": PROMPTS[0]}])
        outcome: list[Any] = []

        def call() -> None:
            try:
                outcome.append(member.new_session().sync(ids, len(ids)).shape)
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                outcome.append(exc)

        caller = threading.Thread(target=call)
        caller.start()
        assert _wait_for(lambda: stand_in.slot_of_call != [])
        member.close()  # the call is still running in the server
        caller.join(5)
        assert server.running_at_close == [0], "the server was dropped under a running call"
        assert len(outcome) == 1 and not isinstance(outcome[0], Exception), outcome
        with pytest.raises(MemberError, match="the member is closed"):
            member.new_session().sync(ids, len(ids))
        assert len(stand_in.slot_of_call) == 1


@pytest.mark.parametrize("closed", ["while the request runs", "after the request was cancelled"])
def test_an_engine_lets_go_of_its_members_off_the_event_loop(closed: str) -> None:
    """The engine's last hold on a llama.cpp member closes it; that waits for the call a cancelled
    request left running, and on the event loop it froze every other coroutine that long (60 s with
    a real in-process server, which never answered the call it was dropped under)."""
    with in_process(delay_s=1.0) as (member, stand_in, server):
        register_member(member, "toy-in-process")
        engine = EnsembleEngine(["toy-in-process"], method="single")
        assert engine.members == [member]
        unregister_member("toy-in-process")  # the engine's hold is the last one

        async def run() -> float:
            async with loop_gaps() as gaps:
                task = asyncio.create_task(engine.agenerate(PROMPTS[0], max_new_tokens=8))
                while not stand_in.slot_of_call:
                    await asyncio.sleep(0.005)
                if closed == "while the request runs":
                    engine.close()  # the request lets go of the member when it ends
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                if closed != "while the request runs":
                    await engine.aclose()
                while not server.running_at_close:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.05)  # the next tick records a freeze, if any
            return max(gaps)

        frozen = asyncio.run(run())
        assert server.running_at_close == [0]
        assert frozen < 0.5, f"the event loop was frozen {frozen:.2f} s"
