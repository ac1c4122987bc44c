"""AdaFuse on the shared engine: word spans, the uncertain branch, cache reuse, real models."""

from __future__ import annotations

import pytest
import torch

from shared_engine import EnsembleEngine, InvalidRequestError
from shared_engine.alignment import TokenizedText, shared_boundaries
from shared_engine.decoding.adafuse import AdaFuseSettings, _next_logits, _score
from shared_engine.words import SharedEnds, complete_word_ends, is_mark, span_end, word_ends
from tests.test_engine import ANSWER, QUESTION, trained_member
from tests.toy import toy_member


def _words(text: str) -> list[str]:
    ends = word_ends(text)
    return [text[a:b] for a, b in zip([0, *ends], ends)]


@pytest.mark.parametrize(("text", "words"), [
    # punctuation attaches to the word before it, as a whitespace split would (issue #16) ...
    ("Hi Sofia, hi.", ["Hi", " Sofia,", " hi."]),
    ("= 18.", ["=", " 18."]),
    ("3.14 km", ["3.14", " km"]),
    ("def add(a_b, c):\n    return a_b+c", ["def", " add(a_b,", " c):", "\n    return", " a_b+c"]),
    # ... while CJK characters stay words of their own (no whitespace to split on)
    ("我们去北京。", ["我", "们", "去", "北", "京。"]),
    ("用Python写，好", ["用", "Python", "写，", "好"]),
    ("e\u0301te\u0301 done", ["e\u0301te\u0301", " done"]),
    ("hi 👩\u200d💻 ok", ["hi", " 👩\u200d💻", " ok"]),
    ("  ", []),
])
def test_words_work_for_prose_code_cjk_marks_and_emoji(text: str, words: list[str]) -> None:
    assert _words(text) == words
    assert "".join(_words(text)) == text.rstrip() or not words


def test_a_word_is_complete_only_once_something_follows_it() -> None:
    assert complete_word_ends(b" Sofia") == []
    assert complete_word_ends(b" Sofia,") == []  # the comma belongs to the word, which may go on
    assert complete_word_ends(b" Sofia, hi") == [7]
    assert complete_word_ends(" 北京".encode()) == [4]  # bytes: " " + 3-byte 北
    assert complete_word_ends(b" ab\xe5\x8c") == []  # an incomplete character is not text yet


def _continuation(table, pieces: list[bytes], sure: list[bool]):  # noqa: ANN001, ANN202
    """A continuation written token by token with the given sureness of each token's row."""
    from shared_engine.decoding.adafuse import Continuation

    settings = AdaFuseSettings(max_words=3)
    cont = Continuation()
    for piece, is_sure in zip(pieces, sure):
        logits = torch.zeros(table.vocab_size)
        logits[table.token_id(piece)] = 20.0 if is_sure else 0.1  # margin ~1 or ~0
        cont.add(table.token_id(piece), logits, table, settings)
    return cont, settings


@pytest.mark.parametrize(("sure", "words"), [
    ([False, True, True, True], 1),  # unsure at step 1: one word
    ([True, False, False, False], 2),  # sure at step 1 already gives 2 words (the released rule)
    ([True, True, False, False], 3),  # sure at the first token of word 2 too: 3 words
    ([True, False, True, True], 2),
])
def test_span_growth_follows_the_released_rule(sure: list[bool], words: int) -> None:
    """Word k+1 joins the span when the first token of word k was sure (AdaFuse_two_models.py:
    margin at step 1 -> 2 words, and at the next word's first token -> 3 words)."""
    table = toy_member("a", "byte_level", "llama", 1).table
    pieces = [b"Tom", b" wrote", b" about", b" numbers"]
    assert all(table.token_id(p) is not None for p in pieces)
    cont, settings = _continuation(table, pieces, sure)
    assert cont.sure_words(settings) == (words, True)


