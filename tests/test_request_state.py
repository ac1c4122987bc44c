"""One record per member in a request: dropping a member removes its record and renormalises the rest."""

from __future__ import annotations

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.decoding import RequestMember, RequestState, request_members
from tests.test_auto_weights import _BrokenMember
from tests.toy import toy_member

MESSAGES = [{"role": "user", "content": "Hi"}]


def _state(weights: list[float]) -> RequestState:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2),
               toy_member("c", "metaspace", "llama", 3)]
    records = request_members(members, ["a", "b", "c"], [m.new_session() for m in members],
                              [m.prompt_ids(MESSAGES) for m in members], torch.tensor(weights))
    return RequestState(records, max_new_tokens=100)


def test_each_member_is_one_record_with_its_own_tokenization() -> None:
    state = _state([0.5, 0.3, 0.2])
    assert [m.label for m in state.members] == ["a", "b", "c"]
    assert all(isinstance(m, RequestMember) and m.tokens.table is m.member.table for m in state.members)
    assert state.drafter is state.members[0] and state.verifiers == state.members[1:]
    assert state.stats.prompt_tokens == len(state.members[0].prompt_ids)
    assert state.stats.member_weights == {"a": 0.5, "b": 0.3, "c": 0.2}
    assert request_members([state.drafter.member], ["a"], [state.drafter.session], [[1]])[0].weight == 1.0


def test_dropping_a_verifier_removes_its_record_and_renormalises_the_weights() -> None:
    state = _state([0.5, 0.3, 0.2])
    state.commit(state.drafter.table.spell("Hi there"), "draft")
    state.drop_member(1, "connection refused")
    assert [m.label for m in state.members] == ["a", "c"]
    assert state.failed_members == {"b": "connection refused"}
    assert state.weights.tolist() == pytest.approx([0.5 / 0.7, 0.2 / 0.7])
    assert state.stats.member_weights == {"a": round(0.5 / 0.7, 5), "c": round(0.2 / 0.7, 5)}
    assert state.reading(1, bytes(state.answer), []).table is state.members[1].table  # "c" reads on


def test_dropping_the_drafter_hands_the_answer_to_the_next_member() -> None:
    state = _state([0.5, 0.3, 0.2])
    state.commit(state.drafter.table.spell("Hi there"), "draft")
    state.drop_member(0, "timeout")
    assert state.drafter.label == "b"
    assert state.drafter.table.to_bytes(state.drafter_ids) == b"Hi there"  # nothing committed changes
    assert state.drafter_target() == state.drafter.prompt_ids + state.drafter_ids
    assert state.stats.member_weights == {"b": 0.6, "c": 0.4}


def test_weights_that_all_fall_away_become_equal() -> None:
    state = _state([1.0, 0.0, 0.0])
    state.drop_member(0, "gone")
    assert state.weights.tolist() == [0.5, 0.5]
    assert state.stats.member_weights == {"b": 0.5, "c": 0.5}


def test_finish_stats_report_the_weights_after_a_member_was_dropped() -> None:
    """The finish event's member_weights are the weights the request ended with (the failed member
    gone, the others renormalised), not the configured ones."""
    members = [toy_member("a", "byte_level", "llama", 1), _BrokenMember(toy_member("b", "metaspace", "gpt2", 2)),
               toy_member("c", "metaspace", "llama", 3)]
    engine = EnsembleEngine(members, weights=[0.6, 0.3, 0.1], on_member_failure="degrade")
    result = engine.generate("Hi", max_new_tokens=3)
    assert result.stats.member_weights == {"a": 0.85714, "c": 0.14286}
    assert set(result.stats.forward_passes) == {"a", "c"}


def test_a_failed_drafter_hands_its_weight_to_the_member_that_drafts_next() -> None:
    """With the default weights the member that drafts weighs drafter_weight: also the heir of a
    drafter that failed mid-answer (a weights list keeps its proportions instead, as above)."""
    members = [_BrokenMember(toy_member("a", "metaspace", "gpt2", 2)), toy_member("b", "byte_level", "llama", 1),
               toy_member("c", "metaspace", "llama", 3)]
    result = EnsembleEngine(members, on_member_failure="degrade").generate("Hi", max_new_tokens=3)
    assert set(result.stats.forward_passes) == {"b", "c"} and result.stats.tokens == 3
    assert result.stats.member_weights == pytest.approx({"b": 2 / 3, "c": 1 / 3}, abs=1e-4)


def test_fusions_past_a_stop_string_are_neither_counted_nor_reported() -> None:
    # A 12-token draft is fused position by position before it is committed; a stop string early in
    # it ends the answer. The stats count what the answer holds (the rate was 6.0 before 57a4e26), and
    # the decisions a client sees (the server's `decisions`, the live page's cards, LangChain's custom
    # events) describe the tokens it receives (a fusion past the stop was streamed before c34dcdc).
    from shared_engine import EnsembleEngine, EnsembleEvent, FinishEvent
    from tests.toy import toy_member

    members = [toy_member("a", "byte_level", "llama", 0), toy_member("b", "metaspace", "gpt2", 1)]
    options = {"method": "safe", "max_new_tokens": 40, "drafter": 0, "drafter_confidence": None,
               "draft_schedule": "fixed", "draft_length": 12}

    def run(prompt: str, **params: object) -> tuple[FinishEvent, list[EnsembleEvent]]:
        events = list(EnsembleEngine(members, **options).stream(prompt, **params))
        finish = next(e for e in events if isinstance(e, FinishEvent))
        return finish, [e for e in events if isinstance(e, EnsembleEvent)]

    checked = cut = 0
    for prompt in ("Hello Sofia", "What is 2+2?", "Tell me about Paris", "def add(a, b):"):
        whole, whole_fusions = run(prompt)
        text = whole.text
        stops = [text[i:i + 2] for i in range(2, len(text) - 2)
                 if "\ufffd" not in text[i:i + 2] and text.find(text[i:i + 2]) == i]
        if not stops:
            continue
        finish, fusions = run(prompt, stop=stops[:1])
        stats = finish.stats
        assert stats.ensembled_tokens <= stats.tokens and stats.ensemble_rate <= 1.0, stats
        assert 0 <= stats.changed_tokens <= stats.ensembled_tokens
        assert all(e.position < stats.tokens for e in fusions), (prompt, [e.position for e in fusions], stats)
        assert len(fusions) == stats.ensembled_tokens
        cut += any(e.position >= stats.tokens for e in whole_fusions)
        checked += 1
    assert checked >= 2 and cut >= 1  # the case happened: fusions past where the stop ends the answer
