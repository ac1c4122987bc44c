"""A tool call the engine could not read (a tool not offered, arguments cut off) left no trace: an
agent's answer was '' with nothing in ``additional_kwargs`` or ``raw`` saying a call was dropped, and
``get_tool_calls_from_response`` said "0 tool calls; the answer was: ''" without naming it."""

from __future__ import annotations

import asyncio

import pytest
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.tools import FunctionTool

from .conftest import scripted_llm

UNKNOWN = ['<tool_call>\n{"name": "mul", ', '"arguments": {"a": 3, "b": 4}}\n</tool_call>']
CUT = ['<tool_call>\n{"name": "multiply", ', '"arguments": {"a": 3, "b": ']


def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    return a * b


TOOL = FunctionTool.from_defaults(multiply)


@pytest.mark.parametrize(("answer", "name", "error"), [(UNKNOWN, "mul", "'mul' is not an offered tool"),
                                                       (CUT, "multiply", "cut off before the call's JSON ends")])
def test_an_agent_shows_the_call_it_could_not_run(answer: list[str], name: str, error: str) -> None:
    llm, engine = scripted_llm(answer, ["12"])
    agent = FunctionAgent(tools=[TOOL], llm=llm)

    async def run() -> object:
        return await agent.run(user_msg="3*4?")

    output = asyncio.run(run())
    assert len(engine.requests) == 1 and str(output) == ""
    [call] = output.response.additional_kwargs["invalid_tool_calls"]  # type: ignore[attr-defined]
    assert (call["name"], call["error"]) == (name, error) and call["id"].startswith("call_")
    assert call["args"] == "".join(answer).removeprefix("<tool_call>\n").removesuffix("\n</tool_call>").strip()
    assert output.raw["invalid_tool_calls"] == [call]  # type: ignore[attr-defined]


@pytest.mark.parametrize("stream", [False, True])
def test_the_no_call_error_names_the_unreadable_call(stream: bool) -> None:
    llm, _ = scripted_llm(CUT)
    messages = [ChatMessage(role=MessageRole.USER, content="3*4?")]
    if stream:
        *_, response = llm.stream_chat_with_tools([TOOL], chat_history=messages)
    else:
        response = llm.chat_with_tools([TOOL], chat_history=messages)
    with pytest.raises(ValueError, match=r"""0 tool calls; 1 unreadable call\(s\): cut off before the call's JSON """
                                         r"""ends: '\{"name": "multiply", "arguments": \{"a": 3, "b":'; the answer"""):
        llm.get_tool_calls_from_response(response)
    assert llm.get_tool_calls_from_response(response, error_on_no_tool_call=False) == []

