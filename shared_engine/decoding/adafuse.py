"""AdaFuse (Cui et al., arXiv 2601.06022) on the shared machinery: decide per *word span*.

One round (``vote="always"``, the released code's behaviour): every member looks at its
next-token distribution after the committed answer and measures its uncertainty (top-1 margin, or
entropy). A member that is sure there proposes one greedy span whose length its own sureness sets
(the released rule: sure at the first token of word 1 -> 2 words, also sure at the first token of
word 2 -> 3 words, up to ``max_words``); an unsure member proposes ``num_candidates`` one-word
continuations (test-time scaling: branching over its top first tokens, each completed greedily or,
with ``candidate_temperature`` > 0, by sampling). The union of proposals is scored by every member
(mean token NLL of the span through the member's own tokenizer, one forward that reuses the KV
cache of the answer) and the lowest weighted mean NLL wins. A member weighted 0 has no say: it
neither proposes nor scores (nor leads, below).

``vote="uncertain"`` (this project's earlier shortcut): if the most confident member (the
*leader*) is sure, it alone writes and commits its span, with no vote.

Where this differs from the released code (ensembling.md §3), on purpose:
- spans end where every member has a token boundary (``words.py``), not just at whitespace, and
  the committed text is exactly the chosen candidate's bytes (no ``" ".join``, no dropped
  punctuation-only words): code and CJK survive;
- a "word" is one whitespace-split word (the released beam-1 path takes up to ``--span_length``,
  default 4, of them as its "first word"; the paper describes one);
- a span its writer wrote up to its EOS ends the answer when chosen (the released code stops in
  the round whose span holds the EOS string) and is a candidate of its own (``text + EOS_KEY``):
  every member that ends its turn with EOS scores the ending too (its end-of-turn log-prob after the
  text is one more term of the span's mean NLL), so one member's early EOS does not end the answer
  on the others' score of its text alone (the released code stops on the EOS string without scoring
  it). A plain-format member (a base model; it ends its turn by writing ``"\nUser:"``, never with
  EOS mass) scores the text only: its near-zero EOS would veto every ending;
- KV caches are kept across rounds (``Session.sync``); the prefix is never re-encoded;
- N members; entropy as an alternative to the margin; first-token branching for every member.

With identical members and ``num_candidates=1`` it is exactly single-model greedy decoding; with
more candidates the vote may deliberately prefer a branch greedy decoding would not take (mean
NLL is length-normalised), which is the point of test-time scaling.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncGenerator, Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import torch

from ..alignment import EOS_KEY, TokenTable, complete_length, valid_prefix_length
from ..events import Event
from ..fusion import without_specials
from ..gather import gather_all
from ..members import Session
from ..members.base import exact_support
from ..repetition import continues_loop
from ..sampling import Sampler
from ..turn_markers import at_answer_start, without_ending
from ..words import SharedEnds, complete_word_ends, span_end, word_cut, word_ends
from .decisions import ScoredSpan, SpanDecision
from .report import count_span, count_span_round, count_span_source, count_turn_markers, span_event
from .state import RequestState, spell_bytes

Uncertainty = Literal["margin", "entropy"]
Vote = Literal["always", "uncertain"]
DEFAULT_THRESHOLD: dict[str, float] = {"margin": 0.7, "entropy": 0.6}
"""Margin: the paper's theta_delta. Entropy (nats): 0.6 is about a 0.85/0.15 split."""
TOKENS_PER_WORD = 8
"""Generation cap per word wanted (plus one word of lookahead), so a round always ends."""
UNSPELLABLE_NLL = 50.0
LOOP_FREE_TOP = 64
"""The drafter's top tokens searched for one that breaks a loop every member proposed to go on with."""


@dataclass(frozen=True, slots=True)
class AdaFuseSettings:
    uncertainty: Uncertainty = "margin"
    threshold: float = 0.7
    max_words: int = 3
    num_candidates: int = 3
    candidate_temperature: float = 0.0
    vote: Vote = "always"

    def measure(self, logits: torch.Tensor) -> float:
        """Top-1 margin p1 - p2 (higher = surer) or entropy in nats (lower = surer)."""
        probs = torch.softmax(logits.float(), dim=-1)
        if self.uncertainty == "margin":
            top = torch.topk(probs, 2).values
            return float(top[0] - top[1])
        return float(-(probs * torch.log(probs.clamp_min(1e-12))).sum())

    def is_sure(self, value: float) -> bool:
        return value >= self.threshold if self.uncertainty == "margin" else value <= self.threshold

    def sureness(self, value: float) -> float:
        return value if self.uncertainty == "margin" else -value


