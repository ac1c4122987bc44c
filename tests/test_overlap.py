"""#18's overlap: the drafter drafts the next round while the verifiers score this one.

The answer must not change (the early draft is the one the drafter would have written next), the
drafter's session must never serve two drafts at once, and a round that diverges must stop and
throw its early draft away."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.decoding import RequestState, request_members
from shared_engine.decoding.round import DraftBase, _draft
from shared_engine.members import HFMember
from shared_engine.sampling import Sampler
from tests.toy import toy_member

R = TypeVar("R")
PROMPT = "Tell me a story."


class _TrackedSession:
    """A member's session that records how many calls run in it at once."""

    def __init__(self, inner: Any, owner: ThreadedMember) -> None:
        self._inner, self._owner = inner, owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _tracked(self, fn: Callable[..., R], *args: Any) -> R:
        with self._owner.guard:
            self._owner.active += 1
            self._owner.most_active = max(self._owner.most_active, self._owner.active)
        try:
            if self._owner.delay_s:
                time.sleep(self._owner.delay_s)
            return fn(*args)
        finally:
            with self._owner.guard:
                self._owner.active -= 1

    def sync(self, target: list[int], first_row: int) -> torch.Tensor:
        return self._tracked(self._inner.sync, target, first_row)

    def step(self, token: int) -> torch.Tensor:
        return self._tracked(self._inner.step, token)

    def rows_at(self, target: list[int], positions: Sequence[int]) -> dict[int, torch.Tensor]:
        return self._tracked(self._inner.rows_at, target, positions)


class ThreadedMember:
    """A toy member whose compute runs in a worker thread of its own, as a remote or llama.cpp
    member's HTTP calls do (a transformers member queues every member's forwards on one thread, so
    nothing could overlap there). ``delay_s``: each call also waits this long (a slow server).
    It says it computes apart, as those do, unless ``computes_apart`` is False."""

    def __init__(self, inner: HFMember, delay_s: float = 0.0, computes_apart: bool = True) -> None:
        self._inner, self.delay_s = inner, delay_s
        self.capabilities = inner.capabilities.model_copy(update={"computes_apart": computes_apart})
        self.guard = threading.Lock()
        self.active = self.most_active = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def new_session(self) -> _TrackedSession:
        return _TrackedSession(self._inner.new_session(), self)

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        return await asyncio.to_thread(fn, *args)


def _pair(delay_s: float = 0.0) -> tuple[ThreadedMember, ThreadedMember]:
    return (ThreadedMember(toy_member("drafts", "metaspace", seed=3)),
            ThreadedMember(toy_member("checks", "byte_level", seed=4), delay_s))


def _fusions(result: Any) -> list[tuple[int, str, bool]]:
    return [(e.position, e.chosen, e.changed) for e in result.events if e.type == "ensemble"]


@pytest.mark.parametrize("confidence", [None, 0.5], ids=["paper-rule", "gated"])
def test_overlap_gives_the_same_greedy_answer_and_fusions(confidence: float | None) -> None:
    drafter, verifier = _pair(delay_s=0.01)

    def run(overlap: bool) -> Any:
        engine = EnsembleEngine([drafter, verifier], method="safe", drafter_confidence=confidence,
                                overlap=overlap, max_new_tokens=48, draft_length=4)
        return engine.generate(PROMPT, keep_events=True)

    off, on = run(False), run(True)
    assert on.text == off.text
    assert _fusions(on) == _fusions(off)
    assert on.stats.tokens == off.stats.tokens and on.stats.rounds == off.stats.rounds
    assert off.stats.ahead_drafts == 0
    # the drafter drafted ahead in every verified round but the last; some rounds stood whole (their
    # early draft was taken), others diverged (theirs was thrown away)
    assert on.stats.ahead_drafts > 0
    assert 0 < on.stats.ahead_drafts_used < on.stats.ahead_drafts, on.stats
    assert any(changed for *_, changed in _fusions(on))
    # a draft taken costs nothing extra; a draft thrown away costs the drafter the forwards it ran
    assert on.stats.forward_passes["drafts"] >= off.stats.forward_passes["drafts"]
    assert on.stats.forward_passes["checks"] == off.stats.forward_passes["checks"]
    assert drafter.most_active == 1 and verifier.most_active == 1  # a session never serves two calls at once


def test_the_drafter_really_drafts_while_the_verifier_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """With a verifier that takes its time, the drafter's early draft steps while it scores."""
    drafter, verifier = _pair(delay_s=0.05)
    seen = {"overlapping": 0}
    inner_step = _TrackedSession.step

    def step(self: _TrackedSession, token: int) -> torch.Tensor:
        if self._owner is drafter and verifier.active:
            seen["overlapping"] += 1
        return inner_step(self, token)

    monkeypatch.setattr(_TrackedSession, "step", step)
    engine = EnsembleEngine([drafter, verifier], method="safe", drafter_confidence=None, overlap=True,
                            max_new_tokens=32, draft_length=4, draft_schedule="fixed")  # 4 steps to see
    result = engine.generate(PROMPT)
    assert result.stats.ahead_drafts > 0
    assert seen["overlapping"] > 0


