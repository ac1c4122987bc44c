"""Constrained JSON decoding across tokenizers (shared_engine.json_constraint and its use in the
decoding round): the character-level prefix check, the drafter's constrained choice, fusion that
never commits a schema-breaking candidate, whole requests on toy members whose unconstrained
answers are not JSON at all, and forced tool calls (name and arguments)."""

from __future__ import annotations

import json
from collections import Counter
from enum import IntEnum
from typing import Annotated, Literal, Union

import jsonschema
import pytest
import torch
from lmformatenforcer import CharacterLevelParser
from pydantic import BaseModel, Field

from shared_engine import EnsembleEngine
from shared_engine.decoding.round import FusionSettings, _fuse
from shared_engine.fusion import MemberDist, make_fuser
from shared_engine.json_constraint import JsonPrefix, call_start_state, constrained_token, start_state
from shared_engine.members import HFMember
from shared_engine.sampling import Sampler
from shared_engine.tools import OutputOptions, OutputPlan, call_prefix
from tests.toy import byte_level_tokenizer, metaspace_tokenizer, tiny_llama, toy_member

PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
CHECK = {"type": "object", "properties": {"ok": {"type": "boolean"}, "size": {"enum": ["S", "M", "L"]}},
         "required": ["ok", "size"], "additionalProperties": False}
CHECK_FORMAT = {"type": "json_object", "json_schema": {"name": "check", "schema": CHECK}}
"""json_object carrying a schema: the answer is constrained to it, and the toy prompt stays short
(the schema is not shown to the members), within the toys' 512-token context. Every value is
bounded (a random toy would write digits forever), so only the whitespace the toys love between
tokens (at most 16 characters in a row; the metaspace toy writes them one by one) varies the
length: 96 tokens finish every case below."""


class Cat(BaseModel):
    kind: Literal["cat"]
    meows: bool


class Dog(BaseModel):
    kind: Literal["dog"]
    barks: int


def feed(state: JsonPrefix | None, text: str | bytes) -> JsonPrefix | None:
    """``state`` after ``text``, one byte at a time (the way byte-level tokens may split it)."""
    data = text.encode("utf-8") if isinstance(text, str) else text
    for i in range(len(data)):
        if state is None:
            return None
        state = state.after(data[i:i + 1])
    return state


# -- the character-level prefix check -------------------------------------------------------------

def test_valid_prefixes_go_on_and_the_complete_value_ends_the_answer() -> None:
    state = feed(start_state(PERSON, "{"), '"name": "Zoë | 東京 ~", "age": 31')
    assert state is not None and not state.complete  # the object is still open
    done = feed(state, "}")
    assert done is not None and done.complete and done.finished


@pytest.mark.parametrize("rest", [
    '"name": "Bob"}',          # "age" is required: the object cannot close yet
    '"name": "Bob", "age": 3.5',  # an integer has no fraction
    '"nickname": 1',           # no such property
    "hello",                   # not JSON
    '"name": "a\nb"',          # a raw newline inside a string
])
def test_a_prefix_that_cannot_become_schema_valid_is_rejected(rest: str) -> None:
    assert feed(start_state(PERSON, "{"), rest) is None


def test_any_json_object_without_a_schema() -> None:
    assert feed(start_state(None, "{"), '"a": [1, {"b": null}], "c": "ü"}').finished  # type: ignore[union-attr]
    assert feed(start_state(None, "{"), "'single quotes'") is None


def test_a_character_split_across_pieces_is_held_until_complete() -> None:
    inside = feed(start_state(PERSON, "{"), '"name": "')
    assert inside is not None
    half = inside.after("東".encode()[:2])
    assert half is not None and half.pending and not half.complete
    assert half.after("東".encode()[2:] + b'"') is not None
    outside = start_state(PERSON, "{")
    assert outside is not None and outside.after("東".encode()[:2]) is None  # only a string takes it


