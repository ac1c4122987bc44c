"""Cancellation, isolation and resources (issue #10, parts 3 and 6).

- Streams are cancelled at random points on every in-process surface (engine ``astream`` broken
  off or its task cancelled, the blocking ``stream``, LangChain ``astream``, LlamaIndex
  ``astream_chat``): 100 times in a
  row on toy members. Criterion (exact, not timing-based): afterwards no session is alive and no KV
  cache is held (sessions are tracked with weak references), the engine holds no live request, and
  Python heap growth (tracemalloc) between the 10th and the 100th cancellation stays under a small
  bound. Then every surface answers byte-identically to a fresh engine.
- Concurrent greedy requests (mixed surfaces, with cancellations in between) give the answers
  they give one by one.
- Resources: engines naming the same members share the loaded objects; ``close()`` / ``with`` /
  ``async with`` end an engine (new requests: ``EngineClosedError``; running ones finish with
  reason ``cancelled``) and leave the shared members usable by every other engine.
- One real-zoo check of the same with a few cancellations (``zoo`` marker).
"""

from __future__ import annotations

import asyncio
import random
import tracemalloc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.messages import HumanMessage
from llama_index.core.base.llms.types import ChatMessage

from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM
from shared_engine import EngineClosedError, EnsembleEngine
from shared_engine.members import HFMember, load_member
from tests.toy import registered_members, settle, toy_member

TOYS = ("toy-bpe", "toy-sp")
PROMPTS = ["Sofia visited Berlin", "Nina looked at the lake", "def add(a, b):", "Q: What is 3 + 4?"]
MAX_TOKENS = 24


@pytest.fixture(scope="module")
def toys() -> list[HFMember]:
    return [toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)]


@pytest.fixture
def registered(toys: list[HFMember]) -> Iterator[list[str]]:
    with registered_members(toys) as names:
        yield names


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> weakref.WeakSet:
    """Every session any member creates from now on, held weakly (alive = not yet freed)."""
    live: weakref.WeakSet = weakref.WeakSet()
    original = HFMember.new_session

    def tracked(self: HFMember) -> Any:
        session = original(self)
        live.add(session)
        return session

    monkeypatch.setattr(HFMember, "new_session", tracked)
    return live


async def _spin() -> None:
    """Let asyncio run the finalizers of async generators a consumer abandoned."""
    for _ in range(5):
        await asyncio.sleep(0)


# --------------------------------------------------------------------- the ways to cancel


async def _engine_break(engine: EnsembleEngine, prompt: str, after: int) -> None:
    stream = engine.astream(prompt, max_new_tokens=200)
    seen = 0
    async for _event in stream:
        seen += 1
        if seen > after:
            break
    await stream.aclose()


