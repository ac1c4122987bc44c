"""Mutation gaps (round g): request validation, the server's error mapping, the member HTTP client and
the tool-call parser, each checked where a changed constant, comparison or branch went unnoticed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared_engine.errors import MemberError
from shared_engine.members import http as member_http
from shared_engine.members.http import HttpSettings, JsonClient
from shared_engine.server.app import ApiError, _unavailable, _validated_request
from shared_engine.server.openai_schema import ChatCompletionRequest, CompletionRequest
from shared_engine.tools import ResponseFormat, forced_tool, format_error, parse_calls
from tests.fixture_server import serve

USER = [{"role": "user", "content": "hi"}]


def chat(**fields: Any) -> ChatCompletionRequest:
    return ChatCompletionRequest.model_validate({"model": "m", "messages": USER, **fields})


def refused(kind: type[ChatCompletionRequest] | type[CompletionRequest], body: dict[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as caught:
        _validated_request(json.dumps(body).encode(), kind)
    return caught.value


# -- request validation ---------------------------------------------------------------------------


def test_five_stops_are_refused_four_are_not() -> None:
    """OpenAI's limit is 4: a fifth is refused (a client written against this server must not fail on OpenAI's)."""
    assert chat(stop=["a", "b", "c", "d"]).stop == ["a", "b", "c", "d"]
    error = refused(ChatCompletionRequest, {"model": "m", "messages": USER, "stop": ["a", "b", "c", "d", "e"]})
    assert error.detail.param == "stop" and "at most 4 stop sequences" in error.detail.message


def test_n_of_two_is_refused() -> None:
    assert chat(n=1).n == 1
    error = refused(ChatCompletionRequest, {"model": "m", "messages": USER, "n": 2})
    assert error.detail.param == "n" and "n must be 1" in error.detail.message


def test_text_and_audio_modalities_are_refused() -> None:
    """["text", "audio"] would get text alone: refused, while ["text"] is accepted."""
    assert chat(modalities=["text"]).unsupported() is None
    problem = chat(modalities=["text", "audio"]).unsupported()
    assert problem is not None and problem[0] == "modalities"


def test_required_tool_choice_without_tools_is_a_conflict() -> None:
    assert chat(tool_choice="auto").conflict() is None
    problem = chat(tool_choice="required").conflict()
    assert problem is not None and problem[0] == "tool_choice"


def test_max_completion_tokens_wins_over_max_tokens() -> None:
    """OpenAI's newer field takes precedence over the deprecated one when both are sent."""
    request = chat(max_tokens=5, max_completion_tokens=9)
    assert request.answer_tokens() == 9 and request.answer_tokens_field() == "max_completion_tokens"
    assert request.generation_params()["max_new_tokens"] == 9


def test_loop_guard_zero_turns_the_guard_off() -> None:
    """0 means off for this request (None to the engine), not a 0-byte limit."""
    assert chat(loop_guard=0).generation_params()["loop_guard"] is None
    assert chat(loop_guard=64).generation_params()["loop_guard"] == 64
    assert "loop_guard" not in chat().generation_params()


def test_prompt_list_limit_is_exact() -> None:
    from shared_engine.server.openai_schema import MAX_PROMPTS

    assert len(CompletionRequest.model_validate({"model": "m", "prompt": ["x"] * MAX_PROMPTS}).prompts) == MAX_PROMPTS
    error = refused(CompletionRequest, {"model": "m", "prompt": ["x"] * (MAX_PROMPTS + 1)})
    assert error.detail.param == "prompt" and f"at most {MAX_PROMPTS}" in error.detail.message


def test_best_of_one_is_accepted_two_is_refused() -> None:
    accepted = CompletionRequest.model_validate({"model": "m", "prompt": "x", "best_of": 1})
    assert accepted.unsupported() is None
    problem = CompletionRequest.model_validate({"model": "m", "prompt": "x", "best_of": 2}).unsupported()
    assert problem is not None and problem[0] == "best_of"


