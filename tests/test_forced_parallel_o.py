"""A forced tool call and parallel calls (helper 224): ``tool_choice`` "required" (or a tool's name)
with ``parallel_tool_calls`` not False returned one call only, whatever the members wrote (OpenAI
returns them all); and an unreadable call went back to an HTTP client with a close tag the members
never wrote (a call cut by max_tokens read as closed)."""

from __future__ import annotations

import json
from typing import Any

import httpx

from shared_engine import EnsembleEngine, GenerationResult
from shared_engine.json_constraint import JsonPrefix
from shared_engine.tools import OutputOptions, OutputPlan, ToolCallParser, parse_calls
from tests.test_json_constraint import feed
from tests.test_server_tools import MODEL, USER, serve  # noqa: F401 - serve: the fixture
from tests.test_tools import ECHO_TOOLS, ScriptedMember, _tokens_through

ECHO_A = '{"name": "echo", "arguments": {"text": "a"}}'
NOOP = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
ECHO_B = '<tool_call>\n{"name": "echo", "arguments": {"text": "b"}}\n</tool_call>'


def _generate(script: str, **options: Any) -> GenerationResult:
    engine = EnsembleEngine([ScriptedMember(script)], method="single", max_new_tokens=300)
    return engine.generate("Echo it.", tools=ECHO_TOOLS, **options)


def _calls(result: GenerationResult) -> list[tuple[str | None, Any]]:
    return [(c.name, c.arguments) for c in result.tool_calls]


def test_a_required_call_keeps_the_further_calls_the_members_write() -> None:
    """After the prefill '<tool_call>\\n{"name": "' the member writes two calls: both come back (the
    constraint ended the answer at the first call's brace); parallel_tool_calls=False keeps one."""
    script = 'echo", "arguments": {"text": "a"}}\n</tool_call>\n' + NOOP
    for choice in ("required", "any", True):
        result = _generate(script, tool_choice=choice)
        assert _calls(result) == [("echo", {"text": "a"}), ("noop", {})], choice
        assert result.text == "" and result.format_error is None
    one = _generate(script, tool_choice="required", parallel_tool_calls=False)
    assert _calls(one) == [("echo", {"text": "a"})] and one.finish_reason == "stop"


def test_the_forced_constraint_lets_the_answer_go_on_after_the_call() -> None:
    plan = OutputPlan(OutputOptions(tools=ECHO_TOOLS, tool_choice="required"))
    state = feed(plan.constraint(), 'echo", "arguments": {"text": "a"}}')
    assert state is not None and state.complete and not state.finished  # it may end, or go on
    assert feed(state, "\n</tool_call>\n<tool_call>\nanything") is not None
    assert isinstance(state, JsonPrefix) and state.parser is None  # free: the calls after it are read, not decoded
    whole_token = plan.constraint()
    assert whole_token is not None
    after = whole_token.after(b'echo", "arguments": {"text": "a"}}\n</')  # one piece past the brace
    assert after is not None and after.complete and not after.finished
    single = OutputPlan(OutputOptions(tools=ECHO_TOOLS, tool_choice="required", parallel_tool_calls=False))
    ended = feed(single.constraint(), 'echo", "arguments": {"text": "a"}}')
    assert ended is not None and ended.finished


def test_text_after_a_forced_call_is_neither_shown_nor_written_on() -> None:
    """Prose after the calls ends the answer where it starts (the request asked for calls)."""
    script = 'echo", "arguments": {"text": "a"}}\n</tool_call>\n' + NOOP + "\nDone: I called both tools for you."
    result = _generate(script, tool_choice="required")
    assert _calls(result) == [("echo", {"text": "a"}), ("noop", {})] and result.text == ""
    assert result.finish_reason == "stop"
    assert result.stats.tokens < _tokens_through(script, "Done: I called")  # not generated on
    prose = _generate('echo", "arguments": {"text": "a"}}\nThe echo tool will repeat it for you now.',
                      tool_choice="required")  # no close tag, then prose: the call's JSON ended the answer
    assert _calls(prose) == [("echo", {"text": "a"})] and prose.text == ""


def test_a_named_forced_tool_may_be_called_again_and_only_it() -> None:
    twice = _generate(' {"text": "a"}}\n</tool_call>\n' + ECHO_B, tool_choice="echo")
    assert _calls(twice) == [("echo", {"text": "a"}), ("echo", {"text": "b"})] and twice.format_error is None
    other = _generate(' {"text": "a"}}\n</tool_call>\n' + NOOP, tool_choice="echo")
    assert other.format_error == "noop was called, but only echo may be called"
    assert len(other.rejected_attempts) == 2  # checked and retried like arguments out of the schema


def test_every_call_of_a_forced_answer_is_checked_against_its_schema() -> None:
    bad = '<tool_call>\n{"name": "echo", "arguments": {"text": 5}}\n</tool_call>'
    result = _generate('echo", "arguments": {"text": "a"}}\n</tool_call>\n' + bad, tool_choice="required")
    assert result.format_error is not None and "the arguments of echo, {\"text\": 5}" in result.format_error
    assert len(result.rejected_attempts) == 2


# -- B: an unreadable call goes back with the tags the members wrote --------------------------------

def test_each_call_says_which_tags_were_written_around_it() -> None:
    assert parse_calls(ECHO_A)[0].tags == "both"
    assert parse_calls('{"name": "echo', closed=False)[0].tags == "open"
    parser = ToolCallParser(["echo"])
    [bare] = [p for p in parser.feed('{"name": "echo", "arguments": {"text": "Par') + parser.close()
              if not isinstance(p, str)]
    assert bare.tags == "none" and bare.error is not None


def _content(url: str, stream: bool) -> str:
    body = {"model": MODEL, "messages": USER, "tools": ECHO_TOOLS, "stream": stream}
    if not stream:
        return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()["choices"][0]["message"][
            "content"]
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


def test_an_unreadable_call_goes_back_as_written_without_a_made_up_close_tag(serve: Any) -> None:  # noqa: F811
    for written in ('<tool_call>\n{"name": "echo', '{"name": "echo", "arguments": {"text": "Par',
                    '<tool_call>\nnot json at all\n</tool_call>'):
        url, _ = serve([written])
        assert _content(url, False) == written == _content(url, True), written
