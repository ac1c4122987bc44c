"""Closing a blocking stream early (``iterate_sync``: ``engine.stream``, LangChain's ``stream``, LlamaIndex's
``stream_chat``) stops the stream where it is: close() used to wait for the stream's next item while the
engine kept calling members whose answers were thrown away (seconds against a slow server)."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

import pytest

from shared_engine import EnsembleEngine
from shared_engine.engine import iterate_sync
from shared_engine.members import HFMember
from tests.toy import toy_member


class Slow:
    """A toy stream: one item, then five slow steps (a draft block's server calls) before the next."""

    def __init__(self, step_s: float = 1.0) -> None:
        self.step_s = step_s
        self.steps: list[int] = []
        self.released = False

    async def events(self) -> AsyncGenerator[str, None]:
        try:
            yield "first"
            for i in range(5):
                await asyncio.sleep(self.step_s)
                self.steps.append(i)
            yield "second"
        finally:
            await asyncio.sleep(0)  # an awaited release (the engine's sessions, its admission) still runs
            self.released = True


def test_close_after_the_first_item_does_no_more_work_and_releases() -> None:
    slow = Slow()
    stream = iterate_sync(slow.events())
    assert next(stream) == "first"
    started = time.monotonic()
    stream.close()
    assert slow.steps == [] and slow.released
    assert time.monotonic() - started < 2  # the next item was 5 s away
    time.sleep(1.2)
    assert slow.steps == []  # nothing went on behind close()


def test_break_out_of_a_for_loop_stops_the_stream() -> None:
    slow = Slow()
    stream = iterate_sync(slow.events())
    for item in stream:
        assert item == "first"
        break
    stream.close()
    assert slow.steps == [] and slow.released


def test_a_stream_dropped_without_close_stops_when_collected() -> None:
    slow = Slow()
    stream = iterate_sync(slow.events())
    assert next(stream) == "first"
    del stream
    gc.collect()
    assert slow.steps == [] and slow.released


def test_keyboard_interrupt_while_waiting_stops_the_stream() -> None:
    """Ctrl-C while the consumer waits for the next item: the stream stops at once and the
    KeyboardInterrupt reaches the consumer."""
    # Ctrl-C as an interactive run has it: a suite started in the background inherits SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupted_while_waiting()
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupted_while_waiting() -> None:
    slow = Slow()
    stream = iterate_sync(slow.events())
    assert next(stream) == "first"
    timer = threading.Timer(0.2, signal.pthread_kill, (threading.main_thread().ident, signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            next(stream)
    finally:
        timer.cancel()
    assert slow.steps == [] and slow.released


def test_keyboard_interrupt_thrown_in_at_an_item_stops_the_stream() -> None:
    slow = Slow()
    stream = iterate_sync(slow.events())
    assert next(stream) == "first"
    with pytest.raises(KeyboardInterrupt):
        stream.throw(KeyboardInterrupt())
    assert slow.steps == [] and slow.released


def test_a_stream_read_to_its_end_gives_every_item_and_releases() -> None:
    slow = Slow(step_s=0.01)
    assert list(iterate_sync(slow.events())) == ["first", "second"]
    assert slow.steps == [0, 1, 2, 3, 4] and slow.released


class StreamFailed(ValueError):
    pass


async def failing(exc: BaseException, released: list[bool]) -> AsyncGenerator[str, None]:
    try:
        yield "first"
        await asyncio.sleep(0.01)
        raise exc
    finally:
        released.append(True)


@pytest.mark.parametrize("make", [lambda: StreamFailed("member 1 failed"), asyncio.CancelledError])
def test_an_error_in_the_stream_reaches_the_consumer_with_its_type(make: Callable[[], BaseException]) -> None:
    """Also a CancelledError of the stream's own (a member's task cancelled): it is not the
    consumer's close, and must not read as the stream's normal end."""
    error = make()
    released: list[bool] = []
    stream = iterate_sync(failing(error, released))
    assert next(stream) == "first"
    with pytest.raises(type(error)) as raised:
        next(stream)
    assert raised.value is error and released == [True]


@pytest.mark.parametrize("burst", [0, 100], ids=["at-an-await", "mid-burst"])
def test_a_stream_collected_on_its_own_pump_thread_stops(burst: int) -> None:
    """An unclosed stream in a reference cycle, collected by a gc run on its own pump thread (the stream's
    step allocating), waited in its finally for that very thread to end: forever, the request live and
    the thread leaked (review of b8e2e81; older than it). Where the step then yields more items than the
    queue holds before its next await (one step's tokens), the pump waited on the full queue for a reader
    gone (review of ec47ff3). It now stops: the stream's finally runs and the thread ends."""
    armed = threading.Event()
    released: list[bool] = []

    async def events() -> AsyncGenerator[int, None]:
        try:
            for i in range(1000):
                if armed.is_set():
                    armed.clear()
                    gc.collect()  # the cycle holding this very stream is collected here, on the pump thread
                    for j in range(burst):  # no await between these
                        yield -j
                await asyncio.sleep(0.01)
                yield i
        finally:
            released.append(True)

    class Holder:
        me: Holder
        stream: Any

    before = set(threading.enumerate())
    holder = Holder()
    holder.me, holder.stream = holder, iterate_sync(events())
    next(holder.stream)
    gc.disable()
    try:
        del holder
        armed.set()
        deadline = time.monotonic() + 10
        while not released and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        gc.enable()
    assert released == [True]
    deadline = time.monotonic() + 5
    while any(t.is_alive() for t in set(threading.enumerate()) - before) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not [t for t in set(threading.enumerate()) - before if t.is_alive()]


def test_close_before_the_first_item_is_fine() -> None:
    slow = Slow()
    stream = iterate_sync(slow.events())
    stream.close()  # never started: nothing to stop
    assert slow.steps == []


def _slow_member(monkeypatch: pytest.MonkeyPatch, member: HFMember, finished: list[float]) -> None:
    """Each compute call of ``member`` waits 0.5 s first (a slow server) and notes when it finished."""
    real = member.run

    async def run(fn: Callable[..., Any], *args: Any) -> Any:
        await asyncio.sleep(0.5)
        result = await real(fn, *args)
        finished.append(time.monotonic())
        return result

    monkeypatch.setattr(member, "run", run)


@pytest.mark.parametrize("method", ["single", "safe"])
def test_an_engine_stream_closed_early_stops_its_member_calls_and_the_engine_stays_right(
        monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    members = members[:1] if method == "single" else members
    prompt = "Sofia visited Berlin"
    fresh = EnsembleEngine(members, method=method, max_new_tokens=16).generate(prompt).text
    finished: list[float] = []
    for member in members:
        _slow_member(monkeypatch, member, finished)
    engine = EnsembleEngine(members, method=method, max_new_tokens=16)
    stream = engine.stream(prompt, max_new_tokens=200)
    assert any(event.type == "token" for event in stream)  # stops at the first token
    closed = time.monotonic()
    stream.close()
    assert [t for t in finished if t > closed] == []  # no member call went on after close()
    monkeypatch.undo()
    assert engine.generate(prompt).text == fresh
