"""The engine's one tool-calling and structured-output mechanism (shared_engine.tools): parsing,
prompt rendering, and whole requests on the toy members (no real model)."""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from shared_engine import EnsembleEngine, GenerationResult, InvalidRequestError
from shared_engine.decoding import RequestState, request_members
from shared_engine.events import Event, FinishEvent, Stats, TokenEvent, ToolCallEvent
from shared_engine.members import HFMember
from shared_engine.members.chat import normalize_messages
from shared_engine.members.session import PrefixSession
from shared_engine.tools import (
    CallEnd,
    OutputOptions,
    OutputPlan,
    ResponseFormat,
    ToolCallParser,
    call_prefix,
    forced_tool,
    format_error,
    parse_calls,
    tool_history_as_text,
    with_tools_system,
)
from tests.toy import byte_level_tokenizer, tiny_llama, toy_member

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather at a place.",
                                           "parameters": {"type": "object",
                                                          "properties": {"location": {"type": "string"}}}}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


def run_parser(deltas: list[str]) -> tuple[str, list[ToolCallEvent]]:
    parser = ToolCallParser(["get_weather"])
    pieces = [p for d in deltas for p in parser.feed(d)] + parser.close()
    return "".join(p for p in pieces if isinstance(p, str)), [p for p in pieces if isinstance(p, ToolCallEvent)]


# -- parsing ----------------------------------------------------------------------------------------

def test_plain_text_passes_through_unchanged() -> None:
    answer = " It is sunny <b>today</b>, 20 °C. <tool is a word>\n"
    assert run_parser(list(answer)) == (answer, [])


def test_tagged_call_is_parsed_and_markup_never_leaks() -> None:
    answer = 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>\n'
    text, calls = run_parser(list(answer))  # one character at a time: the hardest split
    assert text == "Let me check."
    assert [(c.name, c.arguments, c.index) for c in calls] == [("get_weather", {"location": "Paris"}, 0)]
    assert calls[0].id.startswith("call_") and calls[0].error is None


def test_two_calls_get_distinct_ids_and_indexes() -> None:
    one = '<tool_call>{"name": "get_weather", "arguments": {"location": "A"}}</tool_call>'
    _, calls = run_parser([one + "\n" + one.replace('"A"', '"B"')])
    assert [(c.arguments["location"], c.index) for c in calls] == [("A", 0), ("B", 1)]
    assert calls[0].id != calls[1].id


def test_prefilled_unterminated_call_keeps_unicode() -> None:
    text, calls = run_parser([call_prefix("get_weather"), ' {"location": "東京", "note": "こんにちは"}}\n'])
    assert text == "" and calls[0].arguments == {"location": "東京", "note": "こんにちは"}
    assert "東京" in calls[0].arguments_json  # not \\u-escaped


@pytest.mark.parametrize("body, name, arguments", [
    ('{"name": "get_weather", "arguments": {"location": "Ber"}\n', "get_weather", {"location": "Ber"}),  # no last }
    ('{"name": "get_weather", "arguments": "{\\"location\\": \\"Rome\\"}"} trailing', "get_weather", {"location": "Rome"}),
    ('{"name": "get_weather", "parameters": {}}', "get_weather", {}),
    ("{'name': 'get_weather', 'arguments': {'location': 'Oslo', 'metric': True}}", "get_weather",
     {"location": "Oslo", "metric": True}),  # a Python dict
    ('{name: "get_weather", arguments: {location: "Oslo"}}', "get_weather", {"location": "Oslo"}),  # bare keys
    ('```json\n{"function": {"name": "get_weather", "arguments": {}}}\n```', "get_weather", {}),
])
def test_sloppy_calls_are_repaired(body: str, name: str, arguments: dict) -> None:
    [call] = parse_calls(body)
    assert (call.name, call.arguments, call.error) == (name, arguments, None)


def test_unreadable_call_is_reported_not_guessed() -> None:
    [call] = parse_calls("get_weather(Paris)")
    assert call.name is None and call.arguments is None and call.error
    assert call.arguments_json == "get_weather(Paris)"


HUNTED = '{"name": "get_weather", "arguments":\ufffd stationber 73?ou\ufffd\n   Berlinelf\ufffd49\ufffdited a'


