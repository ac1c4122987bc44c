"""llama.cpp slots, one per active request, against a llama.cpp stand-in (tests/fixture_server.py)
whose answers come from a tiny random transformers model: every /completion of a session carries
its slot, concurrent requests run at once in different slots, slots come back however a request
ends, requests beyond the slots go without one, and the slot count has one default
(``DEFAULT_MAX_ACTIVE``) for the HTTP server and the in-process llama.cpp servers."""

from __future__ import annotations

import asyncio
import gc
import inspect
import threading
import time
from collections.abc import Iterator
from contextlib import aclosing, contextmanager
from typing import Any

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.engine_args import engine_from_args
from shared_engine.errors import MemberError
from shared_engine.members import HFMember, MemberConfig
from shared_engine.members.llamacpp import LlamaCppMember, LocalLlamaServer, SlotPool
from shared_engine.members.remote import LocalTokenizer
from shared_engine.options import DEFAULT_MAX_ACTIVE
from tests import toy
from tests.fixture_server import LlamaCppLike, serve

PROMPTS = ["Tell me about Sofia.", "What is a hash table?", "Name three colors.", "Hello there, how are you?"]
TOKENS = 12


def _toy() -> HFMember:
    return toy.toy_member("llama-byte", "byte_level", "llama")


def toy_next_logprobs(hf: HFMember, k: int = 20):  # type: ignore[no-untyped-def]
    """The top-``k`` after a prompt, computed by the toy model (what the stand-in answers)."""
    def next_logprobs(prompt: list[int]) -> list[tuple[int, float]]:
        with torch.no_grad():
            row = torch.log_softmax(hf.new_session().sync(prompt, len(prompt))[-1], -1)
        values, ids = row.topk(k)
        return list(zip(ids.tolist(), values.tolist()))
    return next_logprobs


@contextmanager
def stand_in(slots: int, reuse_prompt_cache: bool = False,
             **options: object) -> Iterator[tuple[LlamaCppMember, LlamaCppLike]]:
    """A LlamaCppMember connected to a llama.cpp stand-in with ``slots`` slots, pinning them as on a
    server of its own (``pin_slots``; tests/test_llamacpp_shared_server.py: a server shared at a URL)."""
    hf = _toy()
    server = LlamaCppLike(toy_next_logprobs(hf), slots, **options)  # type: ignore[arg-type]
    with serve(server) as (url, _):
        tokenizer = LocalTokenizer(hf.tokenizer, hf.table.vocab_size, frozenset(hf.table.eos_ids), 512)
        member = LlamaCppMember("toy-llamacpp", url, tokenizer, check_tokenizer=False,
                                reuse_prompt_cache=reuse_prompt_cache, pin_slots=True)
        try:
            yield member, server
        finally:
            member.close()


def _prompt_ids(member: LlamaCppMember, text: str) -> list[int]:
    return member.prompt_ids([{"role": "user", "content": text}])


# ------------------------------------------------------------------ the pool and the session


def test_slot_pool_leases_the_lowest_free_slot_and_refuses_a_double_return() -> None:
    pool = SlotPool(2)
    assert (pool.lease(), pool.lease(), pool.lease()) == (0, 1, None)
    pool.give_back(0)
    assert pool.leased == 1 and pool.lease() == 0
    with pytest.raises(ValueError):
        pool.give_back(5)
    pool.give_back(1)
    with pytest.raises(ValueError):
        pool.give_back(1)


def test_each_session_sends_its_own_slot_in_every_completion_and_gives_it_back() -> None:
    with stand_in(slots=2) as (member, server):
        assert member.slots.size == 2  # read from the server's /props
        first, second, third = member.new_session(), member.new_session(), member.new_session()
        assert (first.slot, second.slot, third.slot) == (0, 1, None)  # more sessions than slots
        a, b = _prompt_ids(member, PROMPTS[0]), _prompt_ids(member, PROMPTS[1])
        first.sync(a, len(a))
        second.sync(b, len(b))
        first.step(5)
        first.sync(a + [5, 6, 7], len(a) + 1)  # a block: one multi-prompt call, in the same slot
        third.sync(b, len(b))
        assert server.slot_of_call == [0, 1, 0, 0, None]
        assert member.slots.leased == 2
        first.close()
        first.close()  # idempotent
        assert member.slots.leased == 1 and member.new_session().slot == 0
        gc.collect()  # that session was never closed: collecting it returns the slot
        assert member.slots.leased == 1
        second.close()
        assert member.slots.leased == 0


