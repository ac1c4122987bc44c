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
