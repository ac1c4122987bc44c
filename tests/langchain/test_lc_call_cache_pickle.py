"""ChatEnsemble: a forced call with no readable result is a parsing error, the LLM cache keys on the
model's default stop and tool_result_hint, a pickled model holds its engine, bind_tools takes strict."""

from __future__ import annotations

import pickle

import pytest
from langchain_core.exceptions import OutputParserException
from pydantic import BaseModel

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from shared_engine.events import FinishEvent, Stats, TokenEvent, ToolCallEvent
from tests.langchain.test_lc_tools import CutCallEngine as ShapedCutCall
from tests.langchain.test_lc_tools import InvalidJsonEngine

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]


class Person(BaseModel):
    """A person."""

    name: str
    age: int


class CutCallEngine(ShapedCutCall):
    """The engine's own answer shaping over a forced call cut by max_new_tokens."""

    text = ' {"name": "Bob", "age'  # after the prefill's '"arguments":'


class UnreadableCallEngine:
    """A whole call that could not be read (the engine's error says why)."""

    async def astream(self, messages: list[dict], **params: object):
        call = ToolCallEvent(index=0, id="call_1", raw='{"tool": "Person"}', error="no function name")
        yield call
        yield FinishEvent(reason="stop", text="", stats=Stats(), tool_calls=[call])


@pytest.mark.parametrize("schema", [Person, Person.model_json_schema()])
def test_a_forced_call_without_a_readable_result_is_a_parsing_error(monkeypatch: pytest.MonkeyPatch,
                                                                     schema: object) -> None:
    """with_structured_output's default (function_calling) returned None for a call cut by max_tokens
    or unreadable (the tools parser reads no tool_calls as None), stream() yielded nothing and
    include_raw=True had parsing_error None; the invalid call's error was None."""
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: CutCallEngine())
    llm = ChatEnsemble(models=MODELS)
    structured = llm.with_structured_output(schema)
    with pytest.raises(OutputParserException, match="'Person': the call was cut by max_tokens") as caught:
        structured.invoke("Bob is 31")
    assert caught.value.llm_output == '{"name": "Person", "arguments": {"name": "Bob", "age'
    with pytest.raises(OutputParserException, match="cut by max_tokens"):
        list(structured.stream("Bob is 31"))
    out = llm.with_structured_output(schema, include_raw=True).invoke("Bob is 31")
    assert out["parsed"] is None and "cut by max_tokens" in str(out["parsing_error"])
    [invalid] = out["raw"].invalid_tool_calls
    assert invalid["error"] == "cut off before the call's JSON ends"

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: UnreadableCallEngine())
    with pytest.raises(OutputParserException, match=r"could not be read \(no function name\)"):
        structured.invoke("Bob is 31")


async def test_a_forced_call_without_a_readable_result_is_a_parsing_error_async(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: CutCallEngine())
    structured = ChatEnsemble(models=MODELS).with_structured_output(Person)
    with pytest.raises(OutputParserException, match="cut by max_tokens"):
        await structured.ainvoke("Bob is 31")
    with pytest.raises(OutputParserException, match="cut by max_tokens"):
        [chunk async for chunk in structured.astream("Bob is 31")]


def test_a_readable_forced_call_still_parses_and_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    class CallEngine(CutCallEngine):
        text = ' {"name": "Bob", "age": 31}}'

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: CallEngine())
    structured = ChatEnsemble(models=MODELS).with_structured_output(Person)
    assert structured.invoke("Bob is 31") == Person(name="Bob", age=31)
    assert list(structured.stream("Bob is 31"))[-1] == Person(name="Bob", age=31)


