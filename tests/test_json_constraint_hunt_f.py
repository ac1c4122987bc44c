"""Hunt f's findings in json_constraint.py: a string holding a backslash (or a quote, a line break)
could not be written under any ``pattern``, and a definition that is one of its own union options
(through ``$ref``/``anyOf`` alone) sent the parser round it forever, so the answer was not
constrained at all. Pure functions and the toy byte-level vocabulary."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
import torch

from shared_engine.json_constraint import call_start_state, constrained_token, start_state
from shared_engine.sampling import Sampler
from tests.test_json_constraint import feed
from tests.toy import toy_member


def _string_writable(pattern: str, text: str) -> bool:
    """Whether the JSON ``text`` (a string, escapes and all) is a whole answer under ``pattern``."""
    state = feed(start_state({"type": "string", "pattern": pattern}, ""), text)
    return state is not None and state.parser is not None and state.complete


@pytest.mark.parametrize("pattern, value", [
    (r"^.+$", "C:\\Users"),          # the hunt's repro: every pattern refused the backslash
    (r"^[^x]+$", "a\\b"),
    (r"^\\$", "\\"),
    (r"^[a-z:\\]+$", "c:\\x"),
    (r"^[A-Z]:\\", "D:\\data\\x.csv"),
    (r'^say "hi"$', 'say "hi"'),     # an escaped quote
    (r'^[^"]+"$', 'ab"'),
    (r"^a\nb$", "a\nb"),             # an escaped line break matched as one
    (r"^\t$", "\t"),
    (r"^[a-z]+$", "abc"),
])
def test_a_pattern_string_holds_the_characters_its_escapes_stand_for(pattern: str, value: str) -> None:
    assert re.search(pattern, value)
    assert _string_writable(pattern, json.dumps(value))


@pytest.mark.parametrize("pattern, text", [
    (r"^a/b$", '"a\\/b"'),           # "\/" stands for "/"
    (r"^é$", '"\\u00e9"'),           # a \u escape is matched as its character
    (r"^\d+$", '"\\u0661\\u0662"'),  # Unicode digits, as the validation reads \d
    (r"^\\u$", '"\\\\u"'),           # a backslash and a "u": no \u escape
])
def test_a_pattern_string_reads_other_escapes_as_their_characters(pattern: str, text: str) -> None:
    assert re.search(pattern, json.loads(text))
    assert _string_writable(pattern, text)


@pytest.mark.parametrize("pattern, text", [
    (r"^[a-z]+$", '"a\\\\b"'),       # a backslash the pattern does not allow
    (r"^[a-z]+$", '"a\\nb"'),        # nor a line break, escaped
    (r'^[^"]*$', '"a\\"b"'),         # nor a quote
    (r"^.+$", '"\\n"'),              # "." takes no line break
    (r"^é$", '"\\u00e8"'),           # è
    (r"^a$", '"\\u0061b"'),          # "ab"
    (r"^.+$", '"a\\qb"'),            # no JSON escape at all
    (r"^.+$", '"\\ud83d\\ude00"'),   # a surrogate pair: refused under a pattern (written as it is instead)
])
def test_a_pattern_string_refuses_escapes_standing_for_what_it_rules_out(pattern: str, text: str) -> None:
    assert not _string_writable(pattern, text)


def test_an_escape_is_refused_at_its_first_character_the_pattern_rules_out() -> None:
    state = feed(start_state({"type": "string", "pattern": r"^[a-f\\]+$"}, ""), '"a\\')
    assert state is not None
    assert state.after(b"\\") is not None and state.after(b"n") is None  # "\\" is "\", "\n" a line break
    assert state.after(b"u") is not None  # \u0061 ("a") lies ahead
    assert feed(state, "u00") is not None and feed(state, "u007") is None  # \u007X: no a-f, no "\"
    assert feed(state, 'u0062"') is not None and feed(state, 'u0067') is None  # "b" yes, "g" no


def test_a_raw_emoji_is_still_writable_where_its_escape_is_not() -> None:
    assert _string_writable(r"^.+$", json.dumps("😀", ensure_ascii=False))


def _complete(schema: dict[str, Any], text: str) -> bool:
    state = feed(start_state(schema, ""), text)
    return state is not None and state.parser is not None and state.complete


def test_escapes_in_a_union_of_a_pattern_string_and_a_free_one_follow_each() -> None:
    union = {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"type": "string", "maxLength": 3}]}
    assert _complete(union, json.dumps("a\\b"))  # the free one
    assert feed(start_state(union, ""), json.dumps("ab\\cd")) is None  # neither: too long, and a backslash
    enum = {"anyOf": [{"type": "string", "pattern": "^[a-z]+$"}, {"enum": ["a\\b"]}]}
    assert _complete(enum, json.dumps("a\\b"))


PATH_ARGS = {"type": "object", "properties": {"path": {"type": "string", "pattern": "^[A-Z]:\\\\"}},
             "required": ["path"]}


def test_a_windows_path_is_writable_in_an_object_and_a_forced_call() -> None:
    answer = json.dumps({"path": "C:\\Users\\ann"})
    assert _complete(PATH_ARGS, answer)
    assert feed(start_state(PATH_ARGS, ""), json.dumps({"path": "Users\\ann"})) is None
    call = feed(call_start_state({"save": PATH_ARGS}, "save"), answer + "}")
    assert call is not None and call.parser is not None and call.complete


def test_the_drafter_can_write_a_backslash_under_a_pattern() -> None:
    """Token by token (first_byte_ok refused a piece starting with a backslash under a pattern)."""
    table = toy_member("toy", "byte_level").table
    state = start_state(PATH_ARGS, "")
    rest = json.dumps({"path": "C:\\x"}).encode()
    while rest:
        piece = max((p for p in table.pieces if p and rest.startswith(p)), key=len)
        logits = torch.zeros(table.vocab_size)
        logits[table.token_id(piece)] = 30.0
        assert state is not None
        token, state = constrained_token(Sampler(), logits, None, table, state)  # type: ignore[misc]
        assert table.pieces[token] == piece, (rest, table.pieces[token])
        rest = rest[len(piece):]
    assert state is not None and state.finished


# -- a definition among its own union options ---------------------------------------------------

LIT = {"type": "object", "properties": {"v": {"type": "integer"}}, "required": ["v"]}
SELF_UNION: dict[str, Any] = {  # the hunt's schema: Group is Expr, Expr is Lit or Group
    "$defs": {"Expr": {"type": "object", "oneOf": [{"$ref": "#/$defs/Lit"}, {"$ref": "#/$defs/Group"}]},
              "Lit": LIT, "Group": {"type": "object", "anyOf": [{"$ref": "#/$defs/Expr"}]}},
    "$ref": "#/$defs/Expr"}
MUTUAL: dict[str, Any] = {  # A is "a" or B, B is 1 or A, either nested in a wrap object
    "$defs": {"A": {"anyOf": [{"type": "string", "enum": ["a"]}, {"$ref": "#/$defs/B"}]},
              "B": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/A"}, {"$ref": "#/$defs/Wrap"}]},
              "Wrap": {"type": "object", "properties": {"w": {"$ref": "#/$defs/A"}}, "required": ["w"]}},
    "type": "object", "properties": {"a": {"$ref": "#/$defs/A"}, "b": {"$ref": "#/$defs/B"}}, "required": ["a", "b"]}


def _writable(schema: dict[str, Any], value: Any) -> bool:
    state = feed(start_state(schema, ""), json.dumps(value))
    return state is not None and state.parser is not None and state.finished


def test_a_definition_among_its_own_union_options_is_constrained() -> None:
    state = start_state(SELF_UNION, "")
    assert state is not None and state.parser is not None
    assert _writable(SELF_UNION, {"v": 3})
    assert not _writable(SELF_UNION, {"v": "x"}) and not _writable(SELF_UNION, {"w": 1})


@pytest.mark.parametrize("value, valid", [
    ({"a": "a", "b": 1}, True),
    ({"a": 1, "b": "a"}, True),      # A reaches B's integer, B reaches A's "a"
    ({"a": {"w": {"w": 2}}, "b": {"w": "a"}}, True),
    ({"a": "b", "b": 1}, False),
    ({"a": 1.5, "b": 1}, False),
    ({"a": {"w": "x"}, "b": 1}, False),
])
def test_mutually_recursive_unions_take_every_option_either_leads_to(value: dict[str, Any], valid: bool) -> None:
    # (jsonschema itself runs round A and B into a RecursionError on most of these: valid by hand)
    assert _writable(MUTUAL, value) == valid


def test_a_definition_that_is_only_its_own_union_is_left_to_the_validation() -> None:
    none = {"$defs": {"A": {"anyOf": [{"$ref": "#/$defs/B"}]}, "B": {"anyOf": [{"$ref": "#/$defs/A"}]}},
            "$ref": "#/$defs/A"}
    assert start_state(none, "") is None  # no value at all: not constrained (was a RecursionError, caught)