@pytest.mark.parametrize(("pieces", "sure", "words"), [
    # Qwen writes " Paris.\nThe" as " Paris" + ".\n" + "The": the released code's first word is
    # [" Paris", ".\n"] (its text stripped is "Paris."), so word 2's margin is read at "The"
    ([b" Paris", b".\n", b"The", b" capital", b" is"], [True, False, True, False, False], 3),
    ([b" Paris", b".\n", b"The", b" capital", b" is"], [True, True, False, False, False], 2),
    ([b" Paris", b".", b"\n", b"The", b" capital", b" is"], [True, False, True, False, False, False], 3),  # at "\n"
    # a token holding text of both words: the released code reads that token's row
    ([b" Paris", b".\nThe", b" capital", b" is"], [True, True, False, False], 3),
    ([b" Paris", b".\nThe", b" capital", b" is"], [True, False, True, True], 2),
    # the first token holds both words: the released code keeps it as word 1's and reads the next row
    ([b" Hi\nYou", b" there", b" now", b" ok"], [True, True, False, False], 3),
    ([b" Hi\nYou", b" there", b" now", b" ok"], [True, False, True, True], 2),
])
def test_word_two_is_measured_where_the_released_code_reads_it(pieces: list[bytes], sure: list[bool],
                                                               words: int) -> None:
    """A token straddling the end of word 1 (Qwen's ".\n") kept the span at 2 words: word 2 had to
    start at a token start. The released ``extract_word_tokens_from_generated`` takes the tokens that
    spell word 1, whitespace after it ignored, and reads the margin at the next token
    (AdaFuse_two_models.py:89-145, 258-299)."""
    from shared_engine.alignment import TokenTable
    from shared_engine.decoding.adafuse import Continuation

    vocab = sorted(set(pieces))
    table = TokenTable.from_bytes(vocab, special_ids=set(), eos_ids=set(), encode=lambda text: [], name="fake")
    settings, cont = AdaFuseSettings(max_words=3), Continuation()
    for piece, is_sure in zip(pieces, sure):
        logits = torch.zeros(len(vocab))
        logits[vocab.index(piece)] = 20.0 if is_sure else 0.1
        cont.add(vocab.index(piece), logits, table, settings)
    assert cont.sure_words(settings) == (words, True)


def test_spans_never_end_inside_a_token_of_any_member() -> None:
    """' Sofia' is one token for the byte-level member and ' So' + 'fia' for the metaspace one;
    after ' Sofia,' both have a boundary, after ' So' only one does."""
    byte_level, metaspace = trained_member("byte_level"), trained_member("metaspace")
    texts = [TokenizedText(byte_level.table), TokenizedText(metaspace.table)]
    for tokens in texts:
        tokens.set_text(b"Hi")
    shared = SharedEnds(b"Hi", texts)
    assert 3 not in shared(b" Sofia, hi")  # " So|fia": only the metaspace member may stop there
    assert 6 in shared(b" Sofia, hi")
    assert span_end(b" Sofia, hi", 1, shared(b" Sofia, hi"), finished=False) == 7  # " Sofia," is one word
    assert span_end(b" Sofia, hi there", 2, shared(b" Sofia, hi there"), finished=False) == 10
    assert span_end(b" So", 1, shared(b" So"), finished=False) == 0  # nothing safe yet: write on


def test_a_word_whose_end_only_the_whitespace_after_it_shares_ends_there() -> None:
    """Qwen writes ':\n' as one token, Gemma ':' + '\n': after 'Student:' no word end is shared, only
    the end of the new line. span_end fell back to the LAST shared boundary, so a one-word span ran to
    its token limit and a loop ('Student:\n' x 20, low mean NLL) won the vote on the real pair."""
    from tests.test_alignment import _real_table

    text = b"Student:\nStudent:\nStudent:\nStu"
    tables = [_real_table("qwen2.5-coder-0.5b-instruct"), _real_table("gemma-3-270m")]
    texts = [TokenizedText(table) for table in tables]
    for tokens in texts:
        tokens.set_text(b"Hi")
    shared = SharedEnds(b"Hi", texts)(text)
    assert 8 not in shared and 9 in shared  # after 'Student:' only the new line's end is shared
    assert span_end(text, 1, shared, finished=False) == 9  # 'Student:\n', not all three
    assert span_end(text, 2, shared, finished=False) == 18
    assert span_end(b" Sofia, hi", 1, {3, 6, 8}, finished=False) == 8  # ' Sofia, ': the space's end is shared
    assert span_end(b" Sofia, hi", 1, {3, 6, 7, 8}, finished=False) == 7  # the word end itself first


