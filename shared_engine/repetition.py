"""A loop guard: no token may extend an exact repetition at the answer's end past a length.

Small models fall into loops ("a cat is a cat, a cat is a cat, ..." until the length cap), and an
ensemble falls into them more often: a fusion moves the answer off the drafter's own path, and the
drafter, copying from a context it did not choose, repeats it (docs/results/analyses.md, MMLU-Redux: 21 of
the ensemble's 27 capped answers were loops). None of SAFE, AdaFuse, UniTE or GaC guards against
this; Hugging Face's ``no_repeat_ngram_size`` does, but bans every repeated n-gram, which breaks
legitimate repetition in arithmetic ("5 + 5 + 5").

This guard works on the answer's **bytes**, the level every member shares (as the JSON
constraint does), so the same rule applies to the drafter's tokens and to fused candidate strings
of any vocabulary. The answer's tail is a *loop* when it is periodic with some period ``p``
(``text[i] == text[i - p]``) over at least two whole periods and at least ``min_bytes`` bytes;
a piece *continues* the loop when appending it keeps the tail periodic with that period. The
decoding round never drafts or fuses to such a piece while another one is on offer, so a loop
stops growing after ``min_bytes`` and the members' next choice (which may be EOS) is written
instead.
"""

from __future__ import annotations

MAX_PERIOD = 256
"""The longest repeated unit looked for, in bytes (a repeated line or formula of a few dozen
tokens); longer exact repeats are left alone."""


def loop_unit(text: bytes, min_bytes: int) -> bytes | None:
    """The repeated unit if ``text`` ends in a loop (>= 2 periods and >= ``min_bytes`` bytes of one
    period), else None; the shortest such unit, so its continuation is the loop's own."""
    n = len(text)
    for period in range(1, min(MAX_PERIOD, n // 2) + 1):
        run = max(period, min_bytes - period)  # bytes that must equal the bytes one period earlier
        if run + period > n:
            break
        if text[n - run:] == text[n - run - period:n - period]:
            return text[n - period:]
    return None


def continues_loop(unit: bytes | None, piece: bytes) -> bool:
    """Whether appending ``piece`` keeps repeating ``unit`` (the answer's loop, see ``loop_unit``)."""
    if unit is None or not piece:
        return False
    repeated = unit * (len(piece) // len(unit) + 1)
    return repeated.startswith(piece)
