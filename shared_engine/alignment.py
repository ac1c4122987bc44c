"""Exact text <-> token alignment across tokenizers.

Every decision the ensemble makes is about *where* text may be split: SAFE only ensembles at
a character offset that is a token boundary for every member (its "OOV-like" check), because a
model forced to continue from inside one of its own tokens ("So" of "Sofia") drifts.
To get those offsets exactly we never compare decoded strings: each token id is mapped once to
the exact **bytes** it stands for (byte-level BPE ``Ġ``/``Ċ`` undone, SentencePiece ``▁`` made a
space, ``<0xAB>`` byte-fallback pieces made that byte). Offsets are then byte offsets into the
UTF-8 continuation, and an offset is a usable boundary only if it is also a character boundary.

Worked example: continuation ``" Sofia"``; tokenizer A splits ``[" Sofia"]``, tokenizer B
``[" So", "fia"]``. Boundary offsets A = {0, 6}, B = {0, 3, 6}; shared = {0, 6}: ensembling is
allowed before " Sofia" and after it, never after " So".
"""

from __future__ import annotations

import bisect
import re
import unicodedata
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from transformers import PreTrainedTokenizerBase

EOS_KEY = b"\x00<eos>"
"""Union key that stands for 'end of answer' in every member's vocabulary (see fusion)."""

END_OF_TURN_TOKENS = frozenset({
    "<|im_end|>", "<|endoftext|>", "<end_of_turn>", "<eos>", "</s>", "<|eot_id|>", "<|end|>",
    "<|end_of_text|>"})
"""Special tokens that end an answer in common chat formats, whatever the config's single eos id says
(Qwen's config names <|im_end|> but the model may also emit <|endoftext|>)."""

_BYTE_FALLBACK = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
_LOOKBEHIND_TOKENS = 4
"""Tokens re-encoded before the first changed byte: BPE merges can reach back across the edit."""
_WORD_LOOKBEHIND_TOKENS = 32
"""At most this many more, to start the re-encode at the beginning of the word the edit is in."""


@lru_cache(maxsize=1)
def _byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode map (``Ġ`` -> 0x20, ``Ċ`` -> 0x0A, ...)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    chars = printable[:]
    extra = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + extra)
            extra += 1
    return {chr(c): b for b, c in zip(printable, chars)}


def _decoder_kind(tokenizer: PreTrainedTokenizerBase) -> str:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    text = repr(getattr(backend, "decoder", None)) if backend is not None else ""
    if "ByteLevel" in text:
        return "byte_level"
    if "▁" in text or "Metaspace" in text or "ByteFallback" in text:
        return "sentencepiece"
    return "generic"


