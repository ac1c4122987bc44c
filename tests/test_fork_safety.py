"""A process forked after members loaded (multiprocessing's fork start method, a ``ProcessPoolExecutor``
such as LlamaIndex's ``IngestionPipeline.arun(num_workers=...)``, gunicorn's preload) inherits members
whose worker threads, HTTP connections and in-process llama.cpp servers stayed in the parent. Its first
call waited forever. Now an engine built from names or configs loads its members again in the child,
and a member object built in the parent fails at once, saying why. Every child here is bounded: a hang
fails the test instead of hanging the suite."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

import shared_engine.members as registry
from shared_engine import EnsembleEngine
from shared_engine.errors import MemberError
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from tests import toy
from tests.fixture_server import LlamaCppLike, serve

CHILD_TIMEOUT_S = 60.0


def _in_forked_child(target: Callable[[], Any]) -> Any:
    """``target()``'s value (or the error it raised, as text) in a forked child, within CHILD_TIMEOUT_S."""
    context = multiprocessing.get_context("fork")
    results = context.Queue()

    def run() -> None:
        try:
            results.put(("ok", target()))
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            results.put(("error", f"{type(exc).__name__}: {exc}"))

    child = context.Process(target=run)
    started = time.monotonic()
    child.start()
    child.join(CHILD_TIMEOUT_S)
    if child.is_alive():
        child.kill()
        child.join()
        pytest.fail(f"the forked child hung (killed after {CHILD_TIMEOUT_S:g} s)")
    assert child.exitcode == 0, f"the forked child died (exit code {child.exitcode})"
    return (*results.get(timeout=5), time.monotonic() - started)


@contextmanager
def stand_in_member() -> Iterator[Callable[[], LlamaCppMember]]:
    """Makes LlamaCppMembers connected to a llama.cpp stand-in served by a thread of this process
    (a forked child's connections reach it through the listening socket it inherits)."""
    hf = toy.toy_member("llama-byte", "byte_level", "llama")
    word = hf.table.encode_fragment(" Sofia")[0]
    server = LlamaCppLike(lambda prompt: [(word, -0.1), (word + 1, -2.5)], slots=2)
    with serve(server) as (url, _):
        def make() -> LlamaCppMember:
            tokenizer = LocalTokenizer(hf.tokenizer, hf.table.vocab_size, frozenset(hf.table.eos_ids), 512)
            return LlamaCppMember("toy-llamacpp", url, tokenizer, check_tokenizer=False, pin_slots=True)
        yield make


def _after_a_call(engine: EnsembleEngine) -> None:
    """Answer once here, then let the member's worker thread go idle: that idle worker, which a forked
    child does not have, is what its calls were queued for."""
    assert engine.generate("Hello", max_new_tokens=2).text
    time.sleep(0.2)


def test_an_engine_built_from_names_loads_its_members_again_in_a_forked_child(
        monkeypatch: pytest.MonkeyPatch) -> None:
    with stand_in_member() as make:
        built: list[LlamaCppMember] = []

        def build(config: Any, progress: bool) -> LlamaCppMember:
            built.append(make())
            return built[-1]

        monkeypatch.setattr(registry, "_build", build)
        engine = EnsembleEngine(["llamacpp:http://127.0.0.1:1"], method="single")
        try:
            _after_a_call(engine)
            parent_text = engine.generate("Hello", max_new_tokens=3).text

            def in_child() -> tuple[str, bool, int]:
                text = engine.generate("Hello", max_new_tokens=3).text
                member = engine.members[0]
                engine.close()  # lets go of the child's member, never of the parent's
                return text, member is built[0], getattr(member, "pid", 0)

            status, value, _ = _in_forked_child(in_child)
            assert status == "ok", value
            text, same_member, pid = value
            assert text == parent_text and not same_member and pid != os.getpid()
            assert engine.generate("Hello", max_new_tokens=3).text == parent_text  # the parent's is untouched
        finally:
            engine.close()


def test_a_member_object_from_before_the_fork_fails_at_once_in_the_child() -> None:
    with stand_in_member() as make:
        member = make()
        engine = EnsembleEngine([member], method="single")
        try:
            _after_a_call(engine)
            status, message, took = _in_forked_child(lambda: engine.generate("Hello", max_new_tokens=3).text)
            assert status == "error" and MemberError.__name__ in message, message
            assert "forked" in message and "'spawn'" in message and took < CHILD_TIMEOUT_S / 2
            member.close()  # in the parent: stops as usual
        finally:
            engine.close()


@pytest.mark.zoo
def test_a_forked_child_runs_and_closes_an_in_process_llama_cpp_member() -> None:
    # the child can stop no in-process server: the parent's waited forever for threads the child lacks,
    # its own aborted the child (std::system_error: No such process)
    engine = EnsembleEngine(["smollm2-135m-instruct"], method="single")
    try:
        parent_text = engine.generate("Say hi", max_new_tokens=4).text

        def in_child() -> str:
            text = engine.generate("Say hi", max_new_tokens=4).text
            engine.close()
            other = EnsembleEngine(["smollm2-135m-instruct"], method="single")
            other.generate("Say hi", max_new_tokens=2)
            other.close()
            return text

        status, value, _ = _in_forked_child(in_child)
        assert (status, value) == ("ok", parent_text)
        assert engine.generate("Say hi", max_new_tokens=4).text == parent_text
    finally:
        engine.close()