def test_a_prefix_that_is_no_json_start_or_an_unsupported_schema_gives_no_constraint() -> None:
    assert start_state(PERSON, "Sure: {") is None
    assert start_state(PERSON, "{") is not None


@pytest.mark.parametrize("schema, text", [
    (None, '{"a": 1,}'),
    (None, '{"a": [1, 2] , \n}'),
    ({"type": "object", "properties": {"o": {"type": "object"}}, "required": ["o"]}, '{"o": {"k": 2,}}'),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}, '{"a": 1,}'),
])
def test_a_trailing_comma_is_rejected(schema: dict | None, text: str) -> None:
    assert feed(start_state(schema, ""), text) is None  # the parser took it: "complete", then invalid JSON
    assert feed(start_state(schema, ""), text[:text.rindex(",")] + text[text.rindex(",") + 1:]).finished  # type: ignore[union-attr]


def test_a_trailing_comma_is_rejected_in_a_calls_arguments_but_not_inside_strings() -> None:
    assert feed(call_start_state({"f": {}}, "f"), ' {"x": 1,}}') is None
    assert feed(call_start_state({"f": {}}, "any"), 'f", "arguments": {"x": 1,}}') is None
    assert feed(call_start_state({"f": {}}, "any"), 'f", "arguments": {"x": ",}\\",]"}}').finished  # type: ignore[union-attr]
    assert feed(start_state(None, ""), '{"a,": "\\",}"}').finished  # type: ignore[union-attr]


# -- schemas the parser takes only in part ---------------------------------------------------------

def _holding(sub: object) -> dict:
    return {"type": "object", "properties": {"x": sub}, "required": ["x"]}


@pytest.mark.parametrize("sub, value", [
    ({"title": "Extra"}, '"any"'),                          # pydantic's Any: no "type"
    ({}, "[1, {}]"),
    ({"description": "no type"}, "null"),
    (True, "1"),
    ({"allOf": [{"type": "integer"}, {"minimum": 0}]}, "5"),
    ({"not": {"type": "string"}}, "5"),
    ({"if": {"type": "integer"}, "then": {"minimum": 0}}, "5"),
    ({"const": 5}, "5"),
    ({"type": "integer", "const": 5}, "5"),
    ({"const": True}, "true"),
    ({"enum": [True, None]}, "null"),
    ({"enum": ["a", 1, False]}, "1"),
    ({"type": "object", "additionalProperties": True}, '{"a": 1}'),  # pydantic's dict[str, Any]
    ({"type": "object", "additionalProperties": {}}, '{"a": 1}'),
    ({"type": "array", "items": True}, "[1]"),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": False}, "[1]"),
    ({"type": "string", "pattern": "^a+$", "maxLength": 3}, '"aa"'),
    ({"type": ["object", "null"], "properties": {"a": {"type": "integer"}}}, '{"a": 2}'),
    ({"oneOf": [{"type": "string"}, {"type": "number"}]}, "5"),  # a scalar oneOf let "{" through only
    ({"oneOf": [{"type": "string"}, {"type": "number"}]}, '"five"'),
])
def test_a_schema_the_parser_raises_on_or_misreads_is_rewritten_so_valid_answers_stay_writable(
        sub: object, value: str) -> None:
    schema = _holding(sub)
    text = '{"x": ' + value + "}"
    jsonschema.validate(json.loads(text), schema)
    state = feed(start_state(schema, ""), text)
    assert state is not None and state.finished


class Pet(BaseModel):
    pet: Annotated[Union[Cat, Dog], Field(discriminator="kind")]  # noqa: UP007 - pydantic's oneOf


def test_a_pydantic_oneOf_is_enforced_as_its_union() -> None:
    schema = Pet.model_json_schema()
    assert "oneOf" in json.dumps(schema)
    for valid in ('{"pet": {"kind": "cat", "meows": true}}', '{"pet": {"kind": "dog", "barks": 3}}'):
        assert feed(start_state(schema, ""), valid).finished  # type: ignore[union-attr]
    for invalid in ('{"pet": {"anything": 1}}', '{"pet": {}}', '{"pet": {"kind": "cat", "barks": 3}}'):
        assert feed(start_state(schema, ""), invalid) is None  # before: any object went


