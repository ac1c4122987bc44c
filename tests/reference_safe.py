"""A deliberately simple reference of SAFE, to check the engine's decisions one by one.

Written from the rules, not from the engine: plain loops, no KV caches (every distribution comes
from a full forward over prompt + answer), a fresh tokenization of the whole answer for every
verifier in every round, and the fusion/sharpening arithmetic spelled out. Its rules are the
released SAFE code's (ensembling.md §2.2, §2.5, §2.6) plus this project's documented deviations
(README "What it does" / "How it works", docs/methods.md):

- any number of members; weights, normalised, in fusion *and* in the consensus mean;
- a position is fusable when every verifier has a token starting at its byte offset (the
  OOV-like rule on exact bytes instead of ``lstrip``-ed strings) and it is a character boundary;
- consensus: every member's argmax is the token it would read next, or the weighted mean of those
  probabilities is > 0.5; a verifier reading on as drafted is its next token in its own
  tokenization or the token with exactly the drafted bytes; EOS is one token whichever EOS id;
  with ``drafter_confidence``, the drafter's probability of its token >= it also skips; with a
  temperature only that gate skips (consensus is an argmax argument);
- a verifier sharing the drafter's vocabulary reads the drafter's own ids;
- UniTE: union of each member's top-k byte strings (EOS one shared candidate), only what the
  drafter can spell; a missing string scored through the member's exact token, else its first
  sub-token, each id giving its probability once; ``heur`` sharpening when the fused max < 0.5,
  pooling a longer candidate onto a shorter one that ends inside one of its words (letters or
  digits, whitespace or one symbol on both sides of the cut) only where the drafter's own
  tokenization of the longer one starts with the shorter (the released code pools every byte
  extension: " and" onto " a"); at a word's edge ('"' of '"The'), or where either is not whole
  UTF-8, it pools as released; and the mirror (not in the released code): the drafter's own
  candidate (its top-10, fused above 0.1) gains each verifier's weighted probability of a shorter
  candidate that is that verifier's first token of it, where the cut is inside a word and the
  drafter's tokenization does not start with the shorter one;
- with ``plausibility`` (alpha), a candidate the drafter gives less than alpha times its best
  candidate's probability (UniTE's per-member softmax over the union) scores 0 after sharpening;
- when fusion keeps the drafted token the scan goes on (the released code re-drafts);
- with a temperature, the drafted token is accepted by the speculative-sampling rule against the
  tempered fused distribution (the released code is greedy only);
- the drafter never drafts a special token other than EOS (its bytes are a literal name such as
  '<pad>'): they are masked in its rows, which the gate and its vote then read;
- fusion never chooses EOS where the answer holds nothing but whitespace (an empty answer is never
  the answer); it chooses among the other candidates as the loop guard below does. There the drafter
  of an ensemble does not draft EOS either: its row has EOS masked (the gate, its vote and speculative
  acceptance read that row), so a drafter sure of ending at once does not end the answer empty. (A plain-format
  member's turn marker, read as its EOS, is tested in ``test_turn_markers.py``: the reference's toy
  members all have a chat template, so they have none.)
- fusion never chooses a candidate holding part of a character (another vocabulary's byte piece)
  other than the drafted token: the drafter need not complete it (a U+FFFD stayed in the answer);
  their scores are set to 0 (sampling keeps the speculative rule), and where nothing else has a
  score it chooses as the loop guard below does;
- with ``loop_guard`` (none of the anchors has one): where the answer's end repeats a unit of up to
  256 bytes over two units and ``loop_guard`` bytes, the drafter masks a token that repeats it once
  more and chooses again (8 tries at most), and fusion chooses among the candidates that do not
  repeat it (greedy: the best; sampling: a draw from the tempered scores of those; none: the
  drafted token).

Randomness comes from the same ``Sampler`` primitives, called in the same order as the engine
would, so a seeded reference answer can be compared decision by decision.
"""

from __future__ import annotations

import codecs
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from shared_engine.alignment import EOS_KEY, TokenizedText, TokenTable
from shared_engine.members import HFMember
from shared_engine.sampling import Sampler

SHARPEN_BELOW, HEUR_MIN, DRAFTER_TOP = 0.5, 0.1, 10


@dataclass
class Position:
    offset: int
    boundary_ok: bool
    consensus: bool | None


@dataclass
class Fusion:
    position: int
    offset: int
    fused: dict[str, float]  # candidate text -> fused probability (before sharpening)
    member_probs: dict[str, dict[str, float]]  # candidate text -> member -> probability
    sharpened: bool
    chosen: str
    drafted: str | None


