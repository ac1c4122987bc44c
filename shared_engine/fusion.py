"""Cross-vocabulary fusion of several members' next-token distributions, and sharpening.

Pure functions of (distributions, weights). Candidates are identified by their exact **bytes**
(see alignment.py), so " Sofia" from a byte-level BPE and "▁Sofia" from SentencePiece are the
same candidate. 'End of answer' is one shared candidate, ``EOS_KEY``, whatever each member's EOS id.

- UniTE (Yao et al., ICLR 2025, arXiv 2410.03777): union of each member's top-k; a candidate
  missing from a member's top-k is re-scored through that member's own tokenization of the string
  (its first sub-token's logit); softmax per member over the union; weighted mean.
- GaC (Yu et al., arXiv 2406.12585): every member's full distribution mapped onto the union of all
  vocabularies by exact string match (built once per set of tokenizers); weighted sum.
- Sharpening (SAFE, arXiv 2510.15346 §2.6) when the fused max is < 0.5: ``heur`` pools the mass of
  candidates that extend a shorter candidate onto it (" So" gets " Sofia"'s mass), limited to the
  drafter's top-10 and, where the shorter one ends inside a word, to extensions the drafter itself
  writes starting with that shorter token (``drafter_extends``: " and" is not pooled onto " a",
  '"The' is onto '"'), and the mirror: a verifier's first piece of a word the drafter has as one
  token counts for that word (" Kil" for " Kilim", ``mirror_mass``); ``geom`` takes the weighted
  geometric mean instead of the arithmetic one.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import torch

from .alignment import EOS_KEY, TokenTable
from .words import is_mark

SHARPEN_BELOW = 0.5
HEUR_MIN_PROB = 0.1
HEUR_DRAFTER_TOP = 10


@dataclass(frozen=True, slots=True)
class MemberDist:
    """One member's next-token logits at one position of the answer."""

    name: str
    table: TokenTable
    logits: torch.Tensor  # [vocab] float32
    support: int | None = None
    """Top-K backends (members/topk.py): only the K most likely ids are exact; the rest share the
    leftover mass evenly, so they are never offered as this member's own candidates."""


@dataclass(frozen=True, slots=True)
class Fused:
    """Candidates with each member's probability and the fused probability (before sharpening)."""

    keys: list[bytes]
    member_probs: torch.Tensor  # [num_members, num_candidates]
    fused: torch.Tensor  # [num_candidates], sums to <= 1


class Fuser(Protocol):
    def __call__(self, dists: Sequence[MemberDist], weights: torch.Tensor) -> Fused: ...


def candidate_key(table: TokenTable, token_id: int) -> bytes | None:
    """The union key of a token id: its bytes, EOS_KEY for any EOS, None for other specials."""
    if token_id in table.eos_ids:
        return EOS_KEY
    if token_id in table.special_ids or not table.pieces[token_id]:
        return None
    return table.pieces[token_id]


_NON_EOS_SPECIALS: weakref.WeakKeyDictionary[TokenTable, tuple[frozenset[int], frozenset[int], torch.Tensor]] = (
    weakref.WeakKeyDictionary())
"""Per table, its non-EOS special ids as an index tensor (with the sets it was built from)."""


def _non_eos_specials(table: TokenTable) -> torch.Tensor:
    """The ids ``without_specials`` rules out, built once per table: Gemma-3 has 6,247 specials, and
    building the index from the sets took 2.6 ms per drafted token in a Gemma answer
    (llama.cpp, 16 tokens; about 4% of its decode step); now 0.08 ms."""
    cached = _NON_EOS_SPECIALS.get(table)
    if cached is None or cached[0] is not table.special_ids or cached[1] is not table.eos_ids:
        ids = torch.tensor(sorted(table.special_ids - table.eos_ids), dtype=torch.long)
        cached = _NON_EOS_SPECIALS[table] = (table.special_ids, table.eos_ids, ids)
    return cached[2]


def without_specials(logits: torch.Tensor, table: TokenTable) -> torch.Tensor:
    """``logits`` (a copy) with the non-EOS special tokens ruled out, for a member that writes the
    answer itself (a draft, an AdaFuse span): they are no candidates (``candidate_key``), and their
    stored bytes are a literal name such as '<pad>', never answer text."""
    ids = _non_eos_specials(table)
    ids = ids[ids < logits.shape[-1]]
    if not len(ids):
        return logits
    out = logits.clone()
    out[..., ids] = float("-inf")
    return out


