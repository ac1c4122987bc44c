"""Cancellation of AdaFuse, every-token and SAFE with overlap (issue #10, part 3, beyond plain SAFE).

``test_cancellation.py`` soaks cancellation for SAFE only. The other decoding loops have await
points of their own: an AdaFuse round awaits the members' looks, then their span proposals, then
their scoring of every proposal; every-token awaits a draft and the other member's rows each token;
SAFE with ``overlap="on"`` keeps a draft-ahead job running in the executor while the verifiers
score. A cancellation landing at any of these must leave nothing behind.

Cancel points are the member jobs (``HFMember.run`` calls) of one request, counted in the order a
plain run of the same greedy request makes them; a cancellation lands either just before the
job is handed to its member's thread (``before``: the job never starts) or while it is in the
thread (``during``). Points are chosen deterministically: named ones (AdaFuse: between the
proposals and their scoring; overlap: while the draft-ahead job runs) plus a seeded random few.

After each cancellation (exact, not timing-based):
- the consumer sees ``CancelledError`` (the cancellation is not swallowed);
- every session the request made was closed by the engine (KV cache dropped then, not when
  the request's objects happen to be collected);
- once the member threads are idle and garbage is collected, no session is alive and the engine
  holds no live request.
At the end the same engine answers byte-identically to a fresh engine.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import pytest

from shared_engine import EnsembleEngine
from shared_engine.members import HFMember
from shared_engine.members.hf import HFSession
from tests.toy import settle, toy_member

PROMPT = "Sofia visited Berlin"
MAX_TOKENS = 6  # kept small: the file runs in seconds on a loaded CPU
ADAFUSE_TOKENS = 3  # still two AdaFuse rounds (look, propose, score: a job per member each)
Mode = Literal["before", "during"]


@pytest.fixture(scope="module")
def toys() -> list[HFMember]:
    """The members of ``test_cancellation.py``: different tokenizers (byte-level BPE, SentencePiece)."""
    return [toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)]


@dataclass
class _Watch:
    """Member jobs and sessions, seen through ``HFMember.run`` / ``new_session`` / ``HFSession.close``."""

    calls: list[str] = field(default_factory=list)  # the current request's jobs, by function name
    cancel_at: int = 0  # 1-based index into ``calls`` at which to cancel ``consumer`` (0: never)
    mode: Mode = "before"
    consumer: asyncio.Task[None] | None = None
    alive: weakref.WeakSet[HFSession] = field(default_factory=weakref.WeakSet)
    serials: weakref.WeakKeyDictionary[HFSession, int] = field(default_factory=weakref.WeakKeyDictionary)
    unclosed: set[int] = field(default_factory=set)  # serials of sessions made and not closed yet
    counter: itertools.count[int] = field(default_factory=itertools.count)

    def reset(self, cancel_at: int = 0, mode: Mode = "before") -> None:
        self.calls, self.cancel_at, self.mode, self.consumer = [], cancel_at, mode, None
        self.unclosed.clear()  # each request answers for its own sessions


@pytest.fixture
def watch(monkeypatch: pytest.MonkeyPatch) -> _Watch:
    watched = _Watch()
    run, new_session, close = HFMember.run, HFMember.new_session, HFSession.close

    async def cancelling_run(self: HFMember, fn: Callable[..., Any], *args: Any) -> Any:
        watched.calls.append(fn.__name__)
        task = watched.consumer
        if task is not None and len(watched.calls) == watched.cancel_at:
            if watched.mode == "before":
                task.cancel()
                await asyncio.sleep(0)  # the cancellation lands here, before the job is submitted
            else:  # lands while the job is in the member's thread
                asyncio.get_running_loop().call_soon(task.cancel)
        return await run(self, fn, *args)

    def tracked_session(self: HFMember) -> Any:
        session = new_session(self)
        serial = next(watched.counter)
        watched.alive.add(session)
        watched.serials[session] = serial
        watched.unclosed.add(serial)
        return session

    def tracked_close(self: HFSession) -> None:
        watched.unclosed.discard(watched.serials.get(self, -1))
        close(self)

    monkeypatch.setattr(HFMember, "run", cancelling_run)
    monkeypatch.setattr(HFMember, "new_session", tracked_session)
    monkeypatch.setattr(HFSession, "close", tracked_close)
    return watched


async def _cancelled(engine: EnsembleEngine, watched: _Watch) -> None:
    async def consume() -> None:
        async for _event in engine.astream(PROMPT):
            pass

    watched.consumer = asyncio.create_task(consume())
    with pytest.raises(asyncio.CancelledError):
        await watched.consumer


def _following(trace: list[str], name: str, then: str) -> list[int]:
    """1-based indices of the ``then`` jobs that directly follow a ``name`` job."""
    return [i + 2 for i in range(len(trace) - 1) if trace[i] == name and trace[i + 1] == then]


def _adafuse_points(trace: list[str]) -> list[tuple[int, Mode]]:
    """Between a round's proposals and its scoring (first round and last), while a proposal runs."""
    scorings = _following(trace, "_propose", "_score")  # each round's first scoring job
    assert len(scorings) >= 2, f"expected two AdaFuse rounds: {trace}"
    return [(scorings[0], "before"), (scorings[-1], "before"), (trace.index("_propose") + 1, "during")]


