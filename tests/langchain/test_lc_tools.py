"""ChatEnsemble's type translation for tools and structured output, message conversion, bad
input and engine lifetime: no model is loaded (tool parsing itself is tested in tests/test_tools.py)."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import (
    AIMessage,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool
from pydantic import BaseModel

import langchain_ensemble
import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from langchain_ensemble.chat_models import to_engine_messages
from shared_engine import InvalidRequestError
from shared_engine.events import FinishEvent, Stats, TokenEvent, ToolCallEvent

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather at a place.",
                                           "parameters": {"type": "object",
                                                          "properties": {"location": {"type": "string"}}}}}]


def test_message_conversion_with_tool_history() -> None:
    messages = [
        SystemMessage("sys"),
        HumanMessage([{"type": "text", "text": "weather "}, "in Paris?"], name="ann"),
        AIMessage("", tool_calls=[{"name": "get_weather", "args": {"location": "Paris"}, "id": "1"}]),
        ToolMessage("sunny", tool_call_id="1"),
        ToolMessage("boom", tool_call_id="2", status="error"),
        ChatMessage(role="assistant", content="It is sunny."),
    ]
    out = to_engine_messages(messages)
    assert [m["role"] for m in out] == ["system", "user", "assistant", "tool", "tool", "assistant"]
    assert out[1]["content"] == "weather \nin Paris?"  # text parts a newline apart (join_text_parts)
    assert out[2]["tool_calls"] == [{"id": "1", "type": "function",
                                     "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]
    assert (out[3]["content"], out[3]["tool_call_id"]) == ("sunny", "1")
    assert out[4]["content"] == "Error: boom"


@pytest.mark.parametrize("messages, match", [
    ([], "message list is empty"),
    ([ChatMessage(role="critic", content="x")], "unsupported message"),
    ([HumanMessage([{"type": "image", "url": "https://x/y.png"}])], "type 'image' are not supported"),
])
def test_bad_input_is_a_value_error_before_any_model_loads(messages: list, match: str) -> None:
    llm = ChatEnsemble(models=MODELS)
    with pytest.raises(InvalidRequestError, match=match) as info:
        llm.invoke(messages)
    assert isinstance(info.value, ValueError)


def test_bad_options_fail_at_construction() -> None:
    with pytest.raises(ValueError, match="draft_length"):
        ChatEnsemble(models=MODELS, draft_length=0)
    with pytest.raises(ValueError, match="unknown event types"):
        ChatEnsemble(models=MODELS, custom_events=["tokens"])


def test_construction_is_cheap_and_collects_engine_options() -> None:
    llm = ChatEnsemble(models=MODELS, max_tokens=8, draft_length=3, drafter="smollm2-135m-instruct",
                       timeout=5, api_key="unused")
    assert llm.engine_options == {"draft_length": 3, "drafter": "smollm2-135m-instruct"}
    assert llm._identifying_params["draft_length"] == 3
    ls = llm._get_ls_params(stop=["x"])
    assert ls["ls_model_name"] == "qwen2.5-coder-0.5b-instruct+smollm2-135m-instruct"
    assert ls["ls_stop"] == ["x"] and ls["ls_max_tokens"] == 8


def test_bind_tools_rejects_an_unknown_forced_tool() -> None:
    @tool
    def get_weather(location: str) -> str:
        """Get the weather at a location."""
        return "sunny"

    llm = ChatEnsemble(models=MODELS)
    with pytest.raises(ValueError, match="one of the tools"):
        llm.bind_tools([get_weather], tool_choice="get_time")


def test_public_surface() -> None:
    assert sorted(langchain_ensemble.__all__) == ["ChatEnsemble", "__version__"]


class ToolEngine:
    """Stands in for EnsembleEngine: answers with one parsed call, records what it was asked."""

    def __init__(self) -> None:
        self.params: list[dict] = []

    async def astream(self, messages: list[dict], **params: object):
        self.params.append(params)
        yield TokenEvent(text="Checking.", source="draft", position=0)
        call = ToolCallEvent(index=0, id="call_1", name="get_weather", arguments={"location": "東京"})
        yield call
        yield FinishEvent(reason="stop", text="Checking.", stats=Stats(prompt_tokens=5, tokens=9), tool_calls=[call])


@pytest.fixture
def tool_engine(monkeypatch: pytest.MonkeyPatch) -> ToolEngine:
    engine = ToolEngine()
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: engine)
    return engine


def test_tool_call_events_become_tool_calls_and_streamed_chunks(tool_engine: ToolEngine) -> None:
    llm = ChatEnsemble(models=MODELS).bind_tools(TOOLS, tool_choice="any")
    message = llm.invoke("Weather in Tokyo?")
    assert message.content == "Checking."
    assert message.tool_calls == [{"name": "get_weather", "args": {"location": "東京"}, "id": "call_1",
                                   "type": "tool_call"}]
    assert message.response_metadata["finish_reason"] == "tool_calls"
    assert message.response_metadata["model_provider"] == "safe-ensemble"
    assert message.usage_metadata == {"input_tokens": 5, "output_tokens": 9, "total_tokens": 14}
    assert tool_engine.params[0]["tools"] == TOOLS and tool_engine.params[0]["tool_choice"] == "any"
    chunks = list(llm.stream("Weather in Tokyo?"))
    assert [c.tool_call_chunks[0]["args"] for c in chunks if c.tool_call_chunks] == ['{"location": "東京"}']


def test_non_streaming_invoke_reports_new_tokens(tool_engine: ToolEngine) -> None:
    from langchain_core.callbacks import BaseCallbackHandler

    class Tokens(BaseCallbackHandler):
        def __init__(self) -> None:
            self.tokens: list[str] = []

        def on_llm_new_token(self, token: str, **kwargs: object) -> None:
            self.tokens.append(token)

    handler = Tokens()
    ChatEnsemble(models=MODELS).invoke("hi", config={"callbacks": [handler]})
    assert "Checking." in handler.tokens


class Person(BaseModel):
    name: str
    age: int


@pytest.mark.parametrize("method, engine_kwargs", [
    ("function_calling", {"tool_choice": "any"}),
    ("json_schema", {"response_format": {"type": "json_schema", "json_schema": {
        "name": "Person", "schema": {"type": "object", "properties": {"name": {"type": "string"},
                                                                      "age": {"type": "integer"}},
                                     "required": ["name", "age"]}}}}),
    ("json_mode", {"response_format": {"type": "json_object"}}),  # plus the schema, to validate against
])
def test_structured_output_methods_reach_the_engine_as_what_they_say(monkeypatch: pytest.MonkeyPatch,
                                                                      method: str, engine_kwargs: dict) -> None:
    seen: list[dict] = []

    class JsonEngine:
        async def astream(self, messages: list[dict], **params: object):
            seen.append(params)
            if "tools" in params:
                call = ToolCallEvent(index=0, id="call_1", name="Person", arguments={"name": "Ann", "age": 3})
                yield call
                yield FinishEvent(reason="stop", text="", stats=Stats(), tool_calls=[call])
            else:
                yield TokenEvent(text='{"name": "Ann", "age": 3}', source="draft", position=0)
                yield FinishEvent(reason="eos", text='{"name": "Ann", "age": 3}', stats=Stats())

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: JsonEngine())
    structured = ChatEnsemble(models=MODELS).with_structured_output(Person, method=method, include_raw=True)
    out = structured.invoke("Ann is 3.")
    assert out["parsed"] == Person(name="Ann", age=3) and out["parsing_error"] is None
    assert isinstance(out["raw"], AIMessage)
    for key, value in engine_kwargs.items():
        got = seen[0][key]
        if key == "response_format":
            assert got["type"] == value["type"] and got["json_schema"]["schema"]["required"] == ["name", "age"]
        else:
            assert got == value


def test_bind_tools_takes_a_pydantic_response_format_as_chat_openai_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``bind_tools(tools, response_format=Model)`` failed at invoke ("response_format: Input should be a
    valid dictionary"): only the dict create_agent sends was read."""
    seen: list[dict] = []

    class JsonEngine:
        async def astream(self, messages: list[dict], **params: object):
            seen.append(params)
            yield FinishEvent(reason="eos", text='{"name": "Ann", "age": 3}', stats=Stats())

    @tool
    def lookup(name: str) -> str:
        """Look a person up."""
        return name

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: JsonEngine())
    ChatEnsemble(models=MODELS).bind_tools([lookup], response_format=Person).invoke("Ann is 3.")
    fmt = seen[0]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["name"] == "Person"
    assert fmt["json_schema"]["schema"]["required"] == ["name", "age"]


