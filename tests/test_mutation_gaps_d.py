"""Behaviour the suite left unpinned (mutation testing of alignment.py, decoding/adafuse.py and
auto_weights.py): each test fails on one mutant of the code it names and passes on the code as it is.
Pure functions, hand-made tables and fake states only, so the file stays fast."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from shared_engine.alignment import EOS_KEY, TokenTable, complete_length, valid_prefix_length
from shared_engine.auto_weights import FitCache, answer_tokens, choose_drafter, example_answers
from shared_engine.decoding.adafuse import (
    AdaFuseSettings,
    Continuation,
    Span,
    _branches,
    _candidate_keys,
    _leader_span,
    _loop_free_token,
    _propose_spans,
    _write,
)
from shared_engine.sampling import Sampler


def _table(pieces: list[bytes], special: set[int], eos: set[int]) -> TokenTable:
    return TokenTable.from_bytes(pieces, special_ids=special, eos_ids=eos, encode=lambda text: [], name="fake")


def test_an_incomplete_three_byte_character_led_by_0xe0_is_held_back() -> None:
    """alignment.complete_length: a lead byte 0xE0 opens a three-byte character (U+0800..U+0FFF:
    Devanagari, Bengali, Thai...), so its first two bytes at the end of a draft are held back until
    the next token completes it; read as a two-byte lead, the half character counted as text and
    every Hindi or Thai answer could be cut (and sent) inside a character."""
    ka = "क".encode()  # U+0915: E0 A4 95
    assert ka[0] == 0xE0
    assert complete_length(b"x" + ka[:2]) == 1
    assert valid_prefix_length(b"x" + ka[:2]) == 1
    assert complete_length(b"x" + ka) == 4


def test_the_loop_free_fallback_ends_the_answer_where_eos_is_the_drafters_best() -> None:
    """adafuse._loop_free_token: every member proposed the loop, and the drafter's most likely token
    that does not repeat it is its EOS: the answer ends (EOS_KEY). Without that check EOS was read as
    the text of its piece, and the answer got the literal '</s>' and went on."""
    table = _table([b"<pad>", b"</s>", b"a", b" b"], {0, 1}, {1})
    state = SimpleNamespace(members=[SimpleNamespace(table=table, eos_ids=table.eos_ids)],
                            loop_at=lambda tail: None, loop_tail=lambda: b"")
    assert _loop_free_token(state, torch.tensor([0.0, 9.0, 2.0, 3.0]), 0) == EOS_KEY  # type: ignore[arg-type]


def test_tables_with_the_same_pieces_but_other_eos_ids_are_no_same_vocabulary() -> None:
    """alignment.TokenTable.same_vocabulary: a verifier with the drafter's vocabulary reads the
    drafter's own ids instead of re-tokenizing, EOS included; where the two end their turn with other
    ids (a base and an instruct model of one family: '<|endoftext|>' vs '<|im_end|>'), the drafter's
    EOS id would be read as the verifier's and its end-of-answer mass taken from the wrong id."""
    pieces = [b"<|endoftext|>", b"<|im_end|>", b"a", b" b"]
    base, instruct = _table(pieces, {0, 1}, {0}), _table(pieces, {0, 1}, {1})
    assert base.same_vocabulary(_table(pieces, {0, 1}, {0}))
    assert not base.same_vocabulary(instruct) and not instruct.same_vocabulary(base)


def test_a_drafter_weighted_zero_gives_no_fallback_candidate() -> None:
    """adafuse._candidate_keys: where no member proposed anything spellable, the round's one candidate
    is the most likely token of the first *weighted* member: a drafter weighted 0 has no say (it
    neither proposes nor scores), so its own best token must not become the answer either."""
    drafter, verifier = _table([b"</s>", b" x", b" y"], {0}, {0}), _table([b"</s>", b" x", b" y"], {0}, {0})
    state = SimpleNamespace(weighted=lambda: [1], loop_guard=None,
                            members=[SimpleNamespace(table=drafter), SimpleNamespace(table=verifier)])
    outlook = SimpleNamespace(firsts=[torch.tensor([0.0, 5.0, 1.0]), torch.tensor([0.0, 1.0, 5.0])])
    keys, ruled_out = _candidate_keys(state, outlook, [[], []])  # type: ignore[arg-type]
    assert keys == [b" y"] and ruled_out == 0