def key_token(table: TokenTable, key: bytes) -> tuple[int | None, bool]:
    """The id through which a member scores a candidate string, and whether it is an exact match:
    the token with exactly these bytes if one exists, else the first sub-token of the member's own
    tokenization of the string (UniTE's rule). None for EOS_KEY and what it cannot encode."""
    if key == EOS_KEY:
        return None, True
    token = table.token_id(key)
    if token is not None:
        return token, True
    try:
        ids = table.encode_fragment(key.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None, False
    return (ids[0] if ids else None), False


def key_logit(table: TokenTable, logits: torch.Tensor, key: bytes) -> float:
    """A member's logit for a candidate string (see ``key_token``); EOS is its best EOS id."""
    if key == EOS_KEY:
        return max(float(logits[i]) for i in table.eos_ids) if table.eos_ids else float("-inf")
    token, _ = key_token(table, key)
    return float(logits[token]) if token is not None and token < logits.shape[0] else float("-inf")


def top_keys(dist: MemberDist, k: int) -> dict[bytes, float]:
    """A member's top-k candidates (by logit) as {key: logit}, skipping non-EOS specials."""
    exact = dist.support or dist.logits.shape[0]
    values, ids = torch.topk(dist.logits, min(dist.logits.shape[0], k + 8, exact))  # room to skip specials
    out: dict[bytes, float] = {}
    for value, token in zip(values.tolist(), ids.tolist()):
        key = candidate_key(dist.table, token)
        if key is not None and key not in out:
            out[key] = value
        if len(out) == k:
            break
    return out


class UniteFusion:
    """UniTE top-k union fusion."""

    def __init__(self, top_k: int = 10) -> None:
        self.top_k = top_k

    def __call__(self, dists: Sequence[MemberDist], weights: torch.Tensor) -> Fused:
        tops = [top_keys(d, self.top_k) for d in dists]
        keys: list[bytes] = []
        # dists[0] is the drafter: only what it can spell can be committed. A member weighted 0 has
        # no say: its top-k would still change the others' normalisation over the union.
        for top, weight in zip(tops, weights.tolist()):
            if weight > 0:
                keys.extend(k for k in top if k not in keys and dists[0].table.can_spell(k))
        rows = [_softmax_or_zero(torch.tensor(_union_logits(d, top, keys), dtype=torch.float32))
                for d, top in zip(dists, tops)]
        member_probs = torch.stack(rows)
        return Fused(keys, member_probs, weights @ member_probs)


def _softmax_or_zero(logits: torch.Tensor) -> torch.Tensor:
    """Softmax, or no mass at all for a member that can score none of the candidates."""
    return torch.softmax(logits, dim=0) if bool(torch.isfinite(logits).any()) else torch.zeros_like(logits)


def _union_logits(dist: MemberDist, top: dict[bytes, float], keys: list[bytes]) -> list[float]:
    """One member's logit for every union candidate. Each of its token ids counts once: a
    candidate re-scored through a first sub-token that an exact candidate (its own top-k or a
    whole token) or an earlier re-scored candidate already stands for gets no mass. Otherwise
    " So" and " Sofia" would both carry the member's " So" probability (UniTE's released code
    also gives a used id once; it sets the second logit to 0, a scale-dependent neutral value,
    where here it gets no probability at all)."""
    tokens = [key_token(dist.table, k) if k not in top else (None, True) for k in keys]
    used = {t for t, exact in tokens if exact and t is not None}
    used |= {i for k in top if k in keys and k != EOS_KEY if (i := dist.table.token_id(k)) is not None}
    logits = []
    for key, (token, exact) in zip(keys, tokens):
        if key in top:
            logits.append(top[key])
        elif exact or token is None:
            logits.append(key_logit(dist.table, dist.logits, key))
        elif token in used:
            logits.append(float("-inf"))
        else:
            used.add(token)
            logits.append(float(dist.logits[token]) if token < dist.logits.shape[0] else float("-inf"))
    return logits


@dataclass(frozen=True)
class _UnionVocab:
    keys: list[bytes]
    index: list[torch.Tensor]  # per member: union index of every token id (-1: not a candidate)


_UNIONS = 8
"""Verifier sets one drafter's table remembers a union for (then it starts over)."""


def _union_vocab(tables: tuple[TokenTable, ...]) -> _UnionVocab:
    """The union of ``tables``' candidates, remembered in the drafter's (``tables[0]``) ``memo`` under
    weak references to the others (a dead one equals no live table, so a reused id finds nothing):
    no table keeps another alive."""
    unions: dict[tuple[weakref.ref[TokenTable], ...], _UnionVocab] | None = tables[0].memo.get("union_vocab")
    if unions is None:
        unions = tables[0].memo["union_vocab"] = {}
    key = tuple(map(weakref.ref, tables[1:]))
    found = unions.get(key)
    if found is None:
        if len(unions) >= _UNIONS:
            unions.clear()
        found = unions[key] = _build_union_vocab(tables)
    return found


def _build_union_vocab(tables: tuple[TokenTable, ...]) -> _UnionVocab:
    position: dict[bytes, int] = {EOS_KEY: 0}
    keys = [EOS_KEY]
    index = []
    for table in tables:
        mapping = torch.full((table.vocab_size,), -1, dtype=torch.long)
        for token in range(table.vocab_size):
            key = candidate_key(table, token)
            if key is None or not tables[0].can_spell(key):  # tables[0]: the drafter's
                continue
            if key not in position:
                position[key] = len(keys)
                keys.append(key)
            mapping[token] = position[key]
        index.append(mapping)
    return _UnionVocab(keys, index)


class GacFusion:
    """GaC union-vocabulary fusion (the union is built once per tokenizer set and cached)."""

    def __init__(self, num_candidates: int = 10) -> None:
        self.num_candidates = num_candidates

    def __call__(self, dists: Sequence[MemberDist], weights: torch.Tensor) -> Fused:
        union = _union_vocab(tuple(d.table for d in dists))
        per_member = []
        for dist, mapping in zip(dists, union.index):
            probs = torch.softmax(dist.logits, dim=0)
            n = min(probs.shape[0], mapping.shape[0])
            valid = mapping[:n] >= 0
            row = torch.zeros(len(union.keys))
            row.index_add_(0, mapping[:n][valid], probs[:n][valid])
            per_member.append(row)
        full = torch.stack(per_member)
        fused_full = weights @ full
        top = torch.topk(fused_full, self.num_candidates).indices
        return Fused([union.keys[i] for i in top.tolist()], full[:, top], fused_full[top])


def plausible(fused: Fused, alpha: float) -> torch.Tensor:
    """1.0 for each candidate the drafter (row 0) gives at least ``alpha`` times the probability of its
    own most likely candidate, else 0.0: Contrastive Decoding's adaptive plausibility constraint (Li et
    al., ACL 2023, arXiv 2210.15097), with the drafter as the expert. Where the members' top choices are
    disjoint, the weighted mean hands the position to the sharper member however little the drafter
    thinks of its token ('.' after "Edgar Veguilla" at Qwen 0.00, Gemma 0.59); under the constraint a
    verifier reranks only what the drafter finds plausible. The drafter's own best is always kept."""
    drafter = fused.member_probs[0]
    return (drafter >= alpha * drafter.max()).to(fused.fused.dtype)


def make_fuser(name: str, top_k: int = 10) -> Fuser:
    """The fuser for an ``EngineOptions.fusion`` value."""
    if name == "unite":
        return UniteFusion(top_k)
    if name == "gac":
        return GacFusion()
    raise ValueError(f"unknown fusion {name!r}")
SharpenMode = Literal["heur", "heur-bytes", "geom"] | None
PrefixRule = Callable[[bytes, bytes], bool]


def sharpen(fused: Fused, weights: torch.Tensor, mode: SharpenMode, drafter_top: set[bytes],
            extends: PrefixRule | None = None, tables: Sequence[TokenTable] = ()) -> tuple[torch.Tensor, bool]:
    """Scores to pick from, and whether sharpening fired (only when the fused max is < 0.5).

    ``heur`` pools the mass of a longer candidate onto a shorter one it starts with. ``extends``
    (longer, shorter) says whether that longer candidate really continues the shorter one for the
    drafter (the engine passes ``drafter_extends``); None, or ``heur-bytes``, pools every byte
    extension, as the released code does (both modes skip a whitespace-only shorter candidate, the
    released code only " "). Where ``extends`` says no (a cut inside a word the drafter
    writes otherwise), the pair pools the other way when the members' ``tables`` (row order) are given:
    the mirror case (``mirror_mass``), for a longer candidate of the drafter's own (its top-10, fused
    above ``HEUR_MIN_PROB``)."""
    scores = fused.fused
    if mode is None or float(scores.max()) >= SHARPEN_BELOW:
        return scores, False
    if mode == "geom":
        logp = torch.log(fused.member_probs.clamp_min(1e-12))
        return torch.exp((weights.unsqueeze(1) * logp).sum(0) / weights.sum()), True
    if mode == "heur-bytes":
        extends = None
    # the drafter's own real candidates (its top-10, fused above HEUR_MIN_PROB): a pair pools only
    # onto one of them, so a pair with neither is skipped before ``extends`` tokenizes anything
    own = [p > HEUR_MIN_PROB and key in drafter_top for p, key in zip(scores.tolist(), fused.keys)]
    pooled = scores.clone()
    for i, short in enumerate(fused.keys):
        if not short.strip() or short == EOS_KEY:
            continue
        for j, longer in enumerate(fused.keys):
            if j == i or longer == EOS_KEY or not (own[i] or own[j]) or not longer.startswith(short):
                continue
            if extends is None or extends(longer, short):
                if own[i]:
                    pooled[i] += scores[j]
            elif own[j] and tables:  # cut inside a word the drafter writes otherwise: the mirror case
                pooled[j] += mirror_mass(fused, weights, tables, piece=i, longer=longer)
    return pooled, True


def mirror_mass(fused: Fused, weights: torch.Tensor, tables: Sequence[TokenTable], piece: int,
                longer: bytes) -> torch.Tensor:
    """What the drafter's word ``longer`` gains from the verifiers that write it through candidate ``piece``
    (a piece the drafter does not write it through): each such verifier's weighted probability of that
    piece. The mirror of ``heur``'s pooling. Measured (TriviaQA, Gemma-3-270m drafts, Qwen verifies):
    Gemma has " Kilim" as one token (0.38), Qwen writes " Kil" + "im" and gives " Kil" 0.19; UniTE
    scores Qwen's " Kil" once, on the piece, so " Kilim" got nothing from Qwen and " Everest" won,
    although together they backed Kilimanjaro. Committing " Kil" would be the very split SAFE avoids
    (the drafter never writes it there), so the verifier's mass on the piece counts for the drafter's
    word. Only where the piece is that verifier's own first token of the word (``tables`` in row order;
    none given: no mirror)."""
    short = fused.keys[piece]
    return sum((weights[row] * fused.member_probs[row, piece] for row in range(1, len(tables))
                if _first_piece(tables[row], longer) == short), torch.tensor(0.0))


def drafter_extends(drafter: TokenTable) -> PrefixRule:
    """Whether ``longer`` continues the shorter candidate for the drafter. Pooling exists for a word
    the vocabularies split differently (" Sofia" in one, " So" + "fia" in the other): committing " So"
    lets the drafter go on to "fia". Where the shorter one ends inside a word of the longer one, that
    holds only if the drafter's own tokenization of the longer one begins with it: " and" does not
    continue " a" (after " a" the drafter writes " cat", never "nd"), so its mass must not make " a"
    win, and committing " So" where the drafter has " Sofia" as one token is the very split SAFE
    avoids. Where it ends at a word's edge ('"' of '"The', " Paris" of " Paris,") the rest is a word
    of its own, which the drafter writes next whatever its vocabulary merges: pooled, as released
    (measured: without it '"The' and '"' split the drafter's mass, and a base verifier's "User" won
    the first word of a FLORES answer). Text that is not whole UTF-8 pools as released too."""
    def extends(longer: bytes, shorter: bytes) -> bool:
        cut = cuts_a_word(longer, shorter)
        return cut is not True or _first_piece(drafter, longer) in (shorter, None)
    return extends


def cuts_a_word(longer: bytes, shorter: bytes) -> bool | None:
    """Whether ``longer`` (which starts with ``shorter``) runs on across the end of ``shorter`` within
    one word: word characters on both sides (letters, digits, "_"; or a mark after, ``words.is_mark``), whitespace
    on both sides, or one symbol repeated ("`" of "```"). None where either is not whole UTF-8."""
    try:
        head, rest = shorter.decode("utf-8"), longer[len(shorter):].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not head or not rest:
        return False
    before, after = head[-1], rest[0]
    if is_mark(after):
        return True
    return (_is_word_char(before) and _is_word_char(after)) or (before.isspace() and after.isspace()) \
        or before == after


def _is_word_char(char: str) -> bool:
    return char.isalnum() or char == "_"


_FIRST_PIECES = 65536
"""Texts whose first piece one table remembers (then it starts over)."""


def _first_piece(table: TokenTable, text: bytes) -> bytes | None:
    """The bytes of the first token of ``table``'s own tokenization of ``text`` (None: unknown). A
    text that is one of its tokens counts as written in that token, without asking the tokenizer
    (for a llama.cpp member every encode is a request to its server). Remembered in the table's
    ``memo``, so it goes with the table."""
    known: dict[bytes, bytes | None] | None = table.memo.get("first_piece")
    if known is None:
        known = table.memo["first_piece"] = {}
    try:
        return known[text]
    except KeyError:
        pass
    if len(known) >= _FIRST_PIECES:
        known.clear()
    found = known[text] = _tokenize_first_piece(table, text)
    return found


def _tokenize_first_piece(table: TokenTable, text: bytes) -> bytes | None:
    if table.token_id(text) is not None:
        return text
    try:
        ids = table.encode_fragment(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return table.pieces[ids[0]] if ids else None
