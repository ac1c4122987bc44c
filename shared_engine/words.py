"""Word spans for span-level decoding (AdaFuse): where a word ends, in any script, and whether
every member could stop there.

The released AdaFuse code splits text at whitespace and joins spans back with ``" "``, which breaks
code (its indentation and newlines) and text without spaces (CJK is one endless "word"). Here a
*word* is what a whitespace split gives, with its leading whitespace kept (so nothing is ever
re-joined): a run of characters up to the next whitespace, punctuation attached to the word before
it ("= 18." is the two words "=" and " 18."), except that a CJK character (ideograph, kana,
hangul) is a word of its own, with the punctuation that follows it ("京。"), as word segmenters
treat them. A word counts as *complete* only once something follows it (whitespace or a CJK
character), because the next token could still extend it.

A span may end only where every member's tokenization of the text has a token boundary
(``SharedEnds``): the same OOV-like rule SAFE applies to single tokens.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Sequence

from .alignment import TokenizedText, shared_boundaries, valid_prefix_length

_ZWJ, _VS16 = "\u200d", "\ufe0f"
_CJK_RANGES = ((0x2E80, 0x2FFF), (0x3000, 0x303F), (0x3040, 0x30FF), (0x3100, 0x31FF), (0x3400, 0x4DBF),
               (0x4E00, 0x9FFF), (0xAC00, 0xD7AF), (0xF900, 0xFAFF), (0xFF00, 0xFFEF),
               (0x20000, 0x2FFFF))


def _is_cjk(char: str) -> bool:
    code = ord(char)
    return any(lo <= code <= hi for lo, hi in _CJK_RANGES)


def is_mark(char: str) -> bool:
    """A character that belongs to the one before it: a combining mark, a joiner, a variation selector
    or a skin-tone modifier."""
    return unicodedata.category(char).startswith("M") or char in (_ZWJ, _VS16) or 0x1F3FB <= ord(char) <= 0x1F3FF


def _is_cjk_letter(char: str) -> bool:
    """A CJK character that is a word by itself (not CJK punctuation, which attaches)."""
    return _is_cjk(char) and unicodedata.category(char)[0] in "LN"


def word_ends(text: str) -> list[int]:
    """Character offsets where each word of ``text`` ends (the last one too, complete or not)."""
    ends: list[int] = []
    i, n = 0, len(text)
    while i < n:
        while i < n and text[i].isspace():
            i += 1
        if i == n:
            break
        if _is_cjk_letter(text[i]):
            i += 1
            while i < n and (is_mark(text[i]) or unicodedata.category(text[i])[0] in "PS"):
                i += 1  # its marks, and the punctuation after it
        else:  # a whitespace-split word, up to the next CJK character
            while i < n and not text[i].isspace() and not _is_cjk_letter(text[i]):
                i += 1
        ends.append(i)
    return ends


def complete_word_ends(data: bytes) -> list[int]:
    """Byte offsets in ``data`` after each *complete* word (one that something else follows)."""
    text = data[: valid_prefix_length(data)].decode("utf-8")
    ends = [e for e in word_ends(text) if e < len(text)]
    return [len(text[:e].encode("utf-8")) for e in ends]


class SharedEnds:
    """Token boundaries shared by every member in ``answer + continuation``, as offsets into the
    continuation. Works on copies of the members' tokenizations of the answer, re-encoding only
    the continuation (incremental), so it is cheap to ask after every generated token."""

    def __init__(self, answer: bytes, tokenizations: Sequence[TokenizedText]) -> None:
        self.answer = answer
        self._base = list(tokenizations)

    def __call__(self, continuation: bytes) -> set[int]:
        text = self.answer + continuation
        scratch = [TokenizedText(t.table, list(t.ids), list(t.ends), t.data) for t in self._base]
        for tokens in scratch:
            tokens.set_text(text)
        start = len(self.answer)
        # The end of the text is a boundary for everyone trivially: it says nothing about
        # whether a member would split there once more text follows, so it is left out.
        return {o - start for o in shared_boundaries(text, scratch) if start < o < len(text)}


def span_end(continuation: bytes, words: int, shared: set[int], finished: bool) -> int:
    """Where a span of ``words`` words of ``continuation`` should end: after the ``words``-th
    complete word if every member can stop there (or within the whitespace after it, ``word_cut``),
    else at the next complete word they share such a cut after; failing that the last shared word
    cut, then any shared boundary, then (only when the continuation is finished, e.g. by EOS) its
    end. Returns 0 if there is no safe end yet."""
    ends = complete_word_ends(continuation)
    if finished:
        ends.append(valid_prefix_length(continuation))
    cuts = [(i, cut) for i, e in enumerate(ends)
            if (cut := e if finished and e == len(continuation) else word_cut(continuation, e, shared)) is not None]
    later = [cut for i, cut in cuts if i + 1 >= words]
    if later:
        return later[0]
    if cuts:
        return cuts[-1][1]
    if shared:
        return max(shared)
    return valid_prefix_length(continuation) if finished else 0


def word_cut(data: bytes, end: int, shared: set[int]) -> int | None:
    """A shared boundary that ends the word ending at ``end``: ``end`` itself, or else the first one
    within the whitespace that follows it. Qwen writes ":\n" as one token where Gemma writes ":" and
    "\n", so after "Student:" no member set shares the word end, only the end of the new line;
    without this a span found no word end to stop at and ran to its token limit (16 tokens for a
    one-word span, and loops such as "Student:\n" x 20 won the vote by their low mean NLL)."""
    if end in shared:
        return end
    at = end
    while at < len(data) and data[at:at + 1] in _ASCII_SPACE:
        at += 1
        if at in shared:
            return at
    return None


_ASCII_SPACE = frozenset(bytes([c]) for c in b" \t\n\r\x0b\x0c")