def test_a_sessions_first_call_computes_its_prompt_from_position_0_and_later_calls_extend_it() -> None:
    """Whatever the slot held before, a request's rows start from one batch of its own prompt
    (``cache_prompt: false``); a first call that scores a block sends that prompt alone first."""
    with stand_in(slots=2) as (member, server):
        ids = _prompt_ids(member, PROMPTS[0])
        drafter, verifier = member.new_session(), member.new_session()
        drafter.sync(ids, len(ids))
        drafter.step(5)
        verifier.sync(ids + [5, 6, 7], len(ids))  # a verifier's first call: a block of 4 rows
        verifier.sync(ids + [5, 6, 7, 8], len(ids) + 4)
        assert server.prompts_and_cache_of_call == [(1, False), (1, True), (1, False), (3, True), (1, True)]
        assert server.slot_of_call == [0, 0, 1, 1, 1]
        drafter.close()
        verifier.close()


def test_reuse_prompt_cache_lets_a_first_call_extend_what_the_slot_holds() -> None:
    """The speed setting: no call of the session asks the server to recompute from position 0,
    and a first call that scores a block sends all its rows in one request."""
    with stand_in(slots=1, reuse_prompt_cache=True) as (member, server):
        ids = _prompt_ids(member, PROMPTS[0])
        session = member.new_session()
        session.sync(ids + [5, 6, 7], len(ids))
        session.step(8)
        assert server.prompts_and_cache_of_call == [(4, True), (1, True)]
        session.close()
    config = MemberConfig(model="llamacpp:http://127.0.0.1:1", reuse_prompt_cache=True)
    assert config.backend_options() == {"reuse_prompt_cache": True}
    assert config.key != MemberConfig(model="llamacpp:http://127.0.0.1:1").key
    assert MemberConfig(model="llamacpp:http://127.0.0.1:1", reuse_prompt_cache=False).key == \
        MemberConfig(model="llamacpp:http://127.0.0.1:1").key
    with pytest.raises(ValueError, match="reuse_prompt_cache: only for llama.cpp members"):
        MemberConfig(model="vllm:http://127.0.0.1:1#x", reuse_prompt_cache=True)


def test_a_server_that_does_not_report_its_slots_gets_no_id_slot() -> None:
    with stand_in(slots=3, report_slots=False) as (member, server):
        session = member.new_session()
        ids = _prompt_ids(member, PROMPTS[0])
        session.sync(ids, len(ids))
        assert member.slots.size == 0 and session.slot is None and server.slot_of_call == [None]


# ------------------------------------------------------------------ concurrent requests through the engine


async def _answers(engine: EnsembleEngine, prompts: list[str]) -> list[str]:
    results = await asyncio.gather(*(engine.agenerate(p, max_new_tokens=TOKENS) for p in prompts))
    return [r.text for r in results]


def test_concurrent_requests_run_at_once_each_in_its_own_slot_with_the_answers_they_get_alone() -> None:
    with stand_in(slots=4, delay_s=0.02) as (member, server):
        engine = EnsembleEngine([member], method="single")
        alone = [engine.generate(p, max_new_tokens=TOKENS).text for p in PROMPTS]
        assert set(server.slot_of_call) == {0}  # one at a time: always the lowest slot
        server.slot_of_call.clear()
        server.max_in_flight = 0
        together = asyncio.run(_answers(engine, PROMPTS))
        assert together == alone
        assert set(server.slot_of_call) == {0, 1, 2, 3}
        assert server.collisions == 0  # no two requests ever used one slot at once
        assert server.max_in_flight >= 2  # no lock in front of the member: calls overlapped
        assert member.slots.leased == 0
    # and the stand-in's answers are the toy model's own greedy answers
    assert alone[0] == EnsembleEngine([_toy()], method="single").generate(PROMPTS[0], max_new_tokens=TOKENS).text


