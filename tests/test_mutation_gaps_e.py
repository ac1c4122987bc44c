"""Behaviour the suite left unpinned (mutation testing of sampling.py, tools.py and json_constraint.py):
each test fails on one mutant of the code it names and passes on the code as it is. Pure functions and
toy inputs only, so the file stays fast."""

from __future__ import annotations

import pytest
import torch

from shared_engine.alignment import TokenTable
from shared_engine.errors import InvalidRequestError
from shared_engine.events import ToolCallEvent
from shared_engine.json_constraint import JsonPrefix, call_start_state, constrained_token, start_state
from shared_engine.sampling import Sampler, generator_seed, speculative_choice
from shared_engine.tools import (
    CallEnd,
    OutputOptions,
    OutputPlan,
    ToolCallParser,
    coerce_arguments,
    parse_calls,
    tool_call_text,
)


def test_a_seed_beyond_32_bits_keeps_its_generator_seed() -> None:
    """sampling.generator_seed: a seed outside 0..2**32-1 is hashed to all 32 bits of its digest. The
    exact value is what a seeded request's answer rests on: a change (a shorter digest, another hash)
    gave every user's seed -1 or 2**32 another answer than before, and left only 2**24 seeds to draw from."""
    assert generator_seed(-1) == 762098708
    assert generator_seed(2**32) == 1684822834
    assert generator_seed(2**64 - 1) == 2000120129
    assert generator_seed(7) == 7


def test_a_top_k_support_one_short_of_the_vocabulary_never_draws_the_rest() -> None:
    """sampling.Sampler.from_logits: a backend that gives its top ``support`` ids only (the rest spread
    evenly) is drawn from among those ids, also where one id alone is left out: at a high temperature
    the made-up rest would otherwise be drawn as often as a real candidate."""
    sampler = Sampler(temperature=1e6, seed=0)
    logits = torch.tensor([5.0, 4.0, 3.0, 0.0])
    assert {sampler.from_logits(logits, support=3) for _ in range(200)} == {0, 1, 2}


def test_arguments_json_repair_can_only_make_empty_are_reported_not_run_on_empty() -> None:
    """tools._loads: where json_repair reads a string as an empty object or list (``"{"``, ``"{,}"``), no
    JSON was there. A call whose arguments string is such garbage is reported invalid; read as ``{}``, the
    tool was run with no arguments, and an earlier call's garbage arguments were shown to the members as
    a call made with none."""
    (call,) = parse_calls('{"name": "f", "arguments": "{,}"}')
    assert call.error is not None and call.arguments is None and call.name == "f"
    assert '"arguments": "{"' in tool_call_text("f", "{")


def test_a_list_of_calls_whose_last_call_leaves_off_its_brace_is_read_as_written() -> None:
    """tools._cut: in a list of calls the call object sits one bracket deeper (level 2), so a list cut
    after the last call's arguments but before that call's own ``}`` (small models leave it off) is read
    as written, as a lone call is; counted from the list's bracket, both calls were reported as cut off
    and neither run."""
    body = '[{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": 2}'
    calls = parse_calls(body, closed=False)
    assert [(c.name, c.arguments, c.error) for c in calls] == [("f", {"a": 1}, None), ("g", {"b": 2}, None)]


def test_a_blank_tool_name_is_no_call() -> None:
    """tools._as_call: a ``name`` of whitespace only names no tool: the block is reported as no call
    object (name None), not as a call of the tool ``""``, which an agent would look up and fail on."""
    (call,) = parse_calls('{"name": "  ", "arguments": {}}')
    assert call.error is not None and call.name is None


def test_an_unclosed_call_missing_only_its_own_brace_is_run() -> None:
    """tools._cut: an answer that ends (max_new_tokens, end of turn) after a call's complete arguments,
    with only the call object's own ``}`` and the close tag missing, is that call: nothing of the
    arguments was made up. Counting the call's own bracket as cut reported it invalid and the agent
    lost a call it could run."""
    parser = ToolCallParser(["f"])
    out = parser.feed('<tool_call>\n{"name": "f", "arguments": {"a": 1}\n') + parser.close()
    (call,) = [piece for piece in out if isinstance(piece, ToolCallEvent)]
    assert call.error is None and call.name == "f" and call.arguments == {"a": 1}


