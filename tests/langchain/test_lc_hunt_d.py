"""Streamed content blocks of ``output_version="v1"``: each block (a run of text, one call) has its
own ``index``, so text before, between and after calls no longer merges into a call's block; v0's
tool-call chunks keep their place among the calls. And Anthropic-style ``tool_choice`` dicts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

import pytest
from langchain_core.messages import AIMessageChunk, BaseMessageChunk
from langchain_core.tools import tool

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from shared_engine.events import Event, FinishEvent, Stats, TokenEvent
from shared_engine.tools import OutputOptions, OutputPlan

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


def call(a: int, b: int) -> str:
    return f'<tool_call>\n{{"name": "multiply", "arguments": {{"a": {a}, "b": {b}}}}}\n</tool_call>'


class ShapedEngine:
    """Replays one raw answer, piece by piece, through the engine's own answer shaping."""

    def __init__(self, pieces: Sequence[str]) -> None:
        self.pieces = list(pieces)
        self.params: list[dict[str, Any]] = []

    async def astream(self, messages: Any, **params: Any) -> AsyncIterator[Event]:
        self.params.append(params)
        shaper = OutputPlan(OutputOptions(**{k: params[k] for k in OutputOptions.model_fields if k in params})).shaper()
        for i, piece in enumerate(self.pieces):
            await asyncio.sleep(0)
            for event in shaper.on_event(TokenEvent(text=piece, source="draft", position=i)):
                yield event
        stats = Stats(prompt_tokens=3, tokens=len(self.pieces))
        finish = FinishEvent(reason="eos", text="".join(self.pieces), stats=stats)
        for event in shaper.on_event(finish):
            if event.type == "finish":
                for held in shaper.release():
                    yield held
            yield event


def shaped(monkeypatch: pytest.MonkeyPatch, *pieces: str) -> ShapedEngine:
    engine = ShapedEngine(pieces)
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args, **kwargs: engine)
    return engine


def merged(chunks: Sequence[BaseMessageChunk]) -> AIMessageChunk:
    whole = chunks[0]
    for chunk in chunks[1:]:
        whole = whole + chunk
    assert isinstance(whole, AIMessageChunk)
    return whole


def blocks(message: AIMessageChunk) -> list[tuple[str, Any]]:
    return [(b["type"], b.get("text", b.get("args"))) for b in message.content_blocks]


def test_v1_text_before_a_call_stays_its_own_block(monkeypatch: pytest.MonkeyPatch) -> None:
    shaped(monkeypatch, "Let me ", "compute. " + call(6, 7))
    llm = ChatEnsemble(models=MODELS, output_version="v1").bind_tools([multiply])
    whole = merged(list(llm.stream("x")))
    assert blocks(whole) == [("text", "Let me compute."), ("tool_call", {"a": 6, "b": 7})]
    assert [(c["name"], c["args"]) for c in whole.tool_calls] == [("multiply", {"a": 6, "b": 7})]


def test_v1_text_between_and_after_parallel_calls_keeps_every_block(monkeypatch: pytest.MonkeyPatch) -> None:
    shaped(monkeypatch, "First ", call(1, 2), call(3, 4), " then ", call(5, 6), " done")
    llm = ChatEnsemble(models=MODELS, output_version="v1").bind_tools([multiply])

    async def astreamed() -> list[BaseMessageChunk]:
        return [chunk async for chunk in llm.astream("x")]

    for chunks in (list(llm.stream("x")), asyncio.run(astreamed())):
        whole = merged(chunks)
        assert blocks(whole) == [("text", "First"), ("tool_call", {"a": 1, "b": 2}), ("tool_call", {"a": 3, "b": 4}),
                                 ("text", " then"), ("tool_call", {"a": 5, "b": 6}), ("text", " done")]
        assert len({c["id"] for c in whole.tool_calls}) == 3


def test_v1_invoke_is_as_before(monkeypatch: pytest.MonkeyPatch) -> None:
    shaped(monkeypatch, "Let me ", "compute. " + call(6, 7))
    message = ChatEnsemble(models=MODELS, output_version="v1").bind_tools([multiply]).invoke("x")
    assert message.content[0] == {"type": "text", "text": "Let me compute."}
    assert [b["type"] for b in message.content] == ["text", "tool_call"]


def test_v0_streams_string_text_and_calls_numbered_among_the_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    shaped(monkeypatch, "First ", call(1, 2), call(3, 4), " done")
    chunks = list(ChatEnsemble(models=MODELS).bind_tools([multiply]).stream("x"))
    assert [c["index"] for chunk in chunks for c in chunk.tool_call_chunks] == [0, 1]
    whole = merged(chunks)
    assert whole.content == "First done"
    assert [c["args"] for c in whole.tool_calls] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]


@pytest.mark.parametrize(("kind", "forced"), [("any", True), ("required", True), ("auto", False), ("none", False)])
def test_anthropic_style_tool_choice_dicts_are_taken(monkeypatch: pytest.MonkeyPatch, kind: str, forced: bool) -> None:
    engine = shaped(monkeypatch, call(6, 7))
    message = ChatEnsemble(models=MODELS).bind_tools([multiply], tool_choice={"type": kind}).invoke("x")
    assert engine.params[0]["tool_choice"] == {"type": kind}
    plan = OutputPlan(OutputOptions(tools=engine.params[0]["tools"], tool_choice=engine.params[0]["tool_choice"]))
    assert (plan.forced == "multiply") is forced and (plan.tools is None) is (kind == "none")
    assert len(message.tool_calls) == (0 if kind == "none" else 1)