@pytest.mark.parametrize("vote", ["always", "uncertain"])
@pytest.mark.parametrize("threshold", [0.0, 1.0])  # always sure / never sure
@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_identical_members_with_one_candidate_equal_single_greedy(kind: str, threshold: float, vote: str) -> None:
    member = toy_member("toy", kind, "llama", seed=3)
    single = EnsembleEngine([member], method="single").generate("Sofia walked to the park", max_new_tokens=30)
    result = EnsembleEngine([member, member], method="adafuse", num_candidates=1, threshold=threshold,
                            vote=vote).generate("Sofia walked to the park", max_new_tokens=30)
    assert result.text == single.text
    assert result.stats.changed_tokens == 0
    assert result.stats.spans == result.stats.rounds
    voted = vote == "always" or threshold == 1.0
    assert result.stats.fused_spans == (result.stats.spans if voted else 0)


def test_by_default_every_member_proposes_and_the_vote_decides_even_when_one_is_sure() -> None:
    """The released AdaFuse: every model proposes a span every round (its length set by its own
    margin) and the lowest mean NLL over all models wins; a sure member no longer writes alone
    (that shortcut is ``vote="uncertain"``). Threshold 0: every member is always sure."""
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    engine = EnsembleEngine([a, b], method="adafuse", threshold=0.0, weights=[0.3, 0.7])
    assert engine.options.vote == "always"
    result = engine.generate("Tom wrote about numbers 12 and 7", max_new_tokens=24, keep_events=True)
    decisions = [e for e in result.events if e.type == "adafuse"]
    assert decisions and all(d.fused for d in decisions)
    for d in decisions:
        assert {name for c in d.candidates for name in c.proposed_by} == {"a", "b"}
        assert all(set(c.member_nll) == {"a", "b"} for c in d.candidates)
        assert d.chosen == min(d.candidates, key=lambda c: c.score).text
    shortcut = EnsembleEngine([a, b], method="adafuse", threshold=0.0, vote="uncertain").generate(
        "Tom wrote about numbers 12 and 7", max_new_tokens=24, keep_events=True)
    assert not any(e.fused for e in shortcut.events if e.type == "adafuse")
    with pytest.raises(InvalidRequestError, match="vote"):
        EnsembleEngine([a, b], method="adafuse", vote="sometimes")


def test_uncertain_rounds_vote_and_change_the_answer() -> None:
    """Two different members, never sure: every span is voted on; the vote takes the candidate with
    the lowest weighted mean NLL, which is at times not the drafter's greedy word, so the answer
    differs from the drafter's own; committed text is exactly the chosen candidates, in order."""
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    prompt = "Tom wrote about numbers 12 and 7"
    alone = EnsembleEngine([a], method="single").generate(prompt, max_new_tokens=24).text
    engine = EnsembleEngine([a, b], method="adafuse", threshold=1.0, weights=[0.3, 0.7])
    result = engine.generate(prompt, max_new_tokens=24, keep_events=True)
    decisions = [e for e in result.events if e.type == "adafuse"]
    assert decisions and all(d.fused for d in decisions)
    assert result.stats.fused_spans == len(decisions) == result.stats.spans
    for d in decisions:
        scores = [c.score for c in d.candidates]
        assert scores == sorted(scores) and d.chosen == d.candidates[0].text
        for c in d.candidates:  # the score is the weighted mean of the members' NLLs
            assert c.score == pytest.approx(0.3 * c.member_nll["a"] + 0.7 * c.member_nll["b"], abs=2e-3)
        assert len(d.candidates) >= 2  # test-time scaling widened the pool
    assert any(d.chosen not in {c.text for c in d.candidates if c.proposed_by == ["a"]} for d in decisions)
    assert result.text != alone
    tokens = "".join(e.text for e in result.events if e.type == "token")
    assert tokens == result.text
    joined = "".join(d.chosen.removesuffix("<eos>") for d in decisions)
    assert joined.startswith(result.text)  # exactly the chosen spans (the last one may be cut short)


def test_trained_pair_spans_end_on_shared_boundaries_and_recover_the_answer() -> None:
    drafter, verifier = trained_member("metaspace"), trained_member("byte_level")
    for threshold in (0.0, 1.0):
        result = EnsembleEngine([drafter, verifier], method="adafuse", threshold=threshold,
                                max_new_tokens=16).generate(QUESTION, keep_events=True)
        assert result.text == ANSWER
        text = ANSWER.encode()
        shared = set(shared_boundaries(text, [_tokens(drafter, ANSWER), _tokens(verifier, ANSWER)]))
        ends = [e.offset + len(e.chosen.removesuffix("<eos>").encode()) for e in result.events
                if e.type == "adafuse" and e.chosen != "<eos>"]
        assert ends and all(end in shared for end in ends)
        assert not any(e.type == "adafuse" and e.chosen.endswith(" So") for e in result.events)


