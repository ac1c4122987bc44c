"""Review o of da4f1ba (structured-output fidelity): a forced call whose tool schema holds a $ref leading
nowhere crashed the request after generation (a 500; the validation let referencing's Unresolvable out);
one optional property whose enum had no value of its type dropped the whole constraint; an array of a
small integer range lost its minItems/maxItems (the range became a number enum, which the parser counts
twice); multipleOf was tested in floats past 2**53."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from shared_engine.json_constraint import _integer_range, start_state
from shared_engine.json_validation import schema_error
from tests.test_json_fidelity_o import _error, _writable
from tests.test_server_tools import ScriptedDecoding


class _Roomy(ScriptedDecoding):
    async def _retry_fits(self, messages: Any, plan: Any, gen: Any) -> bool:
        return True


def test_a_forced_call_under_an_unresolvable_ref_is_returned_not_a_crash() -> None:
    params = {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}
    assert schema_error({"a": 1}, params) is None  # no verdict where the schema cannot be resolved
    tool = {"type": "function", "function": {"name": "book", "parameters": params}}

    async def run() -> list[Any]:
        return [e async for e in _Roomy([' {"a": 1}}']).astream(
            [{"role": "user", "content": "Book."}], tools=[tool],
            tool_choice={"type": "function", "function": {"name": "book"}})]
    finish = asyncio.run(run())[-1]
    assert finish.type == "finish" and [(c.name, c.arguments) for c in finish.tool_calls] == [("book", {"a": 1})]


@pytest.mark.parametrize("sub", [{"type": "string", "enum": [1, 2]}, {"type": "integer", "enum": [1.5]},
                                 {"type": "string", "const": 5}])
def test_an_optional_property_with_no_value_of_its_type_keeps_the_constraint(sub: dict[str, Any]) -> None:
    schema = {"type": "object", "properties": {"x": sub, "y": {"type": "integer"}}, "required": ["y"]}
    assert start_state(schema, "") is not None
    assert _writable(schema, '{"y": 3}') and not _writable(schema, '{"x": 1, "y": 3}')


def test_an_array_of_a_small_integer_range_keeps_its_item_count() -> None:
    schema = {"type": "object", "required": ["x"], "properties": {"x": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 255}, "minItems": 3, "maxItems": 3}}}
    assert _writable(schema, '{"x": [1, 2, 3]}') and _error(schema, '{"x": [1, 2, 3]}') is None
    assert not _writable(schema, '{"x": [1, 2]}') and not _writable(schema, '{"x": [1, 2, 3, 4]}')


def test_multiple_of_is_exact_for_large_integers() -> None:
    values = _integer_range({"type": "integer", "minimum": 10**18, "maximum": 10**18 + 6, "multipleOf": 7})
    assert values == [v for v in range(10**18, 10**18 + 7) if v % 7 == 0]
