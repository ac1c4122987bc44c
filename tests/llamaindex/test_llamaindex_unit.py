"""EnsembleLLM without models: class contract, message conversion, tool translation, the eight
methods over a scripted engine (events, spans, usage), and a FunctionAgent round trip. Tool-call
parsing itself is the engine's (tests/test_tools.py)."""

from __future__ import annotations

import inspect

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.base import BaseLLM
from llama_index.core.base.llms.types import ChatMessage, ImageBlock, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.callbacks import CallbackManager, TokenCountingHandler
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from pydantic import BaseModel

import llamaindex_ensemble
from llamaindex_ensemble import EnsembleDecisionEvent, EnsembleFinishEvent, EnsembleLLM, to_engine_messages
from llamaindex_ensemble.base import DEFAULT_TOOL_RESULT_HINT
from shared_engine import InvalidRequestError

from .conftest import scripted_llm

USER = [ChatMessage(role=MessageRole.USER, content="Hi there")]


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


MULTIPLY = FunctionTool.from_defaults(fn=multiply)


# --- contract -----------------------------------------------------------------------------------

def test_embedding_class() -> None:  # the name the official llama-index-llms-* tests use
    names = [b.__name__ for b in EnsembleLLM.__mro__]
    assert BaseLLM.__name__ in names and FunctionCallingLLM.__name__ in names


def test_public_api() -> None:
    assert set(llamaindex_ensemble.__all__) == {
        "EnsembleDecisionEvent", "EnsembleFinishEvent", "EnsembleLLM", "EnsembleSpanEvent", "EnsembleStepEvent",
        "__version__", "to_engine_messages"}
    assert llamaindex_ensemble.__version__


def test_importable_as_a_llama_index_namespace_portion() -> None:
    import llama_index
    from llama_index.llms.safe_ensemble import EnsembleLLM as Same
    from llama_index.llms.safe_ensemble import __version__

    assert Same is EnsembleLLM and __version__ == llamaindex_ensemble.__version__
    assert len(llama_index.__path__) >= 2  # merged with llama-index-core's, not shadowing it


def test_constructor_splits_llm_fields_from_engine_options() -> None:
    llm = EnsembleLLM(models=["a", "b"], max_tokens=32, temperature=0.5, draft_length=3, fusion="gac",
                      system_prompt="Be brief.", context_window=2048)
    assert llm.engine.options.draft_length == 3 and llm.engine.options.fusion == "gac"
    assert llm.engine.options.max_new_tokens == 32 and llm.engine.options.temperature == 0.5
    assert llm.engine_options == {"draft_length": 3, "fusion": "gac"} and llm.system_prompt == "Be brief."
    meta = llm.metadata  # context_window given: no member is loaded
    assert (meta.context_window, meta.num_output, meta.is_chat_model, meta.is_function_calling_model) == \
        (2048, 32, True, True)
    assert meta.model_name == "safe(a+b)" and llm.class_name() == "EnsembleLLM"


def test_a_deep_copy_shares_the_engine_and_copies_the_fields() -> None:
    """``copy.deepcopy(llm)`` / ``llm.model_copy(deep=True)`` raised "cannot pickle '_thread.lock'"
    (the engine's locks); a copy now shares the engine, and its own fields change alone."""
    import copy

    llm = EnsembleLLM(models=["a", "b"], max_tokens=32, draft_length=3)
    for clone in (copy.deepcopy(llm), llm.model_copy(deep=True)):
        assert clone is not llm and clone.engine is llm.engine
        assert clone.engine_options == {"draft_length": 3} and clone.engine_options is not llm.engine_options
        clone.max_tokens = 8
        assert llm.max_tokens == 32
    scripted, _ = scripted_llm(["Hi."])
    assert copy.deepcopy(scripted).complete("hello").text == "Hi."


def test_max_new_tokens_is_max_tokens() -> None:
    """The engine's name, which ChatEnsemble takes too, was a raw TypeError ("multiple values")."""
    llm = EnsembleLLM(models=["a", "b"], max_new_tokens=8)
    assert llm.max_tokens == 8 and llm.engine.options.max_new_tokens == 8 and llm.engine_options == {}
    assert EnsembleLLM(models=["a", "b"]).max_tokens == 256