def test_legacy_logprobs_zero_is_refused_false_is_not() -> None:
    """Legacy completions' ``logprobs: 0`` asks for the sampled tokens' log-probabilities: refused."""
    for value in (0, 2):
        problem = CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": value}).unsupported()
        assert problem is not None and problem[0] == "logprobs"
    assert CompletionRequest.model_validate({"model": "m", "prompt": "x", "logprobs": False}).unsupported() is None


def test_two_streamed_prompts_are_a_conflict() -> None:
    one = CompletionRequest.model_validate({"model": "m", "prompt": ["a"], "stream": True})
    assert one.conflict() is None
    two = CompletionRequest.model_validate({"model": "m", "prompt": ["a", "b"], "stream": True})
    problem = two.conflict()
    assert problem is not None and problem[0] == "prompt"


def test_a_result_for_an_anonymous_replayed_call_is_accepted() -> None:
    """A call replayed without an id may be the one a tool result answers."""
    messages = [*USER, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert ChatCompletionRequest.model_validate({"model": "m", "messages": messages}).conflict() is None


def test_a_result_answering_a_known_call_is_accepted_an_unknown_one_refused() -> None:
    call = {"id": "call_1", "function": {"name": "f", "arguments": "{}"}}
    answered = [*USER, {"role": "assistant", "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "call_1", "content": "42"}]
    assert ChatCompletionRequest.model_validate({"model": "m", "messages": answered}).conflict() is None
    answered[-1] = {**answered[-1], "tool_call_id": "call_2"}
    problem = ChatCompletionRequest.model_validate({"model": "m", "messages": answered}).conflict()
    assert problem is not None and problem[0] == "messages.2.tool_call_id"


def test_a_system_message_without_content_is_missing_its_content() -> None:
    """Only an assistant's content may be absent: a system or tool message's is required."""
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [{"role": "system"}, *USER]})
    assert request.missing() == "messages.0.content"


def test_neutral_values_of_refused_fields_are_accepted() -> None:
    """OpenAI's neutral 0, {} and false change nothing: accepted; a value that would change the answer is not."""
    assert chat(frequency_penalty=0, presence_penalty=0.0, logit_bias={}, logprobs=False).unsupported() is None
    problem = chat(frequency_penalty=0.5).unsupported()
    assert problem is not None and problem[0] == "frequency_penalty"


def test_a_developer_message_is_a_system_message_to_the_engine() -> None:
    """``developer`` is OpenAI's newer name for ``system``: the members' templates know only the latter."""
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        {"role": "developer", "content": "Be brief."}, *USER]})
    assert [m.as_engine_message()["role"] for m in request.messages] == ["system", "user"]


def test_stream_options_without_stream_is_a_conflict() -> None:
    assert chat(stream=True, stream_options={"include_usage": True}).conflict() is None
    problem = chat(stream_options={"include_usage": True}).conflict()
    assert problem is not None and problem[0] == "stream_options"


def test_a_tool_result_without_its_call_id_is_missing_it() -> None:
    request = ChatCompletionRequest.model_validate({"model": "m", "messages": [
        *USER, {"role": "tool", "content": "42"}]})
    assert request.missing() == "messages.1.tool_call_id"


def test_a_json_schema_format_without_a_name_is_missing_it() -> None:
    schema = {"type": "object"}
    nameless = chat(response_format={"type": "json_schema", "json_schema": {"schema": schema}})
    assert nameless.missing() == "response_format.json_schema.name"
    named = chat(response_format={"type": "json_schema", "json_schema": {"name": "s", "schema": schema}})
    assert named.missing() is None


# -- the server's error mapping ---------------------------------------------------------------------


