"""``ChatEnsemble`` behaviour: streaming = invoke, ensemble events as LangChain custom events,
tool-call round trip, bad input.

The event plumbing runs on a scripted engine (no weights, milliseconds); what needs real models
(same answer streamed and invoked, a real tool round trip, context-window errors) carries the
``zoo`` marker and keeps answers short.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.messages import AIMessage, AIMessageChunk, HumanMessage, SystemMessage, ToolMessage
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnableLambda, RunnablePassthrough
from langchain_core.tools import tool

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from shared_engine import ContextLengthError, InvalidRequestError
from shared_engine.events import Candidate, EnsembleEvent, FinishEvent, Stats, TokenEvent, VerifiedPosition, VerifyEvent

# transformers members here; the standard suite (test_lc_standard.py) runs the default, llama.cpp
MODELS = ["transformers:qwen2.5-coder-0.5b-instruct", "transformers:smollm2-135m-instruct"]
ENSEMBLE_NAMES = {"ensemble.verify", "ensemble.ensemble", "ensemble.finish"}


class ScriptedEngine:
    """Stands in for EnsembleEngine: the event sequence of a short answer, one fusion included."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    async def astream(self, messages: list[dict[str, str]], **params: Any) -> AsyncIterator[Any]:
        self.calls.append((messages, params))
        yield TokenEvent(text="Hello", source="draft", position=0)
        yield VerifyEvent(positions=[VerifiedPosition(offset=5, boundary_ok=True, consensus=False)])
        yield EnsembleEvent(position=1, offset=5, sharpened=False, chosen=" there", drafted=" world",
                            changed=True, candidates=[Candidate(text=" there", member_probs={"a": 0.6}, fused=0.6)])
        await asyncio.sleep(0)
        yield TokenEvent(text=" there", source="ensemble", position=1)
        yield TokenEvent(text="!", source="draft", position=2)
        stats = Stats(prompt_tokens=7, tokens=3, ensembled_tokens=1, changed_tokens=1, ensemble_rate=1 / 3)
        yield FinishEvent(reason="eos", text="Hello there!", stats=stats)


@pytest.fixture
def scripted(monkeypatch: pytest.MonkeyPatch) -> ScriptedEngine:
    engine = ScriptedEngine()
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: engine)
    return engine