@pytest.mark.parametrize("body, closed", [
    (HUNTED, True),  # AdaFuse's unconstrained forced call, cut by max_new_tokens
    ('{"name": "get_weather", "arguments": "somewhere warm"}', True),
    ('{"name": "get_weather", "arguments": {"location":', True),  # a key without its value
    ('{"name": "get_weather", "arguments":', True),
    ('{"name": "get_weather", "arguments": {"location": "Ber', False),  # cut: json_repair closes it as "Ber"
    ('{"name": "get_weather", "arguments": {', False),
    ('{"name": "get_weather", "arguments": "{\\"location\\": \\"Ro', False),
    ('[{"name": "get_weather", "arguments": {}}, {"name": "get_weather", "arguments": {"location": "B', False),
])
def test_unreadable_or_cut_arguments_are_reported_not_run_with_empty_ones(body: str, closed: bool) -> None:
    """Arguments json_repair could not read came back as a valid call get_weather({}), and a call
    cut inside its arguments as one run on the cut value: an agent ran the tool without (or with
    half) its arguments instead of seeing an invalid call. (``closed``: unreadable even when the
    model's close tag ends the call; else only when the answer stopped before it.)"""
    [call] = parse_calls(body, closed=False)
    meant = None if body.startswith("[") else "get_weather"  # the tool it names, for an agent's retry message
    assert (call.name, call.arguments, call.raw) == (meant, None, body.strip()) and call.error
    assert bool(parse_calls(body)[0].error) == closed
    text, [streamed] = run_parser(["<tool_call>\n", body])  # unterminated, as max_new_tokens leaves it
    assert text == "" and streamed.error and streamed.raw == body.strip()
    text, calls = run_parser(["<tool_call>\n", body, "\n</tool_call>"])
    assert text == "" and bool(calls[0].error) == closed


@pytest.mark.parametrize("body", ['{"name": "get_weather"}', '{"name": "get_weather", "arguments": {}}',
                                  '{"name": "get_weather", "arguments": null}', '{"name": "get_weather", "arguments": ""}',
                                  '{"name": "get_weather", "arguments": "{}"}'])
def test_a_call_without_arguments_stays_a_call(body: str) -> None:
    [call] = parse_calls(body)  # tools without parameters exist
    assert (call.name, call.arguments, call.error) == ("get_weather", {}, None)


def test_bare_json_answer_is_a_call_only_when_it_names_an_offered_tool() -> None:
    text, calls = run_parser(list('```json\n{"name": "get_weather", "arguments": {"location": "Oslo"}}\n```'))
    assert (text, calls[0].name) == ("", "get_weather")
    answer = '{"city": "Oslo", "temp": 3}'
    assert run_parser(list(answer)) == (answer, [])


DELETE_ALL = '{"name": "delete_all", "arguments": {"confirm": true}}'
BOTH = '[{"name": "get_weather", "arguments": {}}, {"name": "delete_all", "arguments": {}}]'


@pytest.mark.parametrize("answer, text, raw, name", [
    (f"Sure, the format is:\n```\n<tool_call>\n{DELETE_ALL}\n</tool_call>\n```\nThat is how it works.",
     "Sure, the format is:\n```\n```\nThat is how it works.", DELETE_ALL, "delete_all"),
    (f"<tool_call>\n{DELETE_ALL}", "", DELETE_ALL, "delete_all"),  # unterminated
    (f"<tool_call>{BOTH}</tool_call>", "", BOTH, None),  # one block: a list names no one tool
])
def test_a_tagged_call_of_a_tool_never_offered_is_invalid_not_run(answer: str, text: str, raw: str,
                                                                   name: str | None) -> None:
    """With tools=[get_weather], an answer explaining the format with a made-up tool in a code
    fence came back as a valid call delete_all({"confirm": true}) (a bare JSON answer counts only
    when it names an offered tool; a tagged one was not checked): the server and LangChain
    forwarded it as a call to run. It is an invalid call now, its text kept as the members wrote
    it (the server shows it as text, LangChain's invalid_tool_calls and LlamaIndex's hold it)."""
    for deltas in ([answer], list(answer)):
        shown, [call] = run_parser(deltas)
        assert (shown, call.name, call.arguments, call.raw) == (text, name, None, raw)
        assert call.error == "'delete_all' is not an offered tool"
    [offered] = parse_calls('{"name": "get_weather", "arguments": {}}', names={"get_weather"})
    assert offered.error is None


@settings(derandomize=os.environ.get("HYPOTHESIS_EXPLORE") != "1", database=None)
@given(st.lists(st.sampled_from(["<tool_call>", "</tool_call>", "<tool", "_call>", "`", "\n", " ", "{", "}", "[",
                                 '"name": "get_weather"', "word", "é"]), max_size=12))
@example(pieces=["<tool", "<tool_call>", "</tool_call>", "_call>"])  # text "<tool" + a call + "_call>"
def test_parser_never_loses_plain_text_or_leaks_a_whole_tag(pieces: list[str]) -> None:
    text, calls = run_parser(pieces)
    # No run of text between calls holds a whole tag (text on both sides of a call may spell one
    # when joined, as the example above does: the model wrote those pieces as text).
    parser = ToolCallParser(["get_weather"])
    runs, current = [], ""
    for piece in [p for d in pieces for p in parser.feed(d)] + parser.close():
        if isinstance(piece, str):
            current += piece
        else:
            runs.append(current)
            current = ""
    assert not any("<tool_call>" in run for run in [*runs, current])
    if "<tool_call>" not in "".join(pieces) and not re.match(r"\s*(\{|`|\[\s*\{)", "".join(pieces)):
        assert text.strip() == "".join(pieces).strip()