@dataclass
class Continuation:
    """What one member wrote from the answer: its ids, their log-probs and byte offsets."""

    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # of each id, under the writer
    measures: list[float] = field(default_factory=list)  # uncertainty of the row each id came from
    starts: list[int] = field(default_factory=list)  # byte offset of each id in ``data``
    data: bytes = b""
    eos: bool = False

    def add(self, token: int, logits: torch.Tensor, table: TokenTable, settings: AdaFuseSettings) -> None:
        logp = torch.log_softmax(logits.float(), dim=-1)
        eos = token in table.eos_ids
        self.ids.append(token)
        self.logprobs.append(float(torch.logsumexp(logp[list(table.eos_ids)], 0)) if eos else float(logp[token]))
        self.measures.append(settings.measure(logits))
        self.starts.append(len(self.data))
        if eos:
            self.eos = True
        else:
            self.data += table.pieces[token]

    def ids_up_to(self, end: int) -> list[int] | None:
        """Own ids spelling exactly ``data[:end]`` (None if a token straddles ``end``)."""
        count = sum(1 for s in self.starts if s < end) if end else 0
        spelled = b"".join(self._piece(i) for i in range(count))
        return self.ids[:count] if len(spelled) == end else None

    def _piece(self, index: int) -> bytes:
        nxt = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.data)
        return self.data[self.starts[index]:nxt]

    def nll_up_to(self, end: int) -> float | None:
        ids = self.ids_up_to(end)
        return -sum(self.logprobs[:len(ids)]) / len(ids) if ids else None

    def sure_words(self, settings: AdaFuseSettings) -> tuple[int, bool]:
        """How many words the span gets, and whether that number can no longer grow. As in the
        released code: one word, plus one more for each word, from the first on, whose first
        token the writer was sure of (sure at step 1 already gives 2 words); a word's first token
        is found as the released code finds it (``_first_token``)."""
        ends = complete_word_ends(self.data)
        words, row = 1, 0  # row: the token whose sureness lets word ``words`` + 1 join
        while words < settings.max_words:
            if words > 1:
                if len(ends) < words - 1:
                    return words, self.eos  # word ``words`` has not started yet
                after = self._first_token(ends[words - 2], row)
                if after is None:
                    return words, self.eos  # its first token is not written yet
                row = after
            if not settings.is_sure(self.measures[row]):
                return words, True
            words += 1
        return words, len(ends) >= words or self.eos

    def _first_token(self, end: int, since: int) -> int | None:
        """The token after ``since`` whose row the released code reads for the word after
        ``data[:end]`` (``extract_word_tokens_from_generated``: the tokens that spell the words,
        whitespace after them ignored, then the next token): the token after the one that reaches
        ``end``, also when that one goes on with whitespace only (Qwen's ".\n" after " Paris");
        where it goes on with text, that token itself, unless its row was read already (then the
        next, as the released code keeps a first token that holds more than the word). None while
        that token is not written yet."""
        for index in range(since, len(self.ids)):
            stop = self.starts[index + 1] if index + 1 < len(self.starts) else len(self.data)
            if stop < end:
                continue
            if stop > end and index > since and self.data[end:stop].decode("utf-8", "replace").strip():
                return index  # text on both sides of ``end``
            return index + 1 if index + 1 < len(self.ids) else None
        return None


def span_text(key: bytes) -> bytes:
    """A candidate's text: its bytes without the EOS that ends the answer after it."""
    return key[:-len(EOS_KEY)] if key.endswith(EOS_KEY) else key


def ends_answer(key: bytes) -> bool:
    """Whether a candidate ends the answer (EOS_KEY alone, or a span its writer ended with EOS)."""
    return key.endswith(EOS_KEY)


