"""Review g's finding in json_constraint.py: a tree recursing through array items (a pydantic model
with ``children: list[Tree]``, a JSON-value alias) got no JSON constraint at all, as telling whether
the parser counts the items twice (``_Rewrite._counted_twice``) rewrote the definition again and
reached its own items' ``$ref`` without end. Pure functions and the byte-level prefix check."""

from __future__ import annotations

import json
import random
import signal
from typing import Any, ForwardRef, Union

import jsonschema
import pytest
from pydantic import BaseModel, Field, TypeAdapter, create_model
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



# Review i: telling whether the items are counted twice rewrote, inside each reading, every
# definition reached through array items again, along every path: n definitions linked by k lists
# took exponential time (20 x 4: 20 s; 30 x 3 and 10 x 10: minutes), on the event loop of every request.

class _TooSlow(BaseException):
    """Raised by the alarm: a BaseException, as start_state reads any Exception as "no constraint"."""


def _timed_start(schema: dict[str, Any], limit: float = 2.0) -> Any:
    """start_state, failing the test once it has run ``limit`` seconds (rather than minutes later)."""
    def ring(signum: int, frame: Any) -> None:
        raise _TooSlow(f"start_state ran over {limit} s")

    previous = signal.signal(signal.SIGALRM, ring)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        return start_state(schema, "")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _graph(n: int, k: int, seed: int = 0) -> dict[str, Any]:
    """``n`` definitions, each with an ``id`` and ``k`` lists (at most 2 items) of other (or its own) definitions."""
    rnd = random.Random(seed)
    defs: dict[str, Any] = {}
    for i in range(n):
        props: dict[str, Any] = {"id": {"type": "string"}}
        for j in rnd.sample(range(n), k):
            props[f"f{j}"] = {"type": "array", "items": {"$ref": f"#/$defs/N{j}"}, "maxItems": 2}
        defs[f"N{i}"] = {"type": "object", "properties": props, "required": ["id"]}
    return {"$ref": "#/$defs/N0", "$defs": defs}


def _graph_value(schema: dict[str, Any]) -> dict[str, Any]:
    """A value two lists deep: N0's first list holds an item with one of its own lists, then another."""
    first = next(key for key in schema["$defs"]["N0"]["properties"] if key != "id")
    second = next(key for key in schema["$defs"][f"N{first[1:]}"]["properties"] if key != "id")
    return {"id": "a", first: [{"id": "b", second: [{"id": "c"}]}, {"id": "d"}]}


def _domain() -> dict[str, Any]:
    """A pydantic domain of 22 models, each with three list fields of others (an extraction schema)."""
    rnd = random.Random(1)
    models: dict[str, Any] = {}
    for i in range(22):
        fields: dict[str, Any] = {f"rel_{j}": (list[ForwardRef(f"Model{j}")], []) for j in rnd.sample(range(22), 3)}
        models[f"Model{i}"] = create_model(f"Model{i}", id=(str, ...), **fields)
    for model in models.values():
        model.model_rebuild(_types_namespace=models)
    items: Any = list.__class_getitem__(models["Model0"])
    doc: Any = create_model("Doc", items=(items, []))
    return dict(doc.model_json_schema())


DOMAIN = _domain()


@pytest.mark.parametrize("n, k", [(30, 3), (10, 10), (20, 4)])
def test_many_definitions_linked_by_lists_are_constrained_at_once(n: int, k: int) -> None:
    schema = _graph(n, k)
    state = _timed_start(schema)  # before: 20 s (20 x 4) to minutes
    assert state is not None
    value = _graph_value(schema)
    jsonschema.validate(value, schema)
    assert _writable(schema, json.dumps(value))
    two = json.dumps(value)[:-2]  # the root's list, its two items written
    assert feed(state, two) is not None
    assert feed(state, two + ",") is None  # a third refused (maxItems 2)
    assert feed(state, two.replace('"c"', "1")) is None  # an item's id a number, two lists deep


def test_a_pydantic_domain_of_models_linked_by_lists_is_constrained_at_once() -> None:
    state = _timed_start(DOMAIN)  # before: 1.8 s; 30 models or 4 lists each: minutes
    assert state is not None
    value = {"items": [{"id": "a", "rel_4": [{"id": "b", "rel_0": [{"id": "c"}]}]}]}
    jsonschema.validate(value, DOMAIN)
    assert _writable(DOMAIN, json.dumps(value))
    assert feed(state, '{"items": [{"id": "a", "rel_4": [{"id": ') is not None
    assert feed(state, '{"items": [{"id": "a", "rel_4": [{"id": 1') is None