def test_unsupported_structured_output_method_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="method 'xml' is not supported"):
        ChatEnsemble(models=MODELS).with_structured_output(Person, method="xml")  # type: ignore[arg-type]


def test_a_per_call_model_is_refused_not_silently_replaced(tool_engine: ToolEngine) -> None:
    llm = ChatEnsemble(models=MODELS)
    with pytest.raises(InvalidRequestError, match="per call is not supported"):
        llm.invoke("hi", model="gpt-4o")
    assert llm.invoke("hi", model=llm.model_name).content == "Checking."  # naming itself is fine


def test_engines_are_released_with_the_last_chat_model() -> None:
    import gc

    options = {"draft_length": 7}
    key = chat_models._engine_key(MODELS, "safe", options)
    first, second = ChatEnsemble(models=MODELS, **options), ChatEnsemble(models=MODELS, **options)
    engine = chat_models._ENGINES[key].engine
    first.close()
    assert chat_models._ENGINES[key].users == 1
    del second
    gc.collect()
    assert key not in chat_models._ENGINES and engine._closed


def test_a_release_while_the_engine_lock_is_held_is_queued_not_a_deadlock() -> None:
    """A chat model collected by a garbage collection that runs while this thread holds the engine
    lock (building an engine allocates) used to wait for the lock forever: the suite hung here."""
    import threading

    from langchain_ensemble import chat_models

    first = ChatEnsemble(models=MODELS, draft_length=2)
    key = chat_models._engine_key(*first._engine_config())
    users = chat_models._ENGINES[key].users

    def release_under_the_lock() -> None:
        with chat_models._ENGINES_LOCK:
            first.close()  # the finalizer, as a collection inside _shared_engine would run it
            assert chat_models._ENGINES[key].users == users  # queued, not applied yet

    worker = threading.Thread(target=release_under_the_lock)
    worker.start()
    worker.join(timeout=30)
    assert not worker.is_alive(), "releasing under the engine lock deadlocked"
    second = ChatEnsemble(models=MODELS, draft_length=2)  # the next holder applies the queued count-off
    assert chat_models._ENGINES[key].users == users and not chat_models._PENDING_RELEASES
    second.close()


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_structured_output_decodes_under_the_schema_on_toy_members(method: str) -> None:
    # Random toys write no JSON unconstrained (tests/test_json_constraint.py); both JSON methods
    # constrain every token to the schema, so even they answer with a valid object.
    from typing import Literal

    from tests.toy import registered_members, toy_member

    class Check(BaseModel):
        ok: bool
        size: Literal["S", "M", "L"]

    toys = [toy_member("lc-json-bpe", "byte_level"), toy_member("lc-json-sp", "metaspace", seed=1)]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names, max_tokens=96)
        out = llm.with_structured_output(Check, method=method, include_raw=True).invoke("Check.")
        llm.close()
    assert isinstance(out["parsed"], Check), out
    assert out["raw"].response_metadata["ensemble"]["constrained"]


