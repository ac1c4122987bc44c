"""``with_structured_output(..., include_raw=True)``: LangChain's contract is ``{"raw", "parsed",
"parsing_error"}`` with a parsing failure *in* the dict. ``invoke`` gave that, but ``stream``/``astream``
raised it (ValidationError for a call failing the pydantic model, OutputParserException for a cut call or
JSON the engine marked invalid) after the ``{"raw": ...}`` chunks: ``with_fallbacks(exception_key=...)``
catches a stream's error only before its first chunk. Every mode now merges into the same dict."""

from __future__ import annotations

import asyncio
from functools import reduce
from operator import add
from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException
from langchain_core.runnables.utils import AddableDict
from pydantic import BaseModel, Field, ValidationError

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from shared_engine.events import FinishEvent, Stats, TokenEvent
from tests.langchain.test_invalid_calls_o import ScriptedCall

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


class Person(BaseModel):
    name: str
    age: int = Field(ge=0)


class ScriptedJson:
    """A JSON answer in two tokens, finished with the engine's verdict (``format_error`` after its retries)."""

    def __init__(self, text: str, reason: str = "stop", error: str | None = None) -> None:
        self.text, self.reason, self.error = text, reason, error

    async def astream(self, messages: list[dict], **params: object):
        half = len(self.text) // 2
        for position, part in enumerate((self.text[:half], self.text[half:])):
            yield TokenEvent(text=part, source="draft", position=position)
        yield FinishEvent(reason=self.reason, text=self.text, stats=Stats(), format_error=self.error)


class FailingEngine:
    """A member failure after the first token: an engine error, not a parsing one."""

    async def astream(self, messages: list[dict], **params: object):
        yield TokenEvent(text='{"name": ', source="draft", position=0)
        raise RuntimeError("member 1 failed")


def structured(monkeypatch: pytest.MonkeyPatch, engine: Any, method: str) -> Any:
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: engine)
    llm = ChatEnsemble(models=MODELS, max_tokens=64)
    return llm.with_structured_output(Person, method=method, include_raw=True)  # type: ignore[arg-type]


def every_way(runnable: Any) -> dict[str, dict[str, Any]]:
    """invoke's dict and the merged stream/astream chunks (AddableDicts merge with +, as LangChain's do)."""

    async def astream() -> list[Any]:
        return [chunk async for chunk in runnable.astream("x")]

    streamed = {"stream": list(runnable.stream("x")), "astream": asyncio.run(astream())}
    for chunks in streamed.values():
        assert all(isinstance(chunk, AddableDict) for chunk in chunks)
        assert all(set(chunk) == {"raw"} for chunk in chunks[:-1]), chunks  # the raw answer streams first
        assert set(chunks[-1]) == {"parsed", "parsing_error"}, chunks[-1]
    return {"invoke": runnable.invoke("x"), **{mode: reduce(add, chunks) for mode, chunks in streamed.items()}}


def calls(message: Any) -> list[tuple[str, Any]]:
    """A message's calls without their ids (each run gets new ones)."""
    return [(call["name"], call["args"]) for call in message.tool_calls]


def same_everywhere(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Checks that each mode gave invoke's parsed, parsing_error (type and text) and raw answer."""
    invoked = results["invoke"]
    assert set(invoked) == {"raw", "parsed", "parsing_error"}
    for mode, result in results.items():
        assert set(result) == {"raw", "parsed", "parsing_error"}, mode
        assert result["parsed"] == invoked["parsed"], mode
        assert type(result["parsing_error"]) is type(invoked["parsing_error"]), (mode, result["parsing_error"])
        assert str(result["parsing_error"]) == str(invoked["parsing_error"]), mode
        assert result["raw"].text == invoked["raw"].text, mode
        assert calls(result["raw"]) == calls(invoked["raw"]), mode
    return invoked


def test_a_valid_call(monkeypatch: pytest.MonkeyPatch) -> None:
    so = structured(monkeypatch, ScriptedCall(' {"name": "Al", "age": 3}}\n</tool_call>'), "function_calling")
    invoked = same_everywhere(every_way(so))
    assert invoked["parsed"] == Person(name="Al", age=3) and invoked["parsing_error"] is None
    assert invoked["raw"].tool_calls[0]["args"] == {"name": "Al", "age": 3}


def test_a_call_failing_the_model_is_a_parsing_error_in_every_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    so = structured(monkeypatch, ScriptedCall(' {"name": "Al", "age": -1}}\n</tool_call>'), "function_calling")
    invoked = same_everywhere(every_way(so))
    assert invoked["parsed"] is None and isinstance(invoked["parsing_error"], ValidationError)
    assert "greater than or equal to 0" in str(invoked["parsing_error"])


def test_a_cut_call_is_a_parsing_error_in_every_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    so = structured(monkeypatch, ScriptedCall(' {"name": "Al", "age": '), "function_calling")
    invoked = same_everywhere(every_way(so))
    assert invoked["parsed"] is None and isinstance(invoked["parsing_error"], OutputParserException)
    assert "no readable call of 'Person'" in str(invoked["parsing_error"])


def test_a_json_schema_answer_the_engine_marked_invalid(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = ScriptedJson('{"name": 3, "age": 1}', error="3 is not of type 'string' at name")
    invoked = same_everywhere(every_way(structured(monkeypatch, engine, "json_schema")))
    assert invoked["parsed"] is None and isinstance(invoked["parsing_error"], OutputParserException)
    assert "is not of type 'string'" in str(invoked["parsing_error"])


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_a_json_answer_failing_the_model_or_cut(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    for engine in (ScriptedJson('{"name": "Al", "age": -1}'),  # a minimum the constraint leaves to validation
                   ScriptedJson('{"name": "Al", "ag', reason="length", error="not valid JSON (cut)")):
        invoked = same_everywhere(every_way(structured(monkeypatch, engine, method)))
        assert invoked["parsed"] is None and invoked["parsing_error"] is not None, (method, engine.text)


@pytest.mark.parametrize("method", ["function_calling", "json_schema", "json_mode"])
def test_a_valid_json_answer_and_an_engine_error(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    if method != "function_calling":
        invoked = same_everywhere(every_way(structured(monkeypatch, ScriptedJson('{"name": "Al", "age": 3}'), method)))
        assert invoked["parsed"] == Person(name="Al", age=3) and invoked["parsing_error"] is None
    # an engine's own failure is no parsing error: it still raises, in every mode
    so = structured(monkeypatch, FailingEngine(), method)
    with pytest.raises(RuntimeError, match="member 1 failed"):
        so.invoke("x")
    with pytest.raises(RuntimeError, match="member 1 failed"):
        list(so.stream("x"))

    async def astream() -> list[Any]:
        return [chunk async for chunk in so.astream("x")]

    with pytest.raises(RuntimeError, match="member 1 failed"):
        asyncio.run(astream())