def _tokens(member, text: str) -> TokenizedText:  # noqa: ANN001
    tokens = TokenizedText(member.table)
    tokens.set_text(text.encode())
    return tokens


def test_candidates_are_scored_on_top_of_the_cached_answer() -> None:
    member = toy_member("a", "byte_level", "llama", 1)
    session = member.new_session()
    context = member.prompt_ids([{"role": "user", "content": "Count: one two three"}]) + \
        member.table.encode_fragment(" four five")
    first = _next_logits(session, context)
    before = session.num_forwards
    nlls = _score(session, context, first, member.table, [b" six", b" seven", b"\xe5\x8c\x97"], {}, "a", True)
    assert session.num_forwards - before == 3  # one forward per candidate ...
    assert session.last_sync[0] >= len(context) - 1  # ... on top of the kept answer cache
    ids = member.table.encode_fragment(" six")
    with torch.no_grad():
        logits = member.model(torch.tensor([context + ids])).logits[0, len(context) - 1:-1]
    expected = -torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)].mean()
    assert nlls[0] == pytest.approx(float(expected), abs=1e-4)


def test_entropy_mode_and_option_validation() -> None:
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    result = EnsembleEngine([a, b], method="adafuse", uncertainty="entropy", vote="uncertain").generate(
        "Tom", max_new_tokens=12, keep_events=True)
    decisions = [e for e in result.events if e.type == "adafuse"]
    assert decisions and all(d.uncertainty == "entropy" for d in decisions)
    assert all(d.fused == (min(d.member_uncertainty.values()) > 0.6) for d in decisions)
    with pytest.raises(InvalidRequestError, match="margin threshold"):
        EnsembleEngine([a, b], method="adafuse", threshold=1.5)
    with pytest.raises(InvalidRequestError, match="num_candidates"):
        EnsembleEngine([a, b], method="adafuse", num_candidates=0)
    settings = AdaFuseSettings()
    assert settings.measure(torch.tensor([10.0, 0.0, 0.0])) > 0.99
    assert settings.is_sure(0.7) and not settings.is_sure(0.69)


@pytest.mark.zoo
@pytest.mark.parametrize("models", [
    ["transformers:qwen2.5-coder-0.5b-instruct", "transformers:smollm2-135m-instruct"],  # exact distributions
    # top-K members, three tokenizers (Gemma's base model with its plain template among them); three
    # transformers members ensemble in test_real_models.py, the vote is the same for any backend
    ["llamacpp:qwen2.5-coder-0.5b-instruct", "llamacpp:smollm2-135m-instruct", "llamacpp:gemma-3-270m"],
], ids=["transformers-pair", "llamacpp-three"])
def test_real_models_give_valid_text(models: list[str]) -> None:
    engine = EnsembleEngine(models, method="adafuse", max_new_tokens=24)
    result = engine.generate("Natalia sold 48 clips in April and half as many in May. How many in total?",
                             keep_events=True)
    assert result.text.strip() and "\ufffd" not in result.text
    assert "".join(e.text for e in result.events if e.type == "token") == result.text
    decisions = [e for e in result.events if e.type == "adafuse"]
    assert result.stats.spans == len(decisions) >= 2
    assert all(set(d.member_uncertainty) == set(engine.labels) for d in decisions)
    assert all(n > 0 for n in result.stats.forward_passes.values())


