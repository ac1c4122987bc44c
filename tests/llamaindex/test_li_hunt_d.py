"""FUNCTION-mode streaming structured output and tool calls fed back: LlamaIndex's streaming
programs (process_streaming_objects) read a turn's calls from ``message.additional_kwargs["tool_calls"]``
only, and an answer carrying its calls there and in ``ToolCallBlock``s must not send them twice."""

from __future__ import annotations

import json

from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, TextBlock, ToolCallBlock
from llama_index.core.prompts import PromptTemplate
from llama_index.core.tools import FunctionTool
from llama_index.core.types import PydanticProgramMode
from pydantic import BaseModel

from llamaindex_ensemble import to_engine_messages

from .conftest import scripted_llm

CALL = ['<tool_call>\n{"name": "Out", ', '"arguments": {"value": 42}}\n</tool_call>']
MULTIPLY_CALL = ['<tool_call>\n{"name": "multiply", ', '"arguments": {"a": 6, "b": 7}}\n</tool_call>']


class Out(BaseModel):
    value: int


def multiply(a: int, b: int) -> int:
    """Multiply two integers and return the product."""
    return a * b


def test_function_mode_stream_structured_predict_ends_with_the_called_object() -> None:
    llm, _ = scripted_llm(CALL, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    items = list(llm.stream_structured_predict(Out, PromptTemplate("q {x}"), x=1))
    assert items and items[-1] == Out(value=42)


async def test_function_mode_astream_structured_predict_ends_with_the_called_object() -> None:
    llm, _ = scripted_llm(CALL, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    items = [o async for o in await llm.astream_structured_predict(Out, PromptTemplate("q {x}"), x=1)]
    assert items and items[-1] == Out(value=42)


def test_structured_llm_stream_chat_ends_with_the_called_object() -> None:
    llm, _ = scripted_llm(CALL, pydantic_program_mode=PydanticProgramMode.FUNCTION)
    *_, last = llm.as_structured_llm(Out).stream_chat([ChatMessage(role=MessageRole.USER, content="q")])
    assert last.raw == Out(value=42)


def test_a_call_is_in_the_blocks_and_the_openai_field_alike() -> None:
    llm, _ = scripted_llm(MULTIPLY_CALL)
    response = llm.chat_with_tools([FunctionTool.from_defaults(fn=multiply)], user_msg="x")
    [block] = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
    [call] = response.message.additional_kwargs["tool_calls"]
    assert call == {"id": block.tool_call_id, "type": "function",
                    "function": {"name": "multiply", "arguments": json.dumps({"a": 6, "b": 7})}}
    assert [c.tool_kwargs for c in llm.get_tool_calls_from_response(response)] == [{"a": 6, "b": 7}]
    plain, _ = scripted_llm(["no call"])
    assert "tool_calls" not in plain.chat([ChatMessage(role=MessageRole.USER, content="q")]).message.additional_kwargs


def test_an_answer_fed_back_sends_its_calls_once() -> None:
    llm, _ = scripted_llm(MULTIPLY_CALL)
    response = llm.chat_with_tools([FunctionTool.from_defaults(fn=multiply)], user_msg="x")
    [assistant] = to_engine_messages([response.message])
    assert len(assistant["tool_calls"]) == 1
    both = ChatMessage(role=MessageRole.ASSISTANT,
                       blocks=[TextBlock(text=""), ToolCallBlock(tool_call_id="c1", tool_name="f", tool_kwargs={})],
                       additional_kwargs={"tool_calls": [{"id": "c1", "type": "function",
                                                          "function": {"name": "f", "arguments": "{}"}}]})
    assert [c["id"] for c in to_engine_messages([both])[0]["tool_calls"]] == ["c1"]
    # a message with only the legacy field (another LLM's, older LlamaIndex) is still read
    legacy = ChatMessage(role=MessageRole.ASSISTANT, blocks=[TextBlock(text="")],
                         additional_kwargs={"tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]})
    assert [c["function"]["name"] for c in to_engine_messages([legacy])[0]["tool_calls"]] == ["f"]


async def test_function_agent_streams_one_call_into_its_memory_once() -> None:
    llm, engine = scripted_llm(MULTIPLY_CALL, ["42."])
    result = await FunctionAgent(tools=[FunctionTool.from_defaults(fn=multiply)], llm=llm).run("6 times 7?")
    assert str(result) == "42."
    second = engine.requests[1][0]
    assert [m["role"] for m in second] == ["user", "assistant", "tool"]
    assert len(second[1]["tool_calls"]) == 1


def test_tool_required_forces_a_call_under_an_anthropic_style_auto_choice() -> None:
    llm, engine = scripted_llm(MULTIPLY_CALL)
    llm.chat_with_tools([FunctionTool.from_defaults(fn=multiply)], user_msg="x", tool_required=True,
                        tool_choice={"type": "auto"})
    assert engine.requests[-1][1]["tool_choice"] == "required"