def test_a_leader_writing_alone_reports_its_own_span_nll() -> None:
    """adafuse._leader_span (vote="uncertain", a sure leader): the span decision's one candidate
    carries the leader's mean NLL of its span as its score; the report (and the span card a user
    reads to see how sure the writer was) showed 0.0 for every span written alone."""
    state = SimpleNamespace(members=[SimpleNamespace(label="qwen"), SimpleNamespace(label="gemma")])
    span = Span(b" Paris", [7, 8], 1.25, 1)
    chosen, (candidate,) = _leader_span(state, 1, [[], [span]])  # type: ignore[arg-type]
    assert chosen == b" Paris"
    assert candidate.score == 1.25 and candidate.member_nll == {"gemma": 1.25}
    assert candidate.proposed_by == ["gemma"]


class _EvenMember:
    """A member whose every next-token distribution is uniform: two of them fit any text equally."""

    def __init__(self, table: TokenTable) -> None:
        self.table = table

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return fn(*args)


class _EvenSession:
    def sync(self, ids: list[int], first: int) -> torch.Tensor:
        return torch.zeros(len(ids) - first + 1, 16)


def test_drafter_auto_keeps_the_configured_order_on_a_tie() -> None:
    """auto_weights.choose_drafter: members that fit the example answers equally well keep the
    configured drafter (the first), as documented; taking the last of the tied ones moved drafting
    to another member (another tokenizer, other speed) for no measured reason."""
    chars = b"QA: hiyes\n"
    table = _table([bytes([c]) for c in chars], set(), set())
    ids = [chars.index(c) for c in b"Q: hi\nA: yes"]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    members: Any = [_EvenMember(table), _EvenMember(table)]
    sessions: Any = [_EvenSession(), _EvenSession()]
    choice = asyncio.run(choose_drafter(members, sessions, [ids, ids], messages, FitCache()))
    assert choice.nll_per_byte[0] == choice.nll_per_byte[1] and choice.index == 0


def test_drafter_auto_scores_the_first_example_answer_tokens_within_its_budget() -> None:
    """auto_weights.answer_tokens: over ``budget`` example-answer tokens, the *first* ones are scored,
    so a conversation that grows keeps the same scored prefix and finds its fit cached (FitCache);
    the last ones changed with every new turn and were scored again each request."""
    chars = b"QA: hiyes\n"
    table = _table([bytes([c]) for c in chars], set(), set())
    ids = [chars.index(c) for c in b"Q: hi\nA: yes\nQ: hi\nA: yes"]
    member: Any = _EvenMember(table)
    every = answer_tokens(member, ids, ["yes", "yes"])
    assert every == [9, 10, 11, 22, 23, 24]
    assert answer_tokens(member, ids, ["yes", "yes"], budget=4) == every[:4]


def test_a_blank_assistant_turn_is_no_example_answer() -> None:
    """auto_weights.example_answers: an assistant turn with only whitespace (a conversation's empty
    reply, a template's placeholder) shows no answer; counted, its empty text is found anywhere in the
    prompt and a prompt with no real example answer is scored as if it had one."""
    messages: Any = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": " \n"},
                     {"role": "assistant", "content": None}, {"role": "assistant", "content": "Paris"}]
    assert example_answers(messages) == ["Paris"]
    assert example_answers(messages[:3]) == []


class _WidthSession:
    """Rows of ``fill`` over ``width`` ids: 0.0 is uniform (NLL log(width) per token), NaN a broken member."""

    def __init__(self, width: int, fill: float = 0.0) -> None:
        self.width, self.fill = width, fill

    def sync(self, ids: list[int], first: int) -> torch.Tensor:
        return torch.full((len(ids) - first + 1, self.width), self.fill)


def test_drafter_auto_keeps_the_configured_drafter_when_a_fit_is_nan() -> None:
    """auto_weights.choose_drafter: a member whose example-answer NLL is NaN (NaN logits) leaves the
    choice to the configuration, with the reason; ``min`` over a list holding NaN is no minimum (NaN
    compares false both ways, so the result depends on where the NaN sits) and silently moved drafting
    to whichever member followed it."""
    chars = b"QA: hiyes\n"
    table = _table([bytes([c]) for c in chars], set(), set())
    ids = [chars.index(c) for c in b"Q: hi\nA: yes"]
    messages = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}]
    members: Any = [_EvenMember(table), _EvenMember(table), _EvenMember(table)]
    sessions: Any = [_WidthSession(32), _WidthSession(16, float("nan")), _WidthSession(16)]
    choice = asyncio.run(choose_drafter(members, sessions, [ids, ids, ids], messages, FitCache()))
    assert choice.index is None and "not finite" in choice.reason


