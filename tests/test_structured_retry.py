"""A structured-output retry whose prompt no longer fits: each retry reads the request's prompt plus
every rejected answer and its correction, so a long rejected answer can leave a member no room. The
request then ends with the last attempt and its format_error, as after the last try; before, the
retry's start raised ContextLengthError and the answer was lost (the server: a 400 though the
request's own prompt fit; streamed: "generation failed" mid-stream). Toy members (512-token context
windows), answers scripted (``Fitted``: each attempt's start checks its prompt fits, as decoding's does)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.events import Event
from shared_engine.options import GenerationParams
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from shared_engine.tools import OutputOptions, OutputPlan
from tests.test_server_tools import ScriptedDecoding

USER = [{"role": "user", "content": "Check."}]
JSON = {"type": "json_object"}


class Fitted(ScriptedDecoding):
    """Scripted answers, each attempt started as decoding starts it: refused where its prompt leaves a
    member no room for max_new_tokens (``_fitted_prompt_ids``)."""

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncIterator[Event]:
        await self._fitted_prompt_ids(messages, plan, gen)
        async for event in super()._decode(messages, plan, gen):
            yield event


def _long(words: int) -> str:
    """An answer after the prefilled ``{`` that is never valid JSON (its string is not closed), about
    two tokens a word on the toys."""
    return '"a": "' + "ab " * words


async def _collect(engine: EnsembleEngine, **options: Any) -> list[Event]:
    return [event async for event in engine.astream(USER, **options)]


def test_a_retry_that_does_not_fit_ends_with_the_answer_and_its_format_error() -> None:
    engine = Fitted([_long(250)])
    asyncio.run(engine.acheck_fits(USER, response_format=JSON))  # the request's own prompt fits
    events = asyncio.run(_collect(engine, response_format=JSON))
    finish = events[-1]
    assert finish.type == "finish" and not [e for e in events if e.type == "format_retry"]
    assert finish.text == "{" + _long(250) and finish.format_error.startswith("not valid JSON")
    assert "".join(e.text for e in events if e.type == "token") == finish.text  # released as an invalid answer is
    assert len(engine.prompts) == 1 and not finish.rejected_attempts


def test_retries_run_while_they_fit_and_the_last_that_ran_is_the_answer() -> None:
    # the first retry (one rejected answer in its prompt) fits; the second (two) would not
    engine = Fitted([_long(100), '"b": ' + "ab " * 100])
    events = asyncio.run(_collect(engine, response_format=JSON))
    finish = events[-1]
    assert [e.attempt for e in events if e.type == "format_retry"] == [1] and len(engine.prompts) == 2
    assert finish.text == '{"b": ' + "ab " * 100 and finish.format_error.startswith("not valid JSON")
    assert len(finish.rejected_attempts) == 1 and finish.usage.prompt_tokens == 10  # both attempts counted


@pytest.mark.parametrize("stream", [False, True])
def test_the_server_answers_with_the_format_error_not_a_400(stream: bool) -> None:
    engine = Fitted([_long(250)])
    body = {"model": "every-token-ensemble", "messages": USER, "response_format": JSON, "stream": stream}
    with serve_in_background(create_app(engine)) as url:
        if not stream:
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            whole = response.json()
            assert whole["choices"][0]["message"]["content"] == "{" + _long(250)
            assert whole["ensemble"]["format_error"].startswith("not valid JSON")
            return
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            data = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in data[:-1]]
    assert not [c for c in chunks if "error" in c]  # before: "generation failed" after the first attempt
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "{" + _long(250)
    assert chunks[-1]["ensemble"]["format_error"].startswith("not valid JSON")


MULTIPLY = {"type": "function", "function": {
    "name": "multiply", "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}
PRODUCT = {"type": "json_schema", "json_schema": {"name": "Answer", "schema": {
    "type": "object", "properties": {"product": {"type": "integer"}}, "required": ["product"]}}}
COPIED_SCHEMA = '{"properties": {"product": {"type": "integer"}}, "required": ["product"], "type": "object"}'


def test_beside_tools_the_json_instruction_comes_before_the_question_and_last_after_a_tool_result() -> None:
    """An agent's tools beside its answer schema: the 'one JSON object only' turn came after the
    question, and the members answered in JSON at once, never calling a tool (a made-up product)."""
    plan = OutputPlan(OutputOptions(tools=[MULTIPLY], response_format=PRODUCT))
    asked = plan.messages([{"role": "system", "content": "Be brief."}, *USER])
    assert [m["role"] for m in asked] == ["system", "system", "user"] and "call it first" in asked[1]["content"]
    after = [*USER, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function", "function": {
        "name": "multiply", "arguments": '{"a": 2, "b": 3}'}}]}, {"role": "tool", "tool_call_id": "c1", "content": "6"}]
    assert plan.messages(after)[-1]["role"] == "system"  # after a tool result: the final answer is asked for


def test_a_retry_beside_tools_answers_under_the_schema() -> None:
    """A small model copied the schema itself at every try beside offered tools (no prefill, no
    constraint: a call had to stay possible). The first try may call a tool; a retry is JSON only."""
    engine = ScriptedDecoding([COPIED_SCHEMA, '"product": 6}'])  # the retry's answer after its prefilled "{"
    events = asyncio.run(_collect(engine, tools=[MULTIPLY], response_format=PRODUCT))
    (first_messages, first), (_, retry) = engine.prompts
    assert first.tools and first.prefix == "" and first.constraint() is None
    assert retry.tools is None and retry.prefix == "{" and retry.constraint() is not None
    assert events[-1].type == "finish" and events[-1].text == '{"product": 6}' and not events[-1].format_error
    assert first_messages[-1]["role"] == "user"  # the instruction stands before the question


def test_generate_reports_every_attempt_the_request_cost() -> None:
    """``generate()`` kept only the last attempt's stats: the rejected attempts and their cost were lost
    to its callers (the finish event and every adapter counted them)."""
    engine = ScriptedDecoding(['"a": 1,, x', '"ok": true}'])  # after the prefilled "{": invalid, then valid
    result = engine.generate("Check.", response_format=JSON)
    assert len(result.rejected_attempts) == 1 and result.format_error is None and result.failed_members == {}
    assert result.usage.completion_tokens == result.stats.tokens + result.rejected_attempts[0].tokens
    assert result.usage.prompt_tokens == result.stats.prompt_tokens + result.rejected_attempts[0].prompt_tokens


def test_after_a_tool_result_the_answer_beside_tools_is_the_final_json() -> None:
    """Free to call again after a tool result, small members called the same tool with the same
    arguments until a LangChain agent's recursion limit (Qwen + Gemma, create_agent with an answer
    schema): after a result, the answer is the final JSON, prefilled and decoded under the schema."""
    engine = ScriptedDecoding(['"product": 6}'])
    conversation = [*USER, {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
                    "function": {"name": "multiply", "arguments": '{"a": 2, "b": 3}'}}]},
                    {"role": "tool", "tool_call_id": "c1", "content": "6"}]
    result = engine.generate(conversation, tools=[MULTIPLY], response_format=PRODUCT)
    ((messages, plan),) = engine.prompts
    assert plan.tools is None and plan.prefix == "{" and plan.constraint() is not None
    assert messages[-1]["role"] == "system" and "call it first" not in messages[-1]["content"]
    assert result.text == '{"product": 6}' and not result.tool_calls and result.format_error is None
    first = ScriptedDecoding(['<tool_call>\n{"name": "multiply", "arguments": {"a": 2, "b": 3}}\n</tool_call>'])
    assert first.generate(USER, tools=[MULTIPLY], response_format=PRODUCT).tool_calls  # before a result: a call