class InvalidJsonEngine:
    """Answers with JSON the engine marked invalid after its retries: a whole answer of the wrong
    shape, or (``cut``) one cut by max_tokens."""

    def __init__(self, cut: bool = False) -> None:
        self.text, self.reason = ('{"name": "An', "length") if cut else ('{"name": 3}', "stop")
        self.error = ("not valid JSON (Unterminated string at character 9)" if cut
                      else "3 is not of type 'string' at name")

    async def astream(self, messages: list[dict], **params: object):
        yield TokenEvent(text=self.text, source="draft", position=0)
        yield FinishEvent(reason=self.reason, text=self.text, stats=Stats(), format_error=self.error)


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_an_answer_the_engine_marked_invalid_is_a_parsing_error(monkeypatch: pytest.MonkeyPatch,
                                                                 method: str) -> None:
    """LangChain's JSON parser handed back a dict of the wrong shape, with parsing_error None. An answer
    cut by max_tokens is read leniently, as LangChain reads any chat model's (the standard suite's
    test_json_mode relies on it at its token cap) in json_mode, its format_error kept in response_metadata; in
    json_schema it was parsed into an object holding the cut value, and is a parsing error now."""
    from langchain_core.exceptions import OutputParserException

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: InvalidJsonEngine())
    schema = Person.model_json_schema()
    llm = ChatEnsemble(models=MODELS)
    out = llm.with_structured_output(schema, method=method, include_raw=True).invoke("Ann is 3.")
    assert out["parsed"] is None and isinstance(out["parsing_error"], OutputParserException)
    assert "not of type" in str(out["parsing_error"])
    assert out["parsing_error"].llm_output == '{"name": 3}'
    with pytest.raises(OutputParserException, match="not of type"):
        llm.with_structured_output(schema, method=method).invoke("Ann is 3.")

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: InvalidJsonEngine(cut=True))
    out = llm.with_structured_output(schema, method=method, include_raw=True).invoke("Ann is 3.")
    assert "Unterminated" in out["raw"].response_metadata["format_error"]
    if method == "json_mode":  # read leniently, as LangChain reads any chat model's (test_json_mode)
        assert out["parsing_error"] is None and out["parsed"] == {"name": "An"}
    else:  # a schema's object built from a cut value ("An"): ChatOpenAI raises LengthFinishReasonError
        assert out["parsed"] is None and "cut by max_tokens" in str(out["parsing_error"])