def test_every_bare_call_is_read_and_text_after_them_is_kept() -> None:
    """A bare-JSON answer was read as one value: a second call and any prose after the call were
    silently lost."""
    paris = '{"name": "get_weather", "arguments": {"location": "Paris"}}'
    rome = paris.replace("Paris", "Rome")
    for deltas in ([paris + "\n" + rome], list(paris + "\n" + rome)):
        text, calls = run_parser(deltas)
        assert (text, [c.arguments["location"] for c in calls]) == ("", ["Paris", "Rome"])
        assert [c.index for c in calls] == [0, 1]
    text, calls = run_parser(list(paris + " Then I will summarise."))
    assert (text, [c.name for c in calls]) == ("Then I will summarise.", ["get_weather"])
    text, calls = run_parser(["```json\n" + paris + "\n```\nDone."])  # a fenced call, then prose
    assert (text, [c.arguments for c in calls]) == ("Done.", [{"location": "Paris"}])
    text, calls = run_parser(["{'name': 'get_weather', 'arguments': {'location': 'Oslo'}} ok"])  # repaired
    assert (text, [c.arguments for c in calls]) == ("ok", [{"location": "Oslo"}])
    # JSON that is no call stays text, whole, even when a call follows it
    answer = '{"city": "Oslo"} ' + paris
    assert run_parser(list(answer)) == (answer, [])
    text, calls = run_parser([paris + ' {"city": "Oslo"}'])  # a call, then JSON that is no call: text
    assert (text, len(calls)) == ('{"city": "Oslo"}', 1)


def test_a_bare_list_of_calls_is_read_as_those_calls() -> None:
    """Some models answer with a JSON list of calls and no tags: it stayed text."""
    paris = '{"name": "get_weather", "arguments": {"location": "Paris"}}'
    listed = f'[{paris}, {paris.replace("Paris", "Rome")}]'
    for answer in (listed, f" [\n  {listed[1:-1]}\n]\nDone.", f"```json\n{listed}\n```"):
        for deltas in ([answer], list(answer)):
            text, calls = run_parser(deltas)
            assert [c.arguments["location"] for c in calls] == ["Paris", "Rome"], answer
            assert text == ("Done." if "Done" in answer else "") and [c.index for c in calls] == [0, 1]
    answer = '[{"city": "Oslo"}, ' + paris + "]"  # not every item is a call: text, whole
    assert run_parser(list(answer)) == (answer, [])
    parser = ToolCallParser(["get_weather"])  # a list that cannot hold calls is streamed, not held
    assert parser.feed("[") == [] and parser.feed("1] See the notes.") == ["[1] See the notes."]


