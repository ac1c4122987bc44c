"""Mutation round e's findings in sampling.py and json_constraint.py: a drafted candidate the target
gives nothing was committed, a typed schema lost its type to an untyped anyOf branch, and a pattern
whose character class starts with ``]`` made every string unwritable. Pure functions, toy inputs."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from shared_engine.json_constraint import JsonPrefix, start_state
from shared_engine.sampling import Sampler, speculative_choice
from shared_engine.tools import ResponseFormat, format_error


def test_a_drafted_candidate_outside_proposal_and_target_is_never_committed() -> None:
    """speculative_choice: the draft spelled candidate 2, which the proposal gives nothing (drawn from
    another distribution) and the target gives nothing either; target == proposal, so the residual is
    empty. The drafted candidate was returned as it was: a token of probability 0 committed."""
    target = torch.tensor([0.5, 0.5, 0.0])
    picks = {speculative_choice(Sampler(temperature=1.0, seed=s), target, target.clone(), 2) for s in range(40)}
    assert picks == {0, 1}


def test_a_rejected_draft_with_an_empty_residual_follows_the_target() -> None:
    """speculative_choice: candidate 0 drafted, the target gives it nothing (ratio 0: always rejected),
    and the proposal, unnormalised, covers the target everywhere (empty residual). The choice follows
    the target (candidate 1), not the rejected draft."""
    target, proposal = torch.tensor([0.0, 1.0]), torch.tensor([0.5, 1.0])
    picks = {speculative_choice(Sampler(temperature=1.0, seed=s), target, proposal, 0) for s in range(20)}
    assert picks == {1}


def _value_state(value_schema: dict[str, Any]) -> tuple[dict[str, Any], JsonPrefix]:
    """An object schema with the one required property ``n`` of ``value_schema``, and its state after ``{``."""
    schema = {"type": "object", "properties": {"n": value_schema}, "required": ["n"]}
    state = start_state(schema, "{")
    assert state is not None
    return schema, state


@pytest.mark.parametrize("value_schema", [
    {"type": "integer", "anyOf": [{"minimum": 5}, {"type": "integer", "maximum": 0}]},
    {"type": "integer", "oneOf": [{"title": "any"}, {"type": "integer"}]},
    {"type": "integer", "anyOf": [{"type": "string"}, {"type": "integer", "maximum": 0}]},
    {"type": "integer", "anyOf": [{"type": "number", "maximum": 0}, {"type": "integer"}]},
])
def test_a_typed_schema_keeps_its_type_whatever_its_anyof_branches_say(value_schema: dict[str, Any]) -> None:
    """_Rewrite.schema: a schema's own type holds beside its anyOf/oneOf. An untyped branch (any value) or
    a branch of another type made the constraint the branches' union, so "text" was written under
    {"type": "integer", ...} and the validation then refused the answer."""
    schema, state = _value_state(value_schema)
    fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"schema": schema}})
    assert state.after(b'"n": "text"}') is None
    assert format_error('{"n": "text"}', fmt) is not None
    assert state.after(b'"n": -3}') is not None


def test_branches_inside_the_own_type_still_narrow_it() -> None:
    """_Rewrite.schema: where every branch is of a type the schema allows, the branches stand (tighter
    than the type alone): a string longer than the branch's maxLength stays unwritable, null writable."""
    _, state = _value_state({"type": ["string", "null"],
                             "anyOf": [{"type": "string", "maxLength": 2}, {"type": "null"}]})
    assert state.after(b'"n": "abc"') is None
    assert state.after(b'"n": "ab"}') is not None
    assert state.after(b'"n": null}') is not None


@pytest.mark.parametrize(("pattern", "value"), [
    ("^[]a]+$", "a"), ("^[]a]+$", "]"), ("^[]a]+$", "a]a"), ("^[^]a]+$", "b"), ("^x[]]$", "x]"),
])
def test_a_class_starting_with_a_bracket_is_read_as_re_reads_it(pattern: str, value: str) -> None:
    """_whole_match: Python's re (the validation's) reads a "]" first in a class ([]a], [^]a]) as one
    of its characters; the parser's regex library read [] as an empty class, so no string at all was
    writable under the pattern."""
    assert re.search(pattern, value)
    _, state = _value_state({"type": "string", "pattern": pattern})
    assert state.after(f'"n": "{value}"}}'.encode()) is not None


def test_a_negated_class_starting_with_a_bracket_still_excludes_it() -> None:
    """_whole_match: [^]a] excludes "]" and "a", as re reads it."""
    _, state = _value_state({"type": "string", "pattern": "^[^]a]+$"})
    assert state.after(b'"n": "]"') is None
    assert state.after(b'"n": "a"') is None


def _writable(schema: dict[str, Any], answer: str) -> bool:
    """Whether ``answer`` can be written whole under the constraint of ``schema`` (checked against the
    validation first: the constraint must take exactly the valid answers here)."""
    fmt = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"schema": schema}})
    valid = format_error(answer, fmt) is None
    state = start_state(schema, "")
    assert state is not None
    after = state.after(answer.encode())
    writable = after is not None and after.complete
    assert writable == valid, (answer, writable, valid)
    return writable