@dataclass(frozen=True, slots=True)
class Span:
    key: bytes  # the span's bytes, + EOS_KEY where its writer's EOS came right after them (ends the answer)
    ids: list[int] | None  # the writer's own ids for its text
    nll: float | None  # the mean NLL of its text under the writer
    words: int
    end_logprob: float | None = None  # the writer's log-prob of its EOS after the text (an ending span)

    def own_nll(self, scores_end: bool) -> float | None:
        """The writer's score of its span, as ``_score`` scores others' (see ``_score``)."""
        if self.nll is None or self.end_logprob is None or not scores_end or not self.ids:
            return self.nll
        return (self.nll * len(self.ids) - self.end_logprob) / (len(self.ids) + 1)


def _next_logits(session: Session, context: list[int]) -> torch.Tensor:
    return session.sync(context, len(context))[-1]


def _write(session: Session, context: list[int], first: torch.Tensor, token: int, table: TokenTable,
           settings: AdaFuseSettings, pick: Callable[[torch.Tensor], int], words: int | None,
           shared: SharedEnds, left: int | None = None) -> Span:
    """Blocking: write from ``context`` starting with ``token`` until a span of ``words`` words
    (None: as many as the writer is sure of) ends where every member has a boundary, or until
    ``left`` tokens (the answer's tokens max_new_tokens still allows; None: no cap) are written and
    end on a whole character: the answer keeps no more of the span, and writing and scoring a whole
    span cost a round's forward passes for its last token or two. A span so cut is all its text
    (``_cut_span``). Where ``left`` is at least the round's token limit nothing changes."""
    cont, logits = Continuation(), first
    limit = TOKENS_PER_WORD * ((words or settings.max_words) + 1)
    cap = left if left is not None and left < limit else None
    while True:
        cont.add(token, logits, table, settings)
        wanted, final = (words, len(complete_word_ends(cont.data)) >= words) if words \
            else cont.sure_words(settings)
        boundaries = None  # every member's shared boundaries in the text written so far
        if cont.eos or len(cont.ids) >= limit:
            break
        if final:
            boundaries = shared(cont.data)
            if _has_end(cont.data, wanted, boundaries):
                break
        if cap is not None and _spent(cont, cap):
            return _cut_span(cont)
        logits = session.sync(context + cont.ids, len(context) + len(cont.ids))[-1]
        token = pick(without_specials(logits, table))  # its own log-prob (``cont.add``) from the whole row
    if not cont.data and cont.eos:
        return Span(EOS_KEY, cont.ids, -cont.logprobs[0], 1)
    if boundaries is None:  # re-tokenizing for every member is the costly part: once per stop
        boundaries = shared(cont.data)
    end = span_end(cont.data, wanted, boundaries, finished=cont.eos) or valid_prefix_length(cont.data)
    text = cont.data[:end]
    ending = cont.eos and end == len(cont.data)
    return Span(text + EOS_KEY if ending else text, cont.ids_up_to(end), cont.nll_up_to(end),
                len(word_ends(text.decode("utf-8", "ignore"))), cont.logprobs[-1] if ending else None)


def _spent(cont: Continuation, cap: int) -> bool:
    """Whether ``cont`` holds the ``cap`` tokens the answer can still take, ending on a whole
    character (a character split across tokens is written to its end: a span cut inside one would
    commit a token with no text, and its decision would describe nothing the client sees)."""
    return len(cont.ids) >= max(cap, 1) and complete_length(cont.data) == len(cont.data)


def _cut_span(cont: Continuation) -> Span:
    """A span cut by the tokens left (``_write``): all the valid text written, the whole of what the
    answer can still take (a word end would keep less of it and need another round)."""
    end = valid_prefix_length(cont.data)
    text = cont.data[:end]
    return Span(text, cont.ids_up_to(end), cont.nll_up_to(end), len(word_ends(text.decode("utf-8", "ignore"))))


def _has_end(data: bytes, words: int, shared: set[int]) -> bool:
    ends = complete_word_ends(data)
    return any(word_cut(data, e, shared) is not None for e in ends[words - 1:])