@dataclass
class Answer:
    text: str
    positions: list[Position] = field(default_factory=list)
    fusions: list[Fusion] = field(default_factory=list)
    rounds: int = 0


def show(key: bytes) -> str:
    return "<eos>" if key == EOS_KEY else key.decode("utf-8", "replace")


def _key(table: TokenTable, token: int) -> bytes | None:
    if token in table.eos_ids:
        return EOS_KEY
    if token in table.special_ids or not table.pieces[token]:
        return None
    return table.pieces[token]


def _last_logits(member: HFMember, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return member.model(torch.tensor([ids])).logits[0].float()


def _char_boundary(data: bytes, offset: int) -> bool:
    return offset in (0, len(data)) or (offset < len(data) and data[offset] & 0xC0 != 0x80)


class ReferenceSafe:
    """SAFE with UniTE fusion over ``members`` (members[0] drafts), one request at a time."""

    def __init__(self, members: Sequence[HFMember], weights: Sequence[float], draft_length: int = 5,
                 top_k: int = 10, sharpen: str | None = "heur", drafter_confidence: float | None = None,
                 loop_guard: int | None = None, plausibility: float | None = None, mirror: bool = True) -> None:
        self.members = list(members)
        self.mirror = mirror  # False: heur without its mirror case (only for tests that show the rule decided)
        self.plausibility = plausibility
        self.loop_guard = loop_guard
        total = sum(weights)
        self.weights = [w / total for w in weights]
        self.draft_length, self.top_k, self.sharpen = draft_length, top_k, sharpen
        self.drafter_confidence = drafter_confidence
        self.labels: list[str] = []
        for m in self.members:
            label = m.name
            while label in self.labels:
                label += "'"
            self.labels.append(label)

    # ------------------------------------------------------------------ the request loop

    def answer(self, messages: list[dict[str, str]], max_new_tokens: int, temperature: float = 0.0,
               top_p: float = 1.0, seed: int | None = None) -> Answer:
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # full forwards of tiny models: threads only add waiting on a busy CPU
        try:
            return self._answer(messages, max_new_tokens, temperature, top_p, seed)
        finally:
            torch.set_num_threads(threads)

    def _answer(self, messages: list[dict[str, str]], max_new_tokens: int, temperature: float,
                top_p: float, seed: int | None) -> Answer:
        sampler = Sampler(temperature, top_p, seed)
        self.prompts = [m.prompt_ids(messages) for m in self.members]
        self.drafter_ids: list[int] = []
        self.answer_bytes = b""
        self.finish: str | None = None
        self.max_new_tokens = max_new_tokens
        out = Answer(text="")
        while not self.finish:
            self._round(sampler, out)
        out.text = codecs.getincrementaldecoder("utf-8")("replace").decode(self.answer_bytes)
        return out

    def _commit(self, ids: list[int]) -> None:
        drafter = self.members[0].table
        for token in ids:
            if self.finish:
                return
            if token in drafter.eos_ids:
                self.finish = "eos"
                return
            self.drafter_ids.append(token)
            self.answer_bytes += drafter.pieces[token]
            if len(self.drafter_ids) >= self.max_new_tokens:
                self.finish = "length"

    # ------------------------------------------------------------------ one round

    def _round(self, sampler: Sampler, out: Answer) -> None:
        drafter = self.members[0]
        table = drafter.table
        out.rounds += 1
        length = min(self.draft_length, self.max_new_tokens - len(self.drafter_ids))
        draft: list[int] = []
        rows: list[torch.Tensor] = []
        for j in range(length):  # GENERATE: one full forward per drafted token
            logits = _last_logits(drafter, self.prompts[0] + self.drafter_ids + draft)[-1]
            logits[[t for t in table.special_ids - table.eos_ids if t < logits.shape[-1]]] = float("-inf")
            so_far = self.answer_bytes + b"".join(table.pieces[t] for t in draft)
            if sum(w > 0 for w in self.weights) > 1 and not so_far.strip():  # an ensemble's answer is never empty
                logits[[t for t in table.eos_ids if t < logits.shape[-1]]] = float("-inf")
            masked = logits.clone()
            for _ in range(8):
                token = sampler.from_logits(masked)
                if token in table.eos_ids or not self._repeats(so_far, table.pieces[token]):
                    break
                masked[token] = float("-inf")
            draft.append(token)
            rows.append(logits)
            if token in table.eos_ids:
                break
        ends_with_eos = draft[-1] in table.eos_ids
        text = self.answer_bytes + b"".join(table.pieces[t] for t in draft if t not in table.eos_ids)
        views = [self._read(i, text, draft, ends_with_eos) for i in range(1, len(self.members))]
        self._text = text

        offset = len(self.answer_bytes)
        for j, token in enumerate(draft):
            boundary = _char_boundary(text, offset) and all(offset in view for view in views)
            position = Position(offset, boundary, None)
            out.positions.append(position)
            fusable = boundary
            if boundary:
                dists = [rows[j]] + [view[offset][0] for view in views]
                owns = [None] + [view[offset][1] for view in views]
                probs, tops = zip(*(self._reads_on(m, d, token, owns[m]) for m, d in enumerate(dists)))
                confident = self.drafter_confidence is not None and probs[0] >= self.drafter_confidence
                mean = sum(w * p for w, p in zip(self.weights, probs))
                position.consensus = confident or (sampler.greedy and (all(tops) or mean > 0.5))
                fusable = not position.consensus
            if fusable:
                key = self._fuse(dists, token, sampler, len(self.drafter_ids) + j, offset, out)
                if key != _key(table, token):  # the draft diverges: commit up to here, then the choice
                    self._commit(draft[:j])
                    if self.finish:
                        return
                    if key == EOS_KEY:
                        self.finish = "eos"
                        return
                    self._commit([table.token_id(key)] if table.token_id(key) is not None
                                 else table.spell(key.decode("utf-8")))
                    return
            if token not in table.eos_ids:
                offset += len(table.pieces[token])
        self._commit(draft)

    def _repeats(self, text: bytes, piece: bytes) -> bool:
        """Whether ``piece`` after ``text`` repeats a loop at its end once more, byte by byte."""
        if self.loop_guard is None or not piece:
            return False
        unit = _loop_unit(text, self.loop_guard)
        return unit is not None and all(b == unit[i % len(unit)] for i, b in enumerate(piece))

    def _read(self, index: int, text: bytes, draft: list[int], ends_with_eos: bool
              ) -> dict[int, tuple[torch.Tensor, int | None]]:
        """Verifier ``index``'s distribution and own next token at every token start of its
        reading of ``text`` (and at its end), from one full forward."""
        member, drafter = self.members[index], self.members[0].table
        if member.table.pieces == drafter.pieces and member.table.eos_ids == drafter.eos_ids:
            ids = [t for t in self.drafter_ids + draft if t not in drafter.eos_ids]
            starts, pos = [], 0
            for t in ids:
                starts.append(pos)
                pos += len(drafter.pieces[t])
            end = pos
        else:
            tokens = TokenizedText(member.table)  # fresh: the whole answer tokenized from scratch
            tokens.set_text(text)
            ids, starts, end = tokens.ids, tokens.starts, len(tokens.data)
        prompt = self.prompts[index]
        logits = _last_logits(member, prompt + ids)
        view: dict[int, tuple[torch.Tensor, int | None]] = {}
        for i, s in enumerate(starts):
            view[s] = (logits[len(prompt) + i - 1], ids[i])
        eos = min(member.table.eos_ids) if ends_with_eos and member.table.eos_ids else None
        view[end] = (logits[len(prompt) + len(ids) - 1], eos)
        return view

    def _reads_on(self, m: int, logits: torch.Tensor, drafted: int, own: int | None) -> tuple[float, bool]:
        """Member ``m``'s probability of reading on as drafted, and whether that is its argmax."""
        table, drafter = self.members[m].table, self.members[0].table
        if m == 0:
            ids = [drafted]
        else:
            same = table.token_id(drafter.pieces[drafted]) if drafted not in drafter.eos_ids else None
            ids = [t for t in (own, same) if t is not None]
        if not ids:
            return 0.0, False
        probs = torch.softmax(logits, -1)
        top = int(torch.argmax(probs))
        if any(t in table.eos_ids for t in ids):
            return float(sum(probs[e] for e in table.eos_ids)), top in table.eos_ids
        return max(float(probs[t]) for t in ids), top in ids

    # ------------------------------------------------------------------ UniTE + heur, spelled out

    def _drafter_starts(self, text: bytes) -> bytes | None:
        return self._starts(0, text)

    def _starts(self, m: int, text: bytes) -> bytes | None:
        """The first token of member ``m``'s tokenization of ``text`` (None: not whole UTF-8). Always
        asks the tokenizer (the engine takes a whole token as itself without asking)."""
        try:
            first = self.members[m].table.encode_fragment(text.decode("utf-8"))[:1]
        except (UnicodeDecodeError, ValueError):
            return None
        return self.members[m].table.to_bytes(first) if first else None

    def _top(self, m: int, logits: torch.Tensor) -> dict[bytes, float]:
        table, top = self.members[m].table, {}
        for token in torch.argsort(logits, descending=True).tolist():
            key = _key(table, token)
            if key is not None and key not in top:
                top[key] = float(logits[token])
            if len(top) == self.top_k:
                break
        return top

    def _member_probs(self, m: int, logits: torch.Tensor, top: dict[bytes, float], keys: list[bytes]) -> list[float]:
        table = self.members[m].table
        chosen: dict[bytes, float] = {}
        claimed: set[int] = set()
        pending: list[tuple[bytes, int]] = []
        for key in keys:
            if key in top:
                chosen[key] = top[key]
                claimed.add(table.token_id(key) if key != EOS_KEY else -1)
            elif key == EOS_KEY:
                chosen[key] = max(float(logits[e]) for e in table.eos_ids)
            elif table.token_id(key) is not None:
                chosen[key] = float(logits[table.token_id(key)])
                claimed.add(table.token_id(key))
            else:
                try:
                    ids = table.encode_fragment(key.decode("utf-8"))
                except (UnicodeDecodeError, ValueError):
                    ids = []
                if ids:
                    pending.append((key, ids[0]))
                else:
                    chosen[key] = float("-inf")
        for key, first in pending:  # first sub-tokens, each id once, in union order
            chosen[key] = float("-inf") if first in claimed else float(logits[first])
            claimed.add(first)
        values = torch.tensor([chosen[k] for k in keys])
        if not bool(torch.isfinite(values).any()):
            return [0.0] * len(keys)
        return torch.softmax(values, 0).tolist()

    def _fuse(self, dists: list[torch.Tensor], drafted: int, sampler: Sampler, position: int, offset: int,
              out: Answer) -> bytes:
        drafter = self.members[0].table
        tops = [self._top(m, d) for m, d in enumerate(dists)]
        keys: list[bytes] = []
        for top in tops:
            keys += [k for k in top if k not in keys and drafter.can_spell(k)]
        member_probs = [self._member_probs(m, d, top, keys) for m, (d, top) in enumerate(zip(dists, tops))]
        fused = [sum(w * row[c] for w, row in zip(self.weights, member_probs)) for c in range(len(keys))]
        scores, sharpened = list(fused), False
        if self.sharpen in ("heur", "heur-bytes") and max(fused) < SHARPEN_BELOW:
            sharpened = True
            for i, short in enumerate(keys):
                if fused[i] > HEUR_MIN and short in tops[0] and short.strip() and short != EOS_KEY:
                    scores[i] += sum(fused[j] for j, long in enumerate(keys)
                                     if j != i and long != EOS_KEY and long.startswith(short)
                                     and (self.sharpen == "heur-bytes" or not _inside_a_word(long, short)
                                          or self._drafter_starts(long) in (short, None)))
            if self.sharpen == "heur" and self.mirror:  # a verifier's first piece of the drafter's word counts for it
                for i, long in enumerate(keys):
                    if fused[i] <= HEUR_MIN or long not in tops[0] or long == EOS_KEY:
                        continue
                    for j, short in enumerate(keys):
                        if j != i and short != EOS_KEY and short.strip() and long.startswith(short) \
                                and _inside_a_word(long, short) and self._drafter_starts(long) not in (short, None):
                            scores[i] += sum(self.weights[m] * member_probs[m][j] for m in range(1, len(dists))
                                             if self._starts(m, long) == short)
        if self.plausibility is not None:  # only what the drafter finds plausible can be chosen
            bar = self.plausibility * max(member_probs[0])
            scores = [sc if member_probs[0][c] >= bar else 0.0 for c, sc in enumerate(scores)]
        drafted_key = _key(drafter, drafted)
        so_far = self._text[:offset]
        partial = [k not in (EOS_KEY, drafted_key) and not _whole_characters(k) for k in keys]
        if any(partial) and sum(sc for sc, p in zip(scores, partial) if not p) > 0:
            scores = [0.0 if p else sc for sc, p in zip(scores, partial)]  # scores gone, the rule below unchanged
            partial = [False] * len(keys)
        allowed = [bool(so_far.strip()) if k == EOS_KEY else not self._repeats(so_far, k) and not part
                   for k, part in zip(keys, partial)]
        if not all(allowed):  # the loop guard, no EOS before the answer has begun, no part of a character
            if sampler.greedy:
                best = max((sc for sc, ok in zip(scores, allowed) if ok), default=None)
                key = keys[scores.index(best)] if best is not None and best > 0 else drafted_key
            else:  # among the allowed candidates that have a score, tempered and cut among themselves
                masked = torch.tensor(scores) * torch.tensor(allowed, dtype=torch.float32)
                if float(masked.sum()) > 0:
                    q = torch.softmax(torch.log((masked / masked.max()).clamp_min(1e-12)) / sampler.temperature, 0)
                    q = q * torch.tensor(allowed, dtype=torch.float32)
                    key = keys[sampler.pick(_nucleus(q / q.sum(), sampler.top_p))]
                else:
                    key = drafted_key
        elif sampler.greedy:
            key = keys[scores.index(max(scores))]
        else:
            key = keys[self._speculative(sampler, scores, keys, dists[0], drafted_key)]
        out.fusions.append(Fusion(
            position=position, offset=offset, fused={show(k): p for k, p in zip(keys, fused)},
            member_probs={show(k): {self.labels[m]: member_probs[m][c] for m in range(len(dists))}
                          for c, k in enumerate(keys)},
            sharpened=sharpened, chosen=show(key), drafted=show(drafted_key) if drafted_key else None))
        return key

    def _speculative(self, sampler: Sampler, scores: list[float], keys: list[bytes], drafter_logits: torch.Tensor,
                     drafted_key: bytes | None) -> int:
        """Accept the drafted candidate with min(1, q/p), else draw from the residual (q - p)+."""
        t, table = sampler.temperature, self.members[0].table
        q = torch.softmax(torch.log(torch.tensor(scores).clamp_min(1e-12)) / t, 0)
        q = _nucleus(q, sampler.top_p)
        p_tokens = _nucleus(torch.softmax(drafter_logits / t, -1), sampler.top_p)
        p = torch.zeros(len(keys))
        for token in range(table.vocab_size):
            key = _key(table, token)
            if key in keys:
                p[keys.index(key)] += p_tokens[token]
        if drafted_key in keys:
            d = keys.index(drafted_key)
            if float(p[d]) > 0:
                ratio = float(q[d]) / float(p[d])
                if ratio >= 1.0 or sampler.uniform() < ratio:
                    return d
        residual = (q - p).clamp_min(0.0)
        if float(residual.sum()) <= 0.0:
            return keys.index(drafted_key) if drafted_key in keys else sampler.pick(q)
        return sampler.pick(residual)


def _whole_characters(piece: bytes) -> bool:
    try:
        piece.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _loop_unit(text: bytes, min_bytes: int) -> bytes | None:
    """The shortest unit of up to 256 bytes that the end of ``text`` repeats, over at least two
    units and ``min_bytes`` bytes (every byte equal to the byte one unit earlier); None if none."""
    n = len(text)
    for unit in range(1, min(256, n // 2) + 1):
        span = max(2 * unit, min_bytes)
        if span > n:
            break
        if all(text[i] == text[i - unit] for i in range(n - span + unit, n)):
            return text[n - unit:]
    return None


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    if top_p < 1.0:
        ordered, order = torch.sort(probs, descending=True)
        keep = torch.cumsum(ordered, 0) - ordered < top_p  # the smallest set holding top_p
        probs = torch.zeros_like(probs).scatter_(0, order, ordered * keep)
    return probs / probs.sum()


def _inside_a_word(longer: bytes, shorter: bytes) -> bool:
    """Whether the cut after ``shorter`` falls inside a word of ``longer``: the two characters around
    it are both word characters, both whitespace, the same symbol, or the second attaches to the first
    (what ``words.is_mark`` counts, spelled out here).
    False where either is not whole UTF-8 (pooled as released)."""
    try:
        pair = shorter.decode("utf-8")[-1:] + longer[len(shorter):].decode("utf-8")[:1]
    except UnicodeDecodeError:
        return False
    if len(pair) < 2:
        return False
    attaches = unicodedata.category(pair[1]).startswith("M") or pair[1] in "\u200d\ufe0f" \
        or 0x1F3FB <= ord(pair[1]) <= 0x1F3FF  # a mark, a joiner, a variation selector, a skin tone
    return bool(re.fullmatch(r"[^\W]{2}|\s{2}", pair)) or pair[0] == pair[1] or attaches