def test_a_close_tag_in_a_list_items_string_is_part_of_the_arguments() -> None:
    """tools._JsonScan: a string opens after ``[`` as after ``{``, ``,`` or ``:``, so a ``</tool_call>``
    written in the first string of a list argument is text of that argument, not the call's end; read
    as the end, the call was cut there and reported invalid, and the rest of it leaked as answer text."""
    parser = ToolCallParser(["f"])
    text = '<tool_call>\n{"name": "f", "arguments": {"tags": ["</tool_call>"]}}\n</tool_call>\nok'
    out = parser.feed(text) + parser.close()
    calls = [piece for piece in out if isinstance(piece, ToolCallEvent)]
    assert [(c.name, c.arguments, c.error) for c in calls] == [("f", {"tags": ["</tool_call>"]}, None)]
    assert [piece for piece in out if isinstance(piece, str)] == ["ok"]


def test_quoted_numbers_become_the_number_they_spell() -> None:
    """tools.coerce_arguments: a quoted integer with a plus sign (``"+5"``) is the integer 5, a
    quoted whole number for a ``number`` parameter stays an int (``"42"`` -> 42, as ``json.loads`` reads
    42; a float 42.0 fails a tool that formats it or indexes with it), and a number with a leading point
    (``".5"``) is 0.5: each otherwise reached the tool as a string or as the wrong type."""
    schema = {"properties": {"n": {"type": "integer"}, "x": {"type": "number"}, "y": {"type": "number"},
                             "z": {"type": "number"}}}
    fixed = coerce_arguments({"n": "+5", "x": "42", "y": ".5", "z": "1e3"}, schema)
    assert fixed == {"n": 5, "x": 42, "y": 0.5, "z": 1000.0}
    assert type(fixed["x"]) is int and type(fixed["z"]) is float


def test_an_invalid_call_of_a_typed_tool_is_reported_not_coerced() -> None:
    """tools.ToolCallParser: arguments are typed by the tool's schema (``coerce_arguments``) only where
    there are any; a call of a typed tool whose arguments could not be read (None) is reported with its
    error, where typing None raised and the whole request failed."""
    parser = ToolCallParser(["f"], {"f": {"type": "object", "properties": {"n": {"type": "integer"}}}})
    out = parser.feed('<tool_call>\n{"name": "f", "arguments": "{,}"}\n</tool_call>') + parser.close()
    (call,) = out
    assert isinstance(call, ToolCallEvent) and call.name == "f" and call.arguments is None and call.error


def test_two_tools_of_one_name_are_refused() -> None:
    """tools.OutputPlan: tool names must be unique, as OpenAI requires: with two tools named alike the
    parsed call names either, the forced call's arguments are constrained to the last one's schema and
    the agent runs the first."""
    tool = {"type": "function", "function": {"name": "f"}}
    with pytest.raises(InvalidRequestError, match="unique"):
        OutputPlan(OutputOptions.model_validate({"tools": [tool, tool]}))


def test_text_starting_with_a_brace_after_a_call_streams_at_once() -> None:
    """tools.ToolCallParser.feed: only an answer that *starts* with ``{`` is held to its end (it may be
    a bare call); text after a tagged call that happens to start with one (an example object, a set) is
    streamed as it comes, where it was held back until the answer ended."""
    parser = ToolCallParser(["f"])
    (call,) = parser.feed('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\n')
    assert isinstance(call, ToolCallEvent) and call.name == "f"
    assert parser.feed('{"x": 1} is the shape') == ['{"x": 1} is the shape']
    assert parser.close() == []


def test_a_json_retry_beside_tools_keeps_the_callers_own_prefix() -> None:
    """tools.OutputPlan.answer_only: the JSON-only retry of a request with tools and a response_format
    is prefilled with ``{`` unless the caller gave a prefix of their own: that prefix stays (the answer
    the caller's code splices onto it would otherwise start over with a second ``{``)."""
    tool = {"type": "function", "function": {"name": "f"}}
    fmt = {"type": "json_object"}
    own = OutputPlan(OutputOptions.model_validate({"tools": [tool], "response_format": fmt,
                                                   "prefix": '{"answer": '}))
    assert own.answer_only().prefix == '{"answer": ' and own.answer_only().tools is None
    plain = OutputPlan(OutputOptions.model_validate({"tools": [tool], "response_format": fmt}))
    assert plain.prefix == "" and plain.answer_only().prefix == "{"


