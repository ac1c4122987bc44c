"""``with_structured_output`` (function_calling) over the engine's own answer shaping: a call whose
arguments fail the pydantic model made ``invoke`` raise but ``stream``/``astream`` yield nothing,
and a streamed unreadable call's error said "(not a call of it)" where ``invoke`` said why."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from pydantic import BaseModel, Field, ValidationError

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from shared_engine.events import FinishEvent, Stats, TokenEvent
from shared_engine.tools import OutputOptions, OutputPlan

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


class Person(BaseModel):
    name: str
    age: int = Field(ge=0)  # a JSON-schema minimum: not enforced while decoding


class ScriptedCall:
    """The engine's OutputPlan (prefill, call parsing) over a scripted answer: what the members wrote
    after the forced call's prefill ('<tool_call>{"name": "Person", "arguments":')."""

    def __init__(self, text: str) -> None:
        self.text = text

    async def astream(self, messages: list[dict], **params: object):
        options = OutputOptions(**{k: v for k, v in params.items() if k in OutputOptions.model_fields})
        shaper = OutputPlan(options).shaper()
        for event in (TokenEvent(text=self.text, source="draft", position=0),
                      FinishEvent(reason="eos", text=self.text, stats=Stats())):
            for shaped in shaper.on_event(event):
                if shaped.type == "finish":
                    for held in shaper.release():
                        yield held
                yield shaped


def structured(monkeypatch: pytest.MonkeyPatch, text: str) -> Any:
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: ScriptedCall(text))
    return ChatEnsemble(models=MODELS, max_tokens=64).with_structured_output(Person)


def every_way(runnable: Any) -> dict[str, Any]:
    """What invoke, stream and astream gave: a result or the exception."""

    async def astream() -> list[Any]:
        return [chunk async for chunk in runnable.astream("x")]

    results: dict[str, Any] = {}
    for mode, call in (("invoke", lambda: runnable.invoke("x")), ("stream", lambda: list(runnable.stream("x"))),
                       ("astream", lambda: asyncio.run(astream()))):
        try:
            results[mode] = call()
        except Exception as error:  # noqa: BLE001 - compared below
            results[mode] = error
    return results


def test_arguments_that_fail_the_model_raise_in_every_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    so = structured(monkeypatch, ' {"name": "Al", "age": -1}}\n</tool_call>')
    for mode, result in every_way(so).items():
        assert isinstance(result, ValidationError), (mode, result)
        assert "greater than or equal to 0" in str(result)


def test_a_valid_call_still_streams_its_object(monkeypatch: pytest.MonkeyPatch) -> None:
    so = structured(monkeypatch, ' {"name": "Al", "age": 3}}\n</tool_call>')
    results = every_way(so)
    assert results["invoke"] == Person(name="Al", age=3)
    assert results["stream"][-1] == results["astream"][-1] == Person(name="Al", age=3)


def test_a_streamed_unreadable_call_says_why_as_invoke_does(monkeypatch: pytest.MonkeyPatch) -> None:
    so = structured(monkeypatch, ' {"name": "Al", "age": ')
    for mode, result in every_way(so).items():
        assert isinstance(result, OutputParserException), (mode, result)
        assert "could not be read (cut off before the call's JSON ends)" in str(result), mode
