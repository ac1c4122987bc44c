"""The validation after a structured answer on schemas whose definitions are each other's union options.

jsonschema goes round such a cycle without end (a RecursionError lost the answer, and a valid value
whose matching branch comes after the cycle's was lost too); the JSON constraint writes these schemas
(``_union_cycles_read``), so their answers must be checked, not crash."""
from __future__ import annotations

from typing import Any

import pytest

from shared_engine.tools import ResponseFormat, format_error

CYCLE_FIRST: dict[str, Any] = {  # A is B or "a", B is A or an integer: the cycle's branch comes first
    "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"type": "string", "enum": ["a"]}]},
              "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "integer"}]}},
    "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}

THROUGH_OBJECT: dict[str, Any] = {  # A is "a", B or {"w": A}; B is A or an integer
    "$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}, {"$ref": "#/$defs/Wrap"}, {"const": "a"}]},
              "B": {"anyOf": [{"$ref": "#/$defs/A"}, {"type": "integer"}]},
              "Wrap": {"type": "object", "properties": {"w": {"$ref": "#/$defs/A"}}, "required": ["w"],
                       "additionalProperties": False}},
    "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}}, "required": ["a"]}

TREE: dict[str, Any] = {  # recursion through a property only: unchanged
    "$defs": {"Node": {"type": "object", "properties": {"v": {"type": "integer"},
                                                        "kids": {"type": "array", "items": {"$ref": "#/$defs/Node"}}},
                       "required": ["v"]}},
    "$ref": "#/$defs/Node"}


def _error(schema: dict[str, Any], text: str) -> str | None:
    spec = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    return format_error(text, spec)


@pytest.mark.parametrize("text", ['{"a": "a"}', '{"a": 7}'])
def test_a_value_matching_after_the_cycle_is_valid(text: str) -> None:
    assert _error(CYCLE_FIRST, text) is None  # was a RecursionError


def test_a_value_matching_no_branch_is_told_which_field() -> None:
    error = _error(CYCLE_FIRST, '{"a": "b"}')
    assert error is not None and error.startswith("a: ") and "'b'" in error


@pytest.mark.parametrize(("text", "valid"), [
    ('{"a": "a"}', True), ('{"a": 3}', True), ('{"a": {"w": {"w": 5}}}', True), ('{"a": {"w": "a"}}', True),
    ('{"a": {"w": "b"}}', False), ('{"a": {"w": {"x": 1}}}', False), ('{"a": 2.5}', False)])
def test_a_cycle_beside_a_recursion_through_an_object(text: str, valid: bool) -> None:
    assert (_error(THROUGH_OBJECT, text) is None) == valid


@pytest.mark.parametrize(("text", "valid"), [
    ('{"v": 1, "kids": [{"v": 2, "kids": [{"v": 1}]}, {"v": 1}]}', True),
    ('{"v": 1, "kids": [{"v": 2, "kids": [{"v": "x"}]}]}', False),
    ('{"v": 1, "kids": [{"kids": []}]}', False)])
def test_a_recursion_through_properties_still_checks_every_level(text: str, valid: bool) -> None:
    assert (_error(TREE, text) is None) == valid
