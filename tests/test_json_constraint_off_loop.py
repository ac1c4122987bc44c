"""A request's JSON constraint, and its output options' validation, are built off the event loop.

Building the character-level parser of a schema (``json_constraint.start_state`` /
``call_start_state``: its patterns' automata) took seconds for a pydantic model of ~20 nested
models or a forced call among ~10 tools, and validating the options checks every tool's
parameter schema (jsonschema, tenths of a second): run on the loop thread, either froze every
other request of the engine (no token streamed meanwhile). The checks here are exact, not
timing-based: which thread ran the work, and whether a coroutine on the loop can run while it
does (a patched ``start_state`` waits for the loop to answer; on the loop thread it never could).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import shared_engine.engine as engine_module
import shared_engine.tools as tools_module
from shared_engine import EnsembleEngine
from shared_engine.json_constraint import JsonPrefix
from shared_engine.members import HFMember
from shared_engine.members.hf import HFSession
from shared_engine.tools import OutputOptions
from tests.toy import registered_members, settle, toy_member

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}}
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]  # the toys: 512 tokens
WAIT_S = 10.0  # how long a patched start_state waits for the loop: far beyond any thread hop


@pytest.fixture
def lifecycle(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Each member released ("release") and each session opened ("session"), in order."""
    seen: list[str] = []
    real_release, real_session = engine_module.release_member, HFMember.new_session

    def release(spec: Any) -> None:
        seen.append("release")
        real_release(spec)

    def new_session(self: HFMember) -> Any:
        seen.append("session")
        return real_session(self)

    monkeypatch.setattr(engine_module, "release_member", release)
    monkeypatch.setattr(HFMember, "new_session", new_session)
    return seen


def _no_session_after_release(seen: list[str], members: int = 2) -> bool:
    return seen.count("release") == members and "session" not in seen[seen.index("release"):]


@pytest.fixture(scope="module")
def toys() -> list[HFMember]:
    return [toy_member("toy-offloop-a", "byte_level"), toy_member("toy-offloop-b", "metaspace", seed=1)]


@pytest.fixture
def engine(toys: list[HFMember]) -> Iterator[EnsembleEngine]:
    engine = EnsembleEngine(toys, method="safe", max_new_tokens=3)
    yield engine
    engine.close()


def recording(monkeypatch: pytest.MonkeyPatch, name: str, hold: threading.Event | None = None,
              wait_s: float = 10.0) -> list[threading.Thread]:
    """Patch ``tools.<name>`` (what ``OutputPlan.constraint`` calls) to record the thread it runs on and, with
    ``hold``, to wait (up to ``wait_s``) until it is set."""
    threads: list[threading.Thread] = []
    real: Callable[..., JsonPrefix | None] = getattr(tools_module, name)

    def recorded(*args: Any) -> JsonPrefix | None:
        threads.append(threading.current_thread())
        if hold is not None:
            hold.wait(wait_s)
        return real(*args)

    monkeypatch.setattr(tools_module, name, recorded)
    return threads


def recording_options(monkeypatch: pytest.MonkeyPatch, module: Any = engine_module) -> list[threading.Thread]:
    """Patch ``module.validated`` to record the thread each OutputOptions validation runs on."""
    threads: list[threading.Thread] = []
    real = module.validated

    def recorded(cls: type[Any], **values: Any) -> Any:
        if cls is OutputOptions:
            threads.append(threading.current_thread())
        return real(cls, **values)

    monkeypatch.setattr(module, "validated", recorded)
    return threads