def test_by_default_it_overlaps_only_where_a_member_computes_apart() -> None:
    """``overlap="auto"`` (the default): on where a member says it computes apart (a server at a
    URL), off where every member runs in this process (transformers members: one compute thread, so
    an early draft could only queue behind the verifiers; in-process llama.cpp: the same cores)."""
    def ahead_drafts(members: list[Any], **options: Any) -> int:
        engine = EnsembleEngine(members, method="safe", drafter_confidence=None, max_new_tokens=32,
                                draft_length=4, **options)
        assert engine.options.overlap == options.get("overlap", "auto")
        return engine.generate(PROMPT).stats.ahead_drafts

    local = [toy_member("drafts", "metaspace", seed=3), toy_member("checks", "byte_level", seed=4)]
    assert not any(m.capabilities.computes_apart for m in local)
    assert ahead_drafts(local) == 0
    assert ahead_drafts(local, overlap="on") > 0
    assert ahead_drafts(list(_pair())) > 0
    assert ahead_drafts(list(_pair()), overlap="off") == 0
    mixed = [ThreadedMember(local[0], computes_apart=False), ThreadedMember(local[1])]
    assert ahead_drafts(mixed) > 0  # the verifier's server computes while this process drafts
    apart_nowhere = [ThreadedMember(m, computes_apart=False) for m in local]
    assert ahead_drafts(apart_nowhere) == 0


def test_overlap_reads_true_and_false_as_on_and_off() -> None:
    from shared_engine.options import EngineOptions

    assert EngineOptions(overlap=True).overlap == "on" and EngineOptions(overlap=False).overlap == "off"
    assert EngineOptions().overlap == "auto"
    with pytest.raises(ValueError):
        EngineOptions(overlap="sometimes")


def test_a_seeded_sampled_answer_is_reproducible_with_overlap() -> None:
    """With a temperature the early draft's draws happen before fusion samples (the round waits for
    it), so one seed gives one answer; and the early draft is still taken where a round stands."""
    drafter, verifier = _pair()

    def run() -> Any:
        engine = EnsembleEngine([drafter, verifier], method="safe", overlap=True, max_new_tokens=40,
                                draft_length=4)
        return engine.generate(PROMPT, temperature=0.8, seed=7)

    first, second = run(), run()
    assert first.text == second.text
    assert first.stats.ahead_drafts > 0 and first.stats.ahead_drafts_used > 0


def test_a_stopped_early_draft_ends_at_its_next_token() -> None:
    member = toy_member("drafts", "metaspace", seed=3)
    messages = [{"role": "user", "content": PROMPT}]
    state = RequestState(request_members([member], ["drafts"], [member.new_session()],
                                         [member.prompt_ids(messages)]), max_new_tokens=40)
    stop = threading.Event()
    full = _draft(state, DraftBase.of(state), 6, Sampler(0.0), None, stop)
    assert len(full.ids) == 6
    stop.set()
    stopped = _draft(state, DraftBase.of(state), 6, Sampler(0.0), None, stop)
    assert stopped.ids == full.ids[:1]


def test_an_early_draft_continues_the_answer_as_if_the_draft_stood() -> None:
    """``DraftBase.after``: the drafter's target and loop tail of the answer followed by the draft,
    without committing it."""
    member = toy_member("drafts", "metaspace", seed=3)
    messages = [{"role": "user", "content": PROMPT}]
    state = RequestState(request_members([member], ["drafts"], [member.new_session()],
                                         [member.prompt_ids(messages)]), max_new_tokens=40, loop_guard=16)
    first = _draft(state, DraftBase.of(state), 4, Sampler(0.0), None)
    ahead = DraftBase.after(state, first)
    state.commit(first.ids, "draft")
    committed = DraftBase.of(state)
    assert (ahead.target, ahead.tail, ahead.opening) == (committed.target, committed.tail, committed.opening)


def test_a_diverged_round_stops_its_early_draft() -> None:
    """A slow drafter and a quick verifier: where fusion changes a token the early draft is told to
    stop, so it runs a token or two of its six instead of all of them."""
    drafter = ThreadedMember(toy_member("drafts", "metaspace", seed=3), delay_s=0.08)
    verifier = ThreadedMember(toy_member("checks", "byte_level", seed=4))

    def run(overlap: bool) -> Any:
        engine = EnsembleEngine([drafter, verifier], method="safe", drafter_confidence=None, overlap=overlap,
                                max_new_tokens=60, draft_length=6)
        return engine.generate(PROMPT)

    off, on = run(False), run(True)
    assert on.text == off.text
    thrown_away = on.stats.ahead_drafts - on.stats.ahead_drafts_used
    assert thrown_away > 0
    extra = on.stats.forward_passes["drafts"] - off.stats.forward_passes["drafts"]
    assert extra <= 2 * thrown_away, (extra, thrown_away)  # unstopped: up to 6 each
