"""Review o of abe0399 (further calls after a forced one): a junk further call (not JSON, or a tool not
offered) was accepted with no retry and went to the server's content beside the valid call; a call left
unclosed and followed by '<tool_call>' written in pieces (Gemma and SmolLM2 split the tag) ended the answer at
'<tool' and, read as one block, lost the next call; a fenced call inside its tags ended the answer at its
closing fence."""

from __future__ import annotations

import warnings

from shared_engine import EnsembleEngine
from shared_engine.call_ends import CallsEndFinder
from tests.test_tools import ECHO_TOOLS, ScriptedMember

FIRST = 'echo", "arguments": {"text": "a"}}\n</tool_call>\n'  # after the prefill '<tool_call>\n{"name": "'


def _answer(script: str, choice: str = "required", tokens: int = 300):  # type: ignore[no-untyped-def]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return EnsembleEngine([ScriptedMember(script)], method="single", max_new_tokens=tokens).generate(
            "Echo it.", tools=ECHO_TOOLS, tool_choice=choice)


def test_a_junk_further_call_is_retried_not_accepted() -> None:
    for second in ('<tool_call>\nnot json\n</tool_call>',
                   '<tool_call>\n{"name": "made_up", "arguments": {}}\n</tool_call>'):
        result = _answer(FIRST + second)
        assert result.rejected_attempts, second  # the scripted member writes the same again: every try rejected
        assert result.format_error is not None and "could not be read" in result.format_error, second


def test_a_call_cut_by_the_length_cap_is_not_retried() -> None:
    result = _answer(FIRST + '<tool_call>\n{"name": "noop", "argu', tokens=len(FIRST) + 12)
    assert result.finish_reason == "length" and not result.rejected_attempts


def test_an_unclosed_call_then_an_open_tag_in_pieces_keeps_the_next_call() -> None:
    prefix = '<tool_call>\n{"name": "'
    for grown in ('echo", "arguments": {}}\n<', 'echo", "arguments": {}}\n<tool'):
        assert CallsEndFinder(prefix).find(grown) == -1, grown  # the next call's open tag may be coming
    result = _answer('echo", "arguments": {"text": "a"}}\n<tool_call>\n{"name": "noop", "arguments": {}}\n'
                     '</tool_call>')
    assert [(c.name, c.arguments) for c in result.tool_calls] == [("echo", {"text": "a"}), ("noop", {})]


def test_a_fenced_call_inside_its_tags_does_not_end_the_answer() -> None:
    result = _answer(FIRST + '<tool_call>\n```json\n{"name": "noop", "arguments": {}}\n```\n</tool_call>\n'
                     '<tool_call>\n{"name": "echo", "arguments": {"text": "c"}}\n</tool_call>')
    assert [(c.name, c.tags) for c in result.tool_calls] == [("echo", "both"), ("noop", "both"), ("echo", "both")]