def _propose(session: Session, context: list[int], first: torch.Tensor, table: TokenTable,
             settings: AdaFuseSettings, shared: SharedEnds, seed: int, support: int | None,
             left: int | None = None) -> list[Span]:
    """Blocking: one member's proposals for the vote. Sure at its first token: its greedy span,
    as many words as its sureness gives (the released code's candidate); unsure: one-word
    branches over its top first tokens (test-time scaling). ``left``: the answer's tokens left (``_write``)."""
    if settings.is_sure(settings.measure(first)):
        return [_write(session, context, first, _argmax(without_specials(first, table)), table, settings, _argmax,
                       None, shared, left)]
    return _branches(session, context, first, table, settings, shared, seed, support, left)


def _branches(session: Session, context: list[int], first: torch.Tensor, table: TokenTable,
              settings: AdaFuseSettings, shared: SharedEnds, seed: int, support: int | None,
              left: int | None = None) -> list[Span]:
    """Blocking: ``num_candidates`` one-word continuations from the member's top first tokens."""
    sampler = Sampler(settings.candidate_temperature, seed=seed)

    def pick(logits: torch.Tensor) -> int:
        if sampler.greedy:
            return int(torch.argmax(logits))
        # the Sampler's softmax: a tiny temperature (2e-38: logits / T overflowed to inf, then NaN) is greedy
        top = torch.topk(logits.float(), min(support or logits.shape[-1], logits.shape[-1]))
        return int(top.indices[sampler.pick(sampler.distribution(top.values))])

    count = min(settings.num_candidates, first.shape[-1], support or first.shape[-1])
    tops = torch.topk(without_specials(first, table), count).indices.tolist()
    return [_write(session, context, first, t, table, settings, pick if i else _argmax, 1, shared, left)
            for i, t in enumerate(tops)]


def _argmax(logits: torch.Tensor) -> int:
    return int(torch.argmax(logits))


def _score(session: Session, context: list[int], first: torch.Tensor, table: TokenTable,
           keys: list[bytes], own: dict[bytes, float], name: str, scores_end: bool) -> list[float]:
    """Blocking: mean token NLL of each candidate span under this member, through its own
    tokenization, each in one forward on top of the cached answer (own spans reuse their
    generation log-probs). A span that ends the answer has its EOS as one more token
    (``scores_end``: a member that ends its turn with EOS; a plain-format one scores the text only)."""
    scores = []
    for key in keys:
        text = span_text(key)
        if key in own:
            scores.append(own[key])
        elif not text:  # EOS_KEY: end the answer here
            logp = torch.log_softmax(first.float(), dim=-1)
            scores.append(-float(torch.logsumexp(logp[list(table.eos_ids)], 0)))
        else:
            try:
                ids = spell_bytes(table, text, name)
            except ValueError:
                scores.append(UNSPELLABLE_NLL)
                continue
            rows = session.sync(context + ids, len(context))
            logp = torch.log_softmax(rows.float(), dim=-1)
            picked = logp[torch.arange(len(ids)), torch.tensor(ids)]
            if scores_end and key != text and table.eos_ids:
                picked = torch.cat([picked, torch.logsumexp(logp[-1, list(table.eos_ids)], 0).reshape(1)])
            scores.append(-float(picked.mean()))
    return scores


@dataclass(frozen=True, slots=True)
class _Outlook:
    """Where every member stands at the start of a round (lists in decoding order)."""

    contexts: list[list[int]]  # prompt + answer in each member's ids
    firsts: list[torch.Tensor]  # each member's next-token logits after the answer
    measures: list[float]  # each member's uncertainty there
    leader: int  # the most confident member
    shared: SharedEnds  # where every member has a token boundary
    turn_markers: int = 0  # members whose turn marker held mass here (turn_markers.py)


Proposals = list[list[Span]]
"""Per member, in decoding order: the spans it proposed this round ([] for none)."""