def test_requests_beyond_the_slots_run_without_one_and_answer_the_same() -> None:
    with stand_in(slots=1, delay_s=0.02) as (member, server):
        engine = EnsembleEngine([member], method="single")
        alone = [engine.generate(p, max_new_tokens=TOKENS).text for p in PROMPTS[:3]]
        server.slot_of_call.clear()
        server.first_prompt_of_call.clear()
        assert asyncio.run(_answers(engine, PROMPTS[:3])) == alone
        # one request held slot 0 for all of its calls; the other two sent no id_slot
        prompts = [_prompt_ids(member, p) for p in PROMPTS[:3]]
        slots_by_request: dict[int, set[int | None]] = {}
        for slot, sent in zip(server.slot_of_call, server.first_prompt_of_call):
            request = next(i for i, ids in enumerate(prompts) if sent[:len(ids)] == ids)
            slots_by_request.setdefault(request, set()).add(slot)
        assert sorted(slots_by_request.values(), key=str) == [{0}, {None}, {None}]
        assert server.collisions == 0 and member.slots.leased == 0


def test_slots_come_back_when_a_request_fails_or_is_cancelled() -> None:
    with stand_in(slots=2, fail_on_call=3) as (member, server):
        engine = EnsembleEngine([member], method="single")
        with pytest.raises(MemberError, match="on purpose"):
            engine.generate(PROMPTS[0], max_new_tokens=TOKENS)
        assert member.slots.leased == 0

        async def break_off() -> None:  # the consumer stops reading after the first token
            async with aclosing(engine.astream(PROMPTS[1], max_new_tokens=TOKENS)) as events:
                async for event in events:
                    if event.type == "token":
                        assert member.slots.leased == 1
                        break

        async def cancel() -> None:  # the task running the request is cancelled mid-answer
            server.delay_s = 0.05
            task = asyncio.create_task(engine.agenerate(PROMPTS[2], max_new_tokens=TOKENS))
            while member.slots.leased == 0:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(break_off())
        assert member.slots.leased == 0
        asyncio.run(cancel())
        assert engine.live_requests == 0
        assert _wait_for(lambda: member.slots.leased == 0)  # once the cancelled call has ended in its thread