_CITY_OR_COORDINATES = {"type": "object", "properties": {"city": {"type": "string"}},
                        "anyOf": [{"required": ["city"]},
                                  {"properties": {"lat": {"type": "number"}, "lon": {"type": "number"}},
                                   "required": ["lat", "lon"]}]}


@pytest.mark.parametrize("answer", ['{"city": "Paris"}', '{"lat": 48.8, "lon": 2.3}',
                                    '{"city": "Paris", "lat": 1, "lon": 2}'])
def test_an_untyped_branch_of_an_object_schema_is_an_object_branch(answer: str) -> None:
    """_Rewrite._branch (86c2a21's regression): a branch saying only "required" was read as untyped (any
    value), so the schema's own part stood for all, and the other branch's keys (lat, lon) could not be
    written. Each branch is now merged with the schema's own part (its type, both properties)."""
    assert _writable(_CITY_OR_COORDINATES, answer)


def test_an_object_schema_with_untyped_branches_still_refuses_other_types() -> None:
    """_Rewrite._branch: the merged branches keep the schema's type (86c2a21's goal): a string, no object,
    stays unwritable (the pre-86c2a21 union of an untyped branch let any value through)."""
    state = start_state(_CITY_OR_COORDINATES, "")
    assert state is not None
    assert state.after(b'"Paris"') is None


def test_the_own_optional_properties_stay_writable_beside_branches_listing_properties() -> None:
    """_Rewrite._branch: a branch listing properties ({"properties": {"type": {"const": "circle"}}, ...})
    stood for the value alone, so the schema's own optional "color" was no key the parser took."""
    schema = {"type": "object", "required": ["type"],
              "properties": {"type": {"enum": ["circle", "square"]}, "radius": {"type": "number"},
                             "side": {"type": "number"}, "color": {"type": "string"}},
              "oneOf": [{"properties": {"type": {"const": "circle"}}, "required": ["radius"]},
                        {"properties": {"type": {"const": "square"}}, "required": ["side"]}]}
    assert _writable(schema, '{"type": "circle", "radius": 1, "color": "red"}')
    assert _writable(schema, '{"type": "square", "side": 2}')
    assert not _writable(schema, '{"type": "circle", "side": 2}')  # the branch's const and required hold


def test_the_own_properties_stay_writable_beside_ref_branches() -> None:
    """_Rewrite._branch: a $ref branch is merged with its definition, so the schema's own "note" (in
    no definition) is writable beside either one."""
    schema = {"$defs": {"A": {"type": "object", "properties": {"k": {"const": "a"}, "x": {"type": "integer"}},
                              "required": ["k", "x"]},
                        "B": {"type": "object", "properties": {"k": {"const": "b"}}, "required": ["k"]}},
              "type": "object", "properties": {"k": {"type": "string"}, "note": {"type": "string"}},
              "oneOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}
    assert _writable(schema, '{"k": "b", "note": "hi"}')
    assert _writable(schema, '{"k": "a", "x": 1, "note": "hi"}')
    assert not _writable(schema, '{"k": "c"}')  # neither definition's "k"


def test_a_recursive_definition_behind_a_typed_schemas_branch_is_still_constrained() -> None:
    """_Rewrite._kinds (86c2a21): reading a $ref branch's type rewrote its definition, which came back
    to the same $ref (the "seen" refs were lost on the way), so a linked list's {"type": ["object",
    "null"], "anyOf": [{"$ref": Node}, {"type": "null"}]} ran into a RecursionError and the answer
    was not constrained at all."""
    schema = {"$defs": {"Node": {"type": "object", "required": ["v"], "properties": {
        "v": {"type": "integer"},
        "next": {"type": ["object", "null"], "anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]}}}},
        "$ref": "#/$defs/Node"}
    assert _writable(schema, '{"v": 1, "next": {"v": 2, "next": null}}')
    assert not _writable(schema, '{"v": 1, "next": "x"}')