def test_a_close_tag_inside_a_string_argument_does_not_end_the_call() -> None:
    """``</tool_call>`` written inside a JSON string (code that prints it) was taken as the end of
    the call: the call was cut there and the rest of it leaked into the text."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"location": "print(\'</tool_call>\')"}}</tool_call>'
    for deltas in ([call + " after"], list(call + " after")):
        text, calls = run_parser(deltas)
        assert (text, [c.arguments for c in calls]) == ("after", [{"location": "print('</tool_call>')"}])
    escaped = '<tool_call>{"name": "get_weather", "arguments": {"location": "a \\"</tool_call>\\" b"}}</tool_call>'
    assert run_parser(list(escaped))[1][0].arguments == {"location": 'a "</tool_call>" b'}
    # a string the model never closed: the tag still ends the call once the answer is over
    text, calls = run_parser(list('<tool_call>{"name": "get_weather", "arguments": {"location": "Ber</tool_call> Hi'))
    assert (text, [c.arguments for c in calls]) == ("Hi", [{"location": "Ber"}])


def test_text_on_both_sides_of_a_call_keeps_one_separator() -> None:
    """Whitespace next to a call was dropped, so the text before and after it ran together
    ("Let me check.Then I answer."); whitespace-only text around calls is still dropped."""
    call = '<tool_call>{"name": "get_weather", "arguments": {"location": "Oslo"}}</tool_call>'
    cases = {
        f"Let me check. {call} Then I answer.": "Let me check. Then I answer.",
        f"Let me check.\n{call}\nThen I answer.\n": "Let me check.\nThen I answer.",
        f"A\n{call}\n\n{call} B": "A B",  # the separator written after the last call
        f"A\n{call}{call}B": "A\nB",  # none after it: the one written before the first
        f"{call}\n Then.": "Then.",  # no text before: nothing to separate
        f"First. {call}\n": "First.",  # no text after: nothing to separate
    }
    for answer, expected in cases.items():
        for deltas in ([answer], list(answer)):
            assert run_parser(deltas)[0] == expected, (answer, deltas[:1])


def test_tool_choice_normalisation() -> None:
    names = ["get_weather", "other"]
    assert forced_tool(None, names) is None and forced_tool("auto", names) is None
    assert forced_tool("any", ["get_weather"]) == "get_weather"  # one tool: its name is prefilled too
    assert forced_tool("required", names) == "any" and forced_tool(True, names) == "any"
    assert forced_tool({"type": "function", "function": {"name": "other"}}, names) == "other"
    with pytest.raises(InvalidRequestError, match="not 'auto'"):
        forced_tool("nope", names)


# -- prompts ----------------------------------------------------------------------------------------

def test_fallback_puts_the_tools_block_into_the_system_message() -> None:
    rendered = with_tools_system([{"role": "user", "content": "hi"}], TOOLS)
    assert rendered[0]["role"] == "system" and json.dumps(TOOLS[0]) in rendered[0]["content"]
    rendered = with_tools_system([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], TOOLS)
    assert rendered[0]["content"].startswith("Be brief.\n\n# Tools")


def test_openai_tool_history_becomes_text_turns() -> None:
    history = normalize_messages([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "2", "content": "Error: boom"},
    ])
    out = tool_history_as_text(history)
    assert [m["role"] for m in out] == ["user", "assistant", "user"]
    assert out[1]["content"] == '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
    assert out[2]["content"] == "<tool_response>\nsunny\n</tool_response>\n<tool_response>\nError: boom\n</tool_response>"


def test_each_member_renders_tools_its_own_way() -> None:
    native, plain = toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)
    messages = [{"role": "user", "content": "Weather in Oslo?"}]
    for member in (native, plain):
        with_tools = member.tokenizer.decode(member.prompt_ids(messages, tools=TOOLS))
        assert '"name": "get_weather"' in with_tools and "<tool_call>" in with_tools
        assert "get_weather" not in member.tokenizer.decode(member.prompt_ids(messages))


def test_tool_result_hint_follows_tool_results_only_when_tools_are_offered() -> None:
    hint = "Using the function result above, answer my original question in plain text."
    after_result = [{"role": "user", "content": "Weather?"},
                    {"role": "assistant", "content": "", "tool_calls": [
                        {"id": "1", "type": "function", "function": {"name": "get_weather", "arguments": {}}}]},
                    {"role": "tool", "content": "sunny"}]
    plan = OutputPlan(OutputOptions(tools=TOOLS, tool_result_hint=hint))
    assert plan.messages(after_result)[-2:] == [{"role": "user", "content": "<tool_response>\nsunny\n</tool_response>"},
                                                {"role": "user", "content": hint}]
    assert plan.messages(after_result[:1])[-1]["content"] == "Weather?"  # no tool result yet: no hint
    no_tools = OutputPlan(OutputOptions(tool_result_hint=hint))
    assert hint not in str(no_tools.messages(after_result))
    assert hint not in str(OutputPlan(OutputOptions(tools=TOOLS)).messages(after_result))  # off by default


def test_plan_for_a_forced_call_and_for_json() -> None:
    plan = OutputPlan(OutputOptions(tools=TOOLS, tool_choice="required"))
    assert plan.forced == "get_weather" and plan.prefix == call_prefix("get_weather")
    assert plan.stops == ["</tool_call>"] and plan.calls_only and not plan.one_call  # further calls may follow
    assert isinstance(plan.stops[0], CallEnd) and plan.stops[0].prefix == plan.prefix
    assert plan.messages([{"role": "user", "content": "hi"}])[-1]["content"] == \
        "Answer with a call to the function get_weather."
    assert OutputPlan(OutputOptions(tools=TOOLS, tool_choice="none")).tools is None
    json_plan = OutputPlan(OutputOptions(response_format={"type": "json_schema",
                                                          "json_schema": {"name": "p", "schema": PERSON}}))
    assert json_plan.prefix == "{" and json_plan.attempts == 3
    assert json.dumps(PERSON) in json_plan.messages([{"role": "user", "content": "hi"}])[-1]["content"]


def test_format_validation() -> None:
    schema = ResponseFormat(type="json_schema", json_schema={"name": "p", "schema": PERSON})
    assert format_error('{"name": "Ann", "age": 3}', schema) is None
    assert "age" in format_error('{"name": "Ann"}', schema)
    assert "not valid JSON" in format_error('{"name": "Ann"', schema)
    assert format_error('{"anything": 1}', ResponseFormat(type="json_object")) is None
    checked = ResponseFormat(type="json_object", json_schema={"name": "p", "schema": PERSON})
    assert "age" in format_error('{"name": "Ann"}', checked)  # validated, though not shown in the prompt
    assert "schema" not in OutputPlan(OutputOptions(response_format=checked)).messages([])[-1]["content"]
    with pytest.raises(ValueError, match="not a valid JSON schema"):
        ResponseFormat(type="json_schema", json_schema={"name": "p", "schema": {"type": 3}})


@pytest.mark.parametrize("schema", [{"type": "array", "items": {"type": "integer"}}, {"enum": ["yes", "no"]},
                                    {"type": "string"}, {"const": 3}, {"type": ["array", "null"]}])
@pytest.mark.parametrize("kind", ["json_schema", "json_object"])
def test_a_schema_whose_root_is_no_object_is_refused(schema: dict[str, Any], kind: str) -> None:
    """The answer is prefilled with ``{``: such a schema could never be met (three attempts of garbage,
    then a misleading format_error), so it is refused up front, naming the field, as OpenAI does."""
    with pytest.raises(InvalidRequestError, match=r"^response_format's schema must have an object at its root"):
        OutputPlan(OutputOptions(response_format={"type": kind, "json_schema": {"name": "x", "schema": schema}}))


@pytest.mark.parametrize("schema", [PERSON, {"type": ["object", "null"]}, {}, {"enum": [{"a": 1}, 2]},
                                    {"anyOf": [PERSON, {"type": "object"}]}])
def test_a_schema_whose_root_may_be_an_object_is_taken(schema: dict[str, Any]) -> None:
    plan = OutputPlan(OutputOptions(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}))
    assert plan.prefix == "{"


@pytest.mark.parametrize(("fmt", "good", "bad"), [
    ("date", "1776-07-04", "July 4th, 1776"),
    ("date-time", "1776-07-04T12:00:00Z", "yesterday"),
    ("time", "12:00:00Z", "noon"),
    ("email", "ann@example.com", "nobody"),
    ("uuid", "12345678-1234-5678-1234-567812345678", "x"),
    ("ipv4", "192.168.0.1", "999.1.1"),
])
def test_format_validation_checks_formats(fmt: str, good: str, bad: str) -> None:
    """A string's ``format`` is checked (and so retried), as the README says: unchecked, a date
    written as prose passed and broke the caller's own parsing (Pydantic's ``date``)."""
    schema = {"type": "object", "properties": {"s": {"type": "string", "format": fmt}}, "required": ["s"]}
    rf = ResponseFormat(type="json_schema", json_schema={"name": "x", "schema": schema})
    assert format_error(json.dumps({"s": good}), rf) is None
    assert format_error(json.dumps({"s": bad}), rf) == f"s: {bad!r} is not a {fmt!r}"


def test_shaper_holds_structured_text_until_finish() -> None:
    plan = OutputPlan(OutputOptions(response_format={"type": "json_object"}))
    shaper = plan.shaper()
    assert shaper.on_event(TokenEvent(text='"a": 1}', source="draft", position=0)) == []
    [finish] = shaper.on_event(FinishEvent(reason="eos", text='"a": 1}', stats=Stats()))
    assert finish.text == '{"a": 1}' and finish.format_error is None
    assert "".join(e.text for e in shaper.release()) == '{"a": 1}'


def test_text_the_parser_held_to_the_end_keeps_its_tokens_place() -> None:
    """A possible tag's start held back to the end went out as position 0, source "draft": the
    server now reads a chunk's AdaFuse span from its position, so it was labelled span 0 and the
    live page attached it to the first token."""
    shaper = OutputPlan(OutputOptions(tools=TOOLS)).shaper()
    shown = shaper.on_event(TokenEvent(text="Hi", source="draft", position=0))
    shown += shaper.on_event(TokenEvent(text=" <tool", source="ensemble", position=1))
    shown += shaper.on_event(FinishEvent(reason="length", text="Hi <tool", stats=Stats()))
    tokens = [e for e in shown if isinstance(e, TokenEvent)]
    assert "".join(e.text for e in tokens) == "Hi <tool"
    assert [(e.source, e.position) for e in tokens if "<" in e.text] == [("ensemble", 1)]


# -- whole requests on toy members --------------------------------------------------------------------

SMALL_TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
"""The toys' context is 512 tokens and their tokenizers know little English: a short spec."""


