"""A plain-format member's turn marker, read as what it is: the end of its turn, never a word.

A base model without a chat template reads the conversation in the plain ``User:/Assistant:``
format (members/chat.py) and ends its turn by writing the next one, ``"\\nUser:"``: that is its
stop string. Its answer starts on a new line (the prompt ends ``"Assistant:\\n"``), so where a line
starts it often gives the role word ``"User"`` most of its mass. As a fusion candidate that mass
is not a vote for the word "User": measured on FLORES en-de (Qwen + Gemma-3-270m), Gemma gave
"User" 0.58-0.62 where the translation's first word starts, it won where Qwen's first word was
flat, and 5 of 100 answers began "User:" and then copied the English source.

So a member's distribution is read with its turn marker (a token that writes the role word of one
of its stop strings at a line start, with or without what follows it in the stop string) as its
**end of turn**: the marker's mass is added to its EOS (the ``"\\n"`` before it was already written,
and ``"\\nUser:"`` would have ended the answer). Fusion never chooses to end at the answer's start
(nothing but whitespace written: an empty answer is never the answer), so there that mass is a vote
for nothing: the member abstains with it. Renormalising the rest instead (the member's next choice
given that it does not end) was measured worse: on FLORES en-de Gemma's second choice is the English
source's first word, and doubling its share turned two German answers English.

Where the member itself writes (it drafts, or proposes an AdaFuse span), the answer's start is the
exception: there the marker is dropped and the rest renormalised, since the member must write
something; later its stop string ends the answer where it writes the marker (trimmed, as ever).
Only there: in SAFE and the baselines the drafter writes the answer (a fused token is its spelling,
and a plain verifier's marker is its EOS, never a token), so a plain member's stop string ends the
answer where it drafts, and a chat drafter's line "User: hi" (an example chat it was asked for)
stays whoever verifies it. In AdaFuse any member may write a span, so every plain member's stop
string applies whoever wrote the span: a span's writer is not one member (several may propose the
same span) and the marker may straddle two spans of different writers, so it is not restricted.
Members with a chat template have no such stop string and are never changed.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Sequence

import torch

from .alignment import TokenTable
from .members.chat import ASSISTANT_TURN

PROMPT_END = ASSISTANT_TURN.encode()
"""What a plain-format member reads just before the answer (its prompt's last line)."""
MARKER_COUNTED = 0.01
"""A turn marker counts in ``Stats.turn_markers`` where it held at least this share of a member's mass."""


_MARKER_STOPS = 64
"""Stop strings one table remembers marker ids for (then it starts over)."""


def _marker_ids(table: TokenTable, stop: bytes) -> tuple[frozenset[int], ...]:
    """Per m: the ids whose piece writes the role word of ``stop`` once the text before them ends
    with its first m bytes. The role word is the stop string up to its last letter ("\\nUser" of
    "\\nUser:"); what a piece writes after it must agree with the rest (":"), so "Users" is a word.
    Built once per (tokenizer, stop string): one pass over the vocabulary, kept in the table's
    ``memo`` (so it goes with the table)."""
    known: dict[bytes, tuple[frozenset[int], ...]] | None = table.memo.get("marker_ids")
    if known is None:
        known = table.memo["marker_ids"] = {}
    found = known.get(stop)
    if found is None:
        if len(known) >= _MARKER_STOPS:
            known.clear()
        found = known[stop] = _build_marker_ids(table, stop)
    return found


def _build_marker_ids(table: TokenTable, stop: bytes) -> tuple[frozenset[int], ...]:
    core = stop.rstrip(b":;,.!?-> \t")  # "\nUser" of "\nUser:"
    rest = stop[len(core):]
    per_m = []
    for m in range(len(core)):
        needed = core[m:]
        per_m.append(frozenset(
            i for i, piece in enumerate(table.pieces)
            if piece.startswith(needed) and _agrees(piece[len(needed):], rest)))
    return tuple(per_m)


def _agrees(after: bytes, rest: bytes) -> bool:
    return rest.startswith(after) or after.startswith(rest)


_LOOKBACK = 64
"""Bytes of the answer's end that marker matching reads (longer than any role-marker stop string)."""
_NOT_SPACE = re.compile(rb"\S")


def marker_ids(table: TokenTable, stops: Sequence[str], before: bytes, end: int | None = None) -> frozenset[int]:
    """The ids of ``table`` that would write one of the turn markers of ``stops`` after the answer
    ``before[:end]`` (a plain-format member reads ``PROMPT_END`` just before it). Reads only the
    answer's last bytes, without copying the answer."""
    end = len(before) if end is None else end
    tail = PROMPT_END + before[max(0, end - _LOOKBACK):end]
    ids: frozenset[int] = frozenset()
    for stop in stops:
        encoded = stop.encode()
        for m, found in enumerate(_marker_ids(table, encoded)):
            if found and tail.endswith(encoded[:m]):
                ids |= found
    return ids


def at_answer_start(answer: bytes | bytearray, end: int | None = None) -> bool:
    """Nothing but whitespace in ``answer[:end]``: ending here would leave the answer empty. Stops at
    the first other byte, so on a long answer it reads one byte."""
    return _NOT_SPACE.search(answer, 0, len(answer) if end is None else end) is None


def read_turn_markers(logits: torch.Tensor, table: TokenTable, stops: Sequence[str], answer: bytes,
                      writing: bool = False, end: int | None = None) -> tuple[torch.Tensor, float]:
    """``logits`` with the member's turn markers after ``answer[:end]`` added to its EOS (the best EOS
    id's logit takes their mass), or dropped where the member ``writing`` its own next token stands
    at the answer's start; the input itself where nothing applies (at once for a member without stop
    strings). Also the probability the markers held, so the caller can count where the rule mattered."""
    if not stops:
        return logits, 0.0
    ids = [i for i in marker_ids(table, stops, answer, end) if i < logits.shape[-1]]
    if not ids:
        return logits, 0.0
    index = torch.tensor(ids)
    marker_logits = logits[index].float()
    mass = float((torch.logsumexp(marker_logits, 0) - torch.logsumexp(logits.float(), 0)).exp())
    out = logits.clone()
    out[index] = float("-inf")
    eos = [i for i in table.eos_ids if i < logits.shape[-1]]
    if eos and not (writing and at_answer_start(answer, end)):
        best = max(eos, key=lambda i: float(logits[i]))
        out[best] = torch.logsumexp(torch.cat([logits[best:best + 1].float(), marker_logits]), 0).to(out.dtype)
    return out, mass


def without_ending(logits: torch.Tensor, eos: Collection[int]) -> torch.Tensor:
    """``logits`` with the EOS ids masked, where an ensemble's answer is still only whitespace (an empty
    answer is never the answer: fusion never ends there either). As with a turn marker above, a member
    sure of ending at once is read by its next choice given that it writes something, so a sure SAFE
    drafter does not end the answer empty unverified (the confidence gate, the consensus skip), nor
    does an AdaFuse proposal of nothing win the vote. The input itself where only EOS is possible."""
    ids = [i for i in eos if i < logits.shape[-1]]
    if not ids:
        return logits
    out = logits.clone()
    out[ids] = float("-inf")
    return out if bool(torch.isfinite(out).any()) else logits