async def _engine_task_cancel(engine: EnsembleEngine, prompt: str, after: int) -> None:
    """The consumer's task is cancelled while the engine is working (mid-forward, mid-round)."""
    started = asyncio.Event()

    async def consume() -> None:
        seen = 0
        async for _event in engine.astream(prompt, max_new_tokens=200):
            seen += 1
            if seen > after:
                started.set()

    task = asyncio.create_task(consume())
    waiter = asyncio.create_task(started.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    task.cancel()
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def _engine_sync_break(engine: EnsembleEngine, prompt: str, after: int) -> None:
    """The blocking ``stream`` (a helper thread drives the engine): the caller stops iterating."""
    for seen, _event in enumerate(engine.stream(prompt, max_new_tokens=200)):
        if seen >= after:
            break


async def _langchain_break(model: ChatEnsemble, prompt: str, after: int) -> None:
    """What a LangChain user writes: break out of the loop, no explicit close."""
    seen = 0
    async for _chunk in model.astream([HumanMessage(content=prompt)], max_tokens=200):
        seen += 1
        if seen > after:
            break
    await _spin()


async def _llamaindex_break(llm: EnsembleLLM, prompt: str, after: int) -> None:
    seen = 0
    stream = await llm.astream_chat([ChatMessage(role="user", content=prompt)], max_tokens=200)
    async for _chunk in stream:
        seen += 1
        if seen > after:
            break
    await _spin()


# --------------------------------------------------------------------- answers


async def _engine_answer(engine: EnsembleEngine, prompt: str) -> str:
    return (await engine.agenerate(prompt, max_new_tokens=MAX_TOKENS)).text


async def _langchain_answer(model: ChatEnsemble, prompt: str) -> str:
    return (await model.ainvoke([HumanMessage(content=prompt)], max_tokens=MAX_TOKENS)).content


async def _llamaindex_answer(llm: EnsembleLLM, prompt: str) -> str:
    response = await llm.achat([ChatMessage(role="user", content=prompt)], max_tokens=MAX_TOKENS)
    return response.message.content


def _fresh_answers(toys: list[HFMember], prompts: list[str]) -> list[str]:
    engine = EnsembleEngine(toys, method="safe")
    return [asyncio.run(_engine_answer(engine, p)) for p in prompts]


# --------------------------------------------------------------------- the soak


def test_100_cancellations_free_everything_and_answers_stay_identical(
        toys: list[HFMember], registered: list[str], sessions: weakref.WeakSet) -> None:
    expected = _fresh_answers(toys, PROMPTS)
    engine = EnsembleEngine(toys, method="safe")
    chat = ChatEnsemble(models=registered, method="safe", max_tokens=MAX_TOKENS)
    llm = EnsembleLLM(models=toys, method="safe", max_tokens=MAX_TOKENS)
    rng = random.Random(20261129)
    kinds = [lambda p, k: _engine_break(engine, p, k), lambda p, k: _engine_task_cancel(engine, p, k),
             lambda p, k: _langchain_break(chat, p, k), lambda p, k: _llamaindex_break(llm, p, k),
             lambda p, k: _engine_sync_break(engine, p, k)]

    async def soak() -> tuple[int, int]:
        baseline = 0
        for i in range(100):
            await kinds[i % len(kinds)](rng.choice(PROMPTS), rng.randrange(0, 12))
            if i == 9:  # warmed up: caches, lazily built tables, LangChain/LlamaIndex singletons
                await _spin()
                settle(toys)
                baseline = tracemalloc.take_snapshot().statistics("filename")
                baseline = sum(s.size for s in baseline)
        await _spin()
        settle(toys)
        end = sum(s.size for s in tracemalloc.take_snapshot().statistics("filename"))
        return baseline, end

    tracemalloc.start()
    try:
        baseline, end = asyncio.run(soak())
    finally:
        tracemalloc.stop()
    settle(toys)
    assert engine.live_requests == 0
    assert [s for s in sessions if s.cache is not None] == [], "a cancelled request kept its KV cache"
    assert len(sessions) == 0, f"{len(sessions)} sessions still alive after 100 cancellations"
    print(f"python heap growth over cancellations 10..100: {end - baseline} bytes")  # shown with -s
    assert end - baseline < 1_000_000, f"Python heap grew by {end - baseline} bytes over 90 cancellations"

    async def answers() -> tuple[list[str], list[str], list[str]]:
        return ([await _engine_answer(engine, p) for p in PROMPTS],
                [await _langchain_answer(chat, p) for p in PROMPTS],
                [await _llamaindex_answer(llm, p) for p in PROMPTS])

    by_engine, by_langchain, by_llamaindex = asyncio.run(answers())
    assert by_engine == expected
    assert by_langchain == expected
    assert by_llamaindex == expected


def test_concurrent_greedy_requests_match_sequential_even_next_to_cancellations(
        toys: list[HFMember], registered: list[str], sessions: weakref.WeakSet) -> None:
    expected = _fresh_answers(toys, PROMPTS)
    engine = EnsembleEngine(toys, method="safe")
    chat = ChatEnsemble(models=registered, method="safe", max_tokens=MAX_TOKENS)
    llm = EnsembleLLM(models=toys, method="safe", max_tokens=MAX_TOKENS)

    async def together() -> list[Any]:
        jobs = [_engine_answer(engine, p) for p in PROMPTS] + [_langchain_answer(chat, p) for p in PROMPTS] \
            + [_llamaindex_answer(llm, p) for p in PROMPTS] \
            + [_engine_break(engine, PROMPTS[0], 3), _engine_task_cancel(engine, PROMPTS[1], 1)]
        return await asyncio.gather(*jobs)

    results = asyncio.run(together())
    assert results[:3 * len(PROMPTS)] == expected * 3
    settle(toys)
    assert len(sessions) == 0 and engine.live_requests == 0


# --------------------------------------------------------------------- resources


def test_engines_share_members_and_close_leaves_them_usable(toys: list[HFMember], registered: list[str],
                                                            sessions: weakref.WeakSet) -> None:
    first, second = EnsembleEngine(registered), EnsembleEngine(list(reversed(registered)), drafter="toy-bpe")
    assert first.members == second.members  # the same order: toy-bpe drafts in both
    assert all(a is b for a, b in zip(first.members, second.members))
    assert first.members[0] is load_member("toy-bpe")
    expected = _fresh_answers(toys, PROMPTS[:2])
    assert asyncio.run(_engine_answer(first, PROMPTS[0])) == expected[0]
    first.close()
    with pytest.raises(EngineClosedError):
        first.generate(PROMPTS[0])
    assert [asyncio.run(_engine_answer(second, p)) for p in PROMPTS[:2]] == expected
    settle(toys)
    assert len(sessions) == 0


def test_with_and_async_with_close_the_engine(toys: list[HFMember]) -> None:
    with EnsembleEngine(toys, max_new_tokens=4) as engine:
        assert engine.generate("hi").finish_reason in {"length", "eos", "stop"}
    with pytest.raises(EngineClosedError):
        engine.generate("hi")

    async def scoped() -> EnsembleEngine:
        async with EnsembleEngine(toys, max_new_tokens=4) as engine:
            await engine.agenerate("hi")
        return engine

    closed = asyncio.run(scoped())
    with pytest.raises(EngineClosedError):
        closed.generate("hi")


def test_closing_ends_running_requests_as_cancelled(toys: list[HFMember], sessions: weakref.WeakSet) -> None:
    engine = EnsembleEngine(toys, method="safe")

    async def run() -> tuple[list[Any], int]:
        events: list[Any] = []
        stream = engine.astream(PROMPTS[0], max_new_tokens=200)
        async for event in stream:
            events.append(event)
            if len(events) == 2:
                assert engine.live_requests == 1
                closer = asyncio.create_task(engine.aclose())
        await closer
        return events, engine.live_requests

    events, live = asyncio.run(run())
    finish = events[-1]
    assert finish.type == "finish" and finish.reason == "cancelled"
    assert finish.stats.tokens < 200
    assert "".join(e.text for e in events if e.type == "token") == finish.text
    assert live == 0
    settle(toys)
    assert len(sessions) == 0


# --------------------------------------------------------------------- the real zoo


@pytest.mark.zoo
def test_zoo_cancellations_leave_identical_answers_and_free_sessions(sessions: weakref.WeakSet) -> None:
    names = ["transformers:qwen2.5-coder-0.5b-instruct", "transformers:smollm2-135m-instruct"]  # KV caches
    prompt, other = "What is 17 + 25? Answer briefly.", "Name a prime number."
    fresh = EnsembleEngine(names, method="safe")
    expected = [asyncio.run(fresh.agenerate(p, max_new_tokens=12)).text for p in (prompt, other)]
    engine = EnsembleEngine(names, method="safe")
    members = engine.members

    async def cancel_then_answer() -> list[str]:
        await _engine_break(engine, prompt, 1)
        await _engine_task_cancel(engine, prompt, 3)
        await _engine_break(engine, other, 6)
        together = await asyncio.gather(engine.agenerate(prompt, max_new_tokens=12),
                                         engine.agenerate(other, max_new_tokens=12))
        return [r.text for r in together]

    assert asyncio.run(cancel_then_answer()) == expected
    settle(members)
    assert engine.live_requests == 0 and len(sessions) == 0