class TokenTable:
    """The exact bytes of every token id of one tokenizer, plus its special and EOS ids.

    Built once per tokenizer (about a second for a 262k vocabulary) and shared by all requests.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, vocab_size: int | None = None,
                 eos_ids: set[int] | None = None) -> None:
        self.tokenizer: PreTrainedTokenizerBase | None = tokenizer  # None: built by from_bytes
        self.name = type(tokenizer).__name__
        self._encoder: Callable[[str], list[int]] = self._encode_locally
        size = max(len(tokenizer), vocab_size or 0)
        kind = _decoder_kind(tokenizer)
        special = {int(i) for i in tokenizer.all_special_ids}
        added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
        special |= {int(i) for i, tok in added.items() if getattr(tok, "special", False)}
        self.special_ids: frozenset[int] = frozenset(special)
        eos = set(eos_ids or ())
        if tokenizer.eos_token_id is not None:
            eos.add(int(tokenizer.eos_token_id))
        pieces = tokenizer.convert_ids_to_tokens(list(range(len(tokenizer))))
        eos |= {i for i in self.special_ids if pieces[i] in END_OF_TURN_TOKENS}
        self.eos_ids: frozenset[int] = frozenset(eos)
        # Byte-fallback pieces (<0x61>) come first in Llama/Gemma vocabularies but are not what the
        # model predicts for "a": map the normal piece first, fallback pieces only where none exists.
        fallback = {i for i, p in enumerate(pieces) if p and _BYTE_FALLBACK.match(p)}
        self._index([self._piece_bytes(i, p, kind) for i, p in enumerate(pieces)], size, fallback)

    @classmethod
    def from_bytes(cls, pieces: list[bytes], *, special_ids: set[int], eos_ids: set[int],
                   encode: Callable[[str], list[int]], name: str,
                   secondary_ids: Iterable[int] = ()) -> TokenTable:
        """A table for a tokenizer known only by the exact bytes of its ids and an ``encode``
        function (a server's tokenize endpoint, see members/llamacpp.py). ``secondary_ids`` are ids
        whose bytes another id also spells and that the tokenizer does not produce for them (byte
        fallback): they are mapped only where no other id has the same bytes."""
        table = cls.__new__(cls)
        table.tokenizer = None
        table.name = name
        table._encoder = encode
        table.special_ids = frozenset(special_ids)
        table.eos_ids = frozenset(eos_ids)
        table._index(list(pieces), len(pieces), set(secondary_ids))
        return table

    def _index(self, pieces: list[bytes], size: int, fallback: set[int]) -> None:
        """Everything derived from the bytes of each id (shared by both constructors)."""
        self._same: weakref.WeakKeyDictionary[TokenTable, bool] = weakref.WeakKeyDictionary()
        self.memo: dict[str, Any] = {}
        """What other modules derive from this table, by their name for it (fusion, decoding, turn
        markers): it goes with the table. A global cache keyed by the table kept every freed member's
        table and tokenizer alive (about 258 MB per Gemma-3 engine created and closed)."""
        self.pieces: list[bytes] = pieces + [b""] * (size - len(pieces))  # padded logits rows: never candidates
        self.vocab_size = size
        self.longest_piece = max(1, max(map(len, self.pieces), default=1))
        """Most bytes one token spells (bounds the tokens a text needs from below)."""
        self._by_bytes: dict[bytes, int] = {}
        for i, piece in enumerate(self.pieces):
            if piece and i not in self.special_ids and i not in fallback:
                self._by_bytes.setdefault(piece, i)
        for i in sorted(fallback):
            self._by_bytes.setdefault(self.pieces[i], i)
        self._prefix_space = self._detect_prefix_space()
        self._unspellable = frozenset(b for b in range(256) if self.token_id(bytes([b])) is None)
        """Bytes no token spells alone (byte-level BPE only merges bytes it has, so no token has them)."""

    def _piece_bytes(self, token_id: int, piece: str | None, kind: str) -> bytes:
        if piece is None:
            return b""
        if token_id in self.special_ids:
            return piece.encode("utf-8")
        if kind == "byte_level":
            table = _byte_level_decoder()
            try:
                return bytes(table[ch] for ch in piece)
            except KeyError:  # an added (non-byte-level) token: stored verbatim
                return piece.encode("utf-8")
        if kind == "sentencepiece":
            match = _BYTE_FALLBACK.match(piece)
            if match:
                return bytes([int(match.group(1), 16)])
            return piece.replace("▁", " ").encode("utf-8")
        assert self.tokenizer is not None  # only __init__ (which has one) reads pieces
        return str(self.tokenizer.decode([token_id], clean_up_tokenization_spaces=False)).encode("utf-8")

    def _detect_prefix_space(self) -> bool:
        """SentencePiece-style tokenizers may prepend a space to the first word of any input;
        a continuation fragment must then be encoded behind an anchor (see encode_fragment)."""
        return self.to_bytes(self._encode("a")) == b" a"

    def _encode(self, text: str) -> list[int]:
        return self._encoder(text)

    def _encode_locally(self, text: str) -> list[int]:
        # split_special_tokens: answer text such as "</s>" is text, never a control token.
        assert self.tokenizer is not None  # the encoder of tables built with one
        return list(self.tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"])

    def same_vocabulary(self, other: TokenTable) -> bool:
        """Whether ``other`` gives every id the same bytes (two models sharing one tokenizer): such a
        verifier can read the drafter's own ids instead of a re-tokenization. Cached per pair."""
        if other is self:
            return True
        known = self._same.get(other)
        if known is None:
            known = self._same[other] = self.pieces == other.pieces and self.eos_ids == other.eos_ids
        return known

    def token_id(self, piece: bytes) -> int | None:
        """The id whose bytes are exactly ``piece`` (None if no single token is)."""
        return self._by_bytes.get(piece)

    def can_spell(self, piece: bytes) -> bool:
        """Whether ids spelling exactly ``piece`` exist (EOS_KEY: always). A fused candidate the
        drafter cannot spell can never be committed, so it must not be chosen."""
        return piece == EOS_KEY or self.token_id(piece) is not None or not self._unspellable.intersection(piece)

    def to_bytes(self, ids: list[int]) -> bytes:
        return b"".join(self.pieces[i] for i in ids)

    def encode_fragment(self, text: str) -> list[int]:
        """Token ids for ``text`` as it would appear *inside* a longer text: no BOS, and no
        implicit leading space from SentencePiece's dummy prefix."""
        if not text:
            return []
        if not self._prefix_space:
            return self._encode(text)
        anchored = self._encode("\n" + text)
        cut, consumed = 0, b""
        while cut < len(anchored) and len(consumed) < len(" \n"):
            consumed += self.pieces[anchored[cut]]
            cut += 1
        if consumed.strip(b" ") != b"\n":
            raise ValueError(f"cannot encode fragment {text!r} without a leading space")
        return list(anchored[cut:])

    def spell(self, text: str) -> list[int]:
        """Ids whose bytes are exactly ``text``: the canonical encoding when the tokenizer
        round-trips it, else normal runs encoded canonically and the characters its normaliser
        would change (e.g. NFC composing "e" + U+0301) spelled byte by byte."""
        ids = self.encode_fragment(text)
        if self.to_bytes(ids) == text.encode("utf-8"):
            return ids
        out: list[int] = []
        for run, literal in _normalisation_runs(text):
            ids = [] if literal else self.encode_fragment(run)
            if literal:
                ids = self._bytewise(run)
            elif self.to_bytes(ids) != run.encode("utf-8"):
                ids = self._spell_around(run)
            out += ids
        return out

    def _bytewise(self, text: str) -> list[int]:
        return [self._byte_token(b) for b in text.encode("utf-8")]

    def _spell_around(self, run: str) -> list[int]:
        """A run the tokenizer does not give back: only the characters it changes on their own
        (SentencePiece reads a literal "▁" as a space) are spelled byte by byte, the text between
        them canonically (the whole run byte by byte made a sentence with one "▁" 5x longer)."""
        ids: list[int] = []
        plain = ""
        for char in run:
            if self.to_bytes(self.encode_fragment(char)) == char.encode("utf-8"):
                plain += char
                continue
            ids += self._canonical_or_bytewise(plain) + self._bytewise(char)
            plain = ""
        return ids + self._canonical_or_bytewise(plain)

    def _canonical_or_bytewise(self, text: str) -> list[int]:
        ids = self.encode_fragment(text)
        return ids if self.to_bytes(ids) == text.encode("utf-8") else self._bytewise(text)

    def spell_covering(self, text: str) -> tuple[list[int], list[int], int]:
        """``spell`` for a verifier, which must hold *any* committed text: characters this
        vocabulary has no bytes for (SmolLM2 lacks e.g. 0x04, 0x16, 0x1D and 0xF1) are left out,
        as the model's own tokenizer drops them. Returns the ids, the bytes of ``text`` each id
        covers (a left-out character is covered by the next token, at the end by the last) and
        the bytes left uncovered (only when ``text`` has no spellable character at all)."""
        if not self._unspellable.intersection(text.encode("utf-8")):
            ids = self.spell(text)
            return ids, [len(self.pieces[i]) for i in ids], 0
        ids, spans, gap = [], [], 0
        for run, spellable in _spellable_runs(text, self._unspellable):
            if not spellable:
                gap += len(run.encode("utf-8"))
                continue
            run_ids = self.spell(run)
            ids += run_ids
            spans += [len(self.pieces[i]) for i in run_ids]
            spans[len(spans) - len(run_ids)] += gap
            gap = 0
        if gap and spans:
            spans[-1] += gap
            gap = 0
        return ids, spans, gap

    def _byte_token(self, byte: int) -> int:
        token = self.token_id(bytes([byte]))
        if token is None:
            raise ValueError(f"{self.name} has no token for byte 0x{byte:02X}; "
                             "it cannot spell this text exactly")
        return token


def _normalisation_runs(text: str) -> list[tuple[str, bool]]:
    """Split text into (run, literal) where literal runs are what a normaliser would change.

    Decided per segment (a character and the combining marks after it), not per character: a
    combining mark that NFC leaves alone (Arabic fatha after U+0600) stays in a normal run, so
    one composable "e" + U+0301 elsewhere in the text does not change how the rest is spelled."""
    runs: list[tuple[str, bool]] = []

    def add(segment: str) -> None:
        literal = unicodedata.normalize("NFC", segment) != segment
        if runs and runs[-1][1] == literal:
            runs[-1] = (runs[-1][0] + segment, literal)
        else:
            runs.append((segment, literal))

    segment = ""
    for ch in text:
        if segment and unicodedata.combining(ch) == 0:
            add(segment)
            segment = ""
        segment += ch
    if segment:
        add(segment)
    return runs


def _starts_segment(data: bytes, offset: int) -> bool:
    """True if a re-encode may start at ``offset``: a character boundary not followed by a
    combining mark (which belongs with the character before it, see _normalisation_runs)."""
    if not is_char_boundary(data, offset):
        return False
    if offset == len(data):
        return True
    before, after = _chars_around(data, offset)
    if after and unicodedata.combining(after):
        return False
    # Byte-level pre-tokenizers (GPT-2's regex) keep a run of symbols together (`[^\s\p{L}\p{N}]+`):
    # never start inside one, e.g. between a combining mark and the apostrophe after it.
    return not (before and after and _is_symbol(before) and _is_symbol(after))


def _inside_word(data: bytes, offset: int) -> bool:
    """True if ``offset`` (a character boundary) falls between two letters."""
    before, after = _chars_around(data, offset)
    return before.isalpha() and after.isalpha()


def _chars_around(data: bytes, offset: int) -> tuple[str, str]:
    """The characters just before and just after character boundary ``offset`` ("" at an end)."""
    return (data[max(0, offset - 4):offset].decode("utf-8", "ignore")[-1:],
            data[offset:offset + 4].decode("utf-8", "ignore")[:1])


def _is_symbol(char: str) -> bool:
    return not (char.isspace() or unicodedata.category(char)[0] in "LN")


def _spellable_runs(text: str, unspellable: frozenset[int]) -> list[tuple[str, bool]]:
    """Split text into (run, spellable): a character is unspellable if one of its bytes is."""
    runs: list[tuple[str, bool]] = []
    for ch in text:
        ok = not unspellable.intersection(ch.encode("utf-8"))
        if runs and runs[-1][1] == ok:
            runs[-1] = (runs[-1][0] + ch, ok)
        else:
            runs.append((ch, ok))
    return runs


def complete_length(data: bytes) -> int:
    """Length of ``data`` without an incomplete character at its end (the next token may complete it)."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        lead = data[n - back]
        if lead & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        if lead >= 0xC0:
            need = 2 if lead < 0xE0 else 3 if lead < 0xF0 else 4
            if need > back:
                n -= back
        break
    return n


def valid_prefix_length(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that is complete, valid UTF-8: an incomplete trailing
    character is held back, and nothing from the first invalid byte on counts."""
    n = complete_length(data)
    try:
        data[:n].decode("utf-8")
        return n
    except UnicodeDecodeError as err:
        return err.start


def utf8_runs(data: bytes) -> list[tuple[bytes, bool]]:
    """``data`` as alternating (run, valid) pieces: valid UTF-8 runs and the invalid bytes between."""
    runs: list[tuple[bytes, bool]] = []
    pos = 0
    while pos < len(data):
        try:
            data[pos:].decode("utf-8")
        except UnicodeDecodeError as err:
            if err.start:
                runs.append((data[pos:pos + err.start], True))
            runs.append((data[pos + err.start:pos + err.end], False))
            pos += err.end
        else:
            runs.append((data[pos:], True))
            break
    return runs


def is_char_boundary(data: bytes, offset: int) -> bool:
    """True if ``offset`` does not fall inside a UTF-8 character of ``data``."""
    return offset == len(data) or offset == 0 or (data[offset] & 0xC0) != 0x80


def whole_characters(piece: bytes) -> bool:
    """Whether ``piece`` is whole UTF-8 characters (not a byte-fallback piece of one, "\xe7")."""
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@dataclass
class TokenizedText:
    """One member's canonical tokenization of a growing continuation, updated incrementally.

    ``ids[i]`` covers bytes ``[starts[i], ends[i])``: its piece, preceded by any characters the
    vocabulary cannot spell (see ``TokenTable.spell_covering``). Bytes that are not valid UTF-8 (a
    drafter can emit them) are spelled by single-byte tokens, or left out the same way where the
    vocabulary has none, and reading goes on after them. Updating the text re-encodes only from a
    few tokens before the first changed byte (never the whole history).
    """

    table: TokenTable
    ids: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)  # cumulative byte end of each token
    data: bytes = b""

    @property
    def starts(self) -> list[int]:
        return [0] + self.ends[:-1] if self.ends else []

    def first_token_from(self, offset: int) -> int:
        """Index of the first token that starts at or after byte ``offset`` (len(ids) if none)."""
        if offset <= 0 or not self.ends:
            return 0
        return min(bisect.bisect_left(self.ends, offset) + 1, len(self.ids))

    def starts_from(self, index: int) -> list[int]:
        """Start offsets of tokens ``index..``, without building the whole list."""
        if index >= len(self.ids):
            return []
        return ([0] if index == 0 else []) + self.ends[max(index - 1, 0):len(self.ids) - 1]

    def set_text(self, data: bytes) -> None:
        """Re-tokenize so that the tokens cover ``data`` up to an incomplete character at its end."""
        data = data[: complete_length(data)]
        if data == self.data:
            return
        same = len(self.data) if data.startswith(self.data) else _common_prefix_len(self.data, data)
        keep = max(0, bisect.bisect_right(self.ends, same) - _LOOKBEHIND_TOKENS)
        # Nor inside a word: its tokens depend on the whole word (a split kept from when the word
        # ended in a combining mark, e.g. single bytes, must not survive). Bounded for scripts
        # written without spaces, where a "word" can be a whole paragraph.
        word_steps = 0
        while keep > 0:
            offset = self.ends[keep - 1]
            if _starts_segment(data, offset):
                if word_steps == _WORD_LOOKBEHIND_TOKENS or not _inside_word(data, offset):
                    break
                word_steps += 1
            keep -= 1
        anchor = self.ends[keep - 1] if keep else 0
        tail, spans, uncovered = _cover(self.table, data[anchor:])
        self.ids = self.ids[:keep] + tail
        self.ends = self.ends[:keep]
        pos = anchor
        for span in spans:
            pos += span
            self.ends.append(pos)
        if pos + uncovered != len(data):
            raise ValueError(
                f"tokenizer {self.table.name} does not round-trip the text "
                f"exactly ({pos} vs {len(data)} bytes); it cannot be aligned with other members")
        self.data = data

    def index_at(self, offset: int) -> int | None:
        """Index of the token that starts exactly at byte ``offset`` (len(ids) for the end)."""
        if offset == len(self.data) or (offset == 0 and not self.ids):
            return len(self.ids)

        i = bisect.bisect_right(self.ends, offset)
        start = self.ends[i - 1] if i else 0
        return i if start == offset and i < len(self.ids) else None

    def boundaries(self) -> set[int]:
        return {0, *self.ends, len(self.data)}