@pytest.mark.parametrize("kwargs, match", [
    ({"models": []}, "at least one member"),
    ({"models": ["a"]}, "at least two members"),
    ({"models": ["a", "b"], "method": "vote"}, "method"),
    ({"models": ["a", "b"], "draft_lenght": 3}, "draft_lenght"),
    ({"models": ["a", "b"], "weights": [1.0]}, "weights"),
    ({"models": ["a", "b"], "engine_options": {"temperature": 0.5}}, r"engine_options \['temperature'\]"),
    ({"models": ["a", "b"], "engine_options": {"max_new_tokens": 8}}, "max_new_tokens"),
    ({"models": ["a", "b"], "max_new_tokens": 8, "max_tokens": 9}, "not both"),
])
def test_bad_construction_is_a_clear_value_error(kwargs: dict, match: str) -> None:
    with pytest.raises(InvalidRequestError, match=match):
        EnsembleLLM(**kwargs)


# --- message conversion ---------------------------------------------------------------------------

def test_messages_with_tool_calls_and_results_become_engine_dicts() -> None:
    messages = [
        ChatMessage(role=MessageRole.SYSTEM, content="sys"),
        ChatMessage(role=MessageRole.USER, content="What is 6 times 7?"),
        ChatMessage(role=MessageRole.ASSISTANT, blocks=[
            TextBlock(text=""), ToolCallBlock(tool_call_id="c1", tool_name="multiply", tool_kwargs={"a": 6, "b": 7})]),
        ChatMessage(role=MessageRole.TOOL, content="42", additional_kwargs={"tool_call_id": "c1"}),
        ChatMessage(role=MessageRole.ASSISTANT, content="",
                    additional_kwargs={"tool_calls": [{"function": {"name": "f", "arguments": '{"x": 1}'}}]}),
    ]
    converted = to_engine_messages(messages)
    assert [m["role"] for m in converted] == ["system", "user", "assistant", "tool", "assistant"]
    assert converted[2]["tool_calls"] == [{"id": "c1", "type": "function",
                                           "function": {"name": "multiply", "arguments": {"a": 6, "b": 7}}}]
    assert (converted[3]["content"], converted[3]["tool_call_id"]) == ("42", "c1")
    assert converted[4]["tool_calls"][0]["function"] == {"name": "f", "arguments": '{"x": 1}'}


def test_non_text_blocks_are_rejected() -> None:
    with pytest.raises(InvalidRequestError, match="text-only"):
        to_engine_messages([ChatMessage(role=MessageRole.USER, blocks=[ImageBlock(url="http://x/y.png")])])
    with pytest.raises(InvalidRequestError, match="sequence of ChatMessage"):
        to_engine_messages("hello")  # type: ignore[arg-type]


def test_requests_are_validated_at_call_time() -> None:
    llm, engine = scripted_llm(["x"])
    with pytest.warns(UserWarning, match="ignores the unknown argument 'format'") as warned:
        llm.chat(USER, format="json")  # another provider's option: ignored, as other LLMs do
    assert warned[0].filename == __file__  # the user's line, not LlamaIndex's dispatcher
    for call in (lambda: llm.complete("hi", format="json"), lambda: list(llm.stream_chat(USER, format="json"))):
        with pytest.warns(UserWarning, match="ignores the unknown argument") as warned:
            call()
        assert warned[0].filename == __file__
    engine.requests.clear()
    with pytest.raises(InvalidRequestError, match="temperature"):
        llm.chat(USER, temperature=-1)
    with pytest.raises(InvalidRequestError, match="empty"):
        llm.chat([ChatMessage(role=MessageRole.USER, content="  ")])
    with pytest.raises(InvalidRequestError, match="tool_choice 'divide'"):
        llm.chat(USER, tools=[MULTIPLY], tool_choice="divide")
    assert engine.requests == []
    llm.chat(USER, max_tokens=5, stop="\n", seed=1)
    assert engine.requests[0][1] == {"max_new_tokens": 5, "temperature": 0.0, "stop": "\n", "seed": 1}
    llm.max_tokens, llm.temperature = 9, 0.7  # fields are read per request
    llm.chat(USER)
    assert engine.requests[1][1] == {"max_new_tokens": 9, "temperature": 0.7}


def test_tools_reach_the_engine_as_openai_specs_and_hint_follows_results() -> None:
    llm, engine = scripted_llm(["ok"])
    history = [ChatMessage(role=MessageRole.SYSTEM, content="You are a calculator."), *USER,
               ChatMessage(role=MessageRole.ASSISTANT, blocks=[ToolCallBlock(tool_name="multiply", tool_kwargs={})]),
               ChatMessage(role=MessageRole.TOOL, content="42")]
    llm.chat(history, tools=[MULTIPLY], tool_choice="multiply")
    messages, params = engine.requests[0]
    assert [t["function"]["name"] for t in params["tools"]] == ["multiply"] and params["tool_choice"] == "multiply"
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool"]
    assert params["tool_result_hint"] == DEFAULT_TOOL_RESULT_HINT  # the engine adds the turn (tests/test_tools.py)
    llm.tool_result_hint = None
    llm.chat(history, tools=[MULTIPLY])
    assert "tool_result_hint" not in engine.requests[1][1]


