"""Anthropic-style ``tool_choice`` dicts ({"type": "any"|"auto"|"none"|"required"}), as LangChain and
Anthropic callers pass them: each reads as its string, and a refused value is named as it was passed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared_engine import InvalidRequestError
from shared_engine.tools import OutputOptions, OutputPlan, forced_tool, tool_call_text

TOOLS = [{"type": "function", "function": {"name": name, "parameters": {"type": "object", "properties": {}}}}
         for name in ("get_weather", "other")]
NAMES = ["get_weather", "other"]


@pytest.mark.parametrize(("choice", "forced"), [
    ({"type": "any"}, "any"), ({"type": "required"}, "any"), ({"type": "auto"}, None), ({"type": "none"}, None),
])
def test_type_dicts_read_as_their_string(choice: dict[str, Any], forced: str | None) -> None:
    assert forced_tool(choice, NAMES) == forced
    assert forced_tool(choice, ["get_weather"]) == (forced and "get_weather")  # one tool: its name


def test_the_plan_forces_offers_or_withholds_the_tools_as_the_string_would() -> None:
    for kind in ("any", "auto", "none", "required"):
        by_dict, by_string = (OutputPlan(OutputOptions(tools=TOOLS, tool_choice=c)) for c in ({"type": kind}, kind))
        assert (by_dict.forced, by_dict.tools) == (by_string.forced, by_string.tools), kind
    assert OutputPlan(OutputOptions(tools=TOOLS, tool_choice={"type": "none"})).tools is None
    assert OutputPlan(OutputOptions(tool_choice={"type": "auto"})).tools is None  # no tools: allowed, as "auto"
    with pytest.raises(InvalidRequestError, match="no tool is offered"):
        OutputPlan(OutputOptions(tool_choice={"type": "any"}))


def test_a_tool_named_by_type_tool_is_still_forced() -> None:
    assert forced_tool({"type": "tool", "name": "other"}, NAMES) == "other"


def test_a_refused_choice_is_named_as_passed() -> None:
    with pytest.raises(InvalidRequestError, match=r"tool_choice \{'type': 'tool', 'name': 'nope'\}"):
        forced_tool({"type": "tool", "name": "nope"}, NAMES)
    with pytest.raises(InvalidRequestError, match=r"tool_choice \{'type': 'bogus'\}"):
        forced_tool({"type": "bogus"}, NAMES)


def test_an_earlier_call_whose_arguments_read_as_no_object_is_shown_as_written() -> None:
    """tools.tool_call_text: a replayed assistant call whose arguments are no JSON object (OpenAI's own
    answers may carry such) was shown to the members as a call with ``{}``: they saw a call made
    without its arguments. It is shown as the string it is; an object (or one json_repair reads) stays
    an object, and no arguments stay ``{}``."""
    def shown(arguments: object) -> object:
        return json.loads(tool_call_text("lookup", arguments).splitlines()[1])["arguments"]

    assert shown("Paris please") == "Paris please"
    assert shown("[1, 2]") == "[1, 2]"
    assert shown('{"city": "Paris"}') == {"city": "Paris"}
    assert shown('{"city": "Paris"') == {"city": "Paris"}
    assert shown("") == {} and shown(None) == {} and shown("null") == {}