class Flags(BaseModel):
    flags: list[bool] = Field(min_length=3, max_length=3)


class Level(IntEnum):
    LOW = 1
    HIGH = 2


@pytest.mark.parametrize("item, value", [
    ({"type": "boolean"}, True),
    ({"type": "null"}, None),
    ({"type": "array", "items": {"type": "integer"}}, [1]),
    ({"enum": [1, 2]}, 2),
    ({"type": ["integer", "null"]}, None),
    ({"$ref": "#/$defs/Level"}, 1),
])
def test_an_array_of_items_the_parser_counts_twice_takes_as_many_items_as_the_schema_says(
        item: dict, value: object) -> None:
    # lm-format-enforcer counted each of these items twice: minItems = maxItems = 3 closed the list at 2
    schema = {"type": "object", "properties": {"xs": {"type": "array", "items": item, "minItems": 3, "maxItems": 3}},
              "required": ["xs"], "$defs": {"Level": {"type": "integer", "enum": [1, 2]}}}
    text = json.dumps({"xs": [value] * 3})
    jsonschema.validate(json.loads(text), schema)
    assert feed(start_state(schema, ""), text).finished  # type: ignore[union-attr]
    flags = Flags.model_json_schema()
    assert feed(start_state(flags, ""), '{"flags": [true, false, true]}').finished  # type: ignore[union-attr]
    counted_once = {"type": "array", "items": {"type": "integer"}, "minItems": 3, "maxItems": 3}
    assert feed(start_state(counted_once, ""), "[1, 2]]") is None  # bounds still enforced where counted right
    assert feed(start_state(counted_once, ""), "[1, 2, 3]").finished  # type: ignore[union-attr]


def test_a_forced_call_whose_parameters_hold_an_untyped_value_is_constrained_not_crashed() -> None:
    params = {"type": "object", "properties": {"value": {"description": "anything"}}, "required": ["value"]}
    state = call_start_state({"store": params}, "store")
    assert feed(state, ' {"value": [5, "x"]}}').finished  # type: ignore[union-attr]
    assert feed(state, ' {"other": 1}}') is None
    untyped = call_start_state({"f": {"properties": {"a": {"type": "integer"}}}}, "f")  # no "type": an object
    assert feed(untyped, ' {"a": 1}}').finished and feed(untyped, " 5}") is None  # type: ignore[union-attr]


def test_a_schema_that_cannot_be_approximated_is_not_constrained() -> None:
    both = {"allOf": [{"type": "object", "properties": {"a": {"type": "integer"}}},
                      {"type": "object", "properties": {"b": {"type": "integer"}}}]}
    assert start_state(both, "{") is None
    assert start_state(_holding({"$ref": "#"}), "{") is None  # the parser resolves "#/$defs/<name>" only
    assert call_start_state({"f": both}, "f") is None


class _Raising(CharacterLevelParser):
    """A parser that takes "{" and then raises, as lm-format-enforcer does on what it took but cannot follow."""

    def add_character(self, new_character: str) -> CharacterLevelParser:
        raise ValueError("Unsupported type None")

    def get_allowed_characters(self) -> str:
        return "{"

    def can_end(self) -> bool:
        return False


def test_a_parser_that_raises_mid_answer_leaves_the_rest_of_the_answer_free() -> None:
    free = JsonPrefix(_Raising()).after(b"{")
    assert free is not None and free.parser is None
    assert free.after(b"anything at all") is free and free.complete and not free.finished
    assert JsonPrefix(_Raising()).after(b"[") is None  # what the parser says before it raises still holds


