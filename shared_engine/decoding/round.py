"""The decoding round shared by every method: draft -> verify -> fuse where needed -> commit.

SAFE (Yun et al., arXiv 2510.15346) in one function, in the spirit of gpt-fast's
``speculative_decode``. The policy (policies.py) turns the same round into the baselines:
``single`` (no verifiers), ``every-token`` (draft 1, always fuse, no boundary check) and
``gac-threshold`` (draft 1, verify only when the drafter is unsure).

One deliberate difference from the released SAFE code: when fusion picks the very token that was
drafted, the rest of the draft stays valid (every member's context is unchanged), so the scan goes
on instead of throwing the draft away. Greedy output is identical; drafter work is saved (the
project's findings measured ~half of all fusions choosing the drafted token).

How long a draft is comes from the policy's ``DraftSchedule``: adaptive by default (longer after a
round whose draft stood whole, shorter after a fusion changed a token), or SAFE's fixed gamma; each round
tells it which, and the request carries the length on to the next round.

With a temperature (the released code is greedy only), every position where fusion may run (a
shared boundary for SAFE) follows the fused distribution exactly: the drafted token is accepted
by the speculative-sampling rule against it (``sampling.speculative_choice``). The consensus skip,
which only proves that the drafted token is the fused argmax, applies to greedy decoding alone.

With a JSON constraint (``state.constraint``, see json_constraint.py) the drafter drafts only tokens
that keep the answer a valid JSON prefix, and fusion chooses only among candidates that do; where
none does, the drafted token stands. A sampled fusion there draws straight from the fused
distribution restricted to valid candidates (no speculative acceptance: the drafter's restricted
distribution is not known in closed form), which keeps the answer exact to that distribution.

With a loop guard (``state.loop_guard``, see repetition.py) the same two places leave out what would
repeat an exact loop at the answer's end once more: the drafter chooses again without that token,
fusion chooses among the candidates that do not repeat it.

Overlap (``policy.overlaps``: by default where a member is a server at a URL): while the
verifiers score round k, the drafter drafts round k+1 from the answer as it stands if round k is
committed whole (``DraftBase.after``). Where the round does commit it whole, the next round takes
that draft instead of drafting; where fusion changes a token, the early draft is stopped and thrown
away (the drafter's cache syncs back by longest common prefix, as after any divergence). The next
draft is the one the drafter would have written anyway (the same ids, the same cache state), so
greedy answers do not change; only when the work happens.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import torch

from ..alignment import EOS_KEY, TokenTable, is_char_boundary, whole_characters
from ..events import Event, TokenEvent, VerifiedPosition, VerifyEvent
from ..fusion import (
    HEUR_DRAFTER_TOP,
    Fuser,
    MemberDist,
    SharpenMode,
    candidate_key,
    drafter_extends,
    plausible,
    sharpen,
    top_keys,
    without_specials,
)
from ..gather import gather_all
from ..json_constraint import JsonPrefix, constrained_token
from ..members.base import exact_support
from ..policies import Policy, agree
from ..repetition import continues_loop
from ..sampling import Sampler, speculative_choice
from ..turn_markers import at_answer_start, without_ending
from .decisions import FusionDecision
from .drafts import AheadDraft, Draft
from .report import (
    count_ahead_draft,
    count_draft,
    count_fusion,
    count_turn_markers,
    count_unverified_round,
    draft_event,
    fusion_event,
    timed,
    uncount_fusions_past,
)
from .state import RequestState

_LOOP_TRIES = 8
"""Tokens masked at one position before the loop guard gives up there (each try is an argmax or a
draw; a model deep in a loop puts its next few choices on the loop too)."""


@dataclass(frozen=True, slots=True)
class DraftBase:
    """What a draft continues, taken from the request before the draft runs off the event loop (the
    round commits to the request meanwhile when the draft is an overlapped one)."""

    target: list[int]  # the drafter's prompt + answer ids
    opening: bytes | None  # the answer, while it is only whitespace and the drafter has a turn marker
    tail: bytes | None  # the answer's last bytes the loop guard reads (None: guard off)
    constraint: JsonPrefix | None
    blank: bool = False  # an ensemble's answer (two members with a say), still only whitespace: no ending

    @classmethod
    def of(cls, state: RequestState) -> DraftBase:
        """The committed answer."""
        opening = bytes(state.answer) if state.drafter.turn_stops and at_answer_start(state.answer) else None
        blank = len(state.weighted()) > 1 and at_answer_start(state.answer)
        return cls(state.drafter_target(), opening, state.loop_tail(), state.constraint, blank)

    @classmethod
    def after(cls, state: RequestState, draft: Draft) -> DraftBase:
        """The committed answer followed by ``draft`` whole (no JSON constraint: its state after the
        draft is the commit's to compute)."""
        pieces = state.drafter.table.to_bytes([t for t in draft.ids if t not in state.drafter.eos_ids])
        opening = None
        if state.drafter.turn_stops and at_answer_start(state.answer) and at_answer_start(pieces):
            opening = bytes(state.answer) + pieces
        tail = None if state.loop_guard is None else state.loop_tail((state.loop_tail() or b"") + pieces)
        blank = len(state.weighted()) > 1 and at_answer_start(state.answer) and at_answer_start(pieces) \
            and not any(t in state.drafter.eos_ids for t in draft.ids)
        return cls(state.drafter_target() + draft.ids, opening, tail, None, blank)


@dataclass(frozen=True, slots=True)
class VerifierView:
    """A verifier's distributions at the token starts of its tokenization, from the round start."""

    rows: dict[int, tuple[torch.Tensor | None, int | None]]
    """Byte offset of each token start -> (logits, own next token id); logits None where not asked for."""


@dataclass(frozen=True, slots=True)
class FusionSettings:
    fuse: Fuser
    sharpen: SharpenMode
    plausibility: float | None = None
    """Only candidates the drafter gives >= this fraction of its top candidate's probability can be
    chosen (``plausible``); None: any."""


def _draft(state: RequestState, base: DraftBase, length: int, sampler: Sampler, stop_below: float | None,
           stop: threading.Event | None = None) -> Draft:
    """Blocking: the drafter syncs its cache to ``base`` and drafts up to ``length`` tokens, fewer at
    EOS or (``stop_below``) after a token it gives less than that probability: fusion may change
    that token, and every token drafted past it would then be thrown away. ``stop``: an overlapped
    draft whose round diverged ends at its next token. Reads nothing of the request but the
    drafter's record and the loop guard's setting: the round may commit meanwhile."""
    session, eos = state.drafter.session, state.drafter.eos_ids
    support = exact_support(state.drafter.member)
    logits = session.sync(base.target, len(base.target))[-1]
    ids, rows, constraint, constraints, probs = [], [], base.constraint, [], []
    tail, loop_breaks, markers, ended = base.tail, 0, 0, False
    opening = base.opening  # the drafter writes the answer's first word: only whitespace so far
    blank = base.blank
    for j in range(length):
        if opening is not None:
            logits, counted = state.drafter.read(logits, opening, len(opening), writing=True)
            markers += counted
        if blank:  # an empty answer is never the ensemble's: fusion never ends there, nor may the drafter
            logits = without_ending(logits, eos)
        # a special token (other than EOS) is never a draft: its stored bytes are a literal name
        # ('<pad>'), and a confident draft is committed unfused. The row keeps the mask, so the gate,
        # the drafter's vote and speculative acceptance read the distribution the draft came from.
        logits = without_specials(logits, state.drafter.table)
        chosen, broke = _guarded_token(state, sampler, logits, support, constraint, state.loop_at(tail))
        loop_breaks += broke
        if chosen is None:  # no token of the drafter's can continue the JSON: the answer ends
            ended = True
            break
        if constraint is not None:
            constraints.append(constraint)
        token, constraint = chosen
        if tail is not None and token not in eos:
            tail = state.loop_tail(tail + state.drafter.table.pieces[token])
        if opening is not None:
            opening += state.drafter.table.pieces[token]
            opening = opening if at_answer_start(opening) else None
        blank = blank and at_answer_start(state.drafter.table.pieces[token])
        ids.append(token)
        rows.append(logits)
        if stop_below is not None:
            probs.append(_drafter_prob(state, token, logits))
        unsure = stop_below is not None and probs[-1] < stop_below
        finished = constraint is not None and constraint.finished
        stopped = stop is not None and stop.is_set()
        if token in eos or j == length - 1 or unsure or finished or stopped:
            break
        logits = session.step(token)
    return Draft(ids, rows, constraints, probs, loop_breaks, markers, ended)


def _guarded_token(state: RequestState, sampler: Sampler, logits: torch.Tensor, support: int | None,
                   constraint: JsonPrefix | None,
                   loop: bytes | None) -> tuple[tuple[int, JsonPrefix | None] | None, bool]:
    """The drafter's next token (under the JSON constraint, if any) that does not continue a loop at
    the answer's end (``loop``: the unit it repeats, see repetition.py; None: no loop). A token that
    would is masked and the choice made again, so a sampled token is drawn from the drafter's
    distribution without the loop's tokens; if every try continues the loop, the last one stands.
    Also says whether the guard turned the drafter off its first choice."""
    table, eos = state.drafter.table, state.drafter.eos_ids
    for tries in range(_LOOP_TRIES):
        if constraint is None:
            chosen: tuple[int, JsonPrefix | None] | None = (sampler.from_logits(logits, support), None)
        else:
            chosen = constrained_token(sampler, logits, support, table, constraint)
        if chosen is None or chosen[0] in eos or not continues_loop(loop, table.pieces[chosen[0]]):
            return chosen, tries > 0
        logits = logits.clone()
        logits[chosen[0]] = float("-inf")
    return chosen, True


class _ContextFull(Exception):
    """A verifier's window cannot hold the answer with this draft: ``max_new_tokens`` counts the
    drafter's tokens (checked against every window at the start), and a verifier may spell the same
    text in more of its own."""


async def _verify(state: RequestState, text: bytes, start: int, ends_with_eos: bool,
                  draft_ids: list[int], needed: set[int] | None = None) -> list[VerifierView]:
    """Every verifier reads ``text`` (re-tokenized incrementally, see ``RequestState.reading``),
    syncs its cache by longest common prefix and scores from byte ``start`` on in ONE request;
    verifiers run concurrently. ``needed``: the byte offsets whose rows can be used (None: every
    one): a backend that pays a decode step per row (llama.cpp) computes only those."""
    readings = [state.reading(i, text, draft_ids) for i in range(1, len(state.members))]
    for verifier, tokens in zip(state.verifiers, readings):
        if len(verifier.prompt_ids) + len(tokens.ids) > verifier.member.context_window:
            raise _ContextFull(verifier.label)
    jobs, layouts = [], []
    for verifier, tokens in zip(state.verifiers, readings):
        first, prompt = tokens.first_token_from(start), verifier.prompt_ids
        offsets = tokens.starts_from(first) + [len(tokens.data)]
        positions = [len(prompt) + first + r for r, o in enumerate(offsets) if needed is None or o in needed]
        jobs.append(verifier.member.run(verifier.session.rows_at, prompt + tokens.ids, positions))
        layouts.append((first, len(prompt) + first, offsets))
    all_rows = await gather_all(*jobs)
    views = []
    for tokens, (first, base, offsets), rows in zip(readings, layouts, all_rows):
        owns: list[int | None] = tokens.ids[first:] + [None]
        if ends_with_eos:
            owns[-1] = next(iter(sorted(tokens.table.eos_ids)), None)
        views.append(VerifierView({o: (rows.get(base + r), owns[r]) for r, o in enumerate(offsets)}))
    return views


def _own_prob(dist: MemberDist, own: tuple[int, ...]) -> tuple[float, bool]:
    """A member's probability of reading on as drafted, and whether that is its argmax.

    ``own`` holds the ids that continue the draft for this member: its next token in its own
    tokenization of the draft (SAFE's rule) and, if its vocabulary has it, the token with exactly
    the drafted token's bytes (so a non-canonical drafter split is not mistaken for disagreement).
    EOS counts as one token whichever of the member's EOS ids it is."""
    if not own:
        return 0.0, False
    probs = torch.softmax(dist.logits, dim=-1)
    top = int(torch.argmax(probs))
    eos = dist.table.eos_ids
    if any(t in eos for t in own):
        return float(probs[list(eos)].sum()), top in eos
    return max(float(probs[t]) for t in own), top in own


async def decode_round(state: RequestState, policy: Policy, fusion: FusionSettings,
                       sampler: Sampler) -> AsyncGenerator[Event, None]:
    """One round; yields events and leaves the state advanced (or finished)."""
    drafter = state.drafter
    start = len(state.answer)
    chosen = state.draft_length or policy.draft.start  # what the schedule asks; the answer's end may cut it
    with timed(state.stats, "draft"):
        draft = _ahead_draft(state)
        if draft is None:
            draft = await drafter.member.run(_draft, state, DraftBase.of(state),
                                             min(chosen, state.max_new_tokens - state.stats.tokens),
                                             sampler, policy.draft.stop_below)
    if not draft.ids:
        if draft.ended:
            state.finish_reason = "stop"  # the constraint left the drafter no token: the answer ends
        return
    count_draft(state.stats, len(draft.ids), chosen, draft.loop_breaks)
    count_turn_markers(state.stats, draft.turn_markers)
    if len(draft.ids) > 1:
        yield draft_event(drafter.label, [drafter.table.pieces[t] for t in draft.ids], draft.ids)

    # the gate reads the drafter's probability of the token it drafted: under a JSON constraint or the loop
    # guard that is not its top choice, and the row's max read it sure where it was overruled
    if len(state.members) == 1 or not policy.needs_verification(lambda: _drafted_prob(state, draft, 0)):
        state.draft_length = policy.draft.after(chosen, kept_whole=True)
        for event in _commit_whole(state, draft):
            yield event
        return
    drafter_probs = _drafter_probs(state, draft, policy)
    if policy.drafter_decides_alone(drafter_probs):
        count_unverified_round(state.stats)
        state.draft_length = policy.draft.after(chosen, kept_whole=True)
        for event in _commit_whole(state, draft):
            yield event
        return

    ends_with_eos = draft.ids[-1] in drafter.eos_ids
    draft_bytes = drafter.table.to_bytes([t for t in draft.ids if t not in drafter.eos_ids])
    text = bytes(state.answer) + (draft_bytes if policy.verify_draft else b"")
    ahead = _draft_ahead(state, policy, sampler, draft, chosen)
    fused: list[FusionDecision] = []  # this round's fusions, counted as they run
    try:
        with timed(state.stats, "verify"):
            try:
                views = await _verify(state, text, start, ends_with_eos and policy.verify_draft, draft.ids,
                                      _undecided_offsets(state, draft, drafter_probs, policy, start))
            except _ContextFull:  # the answer ends where every member can still read it
                state.finish_reason = "length"
                return
            if ahead is not None and not sampler.greedy:
                await ahead.wait()  # fusion samples below: the early draft's draws come first
        for sync_event in state.sync_events():
            yield sync_event

        weights = state.weights
        checked: list[VerifiedPosition] = []
        offset = start
        for j, token in enumerate(draft.ids):
            dists, owns, boundary, markers = _member_views(state, views, text, offset, token, draft.logits[j])
            count_turn_markers(state.stats, markers)
            complete = len(dists) == len(state.members)  # a verifier's row is missing where it was not needed
            fusable = boundary or not policy.require_boundary
            position = VerifiedPosition(offset=offset, boundary_ok=boundary)
            if fusable and policy.skip_consensus:
                probs, tops = zip(*(_own_prob(d, o) for d, o in zip(dists, owns)))
                confident = policy.drafter_confidence is not None and probs[0] >= policy.drafter_confidence
                # Consensus proves the drafted token is the fused *argmax*; a sampled answer must follow
                # the fused distribution, so there only the drafter-confidence gate skips fusion.
                position.consensus = confident or (
                    sampler.greedy and agree(list(probs), list(tops), weights))
                position.probs = {d.name: p for d, p in zip(dists, probs)}
                fusable = not position.consensus
            fusable = fusable and complete
            checked.append(position)
            if fusable:
                decision = _fuse(dists, weights, fusion, sampler, offset, token, state.stats.tokens + j,
                                 draft.constraints[j] if draft.constraints else None,
                                 state.loop_at(state.loop_tail(text[:offset])) if state.loop_guard else None,
                                 may_end=not at_answer_start(text, offset))
                count_fusion(state.stats, decision)
                fused.append(decision)
                if decision.changed:  # the draft diverges here
                    state.draft_length = policy.draft.after(chosen, kept_whole=False)
                    tokens = state.commit(draft.ids[:j], "draft")
                    if not state.finish_reason and decision.chosen == EOS_KEY:
                        state.finish_reason = "eos"
                    elif not state.finish_reason:
                        tokens += state.commit(state.ids_for_piece(decision.chosen), "ensemble")
                    for round_event in _round_events(state, fused, checked, tokens):
                        yield round_event
                    return
                # fusion kept the drafted token: every member's context is unchanged, scan on
            offset += len(drafter.table.pieces[token]) if token not in drafter.eos_ids else 0
        state.draft_length = policy.draft.after(chosen, kept_whole=True)
        for round_event in _round_events(state, fused, checked, _commit_whole(state, draft)):
            yield round_event
        if ahead is not None and not state.finish_reason:
            await ahead.settle(keep=True)
    finally:
        # a stop string (or the length cap) may end the answer before positions fusion already ran at
        uncount_fusions_past(state.stats, fused, _answer_end(state))
        if ahead is not None:
            await ahead.settle(keep=False)  # diverged, finished or failed: stop it, throw it away


def _round_events(state: RequestState, fused: list[FusionDecision], checked: list[VerifiedPosition],
                  tokens: list[TokenEvent]) -> list[Event]:
    """A verified round's events once its tokens are committed: the fusions the answer reached (a
    stop string or the length cap may end it before positions already fused, whose decisions would
    describe tokens no one receives), the verification, then the tokens."""
    reached: list[Event] = [fusion_event(d) for d in fused if d.position < _answer_end(state)]
    return [*reached, VerifyEvent(positions=checked), *tokens]


def _answer_end(state: RequestState) -> int:
    """Positions the answer holds: its tokens, plus the EOS that ended it, up to the first token a
    stop string cut away entirely (``RequestState.answer_end``)."""
    return state.answer_end


def _commit_whole(state: RequestState, draft: Draft) -> list[TokenEvent]:
    """Commit the whole draft; where the constraint left the drafter no token after it, the answer
    ends there (after the draft: finishing first dropped the draft's tokens, so the answer
    depended on the draft length)."""
    events = state.commit(draft.ids, "draft")
    if draft.ended and not state.finish_reason:
        state.finish_reason = "stop"
    return events


class _Ahead:
    """An overlapped draft in flight (see the module docstring): settled exactly once, and awaited
    before the drafter is used again, so its session never serves two drafts at a time."""

    def __init__(self, state: RequestState, job: asyncio.Future[Draft], stop: threading.Event,
                 answer_ids: int) -> None:
        self.state, self.job, self.stop, self.answer_ids = state, job, stop, answer_ids
        self.draft: Draft | None = None
        self.done = self.settled = False

    async def wait(self) -> None:
        """Until the draft is written (a failure leaves it None: it surfaces on the next real draft)."""
        if not self.done:
            try:
                self.draft = await self.job
            except Exception:  # noqa: BLE001
                self.draft = None
            self.done = True

    async def settle(self, keep: bool) -> None:
        """Keep the draft for the next round (this round committed its own draft whole) or stop it
        and throw it away."""
        if self.settled:
            return
        self.settled = True
        if not keep:
            self.stop.set()
        await self.wait()
        keep = keep and self.draft is not None and len(self.state.drafter_ids) == self.answer_ids
        count_ahead_draft(self.state.stats, used=keep)
        if keep and self.draft is not None:
            self.state.ahead = AheadDraft(self.state.drafter.label, self.answer_ids, self.draft)


def _draft_ahead(state: RequestState, policy: Policy, sampler: Sampler, draft: Draft, chosen: int) -> _Ahead | None:
    """Where the policy overlaps: start drafting the next round off the event loop, as if this round's
    draft stands whole (None where no next round could follow it, or under a JSON constraint)."""
    left = state.max_new_tokens - state.stats.tokens - len(draft.ids)
    if (not policy.verify_draft or state.constraint is not None or left <= 0
            or draft.ids[-1] in state.drafter.eos_ids or not policy.overlaps(m.member for m in state.members)):
        return None
    length = min(policy.draft.after(chosen, kept_whole=True), left)
    stop = threading.Event()
    job = asyncio.ensure_future(state.drafter.member.run(
        _draft, state, DraftBase.after(state, draft), length, sampler, policy.draft.stop_below, stop))
    return _Ahead(state, job, stop, len(state.drafter_ids) + len(draft.ids))


def _ahead_draft(state: RequestState) -> Draft | None:
    """The draft the last round wrote ahead, if this round starts where it was based."""
    ahead, state.ahead = state.ahead, None
    if ahead is None or ahead.drafter != state.drafter.label or ahead.answer_ids != len(state.drafter_ids):
        return None
    return ahead.draft


def _undecided_offsets(state: RequestState, draft: Draft, drafter_probs: list[float], policy: Policy,
                       start: int) -> set[int] | None:
    """The byte offsets of the drafted positions that the drafter's confidence does not decide: the
    only ones where the verifiers' distributions can change what is committed (None: without the
    confidence gate every position's consensus needs them)."""
    threshold = policy.confidence_gate
    if threshold is None:
        return None
    undecided, offset = set(), start
    for token, prob in zip(draft.ids, drafter_probs):
        if prob < threshold:
            undecided.add(offset)
        offset += len(state.drafter.table.pieces[token]) if token not in state.drafter.eos_ids else 0
    return undecided


def _drafter_probs(state: RequestState, draft: Draft, policy: Policy) -> list[float]:
    """The drafter's probability of each drafted token, once per round, for the confidence gate (none
    without it): those the draft's stop already computed, the rest from the draft's rows."""
    if policy.confidence_gate is None:
        return []
    return [_drafted_prob(state, draft, j) for j in range(len(draft.ids))]


def _drafted_prob(state: RequestState, draft: Draft, j: int) -> float:
    """The drafter's probability of its ``j``-th drafted token (the draft's stop may have computed it)."""
    return draft.probs[j] if j < len(draft.probs) else _drafter_prob(state, draft.ids[j], draft.logits[j])


def _drafter_prob(state: RequestState, token: int, logits: torch.Tensor) -> float:
    drafter = state.drafter
    return _own_prob(MemberDist(drafter.label, drafter.table, logits, None), (token,))[0]


def _member_views(state: RequestState, views: list[VerifierView], text: bytes, offset: int, token: int,
                  drafter_logits: torch.Tensor) -> tuple[list[MemberDist], list[tuple[int, ...]], bool, int]:
    """Every member's distribution at byte ``offset`` (verifiers only where one of their tokens
    starts there), the ids that would continue the draft for each, whether the offset is a
    boundary for all members (SAFE's OOV-like check), and how many members' turn markers held mass
    there. Each distribution is read with the member's turn marker moved (turn_markers.py)."""
    drafter = state.drafter
    piece = drafter.table.pieces[token]
    logits, counted = drafter.read(drafter_logits, text, offset)
    markers = int(counted)
    dists = [MemberDist(drafter.label, drafter.table, logits, exact_support(drafter.member))]
    owns: list[tuple[int, ...]] = [(token,)]
    boundary = offset <= len(text) and is_char_boundary(text, offset)
    for verifier, view in zip(state.verifiers, views):
        row = view.rows.get(offset)
        if row is None:
            boundary = False
            continue
        if row[0] is None:  # a position the drafter's confidence decides: this row was not computed
            continue
        member = verifier.member
        logits, counted = verifier.read(row[0], text, offset)
        markers += counted
        dists.append(MemberDist(verifier.label, member.table, logits, exact_support(member)))
        same = member.table.token_id(piece) if token not in drafter.eos_ids else None
        owns.append(tuple(t for t in (row[1], same) if t is not None))
    return dists, owns, boundary, markers


def _fuse(dists: list[MemberDist], weights: torch.Tensor, fusion: FusionSettings, sampler: Sampler,
          offset: int, drafted: int, position: int, constraint: JsonPrefix | None = None,
          loop: bytes | None = None, may_end: bool = True) -> FusionDecision:
    """Fuse the members' distributions at one position and pick the token (greedy: the fused
    argmax; sampling: the speculative rule against the fused distribution). With a JSON
    ``constraint`` only candidates that keep the answer valid can be chosen; with a ``loop`` (the
    unit the answer's end repeats, repetition.py) none that repeats it once more; without
    ``may_end`` (the answer's start: an empty answer is never the answer) not EOS, so a member's vote
    to end there counts for nothing (turn_markers.py)."""
    fused = fusion.fuse(dists, weights)
    drafter_top = set(top_keys(dists[0], HEUR_DRAFTER_TOP))
    scores, sharpened = sharpen(fused, weights, fusion.sharpen, drafter_top, drafter_extends(dists[0].table),
                                [d.table for d in dists])
    if fusion.plausibility is not None:
        scores = scores * plausible(fused, fusion.plausibility)
    drafted_key = candidate_key(dists[0].table, drafted)
    valid = None if constraint is None else torch.tensor([_keeps_valid(constraint, k) for k in fused.keys])
    repeats = [k != EOS_KEY and continues_loop(loop, k) for k in fused.keys] if loop is not None else []
    if any(repeats):
        valid = _also(valid, [not r for r in repeats])
    if not may_end and EOS_KEY in fused.keys:
        valid = _also(valid, [k != EOS_KEY for k in fused.keys])
    # a candidate holding part of a character (another vocabulary's byte piece, "\xe7"): the drafter
    # need not complete it, and a U+FFFD stayed in the answer; the drafted token stands as the drafter wrote it
    partial = [k not in (EOS_KEY, drafted_key) and not whole_characters(k) for k in fused.keys]
    if any(partial):  # their scores go, so sampling keeps the speculative rule against what is left
        whole = torch.tensor([not p for p in partial], dtype=scores.dtype)
        if float((scores * whole).sum()) > 0.0:
            scores = scores * whole
        else:  # nothing whole has any score: the drafted token stands, as where no candidate is valid
            valid = _also(valid, [not p for p in partial])
    if valid is not None:
        index = _valid_choice(scores, valid, sampler)
        if index is not None:
            key = fused.keys[index]
        else:  # no allowed candidate (or none left in the nucleus): the drafted token, valid by
            # construction (a constrained draft is never a special token other than EOS); a special
            # token the guard alone left without a candidate: the fused best after all
            key = drafted_key if drafted_key is not None else fused.keys[int(torch.argmax(scores))]
    elif sampler.greedy:
        key = fused.keys[int(torch.argmax(scores))]
    else:  # speculative sampling against the fused distribution: the answer follows it exactly
        proposal = _draft_mass(dists[0], sampler, fused.keys)
        index = fused.keys.index(drafted_key) if drafted_key in fused.keys else None
        key = fused.keys[speculative_choice(sampler, sampler.tempered(scores), proposal, index)]
    return FusionDecision(position=position, offset=offset, members=tuple(d.name for d in dists), fused=fused,
                          sharpened=sharpened, chosen=key, drafted=drafted_key,
                          loop_blocked=bool(repeats) and repeats[int(torch.argmax(scores))])


def _also(valid: torch.Tensor | None, allowed: list[bool]) -> torch.Tensor:
    """The candidates ``valid`` allows (None: all) that ``allowed`` allows too."""
    mask = torch.tensor(allowed)
    return mask if valid is None else valid & mask


def _draft_mass(drafter: MemberDist, sampler: Sampler, keys: list[bytes]) -> torch.Tensor:
    """The probability that the drafter's sampling put on each candidate string (every id that
    spells it; EOS: every EOS id)."""
    probs = sampler.distribution(drafter.logits, drafter.support)
    table, same = drafter.table, _ids_by_bytes(drafter.table)
    mass = []
    for key in keys:
        ids = list(table.eos_ids) if key == EOS_KEY else same.get(key, [])
        mass.append(float(probs[ids].sum()) if ids else 0.0)
    return torch.tensor(mass)


def _valid_choice(scores: torch.Tensor, valid: torch.Tensor, sampler: Sampler) -> int | None:
    """The fused choice among valid candidates (greedy: the best; sampling: a draw from the valid
    candidates' scores, tempered and cut by the nucleus among themselves); None when no valid candidate
    has any weight. The mask comes first: tempering floors every score at 1e-12, so where every valid
    candidate scored 0 (the plausibility filter, the partial-character rule) a draw fell evenly among
    them, valid scores below the floor (1e-13 against 1e-30) drew evenly too, and a nucleus taken over
    every candidate cut every valid one where an invalid candidate held the mass (or, at a high T, the
    invalid ones' floors kept it from cutting any)."""
    masked = scores * valid
    if float(masked.sum()) <= 0.0:
        return None
    if sampler.greedy:
        return int(torch.argmax(masked))
    return sampler.pick(sampler.tempered(masked / masked.max(), among=valid))


def _keeps_valid(constraint: JsonPrefix, key: bytes) -> bool:
    """Whether committing the candidate ``key`` keeps the answer a valid JSON prefix."""
    return constraint.complete if key == EOS_KEY else constraint.after(key) is not None


def _ids_by_bytes(table: TokenTable) -> dict[bytes, list[int]]:
    """Every id that can stand for a candidate string (byte-fallback duplicates included), built once
    per table and kept in its ``memo`` (so it goes with the table)."""
    found: dict[bytes, list[int]] | None = table.memo.get("ids_by_bytes")
    if found is None:
        found = table.memo["ids_by_bytes"] = _build_ids_by_bytes(table)
    return found


def _build_ids_by_bytes(table: TokenTable) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for token in range(table.vocab_size):
        key = candidate_key(table, token)
        if key is not None and key != EOS_KEY:
            out.setdefault(key, []).append(token)
    return out