async def adafuse_round(state: RequestState, settings: AdaFuseSettings,
                        sampler: Sampler) -> AsyncGenerator[Event, None]:
    """One AdaFuse round; yields events and leaves the state advanced (or finished)."""
    start, position = len(state.answer), state.stats.tokens
    contexts = [state.member_context(i) for i in range(len(state.members))]
    if _window_full(state, settings, contexts):
        state.finish_reason = "length"  # the answer ends where every member can still read a round
        return
    outlook = await _look(state, contexts, settings)
    count_span_round(state.stats)
    count_turn_markers(state.stats, outlook.turn_markers)
    voted = settings.vote == "always" or not settings.is_sure(outlook.measures[outlook.leader])
    if not voted:  # vote="uncertain" and the leader is sure: it writes alone, unless its span loops
        proposals = await _leader_writes(state, outlook, settings, sampler)
        span = proposals[outlook.leader][0]
        voted = _ends_in_loop(state, span.key, token_ends=_token_ends(state, outlook.leader, span))  # then the vote
    if voted:
        proposals = await _propose_spans(state, outlook, settings, sampler)
        keys, ruled_out = _candidate_keys(state, outlook, proposals)
        nlls = await _score_candidates(state, outlook, proposals, keys)
        chosen, candidates = _vote(state, keys, proposals, nlls, sampler)
    else:
        ruled_out = 0
        chosen, candidates = _leader_span(state, outlook.leader, proposals)
    labels = [m.label for m in state.members]
    decision = SpanDecision(
        position=position, offset=start, uncertainty=settings.uncertainty,
        member_uncertainty=dict(zip(labels, outlook.measures)), leader=labels[outlook.leader], voted=voted,
        candidates=candidates, chosen=chosen,
        words=next((sp.words for props in proposals for sp in props if sp.key == chosen), 1),
        drafter_proposal=proposals[0][0].key if proposals[0] else None, loop_ruled_out=ruled_out)
    event = span_event(decision)
    if chosen == EOS_KEY:
        yield event
        state.finish_reason = "eos"
        count_span(state.stats, decision, 1)  # the position where it ends, decided as SAFE's EOS fusion is
        return
    before = state.stats.tokens
    tokens = state.commit(_span_ids(state, outlook, chosen, proposals), "ensemble" if voted else "draft")
    if not state.finish_reason and ends_answer(chosen):
        state.finish_reason = "eos"  # as the released code, which stops in the round whose span holds the EOS
    # Sent only where the answer holds its first position: a stop string may cut the whole span away (as
    # would a JSON constraint refusing its first token, were AdaFuse given one), and a decision with no
    # text is a card describing nothing. Its count (the EOS it ends with is a position of its own, as in
    # SAFE's rounds) stops where the answer does.
    if decision.position < state.answer_end:
        yield event
        count_span(state.stats, decision, min(state.stats.tokens, state.answer_end) - before
                   + int(state.finish_reason == "eos"))
    for token_event in tokens:
        yield token_event
    count_span_source(state.stats, own=chosen == decision.drafter_proposal, voted=voted,
                      committed=state.stats.tokens - before)


def _tokens_left(state: RequestState) -> int:
    """The answer's tokens max_new_tokens still allows: a round's spans are cut there (``_write``)."""
    return state.max_new_tokens - state.stats.tokens


def _window_full(state: RequestState, settings: AdaFuseSettings, contexts: list[list[int]]) -> bool:
    """Whether a member's window could not hold another round: max_new_tokens counts the drafter's
    tokens (checked against every window at the start), a member may spell the answer in more of its
    own, and a round writes a span of up to ``TOKENS_PER_WORD * (max_words + 1)`` tokens and scores the
    others' spans (room for twice that, in its own tokens)."""
    room = round_room(settings.max_words)
    return any(len(context) + room > m.member.context_window for context, m in zip(contexts, state.members))


def round_room(max_words: int) -> int:
    """Tokens a member's window must have left for one AdaFuse round (see ``_window_full``); the
    engine refuses a prompt that leaves less (its answer would be empty)."""
    return 2 * TOKENS_PER_WORD * (max_words + 1)