def test_a_wrong_type_is_invalid_type_and_a_wrong_value_invalid_value() -> None:
    assert refused(ChatCompletionRequest, {"model": "m", "messages": USER, "temperature": "1"}).detail.code \
        == "invalid_type"
    assert refused(ChatCompletionRequest, {"model": "m", "messages": USER, "temperature": 9}).detail.code \
        == "invalid_value"
    assert refused(ChatCompletionRequest, {"model": "m"}).detail.code == "missing_required_parameter"


def test_a_long_member_failure_is_cut_without_splitting_a_placeholder() -> None:
    """The client is told at most REASON_CHARS of the reason; an address cut in two is left out whole."""
    from shared_engine.server.app import REASON_CHARS

    url = "http://10.0.0.7:8081"
    page = "x" * (REASON_CHARS - 10) + f" see {url}/health for more " + "y" * 500  # "<its URL>" straddles the cut
    told = str(_unavailable(MemberError("alpha", url, page)))
    reason = told.split("is unavailable: ", 1)[1]
    assert reason.endswith("…") and len(reason) <= REASON_CHARS + 1
    assert "<its" not in reason and "10.0.0.7" not in reason


def test_a_member_failure_names_no_other_address_or_host() -> None:
    url = "http://llm-b.internal:8081"
    told = str(_unavailable(MemberError("b", url, "Bad gateway: Server at llm-b.internal Port 8081; "
                                                  "upstream http://10.1.2.3:9000/v1 refused")))
    assert "llm-b.internal" not in told and "10.1.2.3" not in told
    assert "<its host>" in told and "<a URL>" in told


# -- the member HTTP client ---------------------------------------------------------------------------


def counting(status: int, body: bytes = b'{"error": "busy"}') -> tuple[Any, list[int]]:
    calls: list[int] = []

    def handler(method: str, path: str, payload: object) -> tuple[int, bytes]:
        calls.append(status)
        return status, body

    return handler, calls


