"""A JSON answer decoded without a constraint ends where its top-level value closes (``JsonEnd``; helper 234,
from hunter 231).

AdaFuse takes no JSON constraint (its spans come from every member), and a JSON answer beside offered
tools is decoded free: a valid value followed by prose ("This object has one key.") was "not valid JSON
(Extra data ...)" and retried until its attempts ran out."""

from __future__ import annotations

import warnings

from shared_engine import EnsembleEngine
from shared_engine.call_ends import JsonEnd
from tests.test_tools import ECHO_TOOLS, ScriptedMember

JSON = {"type": "json_object"}


def _engine(script: str, method: str) -> EnsembleEngine:
    members = []
    for name in ("s0", "s1"):
        member = ScriptedMember(script)
        member.name = name
        members.append(member)
    return EnsembleEngine(members, method=method, max_new_tokens=100, drafter=0)


def test_adafuse_json_answer_ends_where_its_value_closes() -> None:
    # the prefill "{" comes first: the members write the rest
    result = _engine('"a": 1}\nThis object has one key.', "adafuse").generate("Give JSON.", response_format=JSON)
    assert result.text == '{"a": 1}'
    assert result.format_error is None and result.rejected_attempts == []
    assert result.finish_reason == "stop"


def test_braces_inside_strings_do_not_end_the_value() -> None:
    result = _engine('"a": "x}y{ \\" }", "b": [1, {"c": "]"}]}\nDone.', "adafuse").generate(
        "Give JSON.", response_format=JSON)
    assert result.text == '{"a": "x}y{ \\" }", "b": [1, {"c": "]"}]}'
    assert result.format_error is None and result.rejected_attempts == []


def test_json_beside_tools_is_accepted_at_its_first_attempt() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = _engine('{"a": 1}\nThis object has one key.', "safe").generate(
            "Give JSON.", response_format=JSON, tools=ECHO_TOOLS)
    assert result.text == '{"a": 1}'
    assert result.format_error is None and result.rejected_attempts == []


def test_a_call_beside_tools_is_still_a_call() -> None:
    script = '<tool_call>\n{"name": "echo", "arguments": {"text": "{hi}"}}\n</tool_call>'
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = _engine(script, "safe").generate("Call echo.", response_format=JSON, tools=ECHO_TOOLS)
    assert [c.name for c in result.tool_calls] == ["echo"]


def test_finder_leaves_prose_fences_and_bare_calls_alone() -> None:
    assert JsonEnd().finder().find('  {"a": "}"} more') == len('  {"a": "}"}')
    assert JsonEnd("{").finder().find('"a": 1} more') == len('"a": 1}')
    for text in ('Here: {"a": 1} more', '```json\n{"a": 1}\n```\nmore', '<tool_call>{"a": 1}</tool_call>'):
        assert JsonEnd().finder().find(text) == -1, text
    bare_call = JsonEnd("", lambda body: '"name"' in body).finder()
    assert bare_call.find('{"name": "echo", "arguments": {}}\n{"name": "echo"}') == -1
    growing = JsonEnd().finder()  # the same answer, grown token by token
    text = '{"a": [1, 2]}\nprose'
    assert [growing.find(text[:n]) for n in (1, 5, 13, len(text))] == [-1, -1, 13, 13]
