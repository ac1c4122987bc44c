"""Review g's finding in json_constraint.py: a tree recursing through array items (a pydantic model
with ``children: list[Tree]``, a JSON-value alias) got no JSON constraint at all, as telling whether
the parser counts the items twice (``_Rewrite._counted_twice``) rewrote the definition again and
reached its own items' ``$ref`` without end. Pure functions and the byte-level prefix check."""

from __future__ import annotations

import json
from typing import Any, Union

import jsonschema
import pytest
from pydantic import BaseModel, Field, TypeAdapter
from typing_extensions import TypeAliasType

from shared_engine.json_constraint import start_state
from tests.test_json_constraint import feed

# a JSON-value alias (an implicit recursive alias recurses in pydantic itself; 3.11 has no `type`)
JV = TypeAliasType("JV", Union[int, str, None, list["JV"], dict[str, "JV"]])  # noqa: UP007


class Tree(BaseModel):
    name: str
    children: list[Tree] = []


class Node(BaseModel):
    value: int
    kids: dict[str, Node] = {}  # through a dict alone: constrained before too (no array items)


class Grove(BaseModel):
    value: int
    kids: dict[str, list[Grove]] = {}


class A(BaseModel):
    name: str
    bs: list[B] = []


class B(BaseModel):
    flag: bool
    as_: list[A] = []


class Bounded(BaseModel):
    name: str
    children: list[Bounded] = Field(default=[], max_length=2)


SCHEMAS: dict[str, dict[str, Any]] = {
    "tree": Tree.model_json_schema(),
    "json value": TypeAdapter(JV).json_schema(),
    "dict tree": Node.model_json_schema(),
    "dict of lists tree": Grove.model_json_schema(),
    "mutual": A.model_json_schema(),
    "bounded tree": Bounded.model_json_schema(),
    # a recursive union holding booleans: the items are counted twice, so the bounds stay the validation's
    "boolean tree": {"type": "array", "items": {"$ref": "#/$defs/V"}, "minItems": 3, "maxItems": 3,
                     "$defs": {"V": {"anyOf": [{"type": "boolean"},
                                               {"type": "array", "items": {"$ref": "#/$defs/V"}}]}}},
}


def _writable(schema: dict[str, Any], text: str) -> bool:
    """Whether ``text`` is a whole answer (complete: a bare number could still go on, so not finished)."""
    state = feed(start_state(schema, ""), text)
    return state is not None and state.parser is not None and state.complete


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_a_tree_through_array_items_is_constrained(name: str) -> None:
    assert start_state(SCHEMAS[name], "") is not None  # before: a RecursionError, caught: no constraint


@pytest.mark.parametrize("name, value", [
    ("tree", {"name": "a", "children": [{"name": "b", "children": [{"name": "c", "children": []}]},
                                        {"name": "d"}]}),
    ("tree", {"name": "leaf"}),
    ("json value", {"a": [1, "x", None, {"b": [], "c": {"d": [2, [3]]}}], "e": 4}),
    ("json value", [[[]], "s", None]),
    ("json value", 7),
    ("dict tree", {"value": 1, "kids": {"x": {"value": 2, "kids": {"y": {"value": 3}}}, "z": {"value": 4}}}),
    ("dict of lists tree", {"value": 1, "kids": {"x": [{"value": 2, "kids": {"y": []}}, {"value": 3}]}}),
    ("mutual", {"name": "a", "bs": [{"flag": True, "as_": [{"name": "b", "bs": [{"flag": False}]}]}]}),
    ("bounded tree", {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}, {"name": "d"}]},
                                                {"name": "e"}]}),
    ("boolean tree", [True, [False, [True]], []]),
])
def test_a_valid_tree_is_writable(name: str, value: Any) -> None:
    text = json.dumps(value)
    jsonschema.validate(value, SCHEMAS[name])
    assert _writable(SCHEMAS[name], text)


@pytest.mark.parametrize("name, text, wrong", [
    ("tree", '{"name": "a", "children": [{"name": 1', '{"name": "a", "children": [{"name": '),
    ("tree", '{"name": "a", "children": [{"name": "b", "children": [[',
     '{"name": "a", "children": [{"name": "b", "children": ['),
    ("tree", '{"name": "a", "children": [{"title"', '{"name": "a", "children": [{"'),
    ("json value", '{"a": [1, {"b": [true', '{"a": [1, {"b": ['),
    ("json value", '[[1, 2.5', '[[1, 2'),
    ("dict tree", '{"value": 1, "kids": {"x": {"value": "2"', '{"value": 1, "kids": {"x": {"value": '),
    ("dict tree", '{"value": 1, "kids": {"x": [', '{"value": 1, "kids": {"x": '),
    ("dict of lists tree", '{"value": 1, "kids": {"x": [{"value": 2}, {"value": true',
     '{"value": 1, "kids": {"x": [{"value": 2}, {"value": '),
    ("dict of lists tree", '{"value": 1, "kids": {"x": {', '{"value": 1, "kids": {"x": '),
    ("mutual", '{"name": "a", "bs": [{"flag": "yes"', '{"name": "a", "bs": [{"flag": '),
    ("mutual", '{"name": "a", "bs": [{"flag": true, "as_": [{"flag"', '{"name": "a", "bs": [{"flag": true, "as_": [{"'),
    ("bounded tree", '{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}, {"name": "d"},',
     '{"name": "a", "children": [{"name": "b", "children": [{"name": "c"}, {"name": "d"}'),
    ("boolean tree", '[true, [false, 1', '[true, [false, '),
])
def test_an_invalid_tree_is_refused_at_its_first_wrong_byte(name: str, text: str, wrong: str) -> None:
    schema = SCHEMAS[name]
    assert text.startswith(wrong)
    assert feed(start_state(schema, ""), wrong) is not None
    assert feed(start_state(schema, ""), text[:len(wrong) + 1]) is None
