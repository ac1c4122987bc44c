"""What a round decided, as plain values: the rounds return these, ``report.py`` counts and shows them.

As in gpt-fast (the loop decides, ``generate`` counts) and vLLM's spec-decode (metrics kept apart),
the decoding algorithms never touch ``Stats`` counters for a decision nor round numbers for display.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ..fusion import Fused


@dataclass(frozen=True, slots=True)
class FusionDecision:
    """One fusion at one position of the answer (SAFE's round and the per-token baselines)."""

    position: int  # index in the answer (drafter tokens) of the fused token
    offset: int  # byte offset in the answer where it starts
    members: tuple[str, ...]  # labels, in the order of ``fused.member_probs``' rows
    fused: Fused  # the candidates with each member's and the fused probability
    sharpened: bool
    chosen: bytes  # the candidate fusion picked (EOS_KEY: end the answer)
    drafted: bytes | None  # the candidate the drafter had drafted here (None: a special token)
    loop_blocked: bool = False  # the loop guard ruled out the fused favourite (it repeated the answer's end)

    @property
    def changed(self) -> bool:
        """The fused choice differs from the draft: the round commits it and drafts anew."""
        return self.chosen != self.drafted


@dataclass(frozen=True, slots=True)
class ScoredSpan:
    """One candidate span of an AdaFuse round, with its scores (unrounded)."""

    key: bytes  # the span's bytes, or EOS_KEY
    proposed_by: list[str]  # labels of the members whose continuations gave it
    member_nll: dict[str, float]  # label -> mean token NLL of the span under that member
    score: float  # the weighted mean of ``member_nll``; the lowest wins


@dataclass(frozen=True, slots=True)
class SpanDecision:
    """One AdaFuse round: the members' uncertainty, the candidates and the span chosen."""

    position: int  # index in the answer (drafter tokens) where the span starts
    offset: int  # byte offset in the answer where it starts
    uncertainty: Literal["margin", "entropy"]
    member_uncertainty: dict[str, float]  # label -> the measure at the member's next token
    leader: str  # the most confident member
    voted: bool  # True: every member scored the candidates; False: the sure leader wrote alone
    candidates: list[ScoredSpan]
    chosen: bytes
    words: int  # words in the chosen span
    drafter_proposal: bytes | None  # the drafter's own first (greedy) proposal, if it made one
    loop_ruled_out: int = 0  # candidate spans the loop guard removed (the answer would end in a loop)