# --- the eight methods over a scripted engine ------------------------------------------------------

PIECES = ["The", " answer", " is", " 42", "."]
START = {"chat": "LLMChatStartEvent", "completion": "LLMCompletionStartEvent"}
END = {"chat": "LLMChatEndEvent", "completion": "LLMCompletionEndEvent"}


async def _call(llm: EnsembleLLM, method: str) -> list:
    """Run one public method; return its responses (one for non-streaming methods)."""
    arg = "Question?" if "complete" in method else USER
    result = getattr(llm, method)(arg)
    if inspect.iscoroutine(result):
        result = await result
    if method.startswith("astream"):
        return [r async for r in result]
    if method.startswith("stream"):
        return list(result)
    return [result]


@pytest.mark.parametrize("method", ["chat", "stream_chat", "complete", "stream_complete",
                                    "achat", "astream_chat", "acomplete", "astream_complete"])
async def test_each_method_streams_usage_and_events_once(method: str, collector) -> None:
    llm, _ = scripted_llm(PIECES)
    responses = await _call(llm, method)
    final = responses[-1]
    text = final.text if "complete" in method else final.message.content
    assert text == "The answer is 42."
    if "stream" in method:
        assert all(r.delta is not None for r in responses)
        assert "".join(r.delta for r in responses) == text
        assert all(r.raw is None for r in responses[:-1])
    assert final.raw["usage"] == {"prompt_tokens": 7, "completion_tokens": 5, "total_tokens": 12}
    assert final.raw["ensemble"]["ensembled_tokens"] == 1 and final.additional_kwargs["finish_reason"] == "stop"

    kind = "completion" if "complete" in method else "chat"
    starts, ends = collector.named(START[kind]), collector.named(END[kind])
    assert len(starts) == 1 and len(ends) == 1, "each public call sends exactly one start/end pair"
    assert collector.named(START["chat" if kind == "completion" else "completion"]) == []
    span = starts[0].span_id
    assert span and span.startswith(f"EnsembleLLM.{method}-")
    decisions = collector.named("EnsembleDecisionEvent")
    finishes = collector.named("EnsembleFinishEvent")
    assert len(decisions) == 1 and len(finishes) == 1
    assert {e.span_id for e in decisions + finishes} == {span}
    decision: EnsembleDecisionEvent = decisions[0]
    assert decision.chosen == " answer" and decision.model_name == "safe(drafter+verifier)"
    assert isinstance(finishes[0], EnsembleFinishEvent) and finishes[0].stats.tokens == 5
    order = [e.class_name() for e in collector.events]
    assert order.index("EnsembleDecisionEvent") < order.index(END[kind])


async def test_sync_methods_work_inside_a_running_loop() -> None:
    llm, _ = scripted_llm(PIECES)
    assert llm.chat(USER).message.content == "The answer is 42."
    assert "".join(r.delta for r in llm.stream_complete("Q")) == "The answer is 42."


async def test_stopping_a_stream_early_closes_the_engine_stream() -> None:
    llm, engine = scripted_llm(PIECES, PIECES)
    stream = await llm.astream_chat(USER)
    async for first in stream:
        break
    await stream.aclose()
    assert first.delta == "The"
    assert (await llm.achat(USER)).message.content == "The answer is 42."


async def test_streamed_tool_call_markup_is_held_back() -> None:
    llm, _ = scripted_llm(["Let me check.", "\n<tool", "_call>\n", '{"name": "multiply", ',
                           '"arguments": {"a": 6, "b": 7}}', "\n</tool_call>"])
    responses = [r async for r in await llm.astream_chat_with_tools([MULTIPLY], user_msg="6*7?")]
    assert [r.delta for r in responses] == ["Let me check.", ""]  # whitespace next to a call is dropped
    final = responses[-1]
    assert final.message.content == "Let me check."
    calls = llm.get_tool_calls_from_response(final)
    assert [(c.tool_name, c.tool_kwargs) for c in calls] == [("multiply", {"a": 6, "b": 7})]
    assert calls[0].tool_id.startswith("call_")