def test_a_request_whose_schema_the_parser_raised_on_is_decoded_under_it() -> None:
    schema = {"type": "object", "properties": {"flag": {"enum": [True, None]}, "size": {"const": 5}},
              "required": ["flag", "size"], "additionalProperties": False}
    fmt = {"type": "json_object", "json_schema": {"name": "s", "schema": schema}}
    result = _engine("bpe", "sp").generate("Check.", response_format=fmt)  # raised from the parser before
    assert result.stats.constrained and result.format_error is None
    jsonschema.validate(json.loads(result.text), schema)


# -- the drafter's constrained choice ------------------------------------------------------------

def _piece_id(table, piece: bytes) -> int:  # noqa: ANN001 - a TokenTable
    token = table.token_id(piece)
    assert token is not None, piece
    return token


def test_greedy_choice_is_the_drafters_best_valid_token() -> None:
    table = toy_member("toy-bpe", "byte_level").table
    logits = torch.zeros(table.vocab_size)
    hello, quote, close = (_piece_id(table, p) for p in (b"Hello", b'"', b"}"))
    logits[hello], logits[close], logits[quote] = 9.0, 8.0, 5.0  # "}" is invalid: "name" and "age" are required
    state = start_state(PERSON, "{")
    assert state is not None
    token, after = constrained_token(Sampler(), logits, None, table, state)
    assert token == quote
    assert feed(after, 'name": "x", "age": 1}').finished  # type: ignore[union-attr] - the state after it


def test_sampled_choice_follows_the_drafters_distribution_restricted_to_valid_tokens() -> None:
    table = toy_member("toy-bpe", "byte_level").table
    logits = torch.full((table.vocab_size,), -30.0)
    hello, quote, space = (_piece_id(table, p) for p in (b"Hello", b'"', b" "))
    logits[hello] = 4.0                                      # most of the mass, but invalid
    logits[quote], logits[space] = 0.0, float(torch.log(torch.tensor(1 / 3)))  # valid, 3 : 1
    state = start_state(PERSON, "{")
    assert state is not None
    sampler = Sampler(temperature=1.0, seed=7)
    counts = Counter(constrained_token(sampler, logits, None, table, state)[0] for _ in range(800))
    assert set(counts) == {quote, space}
    assert 0.68 < counts[quote] / 800 < 0.82  # 0.75 expected; 4 standard deviations either side


CAFE = {"type": "object", "properties": {"e": {"enum": ["café", "tea"]}, "naïve": {"type": "integer"},
                                       "code": {"type": "string"}}, "required": ["e"], "additionalProperties": False}


@pytest.mark.parametrize("tokenizer", ["byte_level", "metaspace"])
@pytest.mark.parametrize("text", ['"e": "café"}',                      # "é" in two byte tokens
                                  '"naïve": 1, "e": "tea"}',
                                  '"e": "tea", "code": "if x:\\n' + " " * 24 + 'return 1"}'])  # spaces in a string
def test_the_drafter_can_write_every_valid_answer(tokenizer: str, text: str) -> None:
    """The drafter wants ``text``, one longest vocabulary piece at a time: the constraint lets it."""
    table = toy_member("toy", tokenizer).table
    state = start_state(CAFE, "{")
    rest = text.encode()
    while rest:
        piece = max((p for p in table.pieces if p and rest.startswith(p)), key=len)
        logits = torch.zeros(table.vocab_size)
        logits[_piece_id(table, piece)] = 30.0
        assert state is not None
        token, state = constrained_token(Sampler(), logits, None, table, state)  # type: ignore[misc]
        assert table.pieces[token] == piece, (rest, table.pieces[token])
        rest = rest[len(piece):]
    assert state.finished