@pytest.mark.parametrize("status", [429, 502, 503, 504])
def test_a_busy_status_is_retried(status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(member_http.time, "sleep", lambda s: None)
    handler, calls = counting(status, b"server busy: try again")
    with serve(handler) as (url, _):
        client = JsonClient("m", url, HttpSettings(retries=2))
        try:
            with pytest.raises(MemberError, match=f"failed after 3 attempt\\(s\\): HTTP {status}: server busy"):
                client.get("/props")
        finally:
            client.close()
    assert len(calls) == 3


@pytest.mark.parametrize("status", [400, 500])
def test_another_error_status_fails_at_once_with_its_status(status: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(member_http.time, "sleep", lambda s: None)
    handler, calls = counting(status)
    with serve(handler) as (url, _):
        client = JsonClient("m", f"{url}/v1", HttpSettings(retries=2))
        try:
            with pytest.raises(MemberError) as caught:
                client.get("/models")
        finally:
            client.close()
    assert len(calls) == 1 and caught.value.status == status
    assert f"answered HTTP {status}" in caught.value.reason
    assert "the URL ends in /v1" not in caught.value.reason  # the hint is for a 404 only


def test_backoff_doubles_from_backoff_s(monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(member_http.time, "sleep", slept.append)
    handler, _ = counting(503)
    with serve(handler) as (url, _):
        client = JsonClient("m", url, HttpSettings(retries=3, backoff_s=0.5))
        try:
            with pytest.raises(MemberError):
                client.get("/props")
        finally:
            client.close()
    assert slept == [0.5, 1.0, 2.0]


def test_the_default_settings_retry_twice(monkeypatch: pytest.MonkeyPatch) -> None:
    """The documented default: two extra attempts after a 429/502/503/504."""
    monkeypatch.setattr(member_http.time, "sleep", lambda s: None)
    handler, calls = counting(503)
    with serve(handler) as (url, _):
        client = JsonClient("m", url)
        try:
            with pytest.raises(MemberError):
                client.get("/props")
        finally:
            client.close()
    assert len(calls) == 3


def test_an_infinite_timeout_is_no_deadline() -> None:
    client = JsonClient("m", "http://127.0.0.1:9", HttpSettings(timeout_s=float("inf")))
    try:
        assert client.deadline_s is None
    finally:
        client.close()
    default = JsonClient("m", "http://127.0.0.1:9")
    try:
        assert default.deadline_s == member_http.REMOTE_TIMEOUT_S
    finally:
        default.close()


# -- tool calls and format errors ----------------------------------------------------------------------


def test_tool_choice_false_is_the_models_choice() -> None:
    assert forced_tool(False, ["a", "b"]) is None
    assert forced_tool(True, ["a"]) == "a" and forced_tool("required", ["a", "b"]) == "any"


def test_anthropic_input_key_holds_the_arguments() -> None:
    [call] = parse_calls('{"name": "get_weather", "input": {"city": "Paris"}}')
    assert call.error is None and call.arguments == {"city": "Paris"}


def test_null_arguments_are_an_empty_object() -> None:
    [call] = parse_calls('{"name": "now", "arguments": null}')
    assert call.error is None and call.arguments == {}


def test_a_blank_or_padded_name() -> None:
    [blank] = parse_calls('{"name": "  ", "arguments": {}}')
    assert blank.error is not None
    [padded] = parse_calls('{"name": " now ", "arguments": {}}', names=["now"])
    assert padded.error is None and padded.name == "now"


def test_a_list_of_calls_is_numbered_in_order() -> None:
    calls = parse_calls('[{"name": "a", "arguments": {}}, {"name": "b", "arguments": {"x": 1}}]', first_index=3)
    assert [(c.index, c.name, c.arguments) for c in calls] == [(3, "a", {}), (4, "b", {"x": 1})]


def test_a_rejected_call_keeps_the_tool_it_meant() -> None:
    [call] = parse_calls('{"name": "get_weather", "arguments": "Paris, tomorrow"}')
    assert call.error is not None and call.name == "get_weather"


def test_a_call_cut_inside_a_nested_value_is_cut() -> None:
    """An unclosed block (max_tokens came first) whose arguments stop inside a nested list is not run."""
    [call] = parse_calls('{"name": "f", "arguments": {"xs": [1, 2', closed=False)
    assert call.error == "cut off before the call's JSON ends"


def test_a_call_cut_after_a_key_is_cut() -> None:
    [call] = parse_calls('{"name": "f", "arguments": {"city":', closed=True)
    assert call.error == "cut off before the call's JSON ends"


def test_format_error_wording() -> None:
    plain = ResponseFormat.model_validate({"type": "json_object"})
    assert format_error('{"a": "b', plain) == "not valid JSON (Unterminated string starting at character 6)"
    assert format_error("[1, 2]", plain) == "a JSON list, not an object"
    schema = ResponseFormat.model_validate({"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"who": {"type": "object", "properties": {"age": {"type": "integer"}}},
                                         "when": {"type": "string", "format": "date"}}}}})
    assert format_error('{"who": {"age": "old"}}', schema) == "who/age: 'old' is not of type 'integer'"
    assert format_error('{"when": "yesterday"}', schema) == "when: 'yesterday' is not a 'date'"
    assert format_error('{"who": {"age": 3}, "when": "2024-02-29"}', schema) is None


def test_a_busy_status_is_retried_where_timeouts_are_not(monkeypatch: pytest.MonkeyPatch) -> None:
    """``retry_timeouts=False`` spares only a call that outlived its deadline: a 503 computed nothing."""
    monkeypatch.setattr(member_http.time, "sleep", lambda s: None)
    handler, calls = counting(503)
    with serve(handler) as (url, _):
        client = JsonClient("m", url, HttpSettings(retries=2))
        try:
            with pytest.raises(MemberError, match="failed after 3 attempt"):
                client.post("/completion", {"prompt": "x"}, retry_timeouts=False)
        finally:
            client.close()
    assert len(calls) == 3
