"""Top-K distributions from servers, turned into full-vocabulary logits the decoders can use.

Servers return only the K most likely ids with their log-probabilities. Decoders, fusion and the
consensus/boundary checks work on a full logits row, so each top-K result becomes one:

- the K returned ids keep their exact log-probabilities;
- the remaining probability mass ``1 - sum(top-K probs)`` is spread **evenly** over every other id
  (the maximum-entropy guess: the server told us nothing about how it is shared).

``softmax`` of the row is then a proper distribution whose top-K part equals the server's. Effects
worth knowing: the argmax and every top-K probability are exact, so greedy decoding, SAFE's
consensus check and UniTE (which fuses each member's top-10) see the true values when K >= 10; a
candidate outside a member's top-K gets the small uniform share instead of its true probability
(UniTE's re-scoring of missing candidates and GaC's union sum see that share); sampling with
``temperature > 0`` and ``top_p = 1`` picks an id outside the top-K with exactly the missing mass,
but uniformly among those ids, so use ``top_p < 1`` (or a larger K) with top-K members.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

MIN_REST_MASS = 1e-9
"""Floor for the mass outside the top-K (rounding can make the top-K sum reach or pass 1)."""
MAX_LOGPROB = 0.01
"""The largest log-probability taken as a rounded 0 (a server computing in float16 reports the
certain token's as a little above 0); above it the number is no probability at all."""


@dataclass(frozen=True, slots=True)
class TopK:
    """One position's top-K: token ids and their natural-log probabilities (any order)."""

    ids: list[int]
    logprobs: list[float]

    def __post_init__(self) -> None:
        if len(self.ids) != len(self.logprobs) or not self.ids:
            raise ValueError("a top-K entry needs as many ids as log-probabilities, at least one")
        # NaN or +inf (JSON NaN/Infinity, which Python's json reads) or a probability well above 1
        # passed silently: the fused row became NaN and the answer degenerated to one id repeated.
        # -inf is a real answer (a token the model rules out).
        bad = next((lp for lp in self.logprobs if not lp <= MAX_LOGPROB), None)
        if bad is not None:
            raise ValueError(f"log-probability {bad} is not a probability's log (NaN, +inf or above 0)")


def topk_logits(entry: TopK, vocab_size: int) -> torch.Tensor:
    """A ``[vocab_size]`` float32 logits row whose softmax keeps the top-K exact (see module doc)."""
    ids = torch.tensor(entry.ids, dtype=torch.long)
    logprobs = torch.tensor(entry.logprobs, dtype=torch.float64)
    if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
        raise ValueError(f"token id outside the vocabulary of {vocab_size}")
    others = vocab_size - len(set(entry.ids))
    rest = max(1.0 - float(torch.exp(logprobs).sum()), MIN_REST_MASS)
    fill = math.log(rest / others) if others > 0 else -math.inf
    row = torch.full((vocab_size,), fill, dtype=torch.float64)
    row[ids] = logprobs
    return row.float()


def topk_rows(entries: list[TopK], vocab_size: int) -> torch.Tensor:
    """Stack several positions into ``[len(entries), vocab_size]``."""
    return torch.stack([topk_logits(e, vocab_size) for e in entries])
