"""Text held back as a possible stop string's start is streamed, once released, under its own tokens'
position and source: it went out in the next token's event (the next round's, the next span's), and
at the end of an answer cut by max_tokens as source "draft" one position past the answer, whatever
had chosen it."""

from __future__ import annotations

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.decoding import RequestState, request_members
from shared_engine.events import TokenEvent
from tests.toy import toy_member

MESSAGES = [{"role": "user", "content": "Sofia walked to the park"}]
NEVER = "\u2603"  # no toy member writes it: a stop ending in it never cuts, only holds text back


def _state(stop: tuple[str, ...], max_new_tokens: int = 100) -> RequestState:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    records = request_members(members, ["a", "b"], [m.new_session() for m in members],
                              [m.prompt_ids(MESSAGES) for m in members], torch.tensor([0.5, 0.5]))
    return RequestState(records, max_new_tokens=max_new_tokens, stop=stop)


def _sent(events: list[TokenEvent]) -> list[tuple[str, str, int]]:
    return [(e.text, e.source, e.position) for e in events]


def test_held_text_is_released_under_the_tokens_that_wrote_it() -> None:
    state = _state(("ab" + NEVER,))
    one = state.ids_for_piece
    assert _sent(state.commit(one(b"x"), "draft")) == [("x", "draft", 0)]
    assert state.commit(one(b"a"), "ensemble") == []  # "a" may start the stop: held
    assert state.commit(one(b"b"), "draft") == []  # so may "ab"
    assert _sent(state.commit(one(b"c"), "draft")) == [("a", "ensemble", 1), ("b", "draft", 2), ("c", "draft", 3)]
    assert state.text == "xabc" and state.finish_reason is None


def test_text_held_when_max_tokens_cuts_the_answer_keeps_its_position_and_source() -> None:
    state = _state(("a" + NEVER,), max_new_tokens=2)
    one = state.ids_for_piece
    assert _sent(state.commit(one(b"x"), "draft")) == [("x", "draft", 0)]
    assert state.commit(one(b"a"), "ensemble") == []
    assert state.finish_reason == "length"
    assert _sent(state.flush()) == [("a", "ensemble", 1)]


def _labels(engine: EnsembleEngine, stop: list[str]) -> tuple[list[tuple[str, int]], str, str]:
    """Each streamed character's (source, position), the answer and why it ended."""
    events = list(engine.stream(MESSAGES, stop=stop))
    labels = [(e.source, e.position) for e in events if e.type == "token" for _ in e.text]
    return labels, events[-1].text, events[-1].reason


@pytest.mark.parametrize("method, options, sources", [
    ("safe", {}, {"draft"}),
    ("every-token", {}, {"draft", "ensemble"}),  # SAFE fusing wherever the members disagree
    ("adafuse", {"threshold": 1.0}, {"ensemble"}),  # every span voted on
])
def test_a_stop_that_only_holds_text_back_changes_no_characters_label(method: str, options: dict,
                                                                      sources: set[str]) -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    engine = EnsembleEngine(members, method=method, max_new_tokens=16, **options)
    plain, answer, reason = _labels(engine, [])
    assert reason == "length" and len(answer) >= 4
    # The answer's last character is held when max_tokens cuts it (then flushed); the others are
    # held wherever they end a round's or span's text, and released by the next.
    stops = [answer[-1] + NEVER, *{c + NEVER for c in answer[:-1] if not c.isspace()}]
    held, held_answer, held_reason = _labels(engine, stops)
    assert (held_answer, held_reason) == (answer, reason)
    assert held == plain
    assert {source for source, _ in plain} == sources