def test_a_string_holds_any_run_of_spaces_and_counts_them() -> None:
    strings = {"type": "object", "properties": {"s": {"type": "string", "minLength": 3, "maxLength": 40}}}
    assert feed(start_state(strings, "{"), '"s": "' + " " * 40 + '"}').finished  # type: ignore[union-attr]
    assert feed(start_state(strings, "{"), '"s": "   "}').finished  # type: ignore[union-attr] - 3 long
    assert feed(start_state(strings, "{"), '"s": "' + " " * 41) is None  # too long
    assert feed(start_state(None, "{"), " " * 16) is not None and feed(start_state(None, "{"), " " * 17) is None
    echo = {"type": "object", "properties": {"text": {"type": "string"}}}
    spaced = '{"text": "' + " " * 30 + 'x"}}'
    assert feed(call_start_state({"echo": echo}, "echo"), " " + spaced).finished  # type: ignore[union-attr]
    assert feed(call_start_state({"echo": echo, "f": {}}, "any"), 'echo", "arguments": ' + spaced).finished  # type: ignore[union-attr]


def test_a_non_ascii_character_of_an_enum_or_key_may_come_in_byte_pieces() -> None:
    state = start_state(CAFE, '{"e": "caf')
    assert state is not None and state.first_byte_ok(0xC3) and not state.first_byte_ok(0xE6)
    half = state.after(b"\xc3")
    assert half is not None and half.pending and half.after(b"\xa9")
    assert state.after("è".encode()[:1]) is not None and state.after("è".encode()) is None  # é or è: the bytes decide
    key = start_state(CAFE, '{"na')
    assert key is not None and key.after("ï".encode()[:1]) is not None and key.after("ś".encode()[:1]) is None


@pytest.mark.parametrize("value", ['a"b', "c\\d", "two\nlines", "tab\there", "bell\x07", 'say "é"'])
def test_an_enum_const_or_key_holding_a_quote_backslash_or_control_character_is_written_escaped(value: str) -> None:
    """Fixed strings were given to the parser raw: for ``a"b`` the quote closed the string, so
    ``{"x": "a"}`` passed as complete and ``"a\\"b"`` was refused; a line break was written raw
    (invalid JSON). Their JSON spelling is what is written now, in a value and in a key."""
    spelled = json.dumps(value, ensure_ascii=False)
    keyed = {"type": "object", "properties": {value: {"type": "integer"}}, "required": [value]}
    for schema, text in ((_holding({"enum": ["other", value]}), '{"x": ' + spelled + "}"),
                         (_holding({"const": value}), '{"x": ' + spelled + "}"),
                         (keyed, "{" + spelled + ": 1}")):
        state = feed(start_state(schema, ""), text)
        assert state is not None and state.finished, (schema, text)
        jsonschema.validate(json.loads(text), schema)
        assert feed(start_state(schema, ""), text.replace(spelled, f'"{value}"')) is None  # written raw
        special = next(i for i, c in enumerate(value) if c in '"\\' or ord(c) < 32)
        assert feed(start_state(schema, ""), text.replace(spelled, f'"{value[:special]}"')) is None  # cut there
    assert feed(call_start_state({"f": _holding({"enum": [value]})}, "f"), f' {{"x": {spelled}}}}}').finished  # type: ignore[union-attr]


# -- fusion never commits a schema-breaking candidate --------------------------------------------

def test_fusion_picks_the_best_valid_candidate_and_else_keeps_the_drafted_token() -> None:
    bpe, sp = toy_member("toy-bpe", "byte_level").table, toy_member("toy-sp", "metaspace", seed=1).table
    settings = FusionSettings(make_fuser("unite", 10), None)
    weights = torch.tensor([0.5, 0.5])
    state = start_state(PERSON, "{")
    assert state is not None

    def dists(favour: dict[bytes, float]) -> list[MemberDist]:
        out = []
        for name, table in (("bpe", bpe), ("sp", sp)):
            logits = torch.full((table.vocab_size,), -20.0)
            for piece, value in favour.items():
                logits[_piece_id(table, piece)] = value
            out.append(MemberDist(name, table, logits))
        return out

    quote = _piece_id(bpe, b'"')
    fused_best_invalid = dists({b"}": 9.0, b'"': 6.0})
    decision = _fuse(fused_best_invalid, weights, settings, Sampler(), 1, quote, 0, None)
    assert decision.chosen == b"}"  # unconstrained, the fused argmax breaks the schema ...
    decision = _fuse(fused_best_invalid, weights, settings, Sampler(), 1, quote, 0, state)
    assert decision.chosen == b'"'  # ... constrained, the best valid candidate wins

    space = _piece_id(bpe, b" ")
    none_valid = dists({b"}": 9.0, b"a": 6.0})
    decision = _fuse(none_valid, weights, settings, Sampler(), 1, space, 0, state)
    assert decision.chosen == b" " and not decision.changed  # the drafted (valid) token stands
    sampled = _fuse(fused_best_invalid, weights, settings, Sampler(temperature=1.0, seed=1), 1, quote, 0, state)
    assert sampled.chosen in (b'"', b" ")