def test_an_unreadable_call_is_an_invalid_tool_call_and_history_blocks_are_skipped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An unreadable <tool_call> (JSON, but no {"name", "arguments"}) reached LangChain as a valid
    call named ''; an earlier answer holding v1 invalid/server tool blocks raised InvalidRequestError."""
    raw = '{"tool": "get_weather", "city": "Paris"}'

    class BadCallEngine:
        async def astream(self, messages: list[dict], **params: object):
            call = ToolCallEvent(index=0, id="call_1", raw=raw, error="no function name")
            yield call
            yield FinishEvent(reason="stop", text="", stats=Stats(), tool_calls=[call])

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: BadCallEngine())
    llm = ChatEnsemble(models=MODELS).bind_tools(TOOLS)
    message = llm.invoke("Weather?")
    chunks = list(llm.stream("Weather?"))
    streamed = chunks[0]
    for chunk in chunks[1:]:
        streamed += chunk
    for answer in (message, streamed):
        assert answer.tool_calls == []
        [invalid] = answer.invalid_tool_calls
        assert (invalid["id"], json.loads(invalid["args"])) == ("call_1", raw)
    history = [HumanMessage("Weather?"), AIMessage(content=[
        {"type": "text", "text": "Let me look."},
        {"type": "invalid_tool_call", "id": "c0", "name": None, "args": raw, "error": "unreadable"},
        {"type": "server_tool_call", "id": "s1", "name": "web_search", "args": {"q": "Paris"}},
        {"type": "server_tool_result", "tool_call_id": "s1", "status": "success", "output": "sunny"}]),
        HumanMessage("And now?")]
    assert to_engine_messages(history)[1] == {"role": "assistant", "content": "Let me look."}


class CutCallEngine:
    """The engine's own answer shaping (OutputPlan: prefill, tool-call parsing) over a scripted
    answer cut by max_new_tokens: what AdaFuse wrote for a forced call on random toy members."""

    text = "\ufffd stationber 73?ou\ufffd\n   Berlinelf\ufffd49\ufffdited a"  # after the prefill's '"arguments":'

    async def astream(self, messages: list[dict], **params: object):
        from shared_engine.tools import OutputOptions, OutputPlan
        options = OutputOptions(**{k: v for k, v in params.items() if k in OutputOptions.model_fields})
        shaper = OutputPlan(options).shaper()
        finish = None
        for event in (TokenEvent(text=self.text, source="draft", position=0),
                      FinishEvent(reason="length", text=self.text, stats=Stats())):
            for shaped in shaper.on_event(event):
                if isinstance(shaped, FinishEvent):
                    finish = shaped
                else:
                    yield shaped
        for held in shaper.release():  # as the engine: what the shaper held for validation, then the finish
            yield held
        assert finish is not None
        yield finish


def test_a_call_with_unreadable_arguments_is_an_invalid_tool_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """Arguments json_repair could not read became a valid get_weather({}) call, which an agent ran
    without its required argument; the call is an invalid_tool_call, with the text as written."""
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: CutCallEngine())
    llm = ChatEnsemble(models=MODELS).bind_tools(TOOLS, tool_choice="get_weather")
    message = llm.invoke("Weather in Paris?")
    assert message.tool_calls == [] and message.response_metadata["finish_reason"] == "length"
    [invalid] = message.invalid_tool_calls
    assert json.loads(invalid["args"]).startswith('{"name": "get_weather", "arguments":\ufffd stationber')
    assert invalid["name"] == "get_weather"  # the tool it meant (was None): an agent's retry can name it


@pytest.fixture
def no_gpt2(monkeypatch: pytest.MonkeyPatch) -> None:
    """LangChain's default token counter downloads GPT-2's tokenizer (offline: minutes of retries)."""
    import langchain_core.language_models.base as lc_base

    def download(*args: object) -> None:
        raise AssertionError("LangChain's GPT-2 tokenizer was asked for")

    monkeypatch.setattr(lc_base, "get_tokenizer", download)


def test_token_ids_are_the_drafters_without_loading_weights(
        monkeypatch: pytest.MonkeyPatch, no_gpt2: None) -> None:
    """``get_token_ids``: the drafter's ids from its tokenizer files alone (a prompt's cost, which
    loads the members, is ``get_num_tokens``: tests/langchain/test_lc_token_counts.py)."""
    from shared_engine.members.remote import LocalTokenizer
    from tests.toy import metaspace_tokenizer

    tokenizer = metaspace_tokenizer()
    asked: list[str] = []

    def load_tokenizer(spec: str) -> LocalTokenizer:
        asked.append(spec)
        return LocalTokenizer(tokenizer, len(tokenizer), frozenset(), None)

    monkeypatch.setattr(chat_models, "load_tokenizer", load_tokenizer, raising=False)
    llm = ChatEnsemble(models=list(reversed(MODELS)), drafter=1)  # the drafter: Qwen, named second
    text = "hello there, world"
    assert len(llm.get_token_ids(text)) == len(tokenizer(text, add_special_tokens=False)["input_ids"]) > 0
    assert asked == [MODELS[0]] and not llm._engine().loaded  # the zoo's tokenizer files, no weights
    llm.get_token_ids(text)
    assert asked == [MODELS[0]]  # read once
    llm.close()


def test_trim_messages_counts_with_the_loaded_members(no_gpt2: None) -> None:
    from langchain_core.messages import trim_messages

    from tests.toy import registered_members, toy_member

    toys = [toy_member("lc-count-sp", "metaspace"), toy_member("lc-count-bpe", "byte_level", seed=1)]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names)
        drafter_ids = toys[0].tokenizer("hello world", add_special_tokens=False)["input_ids"]
        assert llm.get_token_ids("hello world") == drafter_ids
        assert llm.get_num_tokens("hello world") == llm._engine().prompt_tokens("hello world", raw_prompt=True)
        history = [HumanMessage("a b c " * 20), AIMessage("d e f " * 20), HumanMessage("and now?")]
        kept = trim_messages(history, max_tokens=llm.get_num_tokens_from_messages(history[-1:]),
                             token_counter=llm, strategy="last")
        assert kept == history[-1:]
        llm.close()


def test_a_closed_chat_model_takes_no_calls_and_leaks_no_engine() -> None:
    """A call after close() built an engine no one held (users=0), which loaded the members and was
    never released."""
    from shared_engine import EngineClosedError
    from tests.toy import registered_members, toy_member

    toys = [toy_member("lc-closed-bpe", "byte_level"), toy_member("lc-closed-sp", "metaspace", seed=1)]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names, max_tokens=2)
        key = chat_models._engine_key(*llm._engine_config())
        llm.invoke("Hi")
        llm.close()
        assert key not in chat_models._ENGINES
        for use in (lambda: llm.invoke("Hi"), lambda: list(llm.stream("Hi")), lambda: llm.get_num_tokens("Hi"),
                    lambda: llm.context_window):
            with pytest.raises(EngineClosedError, match="closed"):
                use()
        assert key not in chat_models._ENGINES


def test_a_copy_holds_the_engine_on_its_own() -> None:
    """``model_copy`` / ``copy.deepcopy`` shared the original's count-off: closing (or collecting) the
    original closed the copy (EngineClosedError), and the engine went with it."""
    import copy

    from shared_engine import EngineClosedError
    from tests.toy import registered_members, toy_member

    toys = [toy_member("lc-copy-bpe", "byte_level"), toy_member("lc-copy-sp", "metaspace", seed=1)]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names, max_tokens=2)
        key = chat_models._engine_key(*llm._engine_config())
        answer = llm.invoke("Hi").content
        shallow, deep, warmer = copy.deepcopy(llm), llm.model_copy(), llm.model_copy(update={"temperature": 0.5})
        assert chat_models._ENGINES[key].users == 4
        llm.close()
        assert shallow.invoke("Hi").content == deep.invoke("Hi").content == answer
        assert warmer.temperature == 0.5 and llm.temperature is None
        for clone in (shallow, deep):
            clone.close()
        assert chat_models._ENGINES[key].users == 1
        with pytest.raises(EngineClosedError):
            llm.model_copy().invoke("Hi")  # a copy of a closed model is closed
        warmer.close()
        assert key not in chat_models._ENGINES


def test_a_profile_leaves_no_engine_behind(tmp_path) -> None:
    """ChatEnsemble(profile=FILE): langchain-core's profile validator ran before the profile's digest
    was read, and built a second engine, under a key without it, that no one held or released."""
    from shared_engine.profile import EnsembleProfile, FitInfo
    from tests.toy import registered_members, toy_member

    toys = [toy_member("lc-prof-bpe", "byte_level"), toy_member("lc-prof-sp", "metaspace", seed=1)]
    path = tmp_path / "profile.json"
    with registered_members(toys) as names:
        EnsembleProfile(members=names, weights=[0.4, 0.6], drafter=names[0],
                        fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="test")).save(path)
        before = set(chat_models._ENGINES)
        llm = ChatEnsemble(models=names, profile=str(path), max_tokens=2)
        [key] = set(chat_models._ENGINES) - before
        assert key[3] is not None and chat_models._ENGINES[key].users == 1
        llm.close()
        assert set(chat_models._ENGINES) == before


def test_a_schema_without_a_title_and_json_mode_without_a_schema_are_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Both were refused before any request ("Unsupported function"), though ChatOllama takes them."""
    seen: list[dict] = []

    class JsonEngine:
        async def astream(self, messages: list[dict], **params: object):
            seen.append(params)
            yield TokenEvent(text='{"ok": true}', source="draft", position=0)
            yield FinishEvent(reason="eos", text='{"ok": true}', stats=Stats())

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: JsonEngine())
    untitled = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]}
    llm = ChatEnsemble(models=MODELS)
    assert llm.with_structured_output(untitled, method="json_schema").invoke("ok?") == {"ok": True}
    assert seen[-1]["response_format"] == {"type": "json_schema", "json_schema": {"name": "response",
                                                                                  "schema": untitled}}
    assert llm.with_structured_output(untitled, method="json_mode").invoke("ok?") == {"ok": True}
    assert seen[-1]["response_format"]["type"] == "json_object"
    assert seen[-1]["response_format"]["json_schema"]["schema"] == untitled  # checked, not shown
    assert llm.with_structured_output(method="json_mode").invoke("ok?") == {"ok": True}
    assert seen[-1]["response_format"] == {"type": "json_object"}
    for method in ("json_schema", "function_calling"):
        with pytest.raises(ValueError, match="needs a schema"):
            llm.with_structured_output(None, method=method)


@pytest.mark.parametrize("method", ["json_schema", "json_mode"])
def test_a_titled_schema_without_an_object_root_is_the_engines_readable_refusal(method: str) -> None:
    """A titled array schema went through langchain-core's tool conversion, which has no "parameters"
    for it: KeyError 'parameters' before the request reached the engine."""
    llm = ChatEnsemble(models=MODELS)
    with pytest.raises(InvalidRequestError, match="object at its root"):
        llm.with_structured_output({"title": "Nums", "type": "array", "items": {"type": "integer"}},
                                   method=method).invoke("Three numbers.")
