"""Tool calls, structured output and the API key over HTTP, with the official ``openai`` client and
LangChain's ``ChatOpenAI``. The engine is real except for its decoding (``_decode``), which replays
scripted answers: prompts, prefills, parsing, validation and retries are the engine's own. One test
decodes for real (constrained JSON on toy members)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from pydantic import BaseModel

from shared_engine import EnsembleEngine
from shared_engine.events import Event, FinishEvent, Stats, TokenEvent
from shared_engine.options import GenerationParams
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from shared_engine.tools import OutputPlan
from tests.toy import toy_member

MODEL = "every-token-ensemble"
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather at a place.",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}


class Person(BaseModel):
    name: str
    age: int


class ScriptedDecoding(EnsembleEngine):
    """A real engine whose members' output is scripted: each request takes the next answer (the
    last one repeats), streamed in three pieces."""

    def __init__(self, answers: list[str]) -> None:
        super().__init__([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)],
                         method="every-token", max_new_tokens=24)
        self.answers = answers
        self.prompts: list[tuple[list[dict[str, Any]], OutputPlan]] = []

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncIterator[Event]:
        self.prompts.append((messages, plan))
        text = self.answers[min(len(self.prompts), len(self.answers)) - 1]
        cut = [0, len(text) // 3, 2 * len(text) // 3, len(text)]
        for i in range(3):
            yield TokenEvent(text=text[cut[i]:cut[i + 1]], source="draft", position=i)
        yield FinishEvent(reason="eos", text=text, stats=Stats(prompt_tokens=5, tokens=3))


@pytest.fixture
def serve() -> Iterator[Any]:
    def start(answers: list[str], **app_options: Any) -> tuple[str, ScriptedDecoding]:
        engine = ScriptedDecoding(answers)
        context = serve_in_background(create_app(engine, **app_options))
        started.append(context)
        return context.__enter__(), engine

    started: list[Any] = []
    yield start
    for context in started:
        context.__exit__(None, None, None)


def client(url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0)


def test_official_client_gets_a_forced_tool_call(serve: Any) -> None:
    # The engine prefills '<tool_call>\n{"name": "get_weather", "arguments":'; the members write the rest.
    url, engine = serve([' {"location": "Paris"}}'])
    answer = client(url).chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER],  # type: ignore[list-item]
                                                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = answer.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    [call] = choice.message.tool_calls
    assert (call.function.name, call.function.arguments) == ("get_weather", '{"location": "Paris"}')
    assert call.id.startswith("call_")
    messages, plan = engine.prompts[0]
    assert plan.tools and messages[-1]["content"] == "Answer with a call to the function get_weather."


def test_streamed_tool_calls_arrive_as_deltas_and_never_as_text(serve: Any) -> None:
    url, _ = serve(['Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "東京"}}\n</tool_call>'])
    stream = client(url).chat.completions.create(model=MODEL, messages=USER, tools=[WEATHER], stream=True)  # type: ignore[list-item]
    text, calls, reasons = "", [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        text += delta.content or ""
        calls += delta.tool_calls or []
        reasons.append(chunk.choices[0].finish_reason)
    assert text == "Let me look." and reasons[-1] == "tool_calls"
    assert [(c.index, c.function.name, c.function.arguments) for c in calls] == \
        [(0, "get_weather", '{"location": "東京"}')]


def test_tool_results_go_back_through_the_conversation(serve: Any) -> None:
    url, engine = serve(["It is sunny in Paris."])
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    answer = client(url).chat.completions.create(model=MODEL, messages=history, tools=[WEATHER])  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "It is sunny in Paris."
    assert answer.choices[0].finish_reason == "stop"
    messages, _ = engine.prompts[0]
    assert messages[1]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
    assert messages[2] == {"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"}


def test_tool_result_hint_is_taken_per_request(serve: Any) -> None:
    url, engine = serve(["It is sunny in Paris."])
    history = [*USER, {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    hint = "Using the function result above, answer in plain text."
    client(url).chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],  # type: ignore[arg-type]
                                        extra_body={"tool_result_hint": hint})
    assert engine.prompts[0][0][-1] == {"role": "user", "content": hint}
    client(url).chat.completions.create(model=MODEL, messages=history, tools=[WEATHER])  # type: ignore[arg-type]
    assert engine.prompts[1][0][-1]["content"] == "<tool_response>\nsunny\n</tool_response>"  # off unless asked
    with pytest.raises(openai.BadRequestError, match="tool_result_hint"):
        client(url).chat.completions.create(model=MODEL, messages=history, tools=[WEATHER],  # type: ignore[arg-type]
                                            extra_body={"tool_result_hint": 3})


def test_json_schema_output_is_validated_and_retried(serve: Any) -> None:
    # After the prefilled "{": the first answer lacks "age" (rejected, regenerated), the second is valid.
    url, engine = serve(['"name": "Ann"}', '"name": "Ann", "age": 3}'])
    parsed = client(url).chat.completions.parse(model=MODEL, messages=[{"role": "user", "content": "Ann is 3."}],
                                                response_format=Person)
    assert parsed.choices[0].message.parsed == Person(name="Ann", age=3)
    assert len(engine.prompts) == 2
    retry_turn = engine.prompts[1][0][-1]["content"]
    assert retry_turn.startswith("That is not valid:") and "age" in retry_turn


@pytest.mark.parametrize("schema", [{"type": "array", "items": {"type": "integer"}}, {"enum": ["yes", "no"]},
                                    {"type": "string"}])
@pytest.mark.parametrize("stream", [False, True])
def test_a_json_schema_whose_root_is_no_object_is_a_400_naming_response_format(serve: Any, schema: dict[str, Any],
                                                                              stream: bool) -> None:
    # The answer is prefilled with "{": before, such a schema ran three unconstrained attempts of garbage
    # and ended with a misleading format_error. OpenAI's structured outputs refuse it too.
    url, engine = serve(['"a": 1}'])
    with pytest.raises(openai.BadRequestError, match="object at its root") as bad:
        client(url).chat.completions.create(
            model=MODEL, messages=USER, stream=stream,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}})
    assert bad.value.param == "response_format" and not engine.prompts


def test_json_object_mode_streams_only_the_valid_answer(serve: Any) -> None:
    url, _ = serve(['"a": [1, 2', '"a": [1, 2]}'])
    stream = client(url).chat.completions.create(model=MODEL, messages=USER, stream=True,
                                                 response_format={"type": "json_object"})
    assert "".join(c.choices[0].delta.content or "" for c in stream) == '{"a": [1, 2]}'


def test_the_prefilled_brace_is_no_answer_position(serve: Any) -> None:
    """The "{" the engine prefills went out with positions [0], as the answer's first token did: a
    client matching decisions to chunks by position (README) marked it as fused too."""
    url, _ = serve(['"a": 1}'])
    body = {"model": MODEL, "messages": USER, "stream": True, "response_format": {"type": "json_object"}}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    texts = [(c["choices"][0]["delta"].get("content"), c.get("ensemble") or {}) for c in chunks if c["choices"]]
    brace = next(extension for text, extension in texts if text == "{")
    assert brace["source"] == "prefix" and brace["positions"] == [] and brace.get("position") is None
    assert [e["positions"] for t, e in texts if t and t != "{"][0] == [0]  # the answer's first token keeps 0


def test_langchain_chat_openai_bind_tools_calls_a_tool(serve: Any) -> None:
    @tool
    def get_weather(location: str) -> str:
        """Weather at a place."""
        return "sunny"

    url, _ = serve([' {"location": "Paris"}}'])
    llm = ChatOpenAI(base_url=f"{url}/v1", api_key="unused", model=MODEL, max_retries=0)
    message = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("Weather in Paris?")
    assert [(c["name"], c["args"]) for c in message.tool_calls] == [("get_weather", {"location": "Paris"})]
    assert get_weather.invoke(message.tool_calls[0]).content == "sunny"


def test_api_key_guards_every_v1_route_and_health_stays_open(serve: Any) -> None:
    url, _ = serve(["Hello."], api_key="s3cret")
    with pytest.raises(openai.AuthenticationError) as info:
        client(url, "wrong").models.list()
    assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
    assert httpx.get(f"{url}/v1/models").status_code == 401
    bare = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER})
    assert bare.status_code == 401 and set(bare.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(f"{url}/v1/unknown").status_code == 401  # every /v1 route, known or not
    assert httpx.get(f"{url}/health").status_code == 200
    assert client(url, "s3cret").chat.completions.create(model=MODEL, messages=USER).choices[0].message.content == "Hello."


def test_api_key_holds_where_the_app_is_mounted_under_a_prefix_or_served_behind_a_root_path() -> None:
    # Starlette's Mount and uvicorn's --root-path keep the prefix in scope["path"]: the guard must
    # decide on the path the app routes on, or "/ensemble/v1/..." would pass as "not /v1".
    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = create_app(ScriptedDecoding(["Hello."]), api_key="s3cret")
    body = {"model": MODEL, "messages": USER}

    async def statuses(asgi: Any, prefix: str, root_path: str = "") -> list[int]:
        transport = httpx.ASGITransport(app=asgi, root_path=root_path)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            keyed = {"Authorization": "Bearer s3cret"}
            return [(await http.post(f"{prefix}/v1/chat/completions", json=body)).status_code,
                    (await http.get(f"{prefix}/v1/models")).status_code,
                    (await http.get(f"{prefix}/health")).status_code,
                    (await http.get(f"{prefix}/v1/models", headers=keyed)).status_code]

    assert asyncio.run(statuses(app, "")) == [401, 401, 200, 200]
    assert asyncio.run(statuses(Starlette(routes=[Mount("/ensemble", app=app)]), "/ensemble")) == [401, 401, 200, 200]
    assert asyncio.run(statuses(app, "/api", root_path="/api")) == [401, 401, 200, 200]


WEATHER_TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}}}


def test_a_tool_call_beside_a_json_response_format_is_one_call_in_one_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    # the members call the offered tool as bare JSON (no "{" prefill beside tools: it would shut out a
    # <tool_call>). That answer is a call, not a JSON answer to validate: before, it failed as JSON
    # ("" left), was retried twice, and each attempt's call was already sent (three calls; OpenAI's
    # client merged them into one).
    call = '{"name": "get_weather", "arguments": {"location": "Paris"}}'
    engine = ScriptedDecoding([call])
    options = {"tools": [WEATHER_TOOL], "response_format": {"type": "json_object"}}
    events = asyncio.run(_collect(engine.astream("Weather in Paris?", **options)))
    assert len(engine.prompts) == 1 and not [e for e in events if e.type == "format_retry"]
    calls = [e for e in events if e.type == "tool_call"]
    assert [(c.name, c.arguments) for c in calls] == [("get_weather", {"location": "Paris"})]
    assert events[-1].tool_calls == calls and events[-1].format_error is None
    # with tools offered, a rejected attempt (no call, no valid JSON) shows nothing of itself; the retry
    # answers in JSON only, prefilled with "{" (OutputPlan.answer_only)
    engine = ScriptedDecoding(['{"a": 1,, x', '"ok": true}'])
    for member in engine.members:  # a retry runs only where its prompt fits (here 602 tokens with the tools)
        monkeypatch.setattr(member, "context_window", 4096)
    events = asyncio.run(_collect(engine.astream("Weather in Paris?", **options)))
    assert [e.type for e in events if e.type != "token"] == ["format_retry", "finish"]
    assert "".join(e.text for e in events if e.type == "token") == events[-1].text == '{"ok": true}'


def test_an_answer_that_never_validates_says_why_and_counts_every_attempt(serve: Any) -> None:
    url, engine = serve(['"name": 5'])  # after the "{" prefill: '{"name": 5', never valid JSON
    body = {"model": MODEL, "messages": USER, "response_format": {"type": "json_object"}}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
    assert len(engine.prompts) == 3 and whole["choices"][0]["message"]["content"] == '{"name": 5'
    assert whole["ensemble"]["format_error"].startswith("not valid JSON")  # OpenAI has no field for it
    # usage is what the request cost: three attempts of 5 prompt and 3 answer tokens each
    assert whole["usage"] == {"prompt_tokens": 15, "completion_tokens": 9, "total_tokens": 24}
    with httpx.stream("POST", f"{url}/v1/chat/completions", timeout=60,
                      json={**body, "stream": True, "stream_options": {"include_usage": True}}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    assert chunks[-2]["ensemble"]["format_error"].startswith("not valid JSON")  # the final chunk
    assert chunks[-1]["usage"]["total_tokens"] == 24
    finish = asyncio.run(_collect(ScriptedDecoding(['"name": 5']).astream("x", response_format={"type": "json_object"})))[-1]
    assert finish.type == "finish" and len(finish.rejected_attempts) == 2 and finish.usage.prompt_tokens == 15


def test_an_unreadable_call_stands_where_it_was_written_streamed_or_not(serve: Any) -> None:
    url, _ = serve(["A <tool_call>\nnot json at all\n</tool_call> B"])
    body = {"model": MODEL, "messages": USER, "tools": [WEATHER_TOOL]}
    whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"]["content"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    streamed = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert whole == streamed and whole.index("A") < whole.index("<tool_call>") < whole.index("B")


def test_streamed_calls_are_numbered_as_the_answers_list_numbers_them(serve: Any) -> None:
    """A call to a tool not offered (sent as text) before a valid one: the stream numbered the valid
    call 1 (its index among all calls) and never sent 0, and the openai client's stream helper
    (``.stream``, ``.parse`` streaming) failed with an IndexError."""
    url, _ = serve(['<tool_call>\n{"name": "search_web", "arguments": {"q": "Paris"}}\n</tool_call>\n'
                    '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'])
    with client(url).chat.completions.stream(model=MODEL, messages=USER, tools=[WEATHER]) as stream:  # type: ignore[arg-type]
        indices = [call.index for event in stream if event.type == "chunk" and event.chunk.choices
                   for call in event.chunk.choices[0].delta.tool_calls or []]
        final = stream.get_final_completion()
    assert indices == [0]
    calls = final.choices[0].message.tool_calls or []
    assert [call.function.name for call in calls] == ["get_weather"]  # type: ignore[union-attr]


async def _collect(stream: AsyncIterator[Event]) -> list[Event]:
    return [event async for event in stream]


def test_json_schema_output_is_decoded_under_the_schema() -> None:
    # Real decoding on random toys, whose unconstrained answers are no JSON (tests/test_json_constraint.py):
    # the server hands response_format to the engine, which constrains every token to the schema.
    check = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]}},
             "required": ["ok", "size"], "additionalProperties": False}
    engine = EnsembleEngine([toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)],
                            method="safe", max_new_tokens=96)
    with serve_in_background(create_app(engine)) as url:
        completion = client(url).chat.completions.create(
            model="safe-ensemble", messages=[{"role": "user", "content": "Check."}],
            response_format={"type": "json_schema", "json_schema": {"name": "check", "schema": check}})
    jsonschema.validate(json.loads(completion.choices[0].message.content or ""), check)