async def test_json_mode_answer_cut_short_of_a_pydantic_schema_raises_in_stream_too(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """json_mode with a pydantic schema over an answer cut by max_tokens ('{"name": "An'): invoke()
    raised OutputParserException, stream()/astream() yielded nothing and raised nothing (the streaming
    parser reads the cut JSON as a partial object and drops what fails the schema)."""
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: InvalidJsonEngine(cut=True))
    llm = ChatEnsemble(models=MODELS)
    structured = llm.with_structured_output(Person, method="json_mode")
    with pytest.raises(OutputParserException, match="Failed to parse Person") as invoked:
        structured.invoke("Ann is 3.")
    with pytest.raises(OutputParserException, match="Failed to parse Person") as streamed:
        list(structured.stream("Ann is 3."))
    assert str(streamed.value) == str(invoked.value)
    with pytest.raises(OutputParserException, match="Failed to parse Person"):
        [chunk async for chunk in structured.astream("Ann is 3.")]
    out = llm.with_structured_output(Person, method="json_mode", include_raw=True).invoke("Ann is 3.")
    assert out["parsed"] is None and "Failed to parse Person" in str(out["parsing_error"])
    # a dict schema or none is read leniently in every path, as ChatOpenAI's json_mode reads it
    for schema in (Person.model_json_schema(), None):
        lenient = llm.with_structured_output(schema, method="json_mode")
        assert lenient.invoke("Ann is 3.") == {"name": "An"}
        assert list(lenient.stream("Ann is 3."))[-1] == {"name": "An"}


def test_a_whole_json_mode_answer_still_parses_and_streams(monkeypatch: pytest.MonkeyPatch) -> None:
    class WholeJsonEngine(InvalidJsonEngine):
        def __init__(self) -> None:
            self.text, self.reason, self.error = '{"name": "Bob", "age": 31}', "stop", None

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: WholeJsonEngine())
    structured = ChatEnsemble(models=MODELS).with_structured_output(Person, method="json_mode")
    assert structured.invoke("Bob is 31") == Person(name="Bob", age=31)
    assert list(structured.stream("Bob is 31")) == [Person(name="Bob", age=31)]


def test_the_llm_cache_keys_on_the_default_stop_and_tool_result_hint() -> None:
    """ChatEnsemble(stop=[...]) got the cached answer of the same model built without stop
    (_identifying_params left out stop and tool_result_hint)."""
    from langchain_core.caches import InMemoryCache
    from langchain_core.globals import get_llm_cache, set_llm_cache

    from tests.toy import registered_members, toy_member

    toys = [toy_member("lc-cache-bpe", "byte_level"), toy_member("lc-cache-sp", "metaspace", seed=1)]
    before = get_llm_cache()
    with registered_members(toys) as names:
        plain = ChatEnsemble(models=names, max_tokens=12)
        full = str(plain.invoke("Hi").content)
        stop = full[5:8]
        stopped = ChatEnsemble(models=names, max_tokens=12, stop=[stop])
        hinted = ChatEnsemble(models=names, max_tokens=12, tool_result_hint="Answer now.")
        try:
            set_llm_cache(InMemoryCache())
            assert plain.invoke("Hi").content == full
            assert stop not in str(stopped.invoke("Hi").content)
            assert hinted._get_llm_string() != plain._get_llm_string()
            assert stopped._get_llm_string(stop=["x"]) != plain._get_llm_string(stop=["x"])
        finally:
            set_llm_cache(before)
            for model in (plain, stopped, hinted):
                model.close()


def test_a_pickled_chat_model_holds_the_engine_on_its_own() -> None:
    """A pickled and restored ChatEnsemble (multiprocessing, joblib) was closed from the start:
    EngineClosedError at its first call (its weakref.finalize pickled as a dead one)."""
    from tests.toy import registered_members, toy_member

    toys = [toy_member("lc-pickle-bpe", "byte_level"), toy_member("lc-pickle-sp", "metaspace", seed=1)]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names, max_tokens=3)
        key = chat_models._engine_key(*llm._engine_config())
        answer = llm.invoke("Hi").content
        restored = pickle.loads(pickle.dumps(llm))
        assert chat_models._ENGINES[key].users == 2
        llm.close()
        assert restored.invoke("Hi").content == answer
        restored.close()
        assert key not in chat_models._ENGINES


def test_bind_tools_takes_strict_and_does_not_pass_it_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """bind_tools(tools, strict=True), as code written for ChatOpenAI passes it, failed at invoke:
    'invalid parameters: strict: Extra inputs are not permitted'."""
    seen: list[dict] = []

    class Engine:
        async def astream(self, messages: list[dict], **params: object):
            seen.append(params)
            yield TokenEvent(text="Hi.", source="draft", position=0)
            yield FinishEvent(reason="stop", text="Hi.", stats=Stats())

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: Engine())
    llm = ChatEnsemble(models=MODELS).bind_tools([Person], strict=True)
    assert llm.invoke("Hi").content == "Hi."
    assert "strict" not in seen[0] and seen[0]["tools"][0]["function"]["name"] == "Person"
