"""Where the JSON constraint, the validation after it and a forced call's arguments disagreed with
the schema: an ``enum`` beside a ``type``, an array ``const``, a pattern's ``$`` (ECMA-262: the end
of the string only) and a forced call's arguments, which were never validated at all."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from shared_engine.events import Event
from shared_engine.json_constraint import call_start_state, start_state
from shared_engine.options import GenerationParams
from shared_engine.tools import OutputOptions, OutputPlan, ResponseFormat, format_error
from tests.test_json_constraint import feed
from tests.test_server_tools import ScriptedDecoding


def _holding(sub: object) -> dict[str, Any]:
    return {"type": "object", "properties": {"x": sub}, "required": ["x"]}


def _writable(schema: dict[str, Any], text: str) -> bool:
    state = feed(start_state(schema, ""), text)
    return state is not None and state.finished


def _x(value: str) -> str:
    return '{"x": ' + value + "}"


def _written_as_valid(sub: dict[str, Any], valid: list[str], invalid: list[str], refused: bool = True) -> None:
    """Each of ``valid`` (as x's value) passes the validation and can be written; none of ``invalid`` can be
    written (``refused``: and the validation refuses it too)."""
    schema = _holding(sub)
    for value in valid:
        assert _error(schema, _x(value)) is None and _writable(schema, _x(value)), value
    for value in invalid:
        assert not _writable(schema, _x(value)), value
        assert not refused or _error(schema, _x(value)) is not None, value


def _error(schema: dict[str, Any], text: str) -> str | None:
    return format_error(text, ResponseFormat.model_validate(
        {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}))


# -- enum and const values beside a type ----------------------------------------------------------

@pytest.mark.parametrize("sub, valid, invalid", [
    ({"type": "integer", "enum": [1, 2.5]}, ["1"], ["2.5"]),  # 2.5 was written, then refused: a retry wasted
    ({"type": "string", "enum": ["a", 1]}, ['"a"'], ["1"]),
    ({"type": ["string", "null"], "enum": ["a", None, 3]}, ['"a"', "null"], ["3"]),
    ({"type": "integer", "enum": [1.0]}, ["1"], ["1.0"]),  # the integer written as one (json.loads: an int)
    ({"type": "boolean", "const": True}, ["true"], ["false"]),
])
def test_an_enum_beside_a_type_writes_only_the_values_of_that_type(sub: dict[str, Any], valid: list[str],
                                                                    invalid: list[str]) -> None:
    _written_as_valid(sub, valid, invalid, refused=False)


# -- integer bounds ------------------------------------------------------------------------------------

@pytest.mark.parametrize("sub, valid, invalid", [
    ({"type": "integer", "minimum": 1, "maximum": 8}, ["1", "8"], ["0", "9", "99", "-1"]),  # 99 was written
    ({"type": "integer", "exclusiveMinimum": 0.5, "exclusiveMaximum": 12}, ["1", "11"], ["0", "12"]),
    ({"type": "integer", "minimum": -3, "maximum": 3, "multipleOf": 2}, ["-2", "0", "2"], ["1", "-3"]),
    ({"type": ["integer", "null"], "minimum": 1, "maximum": 3}, ["1", "null"], ["4"]),
])
def test_a_small_integer_range_is_enforced_while_written(sub: dict[str, Any], valid: list[str],
                                                         invalid: list[str]) -> None:
    _written_as_valid(sub, valid, invalid)
    call = feed(call_start_state({"f": _holding(sub)}, "f"), " " + _x(invalid[0]) + "}")
    assert call is None or not call.finished  # a forced call's arguments too


def test_a_wide_or_one_sided_integer_range_is_left_to_the_validation() -> None:
    for sub in ({"type": "integer", "minimum": 0, "maximum": 1000}, {"type": "integer", "minimum": 5}):
        assert _writable(_holding(sub), _x("-1")) and _error(_holding(sub), _x("-1")) is not None


# -- array const and enum values -------------------------------------------------------------------

@pytest.mark.parametrize("sub, valid, invalid", [
    ({"const": [1, 2]}, ["[1, 2]"], ["[2, 1]", '["a"]', "[1]"]),  # any array was written, then refused
    ({"enum": [[1], [1, 2], "a"]}, ["[1]", "[1, 2]", '"a"'], ["[2]", "[1, 2, 3]"]),
    ({"type": "array", "anyOf": [{"const": [1]}, {"const": [True, None]}]}, ["[1]", "[true, null]"], ["[3]"]),
    ({"type": "array", "items": {"const": [1]}}, ["[[1], [1]]"], ["[[2]]"]),
    ({"const": {"k": [1, 2]}}, ['{"k": [1, 2]}'], ['{"k": [2]}']),
])
def test_an_array_const_or_enum_value_is_written_as_it_is(sub: dict[str, Any], valid: list[str],
                                                          invalid: list[str]) -> None:
    _written_as_valid(sub, valid, invalid)


def test_an_array_const_holding_strings_stays_writable() -> None:
    """The parser ends a bare const at its first quote: such an array is left to the validation."""
    schema = _holding({"const": ["a b", {"k": "v"}, None]})
    text = '{"x": ["a b", {"k": "v"}, null]}'
    assert _error(schema, text) is None and _writable(schema, text)


# -- a pattern's $ ------------------------------------------------------------------------------------

@pytest.mark.parametrize("pattern, value, ok", [
    ("^a$", "a\n", False),  # Python's re matched $ before the trailing line break: accepted
    ("a$", "ba\n", False),
    ("^a$", "a", True),
    ("^a\\$$", "a$", True),   # an escaped $ and one in a class stay literal
    ("^[$]b$", "$b", True),
    ("^a|b$", "a\n", True),   # ^a matches
])
def test_a_patterns_dollar_is_the_end_of_the_string(pattern: str, value: str, ok: bool) -> None:
    schema = _holding({"type": "string", "pattern": pattern})
    assert (_error(schema, json.dumps({"x": value})) is None) is ok


# -- a forced call's arguments ------------------------------------------------------------------------

TOOL: dict[str, Any] = {"type": "function", "function": {"name": "book", "parameters": {
    "type": "object", "properties": {"seats": {"type": "integer", "minimum": 1, "maximum": 1000}},
    "required": ["seats"]}}}
FORCED = {"type": "function", "function": {"name": "book"}}


class _Roomy(ScriptedDecoding):
    """Scripted answers whose retries always fit (the toys' 512-token window holds no tools block)."""

    async def _retry_fits(self, messages: list[dict[str, Any]], plan: OutputPlan, gen: GenerationParams) -> bool:
        return True


def _run(answers: list[str]) -> tuple[list[Event], _Roomy]:
    engine = _Roomy(answers)

    async def collect() -> list[Event]:
        return [e async for e in engine.astream([{"role": "user", "content": "Book."}], tools=[TOOL],
                                                 tool_choice=FORCED)]
    return asyncio.run(collect()), engine


def test_a_forced_calls_arguments_out_of_range_are_retried_and_never_released() -> None:
    """The constraint does not enforce a wide range; the call ``{"seats": 5000}`` was returned as valid."""
    assert _writable_call('{"seats": 5000}')  # what the constraint lets through
    events, engine = _run([' {"seats": 5000}}', ' {"seats": 3}}'])
    retries = [e for e in events if e.type == "format_retry"]
    assert len(retries) == 1 and "seats: 5000 is greater than the maximum of 1000" in retries[0].error
    calls = [e for e in events if e.type == "tool_call"]
    assert [c.arguments for c in calls] == [{"seats": 3}]  # the rejected call never reached the caller
    finish = events[-1]
    assert finish.type == "finish" and finish.format_error is None and len(finish.rejected_attempts) == 1
    retry_prompt = engine.prompts[1][0]
    assert '{"seats": 5000}' in retry_prompt[-2]["content"] and retry_prompt[-1]["content"].endswith("book.")


def test_a_forced_call_never_valid_ends_with_its_call_and_the_format_error() -> None:
    events, engine = _run([' {"seats": 0}}'])
    finish = events[-1]
    assert len(engine.prompts) == 3 and finish.type == "finish"
    assert finish.format_error is not None and "less than the minimum of 1" in finish.format_error
    assert [c.arguments for c in finish.tool_calls] == [{"seats": 0}]


def test_a_call_the_members_chose_is_not_retried() -> None:
    plan = OutputPlan(OutputOptions(tools=[TOOL], tool_choice="auto"))
    assert plan.attempts == 1 and not plan.checked


def _writable_call(arguments: str) -> bool:
    state = feed(call_start_state({"book": TOOL["function"]["parameters"]}, "book"), " " + arguments + "}")
    return state is not None and state.finished