@pytest.fixture(scope="module")
def engine() -> EnsembleEngine:
    return EnsembleEngine([toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)],
                          max_new_tokens=12)


def test_forced_call_comes_as_a_tool_call_event_and_never_as_text(engine: EnsembleEngine) -> None:
    events = list(engine.stream("Weather?", tools=SMALL_TOOLS, tool_choice="get_weather"))
    tokens = [e for e in events if e.type == "token"]
    calls = [e for e in events if e.type == "tool_call"]
    finish = events[-1]
    assert not any("<tool_call>" in t.text for t in tokens)
    assert len(calls) == 1 and finish.tool_calls == calls
    assert calls[0].name == "get_weather" or calls[0].error  # what the random toy writes is its business
    assert finish.text == "".join(t.text for t in tokens)


def test_prefix_is_continued_and_is_part_of_the_answer(engine: EnsembleEngine) -> None:
    result = engine.generate("Say something.", prefix="Sure: ", keep_events=True)
    first = next(e for e in result.events if e.type == "token")
    assert (first.text, first.source) == ("Sure: ", "prefix")
    assert result.text.startswith("Sure: ")


def test_structured_output_retries_and_reports_what_is_still_wrong(engine: EnsembleEngine) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    result = engine.generate("Give me a person.", response_format=fmt, keep_events=True)
    retries = [e for e in result.events if e.type == "format_retry"]
    # Decoding is constrained, but a random toy cut at 12 tokens finishes no person: every attempt
    # fails, each rejected one is announced and never released as text, and the last answer comes
    # back with the reason.
    assert result.stats.constrained
    assert [r.attempt for r in retries] == [1, 2] and result.format_error
    assert result.text.startswith("{") and result.text == "".join(e.text for e in result.events if e.type == "token")