def test_a_span_that_ends_the_answer_is_scored_with_the_eos_after_it() -> None:
    """' 6.' + EOS is its own candidate: a member scores the EOS after the text as one more token (a
    plain-format member, which ends its turn with a turn marker, the text only); before, ' 6.' + EOS
    was scored as ' 6.' alone, so one member's early EOS ended the answer on the others' score of its
    text ('What is 3.14 times 2?' -> '6.' on Qwen + SmolLM2)."""
    from shared_engine.alignment import EOS_KEY
    from shared_engine.decoding.adafuse import Span

    member = toy_member("a", "byte_level", "llama", 1)
    session = member.new_session()
    context = member.prompt_ids([{"role": "user", "content": "Count: one two three"}]) + \
        member.table.encode_fragment(" four five")
    first = _next_logits(session, context)
    text, ending = _score(session, context, first, member.table, [b" six", b" six" + EOS_KEY], {}, "a", True)
    ids = member.table.encode_fragment(" six")
    with torch.no_grad():
        logp = torch.log_softmax(member.model(torch.tensor([context + ids])).logits[0, len(context) - 1:], -1)
    picked = logp[torch.arange(len(ids)), torch.tensor(ids)]
    end = torch.logsumexp(logp[len(ids), sorted(member.table.eos_ids)], 0)
    assert text == pytest.approx(-float(picked.mean()), abs=1e-4)
    assert ending == pytest.approx(-float(torch.cat([picked, end.reshape(1)]).mean()), abs=1e-4)
    assert _score(session, context, first, member.table, [b" six" + EOS_KEY], {}, "a", False) == \
        pytest.approx([text], abs=1e-4)  # a plain-format member: the text only
    own = Span(b" six" + EOS_KEY, ids, -float(picked.mean()), 1, float(end))  # the writer's own, as it wrote it
    assert own.own_nll(True) == pytest.approx(ending, abs=1e-4) and own.own_nll(False) == own.nll


@pytest.mark.zoo
def test_one_members_early_eos_does_not_end_the_answer_on_real_models() -> None:
    """Qwen + SmolLM2: SmolLM2's ' 6.' + EOS (scored by Qwen as ' 6.' alone, 0.129) beat Qwen's
    ' 6.28.' and the answer was '3.14 times 2 is 6.'; scored with each member's EOS after it, it loses."""
    engine = EnsembleEngine(["transformers:qwen2.5-coder-0.5b-instruct", "transformers:smollm2-135m-instruct"],
                            method="adafuse", max_new_tokens=32)
    result = engine.generate([{"role": "user", "content": "What is 3.14 times 2? Answer with the number."}])
    assert "6.28" in result.text and result.finish_reason == "eos", result.text


@pytest.mark.parametrize("vote", ["always", "uncertain"])
def test_adafuse_stats_say_whose_text_each_span_is(vote: str) -> None:
    # The drafter's own span is its draft kept (accepted), voted on or not; another member's span was
    # chosen over it. Before, every voted span counted as chosen (all of 'Hi Sofia, hi Sofia.' with
    # changed 0), and a sure leader's span as accepted with nothing drafted.
    members = [trained_member("byte_level"), trained_member("metaspace")]
    stats = EnsembleEngine(members, method="adafuse", vote=vote, drafter=0, max_new_tokens=24).generate(QUESTION).stats
    assert stats.tokens == stats.accepted_tokens + stats.chosen_tokens
    assert 0 <= stats.accepted_tokens <= stats.drafted_tokens
    if vote == "always":  # every span voted on, the drafter proposing each time: chosen = changed
        assert stats.chosen_tokens == stats.changed_tokens


def test_no_member_reads_past_its_context_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """max_new_tokens counts the drafter's tokens; a member that spells the answer in more of its own
    (or writes a span past the cap) read past its window mid-answer. The answer now ends ('length')
    while every member can still read a whole round."""
    import copy

    from shared_engine.members import hf

    longest = [0]
    real_sync, real_step = hf.HFSession.sync, hf.HFSession.step

    def sync(self: hf.HFSession, target: list[int], first_row: int) -> torch.Tensor:
        longest[0] = max(longest[0], len(target))
        return real_sync(self, target, first_row)

    def step(self: hf.HFSession, token: int) -> torch.Tensor:
        longest[0] = max(longest[0], len(self.ids) + 1)
        return real_step(self, token)

    monkeypatch.setattr(hf.HFSession, "sync", sync)
    monkeypatch.setattr(hf.HFSession, "step", step)
    verifier = copy.copy(toy_member("b", "metaspace", "gpt2", 2))
    window = len(verifier.prompt_ids([{"role": "user", "content": "Hello"}])) + 120
    verifier.context_window = window
    answer = EnsembleEngine([toy_member("a", "byte_level", "llama", 1), verifier], method="adafuse").generate(
        "Hello", max_new_tokens=120)
    assert answer.finish_reason == "length" and 0 < longest[0] <= window