class Recorder(BaseCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


class AsyncRecorder(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    async def on_custom_event(self, name: str, data: Any, **kwargs: Any) -> None:
        self.events.append((name, data))


def test_chunks_usage_and_metadata(scripted: ScriptedEngine) -> None:
    llm = ChatEnsemble(models=MODELS, max_tokens=12, stop=["\n\n"], seed=3)
    chunks = list(llm.stream("Hi"))
    assert [c.content for c in chunks] == ["Hello", " there", "!", ""]
    assert chunks[-1].chunk_position == "last"
    assert sum(1 for c in chunks if c.usage_metadata) == 1
    full = sum(chunks[1:], chunks[0])
    assert full.usage_metadata == {"input_tokens": 7, "output_tokens": 3, "total_tokens": 10}
    meta = full.response_metadata
    assert meta["model_name"] == "+".join(MODELS) and meta["models"] == MODELS and meta["method"] == "safe"
    assert meta["finish_reason"] == "stop" and meta["ensemble"]["ensembled_tokens"] == 1
    invoked = llm.invoke("Hi")
    assert isinstance(invoked, AIMessage) and invoked.content == full.content == "Hello there!"
    assert invoked.usage_metadata == full.usage_metadata
    assert invoked.response_metadata["model_name"] == meta["model_name"]
    messages, params = scripted.calls[0]
    assert messages == [{"role": "user", "content": "Hi"}]
    assert params == {"max_new_tokens": 12, "seed": 3, "stop": ["\n\n"]}
    llm.invoke("Hi", stop=["x"], max_tokens=5, temperature=0.7)
    assert scripted.calls[-1][1] == {"max_new_tokens": 5, "temperature": 0.7, "seed": 3, "stop": ["x"]}


async def test_custom_events_in_astream_events_of_a_chain(scripted: ScriptedEngine) -> None:
    llm = ChatEnsemble(models=MODELS, custom_events=["verify", "ensemble", "finish"])
    chain = ChatPromptTemplate.from_messages([("user", "{q}")]) | llm
    seen = []
    async for ev in chain.astream_events({"q": "Hi"}, version="v2"):
        if ev["event"] == "on_custom_event":
            seen.append((ev["name"], ev["data"]))
        elif ev["event"] == "on_chat_model_stream":
            seen.append(("token", ev["data"]["chunk"].content))
    names = [n for n, _ in seen]
    assert names == ["token", "ensemble.verify", "ensemble.ensemble", "token", "token", "ensemble.finish", "token"]
    ensemble = dict(seen)["ensemble.ensemble"]
    assert ensemble["type"] == "ensemble" and ensemble["chosen"] == " there"
    assert ensemble["candidates"][0]["fused"] == 0.6
    assert dict(seen)["ensemble.finish"]["stats"]["ensemble_rate"] == pytest.approx(1 / 3)


async def test_default_events_are_decisions_and_finish_not_tokens(scripted: ScriptedEngine) -> None:
    chain = RunnablePassthrough() | ChatEnsemble(models=MODELS)
    names = [ev["name"] async for ev in chain.astream_events("Hi", version="v2") if ev["event"] == "on_custom_event"]
    assert names == ["ensemble.ensemble", "ensemble.finish"]


async def test_callback_handlers_get_events_on_every_path(scripted: ScriptedEngine) -> None:
    llm = ChatEnsemble(models=MODELS)
    expected = ["ensemble.ensemble", "ensemble.finish"]
    for run in (lambda cb: llm.ainvoke("Hi", config={"callbacks": [cb]}),          # _agenerate, run manager
                lambda cb: (RunnablePassthrough() | llm).ainvoke("Hi", config={"callbacks": [cb]})):
        handler = AsyncRecorder()
        await run(handler)
        assert [n for n, _ in handler.events] == expected
    handler = Recorder()
    llm.invoke("Hi", config={"callbacks": [handler]})  # sync _generate inside a running loop: no deadlock
    assert [n for n, _ in handler.events] == expected
    handler = Recorder()
    chain = RunnableLambda(lambda x: x) | llm
    assert "".join(c.content for c in chain.stream("Hi", config={"callbacks": [handler]})) == "Hello there!"
    assert [n for n, _ in handler.events] == expected


async def test_a_bare_model_streams_its_events_as_its_own_run(scripted: ScriptedEngine) -> None:
    """No enclosing Runnable: langchain-core's astream gives _astream no run manager, yet the events
    belong to the model's run, in astream_events and in callbacks of astream and stream."""
    llm = ChatEnsemble(models=MODELS)
    events = [ev async for ev in llm.astream_events("Hi", version="v2")
              if ev["event"] in ("on_chat_model_start", "on_custom_event")]
    assert [ev["name"] for ev in events] == ["ChatEnsemble", "ensemble.ensemble", "ensemble.finish"]
    assert len({ev["run_id"] for ev in events}) == 1
    assert events[1]["data"]["chosen"] == " there"
    handler = AsyncRecorder()
    assert "".join([c.content async for c in llm.astream("Hi", config={"callbacks": [handler]})]) == "Hello there!"
    assert [n for n, _ in handler.events] == ["ensemble.ensemble", "ensemble.finish"]
    handler = Recorder()
    assert "".join(c.content for c in llm.stream("Hi", config={"callbacks": [handler]})) == "Hello there!"
    assert [n for n, _ in handler.events] == ["ensemble.ensemble", "ensemble.finish"]
    assert "".join([c.content async for c in llm.astream("Hi")]) == "Hello there!"  # nobody listening


async def test_a_streaming_model_sends_its_events_on_invoke_and_batch(scripted: ScriptedEngine) -> None:
    """ChatEnsemble(streaming=True): langchain-core's invoke runs _stream with no run manager, and
    invoke/ainvoke/batch sent no ensemble events at all."""

    class RunRecorder(BaseCallbackHandler):
        def __init__(self) -> None:
            self.model_runs: list[Any] = []
            self.events: list[tuple[str, Any]] = []

        def on_chat_model_start(self, serialized: Any, messages: Any, *, run_id: Any, **kwargs: Any) -> None:
            self.model_runs.append(run_id)

        def on_custom_event(self, name: str, data: Any, *, run_id: Any, **kwargs: Any) -> None:
            self.events.append((name, run_id))

    llm = ChatEnsemble(models=MODELS, streaming=True)
    calls = [lambda cb: llm.invoke("Hi", config={"callbacks": [cb]}),
             lambda cb: llm.ainvoke("Hi", config={"callbacks": [cb]}),
             lambda cb: llm.batch(["Hi"], config={"callbacks": [cb]}),
             lambda cb: llm.abatch(["Hi"], config={"callbacks": [cb]})]
    for call in calls:
        handler = RunRecorder()
        out = call(handler)
        if asyncio.iscoroutine(out):
            out = await out
        assert [n for n, _ in handler.events] == ["ensemble.ensemble", "ensemble.finish"]
        assert {run for _, run in handler.events} == set(handler.model_runs)  # the model's own run
    assert chat_models._OWN_RUN.get() is None


async def test_a_bare_stream_leaves_no_run_behind_in_the_callers_context(scripted: ScriptedEngine) -> None:
    llm = ChatEnsemble(models=MODELS)
    stream = llm.astream("Hi")
    await anext(stream)
    assert chat_models._OWN_RUN.get() is None  # set only while LangChain's code runs, never across a yield
    await stream.aclose()


async def test_stopping_early_closes_the_engine_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = asyncio.Event()

    class Endless:
        async def astream(self, messages: Any, **params: Any) -> AsyncIterator[Any]:
            try:
                for i in range(10_000):
                    yield TokenEvent(text="x", source="draft", position=i)
                    await asyncio.sleep(0)
            finally:
                closed.set()

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: Endless())
    stream = ChatEnsemble(models=MODELS).astream("Hi")
    async for _ in stream:
        break
    await stream.aclose()
    await asyncio.wait_for(closed.wait(), 5)


# -- real models ------------------------------------------------------------------------------

@pytest.mark.zoo
async def test_stream_concatenates_to_invoke() -> None:
    llm = ChatEnsemble(models=MODELS, max_tokens=24)
    question = "Name three primary colors."
    invoked = await llm.ainvoke(question)
    chunks = list(llm.stream(question))  # sync bridge, called inside this test's running loop
    assert invoked.content and "".join(c.content for c in chunks) == invoked.content
    full = sum(chunks[1:], chunks[0])
    assert full.usage_metadata == invoked.usage_metadata
    assert full.usage_metadata["output_tokens"] == invoked.response_metadata["ensemble"]["tokens"] > 0


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly and return the product."""
    return a * b


@pytest.mark.zoo
def test_tool_call_round_trip() -> None:
    # Unforced: the model decides to call. weights=[2, 1] lets the tool-trained member lead (see
    # cookbooks/langchain_agent.py for why both settings help a 0.5B model).
    llm = ChatEnsemble(models=MODELS, max_tokens=40, weights=[2, 1]).bind_tools([multiply])
    question = HumanMessage("What is 1234 times 5678?")
    call: AIMessageChunk | None = None
    for chunk in llm.stream([question]):
        assert "<tool_call>" not in chunk.content  # markup never leaks into the text stream
        call = chunk if call is None else call + chunk
    assert call is not None and call.tool_call_chunks and call.tool_call_chunks[0]["id"]
    [tool_call] = call.tool_calls
    assert tool_call["name"] == "multiply" and tool_call["id"].startswith("call_")
    assert tool_call["args"] == {"a": 1234, "b": 5678}
    result = multiply.invoke(tool_call)
    assert isinstance(result, ToolMessage) and result.tool_call_id == tool_call["id"]
    nudge = SystemMessage("Reply to the user in plain text now, using the tool result.")
    answer = llm.invoke([question, call, result, nudge])
    assert not answer.tool_calls and "7006652" in answer.content.replace(",", "")


@pytest.mark.zoo
async def test_context_longer_than_the_smallest_window_is_a_clear_error() -> None:
    llm = ChatEnsemble(models=MODELS, max_tokens=16)
    with pytest.raises(ContextLengthError, match="context window") as info:
        await llm.ainvoke("hello " * 9000)  # > SmolLM2's 8192 positions, fine for Qwen
    assert isinstance(info.value, ValueError)
    with pytest.raises(ContextLengthError):
        list(llm.stream("hi", max_tokens=1_000_000))
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.invoke("hi", temperature=-1)


async def test_adafuse_decisions_are_custom_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """A real engine (tiny random members, two tokenizers) behind ChatEnsemble, method adafuse."""
    from shared_engine import EnsembleEngine
    from tests.toy import toy_member

    engine = EnsembleEngine([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)],
                            method="adafuse", threshold=1.0)
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: engine)
    llm = ChatEnsemble(models=["a", "b"], method="adafuse", max_tokens=8)
    seen = [ev async for ev in llm.astream_events("Hi", version="v2") if ev["event"] == "on_custom_event"]
    names = [ev["name"] for ev in seen]
    assert names[-1] == "ensemble.finish" and "ensemble.adafuse" in names
    spans = [ev["data"] for ev in seen if ev["name"] == "ensemble.adafuse"]
    assert all(s["fused"] and s["chosen"] == s["candidates"][0]["text"] for s in spans)
    assert seen[-1]["data"]["stats"]["fused_spans"] == len(spans)


def test_profile_reports_capabilities_and_the_smallest_context_window() -> None:
    from shared_engine.members import HFMember
    from tests.toy import byte_level_tokenizer, registered_members, tiny_llama, toy_member

    short = HFMember("lc-profile-short", tiny_llama(byte_level_tokenizer()), byte_level_tokenizer())
    short.context_window = 384  # a member of its own (toy_member's are cached and shared), cut short
    toys = [toy_member("lc-profile-sp", "metaspace", seed=1), short]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names, max_tokens=2)
        assert llm.profile is not None and "max_input_tokens" not in llm.profile  # construction loads nothing
        assert llm.profile["tool_calling"] and llm.profile["structured_output"] and not llm.profile["image_inputs"]
        llm.invoke("Hi")  # the first call loads the members ...
        assert llm.profile["max_input_tokens"] == 384 == llm.context_window  # the verifier's, the smaller
        again = ChatEnsemble(models=names, max_tokens=2)  # ... and a later model of this configuration knows it at once
        assert again.profile is not None and again.profile["max_input_tokens"] == 384
        llm.close()
        again.close()


def test_tool_result_hint_goes_to_the_engine_only_with_tools(scripted: ScriptedEngine) -> None:
    @tool
    def magic(x: int) -> int:
        """Magic."""
        return x

    llm = ChatEnsemble(models=MODELS, tool_result_hint="Answer from the result.")
    llm.bind_tools([magic]).invoke("Hi")
    assert scripted.calls[-1][1]["tool_result_hint"] == "Answer from the result."  # the engine adds the turn
    llm.invoke("Hi")
    assert "tool_result_hint" not in scripted.calls[-1][1]
    ChatEnsemble(models=MODELS).bind_tools([magic]).invoke("Hi")
    assert "tool_result_hint" not in scripted.calls[-1][1]  # off by default
