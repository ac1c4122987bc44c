"""A ``pattern`` under the JSON constraint read as the validation reads it (ECMA-262, searched): ``$``
is the end of the string wherever it stands, and the text around an unanchored match may hold
anything, escaped line breaks too."""

from __future__ import annotations

import json

import pytest

from shared_engine.json_constraint import call_start_state, start_state
from shared_engine.json_validation import schema_error
from tests.test_json_constraint import feed


def _holding(pattern: str) -> dict:
    return {"type": "object", "properties": {"s": {"type": "string", "pattern": pattern}}, "required": ["s"]}


def _writable(schema: dict, value: str) -> bool:
    state = feed(start_state(schema, ""), json.dumps({"s": value}))
    return state is not None and state.finished


@pytest.mark.parametrize("pattern, value, ok", [
    ("^(?:x|b$)", "b\n", False),  # $ in a group: the pattern constrained nothing, "b\n" was written, refused
    ("(a$|b)", "a\n", False),
    ("^(a$)", "a\n", False),
    ("^(?:x|b$)", "b", True),
    ("^(?:x|b$)", "xyz", True),
    ("(a$|b)", "za", True),
    ("(a$|b)", "zbz", True),
    ("(a$|b)", "az", False),
    ("a", "x\ny a", True),  # the padding took no line break: a valid string was unwritable
    ("a", "a\n", True),
    ("^a", "a\r\nb", True),
    ("a$", "\na", True),
    ("a$", "a\n", False),
])
def test_a_pattern_is_written_as_the_validation_reads_it(pattern: str, value: str, ok: bool) -> None:
    schema = _holding(pattern)
    assert (schema_error({"s": value}, schema) is None) is ok
    assert _writable(schema, value) is ok


def _x_writable(sub: dict, text: str) -> bool:
    schema = {"type": "object", "properties": {"x": sub}, "required": ["x"]}
    state = feed(start_state(schema, ""), '{"x": ' + text + "}")
    return state is not None and state.finished


_ODD = ['q"\\\n', "é  x" + " " * 20 + "y"]


@pytest.mark.parametrize("sub, valid, invalid", [
    ({"const": ["a", 1]}, ['["a", 1]'], ['["b", 1]', "[1]"]),  # any array was written, then refused
    ({"enum": [["a"], ["b", {"k": "v"}], "s"]}, ['["a"]', '["b", {"k": "v"}]', '"s"'], ['["b"]', '["b", {"k": "w"}]']),
    ({"enum": [["a"], ["ab"]]}, ['["a"]', '["ab"]'], ['["abc"]']),
    ({"const": _ODD}, [json.dumps(_ODD, ensure_ascii=False)], ['["q"]']),  # quote, backslash, line break, spaces
    ({"type": "array", "items": {"const": ["q"]}}, ['[["q"], ["q"]]'], ['[["q"], ["r"]]']),
])
def test_an_array_const_holding_strings_is_written_as_it_is(sub: dict, valid: list[str], invalid: list[str]) -> None:
    schema = {"type": "object", "properties": {"x": sub}, "required": ["x"]}
    for text in valid:
        assert schema_error(json.loads('{"x": ' + text + "}"), schema) is None and _x_writable(sub, text), text
    for text in invalid:
        assert schema_error(json.loads('{"x": ' + text + "}"), schema) is not None and not _x_writable(sub, text), text


def test_an_array_const_is_written_as_it_is_in_a_forced_call() -> None:
    tools = {"f": {"type": "object", "properties": {"x": {"const": ["a", 1]}}, "required": ["x"]}}
    for text, ok in ((' {"x": ["a", 1]}}', True), (' {"x": ["b", 1]}}', False)):
        state = feed(call_start_state(tools, "f"), text)
        assert (state is not None and state.finished) is ok


def test_many_groups_with_anchors_are_counted_not_spread_whole() -> None:
    # review of 22047e0: every alternative was built before the cap of 64 was checked, 4**n lists: '(a$|b)' 22
    # times took 67 s; past the cap the branch keeps its anchors (the parser refuses it: the validation's)
    import time

    from shared_engine.json_regex import whole_regex

    start = time.monotonic()
    whole_regex("(a$|b)" * 24)
    assert time.monotonic() - start < 10  # before: minutes (4 times more per two groups)
    assert whole_regex("^(?:x|b$)") is not None