# -- whole requests on toy members ----------------------------------------------------------------

def _engine(*members: str, method: str = "safe") -> EnsembleEngine:
    built = {"bpe": toy_member("toy-bpe", "byte_level"), "sp": toy_member("toy-sp", "metaspace", seed=1)}
    return EnsembleEngine([built[m] for m in members], method=method, max_new_tokens=96)


@pytest.mark.parametrize("members, method", [(("bpe",), "single"), (("bpe", "sp"), "safe"),
                                             (("sp", "bpe"), "safe")])
def test_unconstrained_toys_write_no_json_constrained_ones_write_schema_valid_json(
        members: tuple[str, ...], method: str) -> None:
    engine = _engine(*members, method=method)
    plain = engine.generate("Check.", prefix="{")
    with pytest.raises(json.JSONDecodeError):
        json.loads(plain.text)
    result = engine.generate("Check.", response_format=CHECK_FORMAT, keep_events=True)
    assert result.stats.constrained and result.format_error is None and result.finish_reason == "stop"
    jsonschema.validate(json.loads(result.text), CHECK)
    assert not [e for e in result.events if e.type == "format_retry"]  # valid at the first attempt
    assert result.text == "".join(e.text for e in result.events if e.type == "token")
    if len(members) > 1:  # the ensemble ran, and every fused choice it committed kept the JSON valid
        assert result.stats.ensembled_tokens > 0


@pytest.mark.parametrize("members", [("bpe", "sp"), ("sp", "bpe")])
def test_sampled_constrained_answers_are_schema_valid(members: tuple[str, ...]) -> None:
    engine = _engine(*members)
    for seed in range(3):
        result = engine.generate("Check.", response_format=CHECK_FORMAT, temperature=0.8, seed=seed)
        assert result.stats.constrained and result.format_error is None
        jsonschema.validate(json.loads(result.text), CHECK)


def test_a_stop_string_inside_the_json_ends_the_answer_once_not_after_every_retry() -> None:
    """A request's stop string that the JSON itself holds cut every attempt at the same place: the
    answer was asked again (three attempts billed) and still ended cut. The stop string is the
    request's own instruction: the answer ends there at once, naming it, with its format_error."""
    engine = _engine("bpe", "sp")
    result = engine.generate("Check.", response_format=CHECK_FORMAT, stop=['"ok"'], keep_events=True)
    assert result.finish_reason == "stop" and result.stop_string == '"ok"' and '"ok"' not in result.text
    assert result.format_error is not None
    assert not [e for e in result.events if e.type == "format_retry"]
    whole = engine.generate("Check.", response_format=CHECK_FORMAT)  # no stop: a whole answer, ended by itself
    assert whole.stop_string is None and whole.format_error is None