async def test_schema_constraint_is_built_off_the_loop(engine: EnsembleEngine,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    threads = recording(monkeypatch, "start_state")
    result = await engine.agenerate("Where?", response_format=RESPONSE_FORMAT)
    assert result.finish_reason in ("stop", "eos", "length")
    assert threads, "the request built no constraint"
    assert threading.current_thread() not in threads, "start_state ran on the event loop's thread"


async def test_forced_call_constraint_is_built_off_the_loop(engine: EnsembleEngine,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    threads = recording(monkeypatch, "call_start_state")
    await engine.agenerate("F?", tools=TOOLS, tool_choice="required")
    assert threads, "the request built no constraint"
    assert threading.current_thread() not in threads, "call_start_state ran on the event loop's thread"


async def test_output_options_are_validated_off_the_loop(engine: EnsembleEngine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The tools' parameter schemas are checked (jsonschema) where OutputOptions is validated."""
    threads = recording_options(monkeypatch)
    await engine.agenerate("F?", tools=TOOLS, tool_choice="required")
    await engine.acheck_fits("F?", tools=TOOLS)
    assert len(threads) == 2
    assert threading.current_thread() not in threads, "the output options were validated on the loop's thread"


def _waiting_start_state(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event, list[bool]]:
    """Patch start_state to wait, the first time, (up to WAIT_S) for ``answered``, which only a coroutine on the loop
    sets: ``answers`` records whether it came (on the loop thread it cannot: the loop is in here).
    ``entered`` is set once the patched start_state runs."""
    entered, answered, answers = threading.Event(), threading.Event(), []
    real = tools_module.start_state

    def waiting(*args: Any) -> JsonPrefix | None:
        if not entered.is_set():  # the first attempt's (a format retry builds its own: not waited on)
            entered.set()
            answers.append(answered.wait(WAIT_S))
        return real(*args)

    monkeypatch.setattr(tools_module, "start_state", waiting)
    return entered, answered, answers


async def _until(check: Callable[[], bool], what: str) -> None:
    """Wait, polling from the loop, until ``check()`` (a worker's progress; work on the loop thread has
    already run by the time this coroutine resumes)."""
    for _ in range(int(WAIT_S / 0.01)):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"{what} never happened")


async def test_other_coroutines_run_while_the_constraint_is_built(engine: EnsembleEngine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    entered, answered, answers = _waiting_start_state(monkeypatch)
    request = asyncio.create_task(engine.agenerate("Where?", response_format=RESPONSE_FORMAT))
    await _until(entered.is_set, "the constraint's build")
    answered.set()  # the loop runs while the constraint is being built
    await request
    assert answers == [True], "the event loop was blocked while the constraint was built"


async def test_cancelled_while_building_leaves_nothing(engine: EnsembleEngine, toys: list[HFMember],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancelled while its constraint is built: the request ends at once, opened no session (or closed
    it), holds no live state, and the engine answers the next request."""
    opened: list[HFSession] = []
    closed: list[HFSession] = []
    new_session, close = HFMember.new_session, HFSession.close

    def tracked_session(self: HFMember) -> Any:
        session = new_session(self)
        opened.append(session)
        return session

    def tracked_close(self: HFSession) -> None:
        closed.append(self)
        close(self)

    monkeypatch.setattr(HFMember, "new_session", tracked_session)
    monkeypatch.setattr(HFSession, "close", tracked_close)
    entered, answered, answers = _waiting_start_state(monkeypatch)
    request = asyncio.create_task(engine.agenerate("Where?", response_format=RESPONSE_FORMAT))
    await _until(entered.is_set, "the constraint's build")
    request.cancel()
    with pytest.raises(asyncio.CancelledError):
        await request
    answered.set()  # the worker ends; its constraint is dropped
    await _until(lambda: bool(answers), "the end of the worker's wait")
    assert answers == [True], "the event loop was blocked while the constraint was built"
    assert all(session in closed for session in opened), "a cancelled request left a session open"
    assert engine.live_requests == 0 and engine._starting == 0
    settle(toys)
    result = await engine.agenerate("Where?", response_format=RESPONSE_FORMAT)
    assert result.finish_reason in ("stop", "eos", "length")


async def test_aclose_waits_for_a_request_still_validating_off_the_loop(toys: list[HFMember], lifecycle: list[str],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The validation's thread hop came before the request was counted: aclose() saw no request, let go
    of the members and returned, and the request then opened sessions on the released members."""
    entered, gate = threading.Event(), threading.Event()
    real_validated = engine_module.validated

    def slow_validated(model: Any, **values: Any) -> Any:
        if model is OutputOptions and values.get("tools"):  # a long tool list's jsonschema checks
            entered.set()
            gate.wait(WAIT_S)
        return real_validated(model, **values)

    monkeypatch.setattr(engine_module, "validated", slow_validated)
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=3)
        await engine.agenerate("hi")  # the members loaded and held
        lifecycle.clear()
        request = asyncio.create_task(engine.agenerate("F?", tools=TOOLS))
        assert await asyncio.to_thread(entered.wait, WAIT_S)
        closing = asyncio.create_task(engine.aclose())
        await asyncio.sleep(0.05)  # the close runs as far as it goes while the request validates
        gate.set()
        await closing
        assert request.done(), "aclose() returned while a request was still starting"
        assert request.result().finish_reason == "cancelled"  # ended as any running request a close ends
    assert _no_session_after_release(lifecycle)


async def test_the_server_checks_a_chat_requests_output_options_off_the_loop(engine: EnsembleEngine,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The server checked a request's tools before admitting it, on the loop thread: the engine's own
    check ran off it, but every stream still froze for the server's (tenths of a second per request).
    The server now runs the engine's check (acheck_request), once per request: astream serves it as checked."""
    import httpx

    from shared_engine.server import create_app

    threads = recording_options(monkeypatch)
    app = create_app(engine, model_name="ens")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        reply = await client.post("/v1/chat/completions", json={
            "model": "ens", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "max_tokens": 2})
        bad = await client.post("/v1/chat/completions", json={
            "model": "ens", "messages": [{"role": "user", "content": "hi"}], "tools": TOOLS, "tool_choice": {
                "type": "function", "function": {"name": "nope"}}})
    assert reply.status_code == 200, reply.text
    assert bad.status_code == 400 and "nope" in bad.text  # the error still a 400 naming what is wrong
    assert len(threads) == 2 and threading.main_thread() not in threads


async def test_aclose_waits_for_a_structured_retry_checking_its_fit(toys: list[HFMember], lifecycle: list[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Between a format retry's attempts (its fit check renders the prompt in a worker thread) the request
    was counted nowhere: aclose() released the members and the retry opened sessions on them."""
    entered, gate = threading.Event(), threading.Event()
    real_render = engine_module._render
    renders: list[int] = []

    def render(member: Any, messages: Any, plan: Any) -> Any:
        renders.append(1)
        if len(renders) == 3:  # the retry's fit check (the first attempt rendered both members)
            entered.set()
            gate.wait(WAIT_S)
        return real_render(member, messages, plan)

    monkeypatch.setattr(engine_module, "_render", render)
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=2)  # 2 tokens: no JSON, a retry
        events = asyncio.create_task(_events(engine.astream("hi", response_format={"type": "json_object"})))
        assert await asyncio.to_thread(entered.wait, WAIT_S), "no retry"
        closing = asyncio.create_task(engine.aclose())
        await asyncio.sleep(0.05)
        gate.set()
        await closing
        assert (await events)[-1].reason == "cancelled"  # the retry never ran: the members were let go
    assert _no_session_after_release(lifecycle)


async def test_a_stream_paused_at_its_finish_holds_nothing(toys: list[HFMember]) -> None:
    """Review of the hold: a stream held the members up to its last event, so a caller that broke out at
    the finish and then closed the engine waited aclose()'s whole timeout (30 s)."""
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=3)
        stream = engine.astream("hi")
        async for event in stream:
            if event.type == "finish":
                break
        assert engine.live_requests == 0
        # aclose() waits for running requests up to timeout_s; a stream nobody reads any more is none
        await asyncio.wait_for(engine.aclose(timeout_s=600), timeout=30)
        await stream.aclose()


def test_close_after_agenerate_on_a_loop_that_never_runs_again_lets_go(toys: list[HFMember],
                                                                       lifecycle: list[str]) -> None:
    """agenerate returned at the finish with its stream still open (closed by the loop's finalizer later):
    a close() right after, on a loop never run again, let go of nothing (a llama.cpp server left running)."""
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=3)
        loop = asyncio.new_event_loop()
        try:
            loop.run_until_complete(engine.agenerate("hi"))
            engine.close()
            assert lifecycle.count("release") == 2
        finally:
            loop.close()


async def _events(stream: Any) -> list[Any]:
    return [event async for event in stream]


async def test_a_close_at_a_retrys_event_counts_each_attempt_once(toys: list[HFMember]) -> None:
    """The cancelled finish of a request closed while its format_retry event was out listed the rejected
    attempt twice (as its own stats and in rejected_attempts): usage, and so billing, doubled."""
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=2)  # 2 tokens: no JSON, a retry
        retry, finish = None, None
        async for event in engine.astream("hi", response_format={"type": "json_object"}):
            if event.type == "format_retry":
                retry = event
                engine.close()
            elif event.type == "finish":
                finish = event
        assert retry is not None and finish is not None and finish.reason == "cancelled"
        assert finish.usage.completion_tokens == retry.stats.tokens
        assert finish.usage.prompt_tokens == retry.stats.prompt_tokens