def test_a_writers_own_eos_log_prob_is_its_whole_end_of_turn_mass() -> None:
    """adafuse.Continuation.add: where the writer's table has several EOS ids ('<|im_end|>' and
    '<|endoftext|>'), the log-prob it keeps for its EOS is the mass of all of them, as ``_score``
    scores the end for every other member; the picked id's share alone made a writer that splits its
    end over two ids score its own ending span worse than the others score it."""
    table = _table([b"<|endoftext|>", b"<|im_end|>", b" a"], {0, 1}, {0, 1})
    logits = torch.tensor([1.0, 1.0, 0.0])
    cont = Continuation()
    cont.add(1, logits, table, AdaFuseSettings())
    expected = float(torch.logsumexp(torch.log_softmax(logits, -1)[[0, 1]], 0))
    assert cont.eos and abs(cont.logprobs[0] - expected) < 1e-6


class _CountingWriter:
    """A session whose next token is always ``token`` (a peaked row), counting its forwards."""

    def __init__(self, width: int, token: int) -> None:
        self.width, self.token, self.forwards = width, token, 0

    def sync(self, ids: list[int], first: int) -> torch.Tensor:
        self.forwards += 1
        rows = torch.zeros(len(ids) - first + 1, self.width)
        rows[:, self.token] = 9.0
        return rows


def _every_boundary(data: bytes) -> set[int]:
    return set(range(len(data) + 1))


def test_a_span_stops_writing_once_its_words_end_where_every_member_can_cut() -> None:
    """adafuse._write: a one-word span stops as soon as its first word is complete and every member
    has a boundary after it; looking for the end only from the next word on wrote one more word per
    span (one more forward of the member for each of its tokens) and threw it away."""
    table = _table([b"</s>", b" a", b" b"], {0}, {0})
    session = _CountingWriter(3, 2)
    span = _write(session, [1], torch.tensor([0.0, 5.0, 1.0]), 1, table, AdaFuseSettings(),  # type: ignore[arg-type]
                  lambda logits: int(torch.argmax(logits)), 1, _every_boundary)  # type: ignore[arg-type]
    assert span.key == b" a" and session.forwards == 1


def test_branches_stay_within_a_top_k_members_exact_support() -> None:
    """adafuse._branches: a member that gives only its top K ids exactly (a top-K backend,
    ``exact_support``) branches over at most K first tokens; past them its logits are filler, so a
    branch started there is written from a token the member never ranked."""
    table = _table([b"</s>", b" a", b" b", b" c"], {0}, {0})
    settings = AdaFuseSettings(num_candidates=3)
    spans = _branches(_CountingWriter(4, 0), [1], torch.tensor([0.0, 5.0, 4.0, 3.0]), table,  # type: ignore[arg-type]
                      settings, _every_boundary, 0, 1)  # type: ignore[arg-type]
    assert len(spans) == 1


def test_every_member_branches_with_its_own_seed() -> None:
    """adafuse._propose_spans: each member samples its branches (candidate_temperature > 0) from its
    own seed (the round's seed + its index); with one seed for all, members with the same vocabulary
    and like distributions drew the same branches, and the vote got fewer distinct candidates."""
    seeds: list[int] = []

    class _Member:
        async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
            seeds.append(args[6])
            return []

    table = _table([b"</s>", b" a"], {0}, {0})
    record = SimpleNamespace(member=_Member(), session=None, table=table)
    state = SimpleNamespace(weighted=lambda: [0, 1], members=[record, record], max_new_tokens=64,
                            stats=SimpleNamespace(tokens=0))
    outlook = SimpleNamespace(contexts=[[1], [1]], firsts=[torch.zeros(2), torch.zeros(2)], shared=_every_boundary)
    settings = AdaFuseSettings(candidate_temperature=1.0)
    asyncio.run(_propose_spans(state, outlook, settings, Sampler(1.0, seed=7)))  # type: ignore[arg-type]
    assert len(seeds) == 2 and len(set(seeds)) == 2