def test_what_is_validated_and_retried_only() -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]
    assert OutputPlan(OutputOptions(response_format=CHECK_FORMAT)).constraint() is not None
    with_tools = OutputPlan(OutputOptions(response_format=CHECK_FORMAT, tools=tools))
    assert with_tools.constraint() is None  # a call must stay possible (the toys' context is too short to run it)
    adafuse = _engine("bpe", "sp", method="adafuse").generate("Check.", response_format=CHECK_FORMAT,
                                                            max_new_tokens=4)
    assert not adafuse.stats.constrained  # every member writes its own span
    plain = _engine("bpe", "sp").generate("Check.", max_new_tokens=4)
    assert not plain.stats.constrained


# -- forced tool calls: the name and the arguments ------------------------------------------------

WEATHER = {"type": "object", "properties": {"city": {"enum": ["Oslo", "Paris"]}}, "required": ["city"]}
CALL_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": WEATHER}},
              {"type": "function", "function": {"name": "get_time", "parameters": {}}}]


def test_a_named_call_takes_schema_valid_arguments_then_closes() -> None:
    state = call_start_state({"get_weather": WEATHER}, "get_weather")  # after '... "arguments":'
    done = feed(state, ' {"city": "Oslo"}}')
    assert done is not None and done.finished
    assert feed(state, ' {"city": "Rome"}') is None  # not in the enum
    assert feed(state, ' {"city": "Oslo"} ,') is None  # the call object closes after the arguments


def test_any_call_names_an_offered_tool_and_takes_its_arguments() -> None:
    tools = {"get_weather": WEATHER, "echo": {"type": "object", "properties": {"text": {"type": "string"}}}}
    state = call_start_state(tools, "any")  # after '<tool_call>\n{"name": "'
    assert feed(state, 'echo", "arguments": {"text": "你好 こんにちは"}}').finished  # type: ignore[union-attr]
    assert feed(state, 'get_weather", "arguments": {}}') is None  # "city" is required
    assert feed(state, 'delete_all"') is None  # no such tool
    assert feed(call_start_state({"noop": {}}, "noop"), " {}}").finished  # type: ignore[union-attr]


def _long_context_toys() -> list[HFMember]:
    """The toys' models under members that take 2048 tokens (their Llama models use RoPE, so the
    512 of the shared toys is only a number): a tools block alone is ~500 toy tokens."""
    out = []
    for name, tokenizer, seed in (("long-bpe", byte_level_tokenizer(), 0), ("long-sp", metaspace_tokenizer(), 1)):
        member = HFMember(name, tiny_llama(tokenizer, seed), tokenizer)
        member.context_window = 2048
        out.append(member)
    return out


@pytest.mark.parametrize("drafter", [0, 1])
def test_forced_calls_on_toys_name_an_offered_tool_with_schema_valid_arguments(drafter: int) -> None:
    engine = EnsembleEngine(_long_context_toys(), drafter=drafter, max_new_tokens=64)
    for choice in ("get_weather", "required"):
        result = engine.generate("Weather?", tools=CALL_TOOLS, tool_choice=choice)
        assert result.stats.constrained and len(result.tool_calls) == 1
        call = result.tool_calls[0]
        assert call.error is None and call.name in ("get_weather", "get_time"), call
        assert choice == "required" or call.name == choice
        jsonschema.validate(call.arguments, WEATHER if call.name == "get_weather" else {"type": "object"})
    # The same prefill as the caller's own prefix is not constrained: the toy writes no arguments.
    own = engine.generate("Weather?", tools=CALL_TOOLS, tool_choice="get_weather", prefix=call_prefix("get_weather"))
    assert not own.stats.constrained
    assert all(c.error or c.arguments != {"city": "Oslo"} and c.arguments != {"city": "Paris"} for c in own.tool_calls)


def test_a_string_ending_in_an_escaped_backslash_is_closed_by_its_quote() -> None:
    """Catches an escaped backslash ("\\\\") escaping the quote after it: the string was read as open,
    so a line break after it was refused as raw in a string and a trailing comma went through."""
    assert feed(start_state(None, ""), '{"a": "x\\\\"\n}').finished  # type: ignore[union-attr]
    assert feed(start_state(None, ""), '["\\\\",]') is None