def test_bad_tool_options_are_typed_errors(engine: EnsembleEngine) -> None:
    with pytest.raises(InvalidRequestError, match="tool_choice"):
        engine.generate("hi", tools=TOOLS, tool_choice="nope")
    with pytest.raises(InvalidRequestError, match="tools"):
        engine.generate("hi", tools=[{"type": "function", "function": {"name": "has space"}}])
    with pytest.raises(InvalidRequestError, match="response_format"):
        engine.generate("hi", response_format={"type": "xml"})


class _ScriptedSession(PrefixSession):
    """Logits that put all the mass on the script's next token (EOS after it), from the first
    position the session is asked about (the end of the prompt)."""

    def __init__(self, member: ScriptedMember) -> None:
        super().__init__()
        self.member, self.start = member, None

    def _compute(self, target: list[int], first_row: int, common: int) -> torch.Tensor:
        if self.start is None:
            self.start = len(target)
        self.last_sync, self.ids = (common, len(self.ids) - common), list(target)
        self.num_forwards += 1
        script, eos = self.member.script, min(self.member.eos_ids)
        rows = torch.full((len(target) - first_row + 1, len(self.member.table.pieces)), -30.0)
        for row, written in enumerate(range(first_row - self.start, len(target) - self.start + 1)):
            rows[row, script[written] if written < len(script) else eos] = 30.0
        return rows


class ScriptedMember(HFMember):
    """A member that writes ``script`` whatever it is asked (the byte-level toy's tokens): a chosen
    answer through the engine's whole decoding (stop strings, constraint, parsing)."""

    def __init__(self, script: str) -> None:
        tokenizer = byte_level_tokenizer()
        super().__init__("scripted", tiny_llama(tokenizer), tokenizer)
        self.context_window = 4096  # the tools block alone is ~500 toy tokens
        self.script = tokenizer.encode(script, add_special_tokens=False)

    def new_session(self) -> _ScriptedSession:  # type: ignore[override]
        return _ScriptedSession(self)


ECHO_TOOLS = [{"type": "function", "function": {"name": "echo", "parameters": {
    "type": "object", "properties": {"text": {"type": "string"}}}}},
              {"type": "function", "function": {"name": "noop", "parameters": {}}}]


def test_a_close_tag_inside_an_argument_does_not_end_a_call_of_one() -> None:
    """A forced call (and any call with parallel_tool_calls=False) stopped at ``</tool_call>``, so
    the tag written inside a JSON string cut the call there ({"text": "use"}). A call of one stops
    at the tag that ends it, on a line of its own or on the call's line, and what follows the first
    call is dropped."""
    arguments = {"text": "use </tool_call> here"}
    body = json.dumps(arguments)
    call = json.dumps({"name": "echo", "arguments": arguments})
    noop = '<tool_call>{"name": "noop", "arguments": {}}</tool_call>'
    cases = [  # (options, what the member writes after the prefill, the answer's text, how it ends)
        ({"tool_choice": "echo", "parallel_tool_calls": False}, f" {body}}}", "", "stop"),
        ({"tool_choice": "required", "parallel_tool_calls": False}, f'echo", "arguments": {body}}}', "", "stop"),
        ({"tool_choice": "required"}, f'echo", "arguments": {body}}}', "", "eos"),  # the member ended it
        ({"parallel_tool_calls": False}, f"Sure.\n<tool_call>\n{call}\n</tool_call>\nMore.", "Sure.", "stop"),
        ({"parallel_tool_calls": False}, f"<tool_call>{call}</tool_call> {noop} Bye.", "", "stop"),
    ]
    for options, script, text, reason in cases:
        result = EnsembleEngine([ScriptedMember(script)], method="single", max_new_tokens=200).generate(
            "Echo it.", tools=ECHO_TOOLS, **options)
        assert [(c.name, c.arguments) for c in result.tool_calls] == [("echo", arguments)], options
        assert (result.text, result.finish_reason) == (text, reason), options
    both = EnsembleEngine([ScriptedMember(cases[-1][1])], method="single", max_new_tokens=200).generate(
        "Echo it.", tools=ECHO_TOOLS)  # parallel calls allowed: both, and the text after them
    assert ([c.name for c in both.tool_calls], both.text) == (["echo", "noop"], "Bye.")


