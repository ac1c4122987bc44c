"""Tool prompt and tool-call parsing, message conversion and bad input: no model is loaded."""

from __future__ import annotations

import json

import pytest
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    ChatMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.tools import tool

from langchain_ensemble import ChatEnsemble
import langchain_ensemble
from langchain_ensemble._tools import (
    ParsedCall,
    ToolCallStreamParser,
    ToolPromptMember,
    call_prefix,
    forced_tool,
    parse_calls,
    with_tools_system,
)
from langchain_ensemble.chat_models import to_engine_messages
from shared_engine import InvalidRequestError

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather at a place.",
                                           "parameters": {"type": "object",
                                                          "properties": {"location": {"type": "string"}}}}}]


def run_parser(deltas: list[str], prefix: str = "") -> tuple[str, list[ParsedCall]]:
    parser = ToolCallStreamParser(["get_weather"], prefix)
    pieces = [p for d in deltas for p in parser.feed(d)] + parser.close()
    text = "".join(p for p in pieces if isinstance(p, str))
    return text, [p for p in pieces if isinstance(p, ParsedCall)]


def char_deltas(text: str) -> list[str]:
    return list(text)  # the hardest split: one character at a time


def test_plain_text_passes_through_unchanged() -> None:
    answer = " It is sunny <b>today</b>, 20 °C. <tool is a word>\n"
    assert run_parser(char_deltas(answer)) == (answer, [])


def test_tagged_call_is_parsed_and_markup_never_leaks() -> None:
    answer = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
    text, calls = run_parser(char_deltas(answer))
    assert text == "Let me check."
    assert [(c.name, json.loads(c.args)) for c in calls] == [("get_weather", {"location": "Paris"})]
    assert calls[0].id.startswith("call_")


def test_two_calls_get_distinct_ids() -> None:
    one = '<tool_call>{"name": "get_weather", "arguments": {"location": "A"}}</tool_call>'
    _, calls = run_parser([one + "\n" + one.replace('"A"', '"B"')])
    assert [json.loads(c.args)["location"] for c in calls] == ["A", "B"]
    assert calls[0].id != calls[1].id


def test_prefilled_unterminated_call_with_unicode() -> None:
    prefix = call_prefix("get_weather")
    assert prefix == '<tool_call>\n{"name": "get_weather", "arguments":'
    text, calls = run_parser([' {"location": "東京", "note": "こんにちは"}}\n'], prefix)
    assert text == ""
    assert json.loads(calls[0].args) == {"location": "東京", "note": "こんにちは"}
    assert "東京" in calls[0].args  # not \\u-escaped


def test_bare_json_answer_naming_a_bound_tool_is_a_call() -> None:
    text, calls = run_parser(char_deltas('```json\n{"name": "get_weather", "arguments": {"location": "Oslo"}}\n```'))
    assert (text, calls[0].name) == ("", "get_weather")


def test_bare_json_answer_not_naming_a_tool_stays_text() -> None:
    answer = '{"city": "Oslo", "temp": 3}'
    assert run_parser(char_deltas(answer)) == (answer, [])


def test_truncated_and_sloppy_calls() -> None:
    [call] = parse_calls('{"name": "get_weather", "arguments": {"location": "Ber')  # cut by max_tokens
    assert json.loads(call.args) == {"location": "Ber"}
    [call] = parse_calls('{"name": "get_weather", "arguments": "{\\"location\\": \\"Rome\\"}"} trailing')
    assert json.loads(call.args) == {"location": "Rome"}
    [call] = parse_calls('{"name": "get_weather", "parameters": {}}')
    assert (call.name, call.args) == ("get_weather", "{}")


def test_unparseable_call_becomes_an_invalid_tool_call() -> None:
    [call] = parse_calls("get_weather(Paris)")
    assert call.name is None and call.args == "get_weather(Paris)"
    from langchain_core.messages.tool import tool_call_chunk
    message = AIMessageChunk(content="", tool_call_chunks=[
        tool_call_chunk(name=call.name, args=call.args, id=call.id, index=0)])
    assert message.tool_calls == [] and len(message.invalid_tool_calls) == 1


def test_tool_choice_normalisation() -> None:
    two = TOOLS + [{"type": "function", "function": {"name": "other", "parameters": {}}}]
    assert forced_tool(None, two) is None and forced_tool("auto", two) is None
    assert forced_tool("any", TOOLS) == "get_weather"  # one tool: its name is prefilled too
    assert forced_tool("required", two) == "any" and forced_tool(True, two) == "any"
    assert forced_tool({"type": "function", "function": {"name": "other"}}, two) == "other"
    with pytest.raises(ValueError, match="not 'auto'"):
        forced_tool("nope", two)


def test_documented_format_goes_into_the_system_message() -> None:
    rendered = with_tools_system([{"role": "user", "content": "hi"}], TOOLS)
    assert rendered[0]["role"] == "system" and "<tools>" in rendered[0]["content"]
    assert json.dumps(TOOLS[0]) in rendered[0]["content"]
    rendered = with_tools_system([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS)
    assert rendered[0]["content"].startswith("Be brief.\n\n# Tools")


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
    assert [m["role"] for m in out] == ["system", "user", "assistant", "user", "assistant"]
    assert out[1]["content"] == "weather in Paris?"
    assert out[2]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
    assert out[3]["content"] == ("<tool_response>\nsunny\n</tool_response>\n"
                                 "<tool_response>\nError: boom\n</tool_response>")


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
    with pytest.raises(ValueError, match="bound tools"):
        llm.bind_tools([get_weather], tool_choice="get_time")


def test_public_surface() -> None:
    assert sorted(langchain_ensemble.__all__) == ["ChatEnsemble", "__version__"]


class StubMember:
    """Enough of an engine member to see what ToolPromptMember hands it."""

    name = "stub"
    tokenizer = None  # no chat template: the documented format is used

    class table:  # noqa: N801 - mimics the attribute
        @staticmethod
        def encode_fragment(text: str) -> list[int]:
            return [ord(c) for c in text]

    def __init__(self) -> None:
        self.seen: list[dict] = []

    def prompt_ids(self, messages: list[dict]) -> list[int]:
        self.seen = list(messages)
        return [1, 2, 3]


def test_tool_prompt_member_renders_tools_instruction_and_prefill() -> None:
    member = StubMember()
    proxy = ToolPromptMember(member, TOOLS, "get_weather", call_prefix("get_weather"))
    ids = proxy.prompt_ids([{"role": "user", "content": "Weather in Oslo?"}])
    assert ids[:3] == [1, 2, 3] and "".join(map(chr, ids[3:])) == call_prefix("get_weather")
    assert [m["role"] for m in member.seen] == ["system", "user", "system"]
    assert "<tools>" in member.seen[0]["content"] and "get_weather" in member.seen[2]["content"]
    assert proxy.name == "stub"  # everything else is the shared member's