def test_a_four_byte_character_split_after_its_third_byte_stays_writable() -> None:
    """json_constraint._split_utf8: a byte-level token may end after three bytes of a four-byte
    character (an emoji, a CJK extension ideograph); those bytes are held as pending until the next
    token completes the character. Looking back three bytes only, such a token was ruled out and
    an emoji in a JSON string could not be written by a tokenizer that splits it that way."""
    emoji = "\N{GRINNING FACE}".encode()
    state = JsonPrefix.start({"type": "object", "properties": {"a": {"type": "string"}}})
    assert state is not None
    held = state.after(b'{"a": "' + emoji[:3])
    assert held is not None and held.pending == emoji[:3] and not held.complete
    done = held.after(emoji[3:] + b'"}')
    assert done is not None and done.finished


def test_a_special_token_is_never_drafted_into_json() -> None:
    """json_constraint._next_state: a special token (a chat marker such as ``<|im_start|>``) is no text
    of the answer, even where its name would be valid string content: drafted inside a JSON string the
    member saw a turn marker and the answer's text got its name written in."""
    table = TokenTable.from_bytes([b"</s>", b"<|x|>", b"a"], special_ids={0, 1}, eos_ids={0},
                                  encode=lambda text: [], name="fake")
    state = JsonPrefix.start(None)
    assert state is not None
    in_string = state.after(b'"')
    assert in_string is not None
    chosen = constrained_token(Sampler(temperature=0.0), torch.tensor([0.0, 9.0, 1.0]), None, table, in_string)
    assert chosen is not None and chosen[0] == 2


def test_a_string_of_one_fixed_length_is_constrained() -> None:
    """json_constraint._Rewrite._typed: ``minLength`` equal to ``maxLength`` (a country code, a fixed-
    length id) is a string the parser can write: the answer is constrained to that length, where
    treating it as no string at all left the whole schema unconstrained (validated and retried only)."""
    schema = {"type": "object", "properties": {"c": {"type": "string", "minLength": 2, "maxLength": 2}},
              "required": ["c"]}
    state = start_state(schema, "{")
    assert state is not None
    assert state.after(b'"c": "abc') is None and state.after(b'"c": "a"') is None
    done = state.after(b'"c": "ab"}')
    assert done is not None and done.finished


def test_a_forced_call_of_an_untyped_schema_gets_object_arguments() -> None:
    """json_constraint._parser_schema(object_only=True): a tool whose parameters schema names no type
    (``{"description": ...}``) still takes an object of arguments; read as any JSON value, the forced
    call could be decoded with a string or a number as its arguments, which no tool can be called with."""
    state = call_start_state({"f": {"description": "no parameters"}}, "f")
    assert state is not None
    assert state.after(b' "x"') is None and state.after(b" 5") is None
    done = state.after(b' {"k": 1}}')
    assert done is not None and done.finished


def test_a_property_schema_of_false_is_left_out_not_the_whole_constraint() -> None:
    """json_constraint._Rewrite._typed: a property whose schema is ``false`` (it must not appear, as
    pydantic writes an excluded field) is left out of the keys the parser offers; rewritten as a schema
    it made the whole response_format unconstrained, validated and retried only."""
    state = start_state({"type": "object", "properties": {"a": {"type": "integer"}, "x": False}}, "{")
    assert state is not None
    assert state.after(b'"x"') is None
    done = state.after(b'"a": 1}')
    assert done is not None and done.finished


def test_a_drafted_candidate_the_proposal_gives_no_mass_is_corrected_not_divided_by() -> None:
    """sampling.speculative_choice: a drafted candidate with proposal probability 0 (the draft spelled
    it through a token outside its nucleus) is not accepted by the ratio target/proposal, which would
    divide by zero and fail the request; the choice is drawn from the residual (here candidate 1 alone)."""
    target, proposal = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([1.0, 0.0, 0.0])
    picks = {speculative_choice(Sampler(temperature=1.0, seed=seed), target, proposal, 1) for seed in range(10)}
    assert picks == {1}


def test_a_call_the_prefix_already_closes_ends_the_answer_at_its_start() -> None:
    """tools.CallEndFinder.find: where the caller's prefix holds a whole call (one call asked for), the
    answer ends at its first character (0): the position is counted in the answer after the prefix,
    and the close tag inside the prefix gave a negative one, no position in the answer at all."""
    prefix = '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>\nDone: '
    assert CallEnd(prefix).finder().find("more text") == 0
