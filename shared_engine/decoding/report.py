"""Decisions into what the caller sees: ``Stats`` counters and the rounded display events.

The one place both rounds (SAFE's ``decode_round``, AdaFuse's ``adafuse_round``) report through, so
a counter means the same for every method and the display rules (rounding, how many candidates are
shown) are written once.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal

import torch

from ..alignment import EOS_KEY
from ..events import AdaFuseEvent, Candidate, DraftEvent, EnsembleEvent, SpanCandidate, Stats
from .decisions import FusionDecision, SpanDecision

CANDIDATES_SHOWN = 10
"""Fused candidates listed in an ``ensemble`` event, most probable first."""
PROB_DIGITS = 5
"""Decimals of a probability in an event."""
NLL_DIGITS = 4
"""Decimals of a negative log-likelihood or uncertainty measure in an event."""


def show(key: bytes) -> str:
    """A candidate as display text: ``<eos>`` for ending the answer (after an AdaFuse span's text where
    its writer ended with it: ``" Sofia.<eos>"``), bytes decoded leniently."""
    text = key[:-len(EOS_KEY)] if key.endswith(EOS_KEY) else key
    return text.decode("utf-8", "replace") + ("<eos>" if text != key else "")


def partial_hex(key: bytes) -> str | None:
    """A candidate's bytes in hex where ``show`` cannot read them whole (part of a character's
    bytes reads "\ufffd", and several such candidates read alike); None for whole characters."""
    text = key[:-len(EOS_KEY)] if key.endswith(EOS_KEY) else key
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return text.hex(" ")
    return None


# -- SAFE's round and the per-token baselines ----------------------------------------------------

def count_draft(stats: Stats, drafted: int, chosen: int, loop_breaks: int = 0) -> None:
    """A round began with a draft of ``drafted`` tokens; the draft schedule had chosen ``chosen``
    (more than ``drafted`` where the draft reached EOS or the answer's length cap); the loop guard
    turned the drafter off its first choice at ``loop_breaks`` of them."""
    stats.rounds += 1
    stats.loop_breaks += loop_breaks
    stats.drafted_tokens += drafted
    stats.draft_lengths[chosen] = stats.draft_lengths.get(chosen, 0) + 1


def count_turn_markers(stats: Stats, positions: int) -> None:
    """At ``positions`` a member's turn marker (turn_markers.py) held mass and was moved."""
    stats.turn_markers += positions


@contextmanager
def timed(stats: Stats, phase: Literal["draft", "verify"]) -> Iterator[None]:
    """Add the wall time of the block to ``Stats.draft_s`` or ``Stats.verify_s``."""
    began = time.perf_counter()
    try:
        yield
    finally:
        seconds = time.perf_counter() - began
        if phase == "draft":
            stats.draft_s += seconds
        else:
            stats.verify_s += seconds


def count_ahead_draft(stats: Stats, used: bool) -> None:
    """The drafter drafted the next round while the verifiers scored this one (overlap); ``used``:
    this round committed its draft whole, so the next round takes that draft."""
    stats.ahead_drafts += 1
    stats.ahead_drafts_used += int(used)


def count_unverified_round(stats: Stats) -> None:
    """The drafter's confidence alone decided the whole draft: no verifier forward this round."""
    stats.unverified_rounds += 1


def draft_event(label: str, pieces: list[bytes], ids: list[int]) -> DraftEvent:
    return DraftEvent(member=label, token_ids=ids, tokens=[p.decode("utf-8", "replace") for p in pieces])


def count_fusion(stats: Stats, decision: FusionDecision, times: int = 1) -> None:
    """Fusion ran at one position (and may have changed the drafted token); ``times=-1`` takes it back."""
    stats.ensembled_tokens += times
    stats.changed_tokens += times * int(decision.changed)
    stats.loop_breaks += times * int(decision.loop_blocked)


def uncount_fusions_past(stats: Stats, decisions: list[FusionDecision], end: int) -> None:
    """Take back the fusions at positions the answer never reached (``end``: its tokens, plus the
    EOS that ended it): a stop string can end a draft before positions already fused, and the
    stats count what the answer holds, so the ensemble rate stays a share of its positions."""
    for decision in decisions:
        if decision.position >= end:
            count_fusion(stats, decision, times=-1)


def fusion_event(decision: FusionDecision) -> EnsembleEvent:
    fused = decision.fused
    order = torch.argsort(fused.fused, descending=True)[:CANDIDATES_SHOWN].tolist()
    candidates = [Candidate(text=show(fused.keys[i]), fused=round(float(fused.fused[i]), PROB_DIGITS),
                            member_probs={label: round(float(fused.member_probs[m, i]), PROB_DIGITS)
                                          for m, label in enumerate(decision.members)},
                            hex=partial_hex(fused.keys[i]))
                  for i in order]
    listed = [fused.keys[i] for i in order]
    return EnsembleEvent(position=decision.position, offset=decision.offset, candidates=candidates,
                         sharpened=decision.sharpened, chosen=show(decision.chosen),
                         chosen_index=listed.index(decision.chosen) if decision.chosen in listed else None,
                         drafted=show(decision.drafted) if decision.drafted else None, changed=decision.changed)


# -- AdaFuse's round -------------------------------------------------------------------------------

def count_span_round(stats: Stats) -> None:
    """An AdaFuse round began: it commits one span (or ends the answer)."""
    stats.rounds += 1
    stats.spans += 1


def count_span(stats: Stats, decision: SpanDecision, committed: int) -> None:
    """The chosen span was committed as ``committed`` drafter tokens. A voted span counts as fused
    (all its tokens ensembled); as changed where the drafter's own first proposal was another span."""
    stats.loop_breaks += int(decision.loop_ruled_out > 0)
    if not decision.voted:
        return
    stats.fused_spans += 1
    stats.ensembled_tokens += committed
    if decision.drafter_proposal and decision.drafter_proposal != decision.chosen:
        stats.changed_tokens += committed


def count_span_source(stats: Stats, own: bool, voted: bool, committed: int) -> None:
    """Whose text a committed span is, in SAFE's terms (``tokens == accepted + chosen``): the
    drafter's own proposal is its draft (drafted and accepted, voted on or not); any other member's
    span was chosen over it (by the vote, or written by a sure leader with ``vote="uncertain"``).
    ``commit`` counted a voted span as chosen and a leader's as accepted; this corrects both."""
    if own:
        stats.drafted_tokens += committed
        if voted:
            stats.chosen_tokens -= committed
            stats.accepted_tokens += committed
    elif not voted:
        stats.accepted_tokens -= committed
        stats.chosen_tokens += committed


def span_event(decision: SpanDecision) -> AdaFuseEvent:
    # Best first, as shown (stable: candidates whose shown scores tie keep the proposal order).
    ranked = sorted(decision.candidates, key=lambda c: round(c.score, NLL_DIGITS))
    candidates = [SpanCandidate(text=show(c.key), proposed_by=c.proposed_by,
                                member_nll={label: round(v, NLL_DIGITS) for label, v in c.member_nll.items()},
                                score=round(c.score, NLL_DIGITS), hex=partial_hex(c.key))
                  for c in ranked]
    listed = [c.key for c in ranked]
    return AdaFuseEvent(position=decision.position, offset=decision.offset, uncertainty=decision.uncertainty,
                        member_uncertainty={label: round(v, NLL_DIGITS)
                                            for label, v in decision.member_uncertainty.items()},
                        leader=decision.leader, fused=decision.voted, words=decision.words,
                        candidates=candidates, chosen=show(decision.chosen),
                        chosen_index=listed.index(decision.chosen) if decision.chosen in listed else None)
