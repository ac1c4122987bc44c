"""When to ensemble: one small policy object per method, read by the one decoding round.

Every method is the same round (draft -> verify -> maybe fuse -> commit, decoding/round.py);
a policy only says how long the draft is, whether verification can be skipped, whether the
boundary (OOV-like) check applies, and whether members already agree.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Policy:
    """Knobs of the round for one method."""

    name: str
    draft_length: int
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

    def needs_verification(self, drafter_logits: torch.Tensor) -> bool:
        if not self.uses_verifiers:
            return False
        if self.gate_threshold is None:
            return True
        return float(torch.softmax(drafter_logits, dim=-1).max()) < self.gate_threshold


    def drafter_decides_alone(self, drafter_probs: Iterable[float]) -> bool:
        """True when no drafted position can be fused: SAFE with ``drafter_confidence`` treats a
        position where the drafter's probability of its token is >= it as agreed whatever the
        verifiers say, so a draft that is that sure everywhere is committed without their forward
        (they catch up in the next verified round's one pass). Exact: the same tokens are committed."""
        threshold = self.drafter_confidence
        return self.skip_consensus and threshold is not None and all(p >= threshold for p in drafter_probs)


def agree(own_probs: list[float], argmax_is_own: list[bool], weights: torch.Tensor) -> bool:
    """SAFE's consensus rule for N members: every member's argmax is its own next token, or the
    ``weights``-weighted mean probability of those tokens is > 0.5. ``weights`` are fusion's
    (normalised), so either condition guarantees the drafted token is the argmax of the very
    weighted mean fusion would take (> 0.5 leaves nothing that could beat it): a consensus skip
    never disagrees with what fusion would pick."""
    if all(argmax_is_own):
        return True
    mean = sum(float(w) * p for w, p in zip(weights.tolist(), own_probs)) / float(weights.sum())
    return mean > 0.5


def make_policy(method: str, draft_length: int, gate_threshold: float,
                drafter_confidence: float | None = None) -> Policy:
    if method == "safe":
        return Policy("safe", draft_length, verify_draft=True, require_boundary=True, skip_consensus=True,
                      drafter_confidence=drafter_confidence)
    if method == "every-token":
        return Policy("every-token", 1, verify_draft=False, require_boundary=False, skip_consensus=False)
    if method == "gac-threshold":
        return Policy("gac-threshold", 1, verify_draft=False, require_boundary=False,
                      skip_consensus=False, gate_threshold=gate_threshold)
    if method == "single":
        return Policy("single", draft_length, verify_draft=False, require_boundary=False,
                      skip_consensus=False, uses_verifiers=False)
    raise ValueError(f"unknown method {method!r}")