def _overlap_points(trace: list[str]) -> list[tuple[int, Mode]]:
    """While the draft-ahead job (the second ``_draft`` in a row) waits or runs beside the verifier."""
    aheads = _following(trace, "_draft", "_draft")
    assert aheads and trace[aheads[0]] == "rows_at", f"expected a draft ahead of the verifier: {trace}"
    return [(aheads[0] + 1, "before"), (aheads[0] + 1, "during"), (aheads[0], "during")]


CASES: dict[str, tuple[dict[str, Any], Callable[[list[str]], list[tuple[int, Mode]]], int]] = {
    # engine options, the named cancel points, how many seeded random ones (AdaFuse's jobs are the slow ones)
    "adafuse": ({"method": "adafuse", "max_new_tokens": ADAFUSE_TOKENS}, _adafuse_points, 1),
    "every-token": ({"method": "every-token", "max_new_tokens": MAX_TOKENS}, lambda trace: [], 4),
    "safe-overlap-on": ({"method": "safe", "overlap": "on", "max_new_tokens": MAX_TOKENS}, _overlap_points, 2),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cancelling_at_member_jobs_frees_everything_and_answers_stay_identical(
        case: str, toys: list[HFMember], watch: _Watch) -> None:
    options, named_points, random_points = CASES[case]
    fresh = EnsembleEngine(toys, **options)
    watch.reset()
    expected = fresh.generate(PROMPT).text
    trace = list(watch.calls)
    assert watch.unclosed == set(), f"{case}: a finished request left its sessions open"
    rng = random.Random(f"20261207-{case}")
    modes: tuple[Mode, Mode] = ("before", "during")
    picked = [(n, rng.choice(modes)) for n in rng.sample(range(1, len(trace) + 1), random_points)]
    points = named_points(trace) + picked

    engine = EnsembleEngine(toys, **options)
    for at, mode in points:
        watch.reset(at, mode)
        asyncio.run(_cancelled(engine, watch))
        where = f"{case}: cancelled {mode} job {at} ({trace[at - 1]}) of {trace}"
        # a job started before the cancellation landed (the other member's of one step, a draft ahead) may follow
        assert len(watch.calls) <= at + 1, f"{where}: the request went on after the cancellation ({watch.calls})"
        assert watch.unclosed == set(), f"{where}: the engine left {len(watch.unclosed)} session(s) open"
        watch.consumer = None
        settle(toys)
        assert engine.live_requests == 0, f"{where}: the engine still holds the request"
        assert len(watch.alive) == 0, f"{where}: {len(watch.alive)} session(s) still alive"

    watch.reset()
    assert engine.generate(PROMPT).text == expected
    settle(toys)
    assert engine.live_requests == 0 and len(watch.alive) == 0
