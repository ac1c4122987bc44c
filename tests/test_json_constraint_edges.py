"""Edges of the JSON constraint (shared_engine.json_constraint) where it and the validation
(``jsonschema``) read a schema differently: spaces in fixed strings, boolean consts, integers,
``additionalProperties`` beside ``properties``, Unicode ``\\d`` and ``\\s`` in a ``pattern``."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shared_engine.json_constraint import call_start_state, start_state
from tests.test_json_constraint import feed


def _holding(sub: object) -> dict:
    return {"type": "object", "properties": {"x": sub}, "required": ["x"]}


def _writable(schema: dict, text: str) -> bool:
    state = feed(start_state(schema, ""), text)  # byte by byte
    return state is not None and state.finished


# -- spaces in an enum value, a const, a key or a pattern string ---------------------------------

@pytest.mark.parametrize("value", [" a", "a" + " " * 17 + "b", " " * 20, "a "])
def test_a_fixed_string_starting_with_a_space_or_holding_a_long_run_of_them_is_writable(value: str) -> None:
    """The parser dropped a space at a string's start and capped a run of spaces at 16: such an
    enum value, const or key could not be written at all."""
    keyed = {"type": "object", "properties": {value: {"type": "integer"}}, "required": [value]}
    short = value.replace(" ", "", 1)  # one space short
    for schema, answer, wrong in ((_holding({"enum": [value, "z"]}), {"x": value}, {"x": short}),
                                  (_holding({"const": value}), {"x": value}, {"x": short}),
                                  (keyed, {value: 1}, {short: 1})):
        jsonschema.validate(answer, schema)
        assert _writable(schema, json.dumps(answer)), (schema, answer)
        assert not _writable(schema, json.dumps(wrong)), (schema, wrong)
    called = feed(call_start_state({"f": _holding({"enum": [value]})}, "f"), ' {"x": ' + json.dumps(value) + "}}")
    assert called is not None and called.finished


@pytest.mark.parametrize("pattern, value, ok", [
    ("^[ a]b$", "   ab", False),  # the parser let leading spaces by without its regex seeing them
    ("^[ a]b$", " b", True),
    ("^ x$", " x", True),        # and refused one the regex wants
    ("^abc$", " abc", False),
    ("b", "  " * 10 + "b", True),
])
def test_a_pattern_string_sees_its_leading_spaces(pattern: str, value: str, ok: bool) -> None:
    schema = _holding({"type": "string", "pattern": pattern})
    assert jsonschema.Draft202012Validator(schema).is_valid({"x": value}) is ok
    assert _writable(schema, json.dumps({"x": value})) is ok


# -- const and enum values the parser has no form for ---------------------------------------------

@pytest.mark.parametrize("sub, valid, invalid", [
    ({"const": True}, "true", "false"),  # any boolean went
    ({"const": False}, "false", "true"),
    ({"enum": [False, "no"]}, "false", "true"),
    ({"enum": [True, None]}, "null", "false"),
    ({"const": {"a": 1, "b": [True], "c": {"d": False}}}, '{"b": [true], "c": {"d": false}, "a": 1}', '{"a": 1}'),
    ({"const": {"a": True}}, '{"a": true}', '{"a": false}'),
    ({"enum": [{"a": 1}, {"b": "x"}]}, '{"b": "x"}', '{"a": "x"}'),
    ({"const": {}}, "{}", '{"a": 1}'),
])
def test_a_boolean_or_object_const_is_written_as_itself(sub: dict, valid: str, invalid: str) -> None:
    schema = _holding(sub)
    jsonschema.validate(json.loads(valid), sub)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(json.loads(invalid), sub)
    assert _writable(schema, '{"x": ' + valid + "}")
    assert not _writable(schema, '{"x": ' + invalid + "}")
    call = call_start_state({"f": schema}, "f")  # a forced call's arguments are not validated after
    assert feed(call, ' {"x": ' + invalid + "}}") is None
    assert feed(call, ' {"x": ' + valid + "}}").finished  # type: ignore[union-attr]


def test_an_array_of_a_boolean_const_takes_as_many_items_as_the_schema_says() -> None:
    schema = _holding({"type": "array", "items": {"const": True}, "minItems": 3, "maxItems": 3})
    assert _writable(schema, '{"x": [true, true, true]}')
    assert not _writable(schema, '{"x": [true, false, true]}')


# -- integers --------------------------------------------------------------------------------------

@pytest.mark.parametrize("sub, text, ok", [
    ({"type": "integer"}, "1e-3", False),  # the parser let an integer take an exponent: 0.001
    ({"type": "integer"}, "1E400", False),  # inf
    ({"type": "integer"}, "1e3", False),   # 1000.0: a float to json.loads and to a strict pydantic int
    ({"type": "integer"}, "-120", True),
    ({"type": "integer"}, "1.0", False),
    ({"type": ["integer", "null"]}, "2e1", False),
    ({"anyOf": [{"type": "integer"}, {"type": "string"}]}, "2e1", False),
    ({"type": "array", "items": {"type": "integer"}}, "[1, 2e1]", False),
    ({"type": "number"}, "1e-3", True),
    ({"type": ["integer", "number"]}, "1e-3", True),
    ({"anyOf": [{"type": "integer"}, {"type": "object"}]}, "12", True),
])
def test_an_integer_is_written_in_digits_alone(sub: dict, text: str, ok: bool) -> None:
    assert _writable(_holding(sub), '{"x": ' + text + "}") is ok
    root = feed(start_state(sub, ""), text)  # a number at the root is complete, never finished (more digits)
    assert (root is not None and root.complete) is ok
    if ok:
        jsonschema.validate(json.loads(text), sub)


# -- additionalProperties beside properties -------------------------------------------------------

STRINGS_BESIDE = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a", "b"],
                  "additionalProperties": {"type": "string"}}


@pytest.mark.parametrize("schema, text, ok", [
    (STRINGS_BESIDE, '{"a": 1, "b": "x"}', True),
    (STRINGS_BESIDE, '{"a": 1, "b": 5}', False),  # a required key beyond properties took any value
    ({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}, '{"k": 1, "j": 2}', True),
    ({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}, '{"k": "1"}', False),
    ({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}, "required": ["k"]}, "{}", False),
    ({"type": "object", "properties": {}}, "{}", True),  # an empty pydantic model: "{}" as before
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
     '{"a": 1}', True),
])
def test_additional_properties_give_the_value_of_keys_beyond_properties(schema: dict, text: str, ok: bool) -> None:
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) is ok
    assert _writable(schema, text) is ok


# -- \d and \s in a pattern, as Python's re (the validation) reads them ----------------------------

@pytest.mark.parametrize("pattern, value, ok", [
    ("^\\d+$", "١٢٣", True),     # Arabic-Indic digits: \d to re, not to the parser's regex library
    ("^[\\d.]+$", "٣.١", True),
    ("^a\\sb$", "a\u00a0b", True),  # a no-break space: \s to re
    ("^[^\\s]+$", "a\u3000b", False),
    ("^\\D+$", "١", False),        # the parser let it through
    ("^[^\\d]+$", "x١", False),
    ("^\\S+$", "a\u2003b", False),
    ("^\\d+$", "12a", False),
    ("^\\d+$", "é", False),
    ("^\\d+$", "42", True),
    ("^[\\w\\d]+$", "é٣", True),
])
def test_a_patterns_digits_and_whitespace_are_unicode_as_the_validation_reads_them(
        pattern: str, value: str, ok: bool) -> None:
    schema = _holding({"type": "string", "pattern": pattern})
    assert jsonschema.Draft202012Validator(schema).is_valid({"x": value}) is ok
    assert _writable(schema, json.dumps({"x": value}, ensure_ascii=False)) is ok


@pytest.mark.parametrize("raw", ["\t", "\n"])
def test_a_string_takes_no_raw_control_character_even_where_a_pattern_would(raw: str) -> None:
    schema = _holding({"type": "string", "pattern": "^a\\sb$"})  # \s offered a raw tab: invalid JSON
    assert not _writable(schema, '{"x": "a' + raw + 'b"}')
    assert _writable(schema, '{"x": "a b"}')