def _scripted(script: str, **options: Any) -> tuple[list[Event], GenerationResult]:
    """The streamed events and the whole result of ``ScriptedMember(script)`` answering alone."""
    engine = EnsembleEngine([ScriptedMember(script)], method="single", max_new_tokens=300)
    events = list(engine.stream("Echo it.", tools=ECHO_TOOLS, **options))
    return events, engine.generate("Echo it.", tools=ECHO_TOOLS, **options)


def _tokens_through(script: str, end: str) -> int:
    """How many of the byte-level toy's tokens of ``script`` it takes to write it through ``end``."""
    tokenizer = byte_level_tokenizer()
    ids, through = tokenizer.encode(script, add_special_tokens=False), script.index(end) + len(end)
    return next(n for n in range(len(ids) + 1) if len(tokenizer.decode(ids[:n])) >= through)


def test_a_call_of_one_stops_at_its_close_tag_written_inline() -> None:
    """Qwen writes ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` on one line; a call
    of one (parallel_tool_calls=False, a forced call) stopped only at a tag starting a line, so
    such an answer ran on to EOS or max_new_tokens after its call. It stops at the tag that ends the
    call now, never at one inside the call's strings: nothing after it is written, counted or
    streamed."""
    arguments = {"text": "a </tool_call> b"}
    call = json.dumps({"name": "echo", "arguments": arguments})
    junk = " And now a lot more text that should never be written or streamed. " * 3
    script = f"Sure. <tool_call>{call}</tool_call>{junk}"
    events, result = _scripted(script, parallel_tool_calls=False)
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("echo", arguments)]
    assert (result.text, result.finish_reason) == ("Sure.", "stop")
    assert result.stats.tokens == _tokens_through(script, f"{call}</tool_call>")
    streamed = "".join(e.text for e in events if isinstance(e, TokenEvent))
    assert streamed == "Sure." and [e.arguments for e in events if isinstance(e, ToolCallEvent)] == [arguments]
    # a prefix of the caller's own that opens a string (no constraint): the tag in it is no stop
    prefix = '<tool_call>\n{"name": "echo", "arguments": {"text": "'
    _, forced = _scripted(f'</tool_call> x"}}</tool_call>{junk}', tool_choice="echo", prefix=prefix)
    assert [c.arguments for c in forced.tool_calls] == [{"text": "</tool_call> x"}]
    assert (forced.text, forced.finish_reason) == ("", "stop")
    # parallel calls allowed: no stop, both calls and the text after them
    two = f"<tool_call>{call}</tool_call> <tool_call>{call}</tool_call> Bye."
    for options in ({}, {"parallel_tool_calls": True}):
        _, both = _scripted(two, **options)
        assert ([c.arguments for c in both.tool_calls], both.text, both.finish_reason) == \
            ([arguments, arguments], "Bye.", "eos")
    plain = EnsembleEngine([ScriptedMember(script)], method="single", max_new_tokens=300).generate("Echo it.")
    assert (plain.text, plain.finish_reason) == (script, "eos")  # no tools: no stop, the answer whole


def test_a_lenient_call_of_one_keeps_a_close_tag_in_its_strings() -> None:
    """The line-start stop cut the close tag off the answer, so the parser read the call as never
    closed and, its Python-style quotes being no strict JSON, cut it at the tag inside its string
    ({"text": "a"}). The answer now ends after the close tag, which the parser reads as the end."""
    call = "{'name': 'echo', 'arguments': {'text': 'a </tool_call> b'}}"
    for script in (f"<tool_call>\n{call}\n</tool_call>\nMore.", f"<tool_call>{call}</tool_call> More."):
        _, result = _scripted(script, parallel_tool_calls=False)
        assert [c.arguments for c in result.tool_calls] == [{"text": "a </tool_call> b"}], script
        assert (result.text, result.finish_reason) == ("", "stop"), script