def test_chat_with_tools_and_errors_without_calls() -> None:
    llm, _ = scripted_llm(['{"name": "multiply", "arguments": {"a": 2, "b": 3}}'], ["No tool needed."])
    response = llm.chat_with_tools([MULTIPLY], user_msg="2*3?")
    assert [c.tool_kwargs for c in llm.get_tool_calls_from_response(response)] == [{"a": 2, "b": 3}]
    response = llm.chat_with_tools([MULTIPLY], user_msg="hi")
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []
    with pytest.raises(ValueError, match="Expected at least one tool call"):
        llm.get_tool_calls_from_response(response)


def test_single_tool_call_unless_parallel_allowed() -> None:
    two = '<tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 2}}</tool_call>' * 2
    llm, _ = scripted_llm([two], [two])
    assert len(llm.get_tool_calls_from_response(llm.chat_with_tools([MULTIPLY], user_msg="x"))) == 1
    response = llm.chat_with_tools([MULTIPLY], user_msg="x", allow_parallel_tool_calls=True)
    assert len(llm.get_tool_calls_from_response(response)) == 2


async def test_a_stream_with_parallel_calls_off_asks_the_engine_for_one_call() -> None:
    """stream_chat_with_tools (FunctionAgent streams) ignored allow_parallel_tool_calls=False: only
    the non-streaming path trimmed the extra calls, so an agent ran every call the members wrote."""
    two = '<tool_call>{"name": "multiply", "arguments": {"a": 1, "b": 2}}</tool_call>' * 2
    for allowed, expected in ((False, 1), (True, 2)):
        llm, engine = scripted_llm([two])
        *_, last = llm.stream_chat_with_tools([MULTIPLY], user_msg="x", allow_parallel_tool_calls=allowed)
        assert len(llm.get_tool_calls_from_response(last)) == expected
        stream = await llm.astream_chat_with_tools([MULTIPLY], user_msg="x", allow_parallel_tool_calls=allowed)
        *_, last = [response async for response in stream]
        assert len(llm.get_tool_calls_from_response(last)) == expected
        assert [r[1].get("parallel_tool_calls") for r in engine.requests] == [False if not allowed else None] * 2


async def test_function_agent_round_trip_with_scripted_answers() -> None:
    llm, engine = scripted_llm(['{"name": "multiply", "arguments": {"a": 6, "b": 7}}'], ["6 times 7 is ", "42."])
    agent = FunctionAgent(tools=[MULTIPLY], llm=llm)
    result = await agent.run("What is 6 times 7?")
    assert str(result) == "6 times 7 is 42."
    second = engine.requests[1][0]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert engine.requests[1][1]["tool_result_hint"] == DEFAULT_TOOL_RESULT_HINT
    assert second[1]["tool_calls"][0]["function"] == {"name": "multiply", "arguments": {"a": 6, "b": 7}}
    assert second[2]["content"] == "42"


class City(BaseModel):
    name: str
    country: str


async def test_structured_predict_asks_the_engine_for_json_under_the_schema() -> None:
    # The engine prefills "{" and decodes under the schema; the members write the rest.
    answer = ['"name": "Paris", ', '"country": "France"}']
    llm, engine = scripted_llm(answer, answer, answer, answer)
    prompt = PromptTemplate("Extract the city from: {text}")
    paris = City(name="Paris", country="France")
    assert llm.structured_predict(City, prompt, text="I live in Paris.") == paris
    assert await llm.astructured_predict(City, prompt, text="I live in Paris.") == paris
    assert list(llm.stream_structured_predict(City, prompt, text="I live in Paris.")) == [paris]
    assert [c async for c in await llm.astream_structured_predict(City, prompt, text="I live in Paris.")] == [paris]
    messages, params = engine.requests[0]
    assert params["response_format"] == {"type": "json_schema",
                                         "json_schema": {"name": "City", "schema": City.model_json_schema()}}
    assert "tools" not in params and messages[-1]["content"] == "Extract the city from: I live in Paris."


def test_structured_predict_reports_an_answer_that_never_validated() -> None:
    llm, _ = scripted_llm(['"name": "Paris"}'])
    with pytest.raises(ValueError, match="not a valid City: the object: 'country' is a required property"):
        llm.structured_predict(City, PromptTemplate("Extract the city from: {text}"), text="I live in Paris.")


async def test_token_counting_handler_reads_the_usage() -> None:
    counter = TokenCountingHandler()
    llm, _ = scripted_llm(PIECES, PIECES, callback_manager=CallbackManager([counter]))
    llm.chat(USER)
    [r async for r in await llm.astream_chat(USER)]
    assert counter.prompt_llm_token_count == 14 and counter.completion_llm_token_count == 10