def _wait_for(condition, timeout_s: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_a_session_closed_during_a_call_keeps_its_slot_until_the_call_ends_and_starts_no_other() -> None:
    with stand_in(slots=2, delay_s=0.4) as (member, server):
        session = member.new_session()
        ids = _prompt_ids(member, PROMPTS[0])
        caller = threading.Thread(target=session.sync, args=(ids, len(ids)))
        caller.start()
        assert _wait_for(lambda: server.slot_of_call == [0])
        session.close()  # the call is still running in slot 0
        other = member.new_session()
        assert member.slots.leased == 2 and other.slot == 1
        caller.join()
        assert member.slots.leased == 1  # slot 0 came back when the call ended
        with pytest.raises(MemberError, match="closed session"):
            session.step(5)
        assert len(server.slot_of_call) == 1
        other.close()
        assert member.slots.leased == 0


def test_the_next_request_never_gets_the_slot_of_a_cancelled_request_whose_call_still_runs() -> None:
    with stand_in(slots=2, delay_s=0.6) as (member, server):
        engine = EnsembleEngine([member], method="single")

        async def cancel_then_ask() -> None:
            task = asyncio.create_task(engine.agenerate(PROMPTS[0], max_new_tokens=4))
            while not server.slot_of_call:
                await asyncio.sleep(0.005)
            await asyncio.sleep(0.1)  # the first call (slot 0) is in flight in a worker thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert member.slots.leased == 1  # slot 0 is still busy with the cancelled call
            await engine.agenerate(PROMPTS[1], max_new_tokens=2)

        asyncio.run(cancel_then_ask())
        assert server.slot_of_call[0] == 0 and set(server.slot_of_call[1:]) == {1}
        assert server.collisions == 0
        assert _wait_for(lambda: member.slots.leased == 0)


def test_safe_over_two_llamacpp_members_gives_every_request_a_slot_in_each() -> None:
    hf_b = toy.toy_member("gpt2-meta", "metaspace", "gpt2", seed=1)
    with stand_in(slots=2, delay_s=0.01) as (drafter, drafter_server), \
            serve(LlamaCppLike(toy_next_logprobs(hf_b), 2, delay_s=0.01)) as (url, _):
        tokenizer = LocalTokenizer(hf_b.tokenizer, hf_b.table.vocab_size, frozenset(hf_b.table.eos_ids), 512)
        verifier = LlamaCppMember("toy-verifier", url, tokenizer, check_tokenizer=False)
        engine = EnsembleEngine([drafter, verifier], method="safe")
        alone = [engine.generate(p, max_new_tokens=TOKENS).text for p in PROMPTS[:2]]
        assert asyncio.run(_answers(engine, PROMPTS[:2])) == alone
        assert {0, 1} <= set(drafter_server.slot_of_call) and drafter_server.collisions == 0
        assert drafter.slots.leased == verifier.slots.leased == 0
        verifier.close()


# ------------------------------------------------------------------ one default for slots and admission


def test_in_process_llamacpp_slots_default_to_the_requests_the_server_admits() -> None:
    from shared_engine.cli import build_parser
    from shared_engine.server.app import create_app

    assert inspect.signature(LocalLlamaServer).parameters["slots"].default == DEFAULT_MAX_ACTIVE
    assert inspect.signature(LlamaCppMember.from_gguf).parameters["slots"].default == DEFAULT_MAX_ACTIVE
    assert inspect.signature(create_app).parameters["max_active"].default == DEFAULT_MAX_ACTIVE
    serve_args = build_parser().parse_args(["serve", "--models", "llamacpp:a,b,llamacpp:http://h:1"])
    assert serve_args.max_active == DEFAULT_MAX_ACTIVE
    # the default is the loader's: the same registry member as asking for it explicitly
    assert MemberConfig(model="llamacpp:a").key == MemberConfig(model="llamacpp:a", slots=DEFAULT_MAX_ACTIVE).key
    # serve --max-active N: N slots for every in-process llama.cpp member that sets none (members
    # load lazily: nothing starts here)
    args = build_parser().parse_args(["serve", "--models", "llamacpp:a,b,llamacpp:http://h:1", "--max-active", "6"])
    specs = engine_from_args(args, "safe").member_specs
    assert [getattr(s, "slots", None) for s in specs] == [6, None, None]
    assert EnsembleEngine(["llamacpp:a", "b"], slots=3).member_specs[0].slots == 3  # type: ignore[union-attr]
    explicit = EnsembleEngine([MemberConfig(model="llamacpp:a", slots=2)], method="single", slots=5)
    assert explicit.member_specs[0].slots == 2  # type: ignore[union-attr]


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The params of every llama.cpp server this test starts in-process (none really starts)."""
    import xllamacpp

    params: list[Any] = []

    class Recorded:
        listening_address = "127.0.0.1:1"

        def __init__(self, server_params: Any) -> None:
            params.append(server_params)

    monkeypatch.setattr(xllamacpp, "Server", Recorded)
    monkeypatch.setattr(LocalLlamaServer, "_wait_until_serving", lambda self, timeout_s: None)  # nothing serves
    return params


def test_poll_reaches_the_servers_threads(started: list[Any]) -> None:
    """``poll`` (how long llama.cpp's threads busy-wait after a job) is set on both thread pools of
    the server this process starts; unset, llama.cpp keeps its own default."""
    import xllamacpp

    LocalLlamaServer("x.gguf", n_ctx=64, threads=1, poll=0)
    LocalLlamaServer("x.gguf", n_ctx=64, threads=1)
    (quiet, default) = started
    assert quiet.cpuparams.poll == quiet.cpuparams_batch.poll == 0
    assert default.cpuparams.poll == xllamacpp.CommonParams().cpuparams.poll == 50
    assert MemberConfig(model="llamacpp:a", poll=0).backend_options()["poll"] == 0


def test_embeddings_sets_per_token_hidden_states_and_leaves_the_default_server_alone(started: list[Any]) -> None:
    """``embeddings=True`` (scripts/one_pass_rows.py) turns on per-token hidden states, pooling none, with
    a physical batch spanning a slot's window (llama.cpp refuses an embeddings prompt longer than it);
    the default server is left as it was."""
    import xllamacpp

    LocalLlamaServer("x.gguf", n_ctx=640, threads=1, slots=2, embeddings=True)
    LocalLlamaServer("x.gguf", n_ctx=640, threads=1, slots=2)
    (hidden, plain) = started
    assert hidden.embedding and hidden.pooling_type == xllamacpp.llama_pooling_type.LLAMA_POOLING_TYPE_NONE
    assert hidden.n_batch == hidden.n_ubatch == 640 and hidden.n_ctx == 1280
    defaults = xllamacpp.CommonParams()
    # its physical batch as llama.cpp's default; one per loop turn (the logical batch), so a stop is seen soon
    assert not plain.embedding and (plain.n_batch, plain.n_ubatch) == (defaults.n_ubatch, defaults.n_ubatch)