def _cover(table: TokenTable, data: bytes) -> tuple[list[int], list[int], int]:
    """``TokenTable.spell_covering`` for bytes that may hold invalid UTF-8: each valid run is
    spelled canonically, each invalid byte by its single-byte token (byte-level BPE and byte
    fallback have one, so a member reads exactly the drafter's bytes); a byte without one joins the
    span of the next token (of the last one at the end)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        runs = utf8_runs(data)
    else:
        return table.spell_covering(text)  # the usual case: valid text, decoded once
    ids: list[int] = []
    spans: list[int] = []
    gap = 0
    for run, valid in runs:
        if valid:
            run_ids, run_spans, run_gap = table.spell_covering(run.decode("utf-8"))
        else:
            singles = [table.token_id(bytes([b])) for b in run]
            run_ids, run_spans, run_gap = [], [], 0
            for token in singles:
                if token is None:
                    run_gap += 1
                    continue
                run_ids.append(token)
                run_spans.append(1 + run_gap)
                run_gap = 0
        if run_ids:
            run_spans[0] += gap
            gap = 0
        ids += run_ids
        spans += run_spans
        gap += run_gap
    if gap and spans:
        spans[-1] += gap
        gap = 0
    return ids, spans, gap


def _common_prefix_len(a: bytes | list[int], b: bytes | list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two id lists (the part of a KV cache to keep)."""
    return _common_prefix_len(a, b)


def shared_boundaries(data: bytes, tokenizations: list[TokenizedText]) -> list[int]:
    """Byte offsets (ascending) that are a token boundary in every tokenization *and* a
    character boundary of ``data``: the only places where ensembling is safe."""
    common = set.intersection(*(t.boundaries() for t in tokenizations)) if tokenizations else set()
    return sorted(o for o in common if o <= len(data) and is_char_boundary(data, o))