def test_a_prompt_that_leaves_less_than_one_round_is_refused_not_answered_empty() -> None:
    """AdaFuse's round needs room for a span and the scoring of the others' (``round_room``): a prompt
    that fits max_new_tokens but not a round answered "" ('length'); it is refused like a prompt too long."""
    import copy

    from shared_engine import ContextLengthError
    from shared_engine.decoding.adafuse import round_room

    a, b = toy_member("a", "byte_level", "llama", 1), copy.copy(toy_member("b", "byte_level", "gpt2", 2))
    prompt = [{"role": "user", "content": "Sofia"}]
    b.context_window = len(b.prompt_ids(prompt)) + round_room(3) - 1
    engine = EnsembleEngine([a, b], method="adafuse", drafter=0)
    with pytest.raises(ContextLengthError, match="AdaFuse needs 64 for one round"):
        engine.generate(prompt, max_new_tokens=20)
    b.context_window += 1  # room for one round: an answer
    assert engine.generate(prompt, max_new_tokens=20).stats.tokens > 0


def test_the_loop_free_fallback_never_offers_a_special_tokens_name() -> None:
    """Every member proposed the loop: the drafter's most likely token that does not repeat it is the
    only candidate; a special token ('<pad>') there would put its literal name in the answer."""
    from types import SimpleNamespace

    from shared_engine.alignment import TokenTable
    from shared_engine.decoding.adafuse import _loop_free_token

    table = TokenTable.from_bytes([b"<pad>", b"</s>", b"a", b" b"], special_ids={0, 1}, eos_ids={1},
                                  encode=lambda text: [], name="fake")
    state = SimpleNamespace(members=[SimpleNamespace(table=table, eos_ids=table.eos_ids)],
                            loop_at=lambda tail: None, loop_tail=lambda: b"")
    assert _loop_free_token(state, torch.tensor([9.0, 1.0, 2.0, 3.0]), 0) == b" b"  # type: ignore[arg-type]


def test_a_chosen_span_written_up_to_its_writers_eos_ends_the_answer() -> None:
    """The drafter wrote ' Sofia.' and then its EOS; the vote chose ' Sofia.'. The released code stops
    in the round whose chosen span holds the EOS (AdaFuse_two_models.py:1100); ours dropped the EOS,
    committed the text and ran another round, where <eos> was one candidate among the others' spans."""
    drafter, verifier = trained_member("byte_level"), toy_member("v", "metaspace", "gpt2", 2)
    engine = EnsembleEngine([drafter, verifier], method="adafuse", weights=[0.5, 0.5], threshold=0.5)
    result = engine.generate(QUESTION, max_new_tokens=48, keep_events=True)
    decisions = [e for e in result.events if e.type == "adafuse"]
    assert result.text == "Hi Sofia, hi Sofia." and result.finish_reason == "eos"
    assert decisions[-1].chosen == " Sofia.<eos>" and "<eos>" not in [d.chosen for d in decisions]


def test_a_cjk_character_keeps_the_symbols_and_joiners_after_it() -> None:
    """Catches a CJK word dropping the symbols (category S: "～") or a zero-width joiner after it,
    which then became words of their own."""
    assert word_ends("好～ 好") == [2, 4]
    assert word_ends("好\u200d好") == [2, 3]
    assert is_mark("\u200d") and is_mark("\ufe0f") and not is_mark("a")


def test_without_a_word_cut_far_enough_the_span_ends_at_the_last_shared_word_cut() -> None:
    """Catches the fallback taking the first shared word cut instead of the last one."""
    assert span_end(b" a b c", 5, {2, 4}, finished=False) == 4


def test_every_span_voted_is_an_ensemble_rate_of_one() -> None:
    """The rate counts the position where the answer ends with EOS (as SAFE's rounds do), but a voted
    span's EOS was never counted as ensembled: every span voted, rate 0.5 (1 token) or 0.75 (3)."""
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    result = EnsembleEngine(members, method="adafuse").generate("Hello Sofia! What is 3 + 4?", max_new_tokens=20)
    stats = result.stats
    assert result.finish_reason == "eos" and stats.fused_spans == stats.spans
    assert stats.ensembled_tokens == stats.tokens + 1 and stats.ensemble_rate == 1.0
