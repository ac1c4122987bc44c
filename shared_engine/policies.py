"""When to ensemble: one small policy object per method, read by the one decoding round.

Every method is the same round (draft -> verify -> maybe fuse -> commit, decoding/round.py);
a policy only says how long the draft is (``DraftSchedule``), whether verification can be skipped,
whether the boundary (OOV-like) check applies, and whether members already agree.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from .members.base import Member

ADAPTIVE_GROW = 2
"""Tokens the adaptive schedule adds after a round whose draft was committed whole."""
ADAPTIVE_SHRINK = 1
"""Tokens it takes away after a round where fusion changed a drafted token."""
ADAPTIVE_SHORTEST = 1
"""The adaptive schedule's shortest draft (its longest is the ``max_draft_length`` option)."""
ADAPTIVE_STOP_BELOW = 0.4
"""Without ``drafter_confidence``, the adaptive draft ends after a token the drafter gives less than
this (Hugging Face's default ``assistant_confidence_threshold``)."""


@dataclass(frozen=True, slots=True)
class DraftSchedule:
    """How many tokens the next round drafts, given the last round's length and outcome.

    Fixed (SAFE's gamma): always ``start``. Adaptive, as dynamic speculation lookahead in Hugging
    Face's assisted generation (``num_assistant_tokens_schedule="heuristic"`` with DISCO's
    ``assistant_confidence_threshold``): +2 after a round whose draft stood whole, -1 after a round
    where fusion changed a token, kept within [``shortest``, ``longest``]; and a draft ends early
    after a token the drafter gives less than ``stop_below``. With ``drafter_confidence`` that is
    the bar itself: only a token below it can be fused, so nothing drafted is thrown away."""

    start: int
    shortest: int
    longest: int
    grow: int = 0
    shrink: int = 0
    stop_below: float | None = None

    @classmethod
    def fixed(cls, length: int) -> DraftSchedule:
        return cls(length, length, length)

    @classmethod
    def adaptive(cls, start: int, longest: int, drafter_confidence: float | None = None) -> DraftSchedule:
        if not ADAPTIVE_SHORTEST <= start <= longest:
            raise ValueError(f"the first draft length {start} must be within [{ADAPTIVE_SHORTEST}, {longest}]")
        stop_below = ADAPTIVE_STOP_BELOW if drafter_confidence is None else drafter_confidence
        return cls(start, ADAPTIVE_SHORTEST, longest, ADAPTIVE_GROW, ADAPTIVE_SHRINK, stop_below)

    def after(self, length: int, kept_whole: bool) -> int:
        """The next round's length after a round that drafted ``length`` tokens and committed
        them all (``kept_whole``) or had one changed by fusion."""
        step = self.grow if kept_whole else -self.shrink
        return max(self.shortest, min(self.longest, length + step))


@dataclass(frozen=True, slots=True)
class Policy:
    """Knobs of the round for one method."""

    name: str
    draft: DraftSchedule
    verify_draft: bool
    """Verifiers score their tokenization of (answer + draft) — SAFE — instead of the answer only
    (per-token methods, which force every verifier to continue from the committed text)."""
    require_boundary: bool
    """SAFE's OOV-like check: fuse only where every member sits on a token boundary."""
    skip_consensus: bool
    """SAFE's consensus check: do not fuse where members already agree."""
    gate_threshold: float | None = None
    """GaC-threshold: verify and fuse only when the drafter's max probability is below this."""
    uses_verifiers: bool = True
    drafter_confidence: float | None = None
    """SAFE's GaC variant: also treat a position as agreed when the drafter's own probability of
    its token is >= this (the released code uses 0.5). Fewer fusions with a weak verifier."""
    overlap: Literal["auto", "on", "off"] = "off"
    """While the verifiers score a draft, the drafter drafts the next round as if it stands
    (round.py); the same greedy answers (a seeded answer is one answer per seed, not the same as
    without overlap: the early draft's draws come first). ``auto``: where a member computes
    apart (``Capabilities.computes_apart``: a server at a URL), i.e. where the two can run at the
    same time without taking each other's cores."""

    def overlaps(self, members: Iterable[Member]) -> bool:
        """Whether this request drafts ahead, given its members."""
        if self.overlap == "auto":
            return any(m.capabilities.computes_apart for m in members)
        return self.overlap == "on"

    def needs_verification(self, drafted_prob: Callable[[], float]) -> bool:
        """GaC's gate: the others are asked where the drafter gives the token it drafted less than the
        threshold (its top-1 probability unless a JSON constraint or the loop guard overruled it).
        ``drafted_prob`` is read only where a gate is set: a softmax over the vocabulary every round."""
        if not self.uses_verifiers:
            return False
        if self.gate_threshold is None:
            return True
        return drafted_prob() < self.gate_threshold


    @property
    def confidence_gate(self) -> float | None:
        """``drafter_confidence`` where it decides positions on its own (SAFE's consensus check), else None."""
        return self.drafter_confidence if self.skip_consensus else None

    def drafter_decides_alone(self, drafter_probs: Iterable[float]) -> bool:
        """True when no drafted position can be fused: SAFE with ``drafter_confidence`` treats a
        position where the drafter's probability of its token is >= it as agreed whatever the
        verifiers say, so a draft that is that sure everywhere is committed without their forward
        (they catch up in the next verified round's one pass). Exact: the same tokens are committed."""
        threshold = self.confidence_gate
        return threshold is not None and all(p >= threshold for p in drafter_probs)


def agree(own_probs: list[float], argmax_is_own: list[bool], weights: torch.Tensor) -> bool:
    """SAFE's consensus rule for N members: every member's argmax is its own next token, or the
    ``weights``-weighted mean probability of those tokens is > 0.5. ``weights`` are fusion's
    (normalised), so a weighted mean > 0.5 leaves no other candidate that could beat the drafted
    token under fusion's weights. Not exact where a verifier's own next token is a shorter string
    than the drafted one (Gemma drafts " Kilim", Qwen's own is " Kil"): the members "agree" by their
    own argmax while fusion's argmax may be " Kil" (README, "Where SAFE differs"; kept: changing it
    needs an accuracy evaluation)."""
    if all(argmax_is_own):
        return True
    mean = sum(float(w) * p for w, p in zip(weights.tolist(), own_probs)) / float(weights.sum())
    return mean > 0.5


def make_policy(method: str, draft: DraftSchedule, gate_threshold: float | None,
                drafter_confidence: float | None = None,
                overlap: Literal["auto", "on", "off"] = "off") -> Policy:
    """The policy of ``method``; ``draft`` is SAFE's schedule (``single`` drafts its first length,
    fixed: with nobody to check the draft there is nothing to adapt to). ``gate_threshold`` None:
    gac-threshold verifies every token (a drafter weighted 0 is never sure enough to write alone)."""
    if method == "safe":
        return Policy("safe", draft, verify_draft=True, require_boundary=True, skip_consensus=True,
                      drafter_confidence=drafter_confidence, overlap=overlap)
    if method == "every-token":
        return Policy("every-token", DraftSchedule.fixed(1), verify_draft=False, require_boundary=False,
                      skip_consensus=False)
    if method == "gac-threshold":
        return Policy("gac-threshold", DraftSchedule.fixed(1), verify_draft=False, require_boundary=False,
                      skip_consensus=False, gate_threshold=gate_threshold)
    if method == "single":
        return Policy("single", DraftSchedule.fixed(draft.start), verify_draft=False, require_boundary=False,
                      skip_consensus=False, uses_verifiers=False)
    raise ValueError(f"unknown method {method!r}")

