"""A round's draft, and one written ahead while the previous round's verifiers scored (overlap)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..json_constraint import JsonPrefix


@dataclass(frozen=True, slots=True)
class Draft:
    ids: list[int]
    logits: list[torch.Tensor]  # logits[j] predicted ids[j]
    constraints: list[JsonPrefix] = field(default_factory=list)  # with a JSON constraint: the state before ids[j]
    probs: list[float] = field(default_factory=list)  # the drafter's p(ids[j]) where the draft's stop computed it
    loop_breaks: int = 0  # positions where the loop guard turned the drafter off its first choice
    turn_markers: int = 0  # positions where the drafter's turn marker (turn_markers.py) was dropped
    ended: bool = False  # no token of the drafter's could continue the JSON: the answer ends here


@dataclass(slots=True)
class AheadDraft:
    """The next round's draft, written while this round's verifiers scored: valid for the round that
    starts where it was based (this drafter, this many answer ids)."""

    drafter: str
    answer_ids: int
    draft: Draft
