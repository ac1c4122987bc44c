"""A string's ``pattern`` under the JSON constraint: searched for, as JSON Schema (and pydantic's
``Field(pattern=)``) means it, not matched against the whole string."""

from __future__ import annotations

import json

import jsonschema
import pytest

from shared_engine.json_constraint import start_state
from tests.test_json_constraint import feed


def _holding(pattern: str) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}


def _writable(schema: dict, value: object) -> bool:
    state = feed(start_state(schema, ""), json.dumps({"s": value}, ensure_ascii=False))
    return state is not None and state.finished


@pytest.mark.parametrize("pattern, value", [
    ("^https?://", "https://example.com"),  # the constraint let the string be "https://" only
    ("^https?://", "http://"),
    ("@", "ann@example.com"),
    ("@", "@"),
    ("^[A-Z]", "Paris"),
    ("\\.pdf$", "report.pdf"),
    ("^[a-z]+$", "abc"),
    ("^a|b$", "axx"),       # an alternative anchored at its own end
    ("^a|b$", "xxb"),
    ("^(a|b)$", "b"),
    ("x[|]y", "-x|y-"),     # a "|" in a character class is no alternative
    ("a\\$", "a$!"),        # an escaped "$" is no anchor
    ("^$", ""),
])
def test_a_string_may_hold_its_pattern_anywhere_it_is_not_anchored(pattern: str, value: str) -> None:
    schema = _holding(pattern)
    jsonschema.validate({"s": value}, schema)
    assert _writable(schema, value)


@pytest.mark.parametrize("pattern, value", [
    ("^https?://", "ftp://x"),
    ("^https?://", "see https://x"),
    ("@", "no at sign"),
    ("\\.pdf$", "report.pdf.exe"),
    ("^[a-z]+$", "abc1"),
    ("^(a|b)$", "ab"),
    ("^$", "x"),
])
def test_a_string_that_cannot_match_its_pattern_is_still_rejected(pattern: str, value: str) -> None:
    schema = _holding(pattern)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"s": value}, schema)
    assert not _writable(schema, value)


@pytest.mark.parametrize("sub, value, ok", [
    ({"type": "string", "pattern": "^[^0-9]+$"}, "café", True),  # the parser offered ASCII characters only
    ({"type": "string", "pattern": "^[^0-9]+$"}, "東京", True),
    ({"type": "string", "pattern": "@"}, "zoë@example.com", True),
    ({"type": "string", "pattern": "^caf[éè]$"}, "café", True),
    ({"type": "string", "pattern": "^é+$"}, "éé", True),
    ({"anyOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}]}, "éb", True),
    ({"anyOf": [{"type": "string", "pattern": "^a"}, {"type": "integer"}]}, "aé", True),
    ({"type": "string", "pattern": "^\\w+$"}, "café", True),  # \w: ASCII to the parser, not to the validation
    ({"type": "string", "pattern": "^[\\w.-]+@"}, "josé.m@example.com", True),
    ({"type": "string", "pattern": "^\\w+$"}, "ca fé", False),
    ({"type": "string", "pattern": "^[a-z]+$"}, "café", False),
    ({"type": "string", "pattern": "^caf[éè]$"}, "cafë", False),
])
def test_a_pattern_string_takes_the_non_ascii_characters_its_pattern_allows(sub: dict, value: str, ok: bool) -> None:
    schema = {"type": "object", "properties": {"s": sub}, "required": ["s"]}
    assert (jsonschema.Draft202012Validator(schema).is_valid({"s": value})) is ok
    state = feed(start_state(schema, ""), json.dumps({"s": value}, ensure_ascii=False))  # byte by byte
    assert (state is not None and state.finished) is ok


def test_a_non_ascii_character_a_pattern_rules_out_is_refused_at_its_first_byte() -> None:
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "^caf[éè]$"}}}
    state = feed(start_state(schema, ""), '{"s": "caf')
    assert state is not None and state.after("é".encode()[:1]) is not None  # é and è start with b"\xc3"
    assert state.after("東".encode()[:1]) is None
    ascii_only = feed(start_state(_holding("^[a-z]+$"), ""), '{"s": "a')
    assert ascii_only is not None and ascii_only.after("é".encode()[:1]) is None