async def _look(state: RequestState, contexts: list[list[int]], settings: AdaFuseSettings) -> _Outlook:
    """Every member's next-token distribution after the answer (``contexts``: prompt + answer in
    each member's ids), its uncertainty, and the leader."""
    answer = bytes(state.answer)
    shared = SharedEnds(answer, state.canonical_texts())
    raw = await gather_all(*(m.member.run(_next_logits, m.session, c) for m, c in zip(state.members, contexts)))
    # a plain-format member's turn marker is its end of turn, never a word (turn_markers.py)
    read = [m.read(logits, answer, len(answer), writing=True) for m, logits in zip(state.members, raw)]
    firsts = [logits for logits, _ in read]
    if len(state.weighted()) > 1 and at_answer_start(answer):  # an empty answer is never the ensemble's
        firsts = [without_ending(f, m.eos_ids) for f, m in zip(firsts, state.members)]
    measures = [settings.measure(f) for f in firsts]
    leader = max(state.weighted(), key=lambda i: (settings.sureness(measures[i]), -i))
    return _Outlook(contexts, firsts, measures, leader, shared, sum(counted for _, counted in read))


async def _propose_spans(state: RequestState, outlook: _Outlook, settings: AdaFuseSettings,
                         sampler: Sampler) -> Proposals:
    """Every weighted member's proposals for the vote, written concurrently (see ``_propose``); a
    member weighted 0 proposes nothing (its span could win the vote: it has no say)."""
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=sampler.generator))
    weighted = state.weighted()
    spans = await gather_all(*(
        state.members[i].member.run(_propose, state.members[i].session, outlook.contexts[i], outlook.firsts[i],
                                    state.members[i].table, settings, outlook.shared, seed + i,
                                    exact_support(state.members[i].member), _tokens_left(state))
        for i in weighted))
    proposals: Proposals = [[] for _ in state.members]
    for i, props in zip(weighted, spans):
        proposals[i] = props
    return proposals


def _candidate_keys(state: RequestState, outlook: _Outlook, proposals: Proposals) -> tuple[list[bytes], int]:
    """The distinct proposed spans, in proposal order, and how many of them the loop guard ruled
    out: a span after which the answer would end in a loop (repetition.py), unless every span would."""
    keys = list(dict.fromkeys(sp.key for props in proposals for sp in props if sp.key))
    voice = state.weighted()[0]  # the drafter, unless it is weighted 0 (no say)
    if not keys:  # nothing spellable came out (cannot happen with real text): take one token
        table = state.members[voice].table
        keys = [table.pieces[int(torch.argmax(without_specials(outlook.firsts[voice], table)))]]
    if state.loop_guard is None:
        return keys, 0
    tail = state.loop_tail() or b""  # the answer's end is all a loop check reads, not a copy of the whole answer
    token_ends: dict[bytes, set[int]] = {}  # every writer's token ends in the span
    for i, props in enumerate(proposals):
        for sp in props:
            token_ends.setdefault(sp.key, set()).update(_token_ends(state, i, sp))
    free = [k for k in keys if not _ends_in_loop(state, k, tail, token_ends.get(k, ()))]
    return (free or [_loop_free_token(state, outlook.firsts[voice], voice)]), len(keys) - len(free)


def _ends_in_loop(state: RequestState, key: bytes, tail: bytes | None = None,
                  token_ends: Iterable[int] = ()) -> bool:
    """Whether the answer would end in a loop the guard stops (repetition.py) after span ``key``, or
    after one of its words or of its writer's tokens (``token_ends``): a span of up to 32 tokens could
    repeat a unit far past the limit and end on other text (" na na ... na Batman", or within one word:
    " hahaha...ha!"), where SAFE's guard, token by token, would have stopped it. ``tail``: the
    answer's end, ``state.loop_tail()``, where the caller has it."""
    if state.loop_guard is None or ends_answer(key):
        return False  # an answer that ends here ends any loop
    tail = (state.loop_tail() or b"") if tail is None else tail
    ends = sorted({*complete_word_ends(key), *(e for e in token_ends if 0 < e < len(key)), len(key)})
    return any(state.loop_at(state.loop_tail(tail + key[:end])) is not None for end in ends)


def _token_ends(state: RequestState, writer: int, span: Span) -> list[int]:
    """The byte offsets in ``span.key`` where its writer's tokens end (none where it has no ids)."""
    pieces = state.members[writer].table.pieces
    return list(itertools.accumulate(len(pieces[token]) for token in span.ids or []))