def test_the_stop_of_a_call_of_one_holds_back_a_possible_tag_and_releases_nothing_past_it() -> None:
    """Committed one character at a time: text that may start the close tag is held back, a tag
    in the call's string is released with it, and the answer ends right after the call's own tag."""
    member = toy_member("a", "byte_level", "llama", 1)
    plan = OutputPlan(OutputOptions(tools=ECHO_TOOLS, parallel_tool_calls=False))
    state = RequestState(request_members([member], ["a"], [member.new_session()], [[1]]), 500,
                         stop=tuple(plan.stops))
    call = '<tool_call>{"name": "echo", "arguments": {"text": "</tool_call>"}}</tool_call>'
    released, written = "", 0
    for char in call + " Bye.":
        if state.finish_reason:
            break
        released += "".join(e.text for e in state.commit(member.table.spell(char), "draft"))
        written += 1
        assert call.startswith(released), written
        if written == call.rindex("<") + 1:
            assert not released.endswith("<")  # the start of the call's own tag: held until decided
    assert (written, state.finish_reason, state.stats.tokens, state.text) == (len(call), "stop", len(call), call)
    assert released + "".join(e.text for e in state.flush()) == call


def test_quoted_numbers_and_booleans_take_the_type_the_tool_schema_asks_for() -> None:
    """Small models write ``{"a": "1234"}`` for an integer; LlamaIndex calls the function with what
    the engine parsed, so the engine gives the schema's type where the whole string reads as one."""
    from shared_engine.tools import ToolCallParser, coerce_arguments

    schema = {"properties": {"a": {"type": "integer"}, "x": {"type": "number"}, "ok": {"type": "boolean"},
                             "name": {"type": "string"}}}
    assert coerce_arguments({"a": "1234", "x": " 2.5 ", "ok": "True", "name": "42"}, schema) == \
        {"a": 1234, "x": 2.5, "ok": True, "name": "42"}
    assert coerce_arguments({"a": "12 apples", "x": "1e3", "ok": "yes", "extra": "7"}, schema) == \
        {"a": "12 apples", "x": 1000.0, "ok": "yes", "extra": "7"}
    parser = ToolCallParser(["multiply"], {"multiply": schema})
    out = parser.feed('<tool_call>\n{"name": "multiply", "arguments": {"a": "1234", "name": "b"}}\n</tool_call>')
    out += parser.close()
    calls = [c for c in out if not isinstance(c, str)]
    assert [c.arguments for c in calls] == [{"a": 1234, "name": "b"}]


def test_text_json_repair_fails_on_is_read_as_text() -> None:
    """json_repair raised its own AssertionError on some garbage (the server answered 500); it is text."""
    garbage = '{"```json\n\\{```json\n```json\n<tool\n"name": "get_weather"\''
    text, calls = run_parser([garbage])
    assert text.strip() and calls == []


def test_tools_beside_a_json_format_can_still_be_called_and_a_text_answer_is_still_checked() -> None:
    """An agent with tools and an answer schema (LangChain's create_agent(response_format=...) binds
    both) never called its tools: the answer was prefilled with "{", which shuts out a <tool_call>."""
    fmt = {"type": "json_schema", "json_schema": {"name": "echoed", "schema": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    plan = OutputPlan(OutputOptions(tools=ECHO_TOOLS, response_format=fmt))
    assert plan.prefix == "" and plan.constraint() is None and plan.attempts == 3

    def answer(script: str) -> tuple[object, list[str]]:
        result = EnsembleEngine([ScriptedMember(script)], method="single", max_new_tokens=200).generate(
            "Echo it.", tools=ECHO_TOOLS, response_format=fmt, keep_events=True)
        return result, [e.type for e in result.events]

    call, types = answer('<tool_call>\n{"name": "echo", "arguments": {"text": "hi"}}\n</tool_call>')
    assert [(c.name, c.arguments) for c in call.tool_calls] == [("echo", {"text": "hi"})]
    assert call.text == "" and call.format_error is None and "format_retry" not in types  # a call, not retried
    valid, types = answer('{"text": "hi"}')
    assert (valid.text, valid.tool_calls, valid.format_error) == ('{"text": "hi"}', [], None)
    invalid, types = answer("Just words.")
    assert types.count("format_retry") == 2 and "not valid JSON" in invalid.format_error


def test_a_close_tag_in_a_string_after_a_comma_in_a_list_does_not_end_the_call() -> None:
    """Catches a string after ',' not being read as a string: the close tag inside the list's second
    item ended the call there."""
    call = '<tool_call>{"name": "echo", "arguments": {"text": ["a", "</tool_call>"]}}</tool_call>'
    assert CallEnd().finder().find(call + " more") == len(call)
