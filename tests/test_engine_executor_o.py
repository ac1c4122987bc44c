"""A request's structured-output setup runs on its own small pool (``shared_engine.offload``), and a request
closed at a structured-output retry ends with no answer.

On the loop's default executor (``asyncio.to_thread``: min(32, cores + 4) workers), a dozen requests whose
schemas take a second each to build a constraint for filled every worker, and a plain request's member
loading and prompt rendering waited behind them (its start delayed by seconds). The checks here are exact,
not timed: which threads ran the work, and whether a plain request ends while every schema worker is held.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.members import HFMember
from shared_engine.offload import SCHEMA_THREAD_PREFIX, SCHEMA_WORKERS, run_schema_work
from shared_engine.server import create_app
from tests.test_json_constraint_off_loop import recording, recording_options
from tests.toy import registered_members, toy_member

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
WAIT_S = 10.0  # how long a held worker or a waiting test waits: far beyond any thread hop


@pytest.fixture(scope="module")
def toys() -> list[HFMember]:
    return [toy_member("toy-executor-a", "byte_level"), toy_member("toy-executor-b", "metaspace", seed=1)]


@pytest.fixture
def engine(toys: list[HFMember]) -> Iterator[EnsembleEngine]:
    engine = EnsembleEngine(toys, method="safe", max_new_tokens=3)
    yield engine
    engine.close()


def _on_schema_pool(threads: list[threading.Thread]) -> bool:
    return bool(threads) and all(t.name.startswith(SCHEMA_THREAD_PREFIX) for t in threads)


async def test_a_schemas_constraint_is_built_on_the_schema_pool(engine: EnsembleEngine,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    threads = recording(monkeypatch, "start_state")
    result = await engine.agenerate("Where?", response_format=RESPONSE_FORMAT)
    assert result.finish_reason in ("stop", "eos", "length")
    assert _on_schema_pool(threads), [t.name for t in threads]


async def test_output_options_are_validated_on_the_schema_pool(engine: EnsembleEngine,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    threads = recording_options(monkeypatch)
    await engine.agenerate("F?", tools=TOOLS, tool_choice="required")
    await engine.acheck_fits("F?", tools=TOOLS)
    assert len(threads) == 2 and _on_schema_pool(threads), [t.name for t in threads]


async def test_a_plain_request_ends_while_every_schema_worker_is_held(engine: EnsembleEngine,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """More schema requests than the loop's default executor has workers, each holding its worker in its
    constraint's build: a plain request (loading, rendering in worker threads) still runs to its finish."""
    hold = threading.Event()
    threads = recording(monkeypatch, "start_state", hold, WAIT_S)
    default_workers = min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default, asyncio's executor
    slow = [asyncio.create_task(engine.agenerate("Where?", response_format=RESPONSE_FORMAT))
            for _ in range(default_workers + 1)]
    try:
        for _ in range(int(WAIT_S / 0.01)):  # until the schema workers are all held
            if len(threads) >= min(SCHEMA_WORKERS, len(slow)):
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)  # the other schema requests reach their queue
        plain = await asyncio.wait_for(engine.agenerate("hi"), WAIT_S / 2)
        assert plain.finish_reason in ("stop", "eos", "length")
        assert not hold.is_set() and not any(task.done() for task in slow)  # they were held all along
    finally:
        hold.set()
        results = await asyncio.gather(*slow, return_exceptions=True)
    assert all(not isinstance(r, BaseException) for r in results), results


async def test_the_server_checks_a_chat_requests_schemas_on_the_schema_pool(engine: EnsembleEngine,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    threads = recording_options(monkeypatch)
    app = create_app(engine, model_name="ens")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        reply = await client.post("/v1/chat/completions", json={
            "model": "ens", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 2})
        bad = await client.post("/v1/chat/completions", json={
            "model": "ens", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": {
                "type": "function", "function": {"name": "nope"}}})
        plain = await client.post("/v1/chat/completions", json={
            "model": "ens", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert bad.status_code == 400 and "nope" in bad.text  # the error still a 400 naming what is wrong
    assert plain.status_code == 200, plain.text
    assert len(threads) == 3, [t.name for t in threads]
    assert _on_schema_pool(threads[:2]) and threads[2] is threading.current_thread()  # nothing slow: at once


async def test_a_closed_engine_answers_chat_requests_with_a_503(engine: EnsembleEngine) -> None:
    """The server's mapping of a closed engine (``server_shutting_down``), with and without schemas to check."""
    app = create_app(engine, model_name="ens")
    engine.close()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        for extra in ({}, {"tools": TOOLS}, {"response_format": RESPONSE_FORMAT}, {"stream": True}):
            reply = await client.post("/v1/chat/completions", json={
                "model": "ens", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **extra})
            assert reply.status_code == 503, (extra, reply.text)
            assert reply.json()["error"]["code"] == "server_shutting_down"


async def test_a_close_at_a_retrys_event_ends_with_no_answer(toys: list[HFMember]) -> None:
    """Closed while its format_retry event was out, the request ended 'cancelled' with the rejected attempt's
    text and format_error, as if that were its answer (a caller reading the finish took the rejected text)."""
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=2)  # 2 tokens: no JSON, a retry
        retry, finish = None, None
        async for event in engine.astream("hi", response_format={"type": "json_object"}):
            if event.type == "format_retry":
                retry = event
                engine.close()
            elif event.type == "finish":
                finish = event
        assert retry is not None and retry.text and finish is not None
        assert finish.reason == "cancelled"
        assert finish.text == "" and finish.format_error is None and finish.tool_calls == []
        # the rejected attempt counted once (usage)
        assert finish.usage.completion_tokens == retry.stats.tokens
        assert finish.usage.prompt_tokens == retry.stats.prompt_tokens


def test_a_forked_child_makes_its_own_schema_pool() -> None:
    """The parent's pool threads do not exist in a forked child: its jobs would wait forever."""
    assert asyncio.run(run_schema_work(int, "3")) == 3  # the parent's pool is made
    pid = os.fork()
    if pid == 0:  # the child: exit status 0 only if a job ran
        code = 1
        try:
            code = 0 if asyncio.run(asyncio.wait_for(run_schema_work(int, "7"), WAIT_S)) == 7 else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