def _loop_free_token(state: RequestState, logits: torch.Tensor, voice: int) -> bytes:
    """Every member proposed the loop: member ``voice``'s (the drafter, unless it is weighted 0) most
    likely token that does not repeat it (EOS counts as one), as the round's only candidate."""
    member = state.members[voice]
    table, eos, unit = member.table, member.eos_ids, state.loop_at(state.loop_tail())
    for token in torch.topk(without_specials(logits, table), min(LOOP_FREE_TOP, logits.shape[-1])).indices.tolist():
        if token in eos:
            return EOS_KEY
        if table.pieces[token] and not continues_loop(unit, table.pieces[token]):
            return table.pieces[token]
    return EOS_KEY  # its whole top is the loop: the answer ends here


async def _score_candidates(state: RequestState, outlook: _Outlook, proposals: Proposals,
                            keys: list[bytes]) -> torch.Tensor:
    """Every weighted member's mean NLL of every candidate, [weighted members, candidates] in the
    order of ``state.weighted()`` (see ``_score``); a member weighted 0 scores nothing (0 * an
    infinite NLL, a top-K backend's, would make every score NaN)."""
    scores_end = [not m.turn_stops for m in state.members]
    owns = [{sp.key: nll for sp in props if (nll := sp.own_nll(scores_end[i])) is not None}
            for i, props in enumerate(proposals)]
    nlls = await gather_all(*(
        state.members[i].member.run(_score, state.members[i].session, outlook.contexts[i], outlook.firsts[i],
                                    state.members[i].table, keys, owns[i], state.members[i].member.name,
                                    scores_end[i])
        for i in state.weighted()))
    return torch.tensor(nlls, dtype=torch.float32)


def _vote(state: RequestState, keys: list[bytes], proposals: Proposals, nlls: torch.Tensor,
          sampler: Sampler) -> tuple[bytes, list[ScoredSpan]]:
    """The span with the lowest weighted mean NLL (sampling: softmax of minus the score); ``nlls``
    holds the weighted members' rows (``_score_candidates``)."""
    weighted = state.weighted()
    scores = state.weights[weighted] @ nlls
    chosen = keys[sampler.from_probs(torch.softmax(-scores, dim=0))]
    labels = [m.label for m in state.members]
    candidates = [ScoredSpan(key, proposed_by=[labels[i] for i, props in enumerate(proposals)
                                               if any(sp.key == key for sp in props)],
                             member_nll={labels[i]: float(nlls[row, c]) for row, i in enumerate(weighted)},
                             score=float(scores[c]))
                  for c, key in enumerate(keys)]
    return chosen, candidates


async def _leader_writes(state: RequestState, outlook: _Outlook, settings: AdaFuseSettings,
                         sampler: Sampler) -> Proposals:
    """The sure leader's span, as many words as its sureness gives, sampled as the request asks."""
    leader = state.members[outlook.leader]
    support = exact_support(leader.member)

    def pick(logits: torch.Tensor) -> int:
        return sampler.from_logits(logits, support)

    first = outlook.firsts[outlook.leader]
    token = pick(without_specials(first, leader.table))
    span = await leader.member.run(_write, leader.session, outlook.contexts[outlook.leader], first, token,
                                   leader.table, settings, pick, None, outlook.shared, _tokens_left(state))
    proposals: Proposals = [[] for _ in state.members]
    proposals[outlook.leader] = [span]
    return proposals


def _leader_span(state: RequestState, leader: int, proposals: Proposals) -> tuple[bytes, list[ScoredSpan]]:
    """The leader's span as the only candidate, scored by the leader alone."""
    (span,) = proposals[leader]
    label = state.members[leader].label
    nll = span.nll or 0.0
    return span.key, [ScoredSpan(span.key, proposed_by=[label], member_nll={label: nll}, score=nll)]


def _span_ids(state: RequestState, outlook: _Outlook, chosen: bytes, proposals: Proposals) -> list[int]:
    """Drafter ids to commit for the chosen span: the drafter's own if it wrote the span, else its
    spelling of the span's bytes. An empty span (a member wrote only text-less tokens) still has to
    move the answer on: the drafter's most likely token."""
    own = next((sp.ids for sp in proposals[0] if sp.key == chosen and sp.ids), None)
    text = span_text(chosen)
    return own or (state.ids_for_piece(text) if text
                   else [int(torch.argmax(without_specials(outlook.firsts[0], state.drafter.table)))])
