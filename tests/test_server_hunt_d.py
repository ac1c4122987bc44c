"""Server hunt 2026-12-07d (toy members, the page in headless Chromium): the page and infinite AdaFuse
scores, error codes of engine-validated fields, message fields OpenAI requires or does not know, and a
member backend's failure."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.errors import MemberError
from shared_engine.events import AdaFuseEvent, Event
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.test_server import MODEL, USER, _wait_until, post, sse_payloads, toy_engine, toy_members
from tests.test_server_request_errors import error_of

# ----------------------------------------------------------------------------- the page


def _infinite_nll_engine() -> EnsembleEngine:
    """AdaFuse whose voted spans' last candidate has one member's NLL (and so the score) +inf: what a
    top-K backend (llama.cpp) gives a span holding a token outside its top K; JSON writes it as null."""
    engine = EnsembleEngine(toy_members(), method="adafuse", threshold=1.0, max_new_tokens=8)
    original = engine.astream

    async def astream(*args: Any, **kwargs: Any) -> AsyncIterator[Event]:
        async for event in original(*args, **kwargs):
            if isinstance(event, AdaFuseEvent) and event.fused and len(event.candidates) > 1:
                last = event.candidates[-1]
                label = next(iter(last.member_nll))
                last = last.model_copy(update={"member_nll": {**last.member_nll, label: math.inf}, "score": math.inf})
                event = event.model_copy(update={"candidates": [*event.candidates[:-1], last]})
            yield event

    engine.astream = astream  # type: ignore[method-assign,assignment]
    return engine


def test_page_shows_an_infinite_nll_and_score() -> None:
    """null.toFixed threw on the first such decision: no card, no answer, no stats, and the error
    "Cannot read properties of null (reading 'toFixed')" in its place."""
    from tests.test_server_zoo import browser_page

    with browser_page(_infinite_nll_engine(), "adafuse") as (page, console_errors):
        page.fill("#max-tokens", "8")
        page.click("#send")
        page.wait_for_selector("#stats[data-done]", timeout=60_000)
        assert page.inner_text("#error") == ""
        cards = page.locator("#decisions .decision")
        assert cards.count() >= 1 and page.inner_text("#answer")
        infinite = [text for text in cards.all_inner_texts() if "∞" in text]
        assert infinite, cards.all_inner_texts()
        assert not console_errors, console_errors


def _slow_engine(ended: list[bool]) -> EnsembleEngine:
    """Every-token whose events come a tenth of a second apart; ``ended`` gets True when the stream ran
    to its end, False when it was cut short (the client went away)."""
    engine = EnsembleEngine(toy_members(), method="every-token", max_new_tokens=200)
    original = engine.astream

    async def astream(*args: Any, **kwargs: Any) -> AsyncIterator[Event]:
        finished = False
        try:
            async for event in original(*args, **kwargs):
                await asyncio.sleep(0.1)
                yield event
            finished = True
        finally:
            ended.append(finished)

    engine.astream = astream  # type: ignore[method-assign,assignment]
    return engine


def test_a_chunk_the_page_cannot_show_ends_the_request() -> None:
    """The page stopped reading after a render error but never aborted the fetch: the server went on
    generating the whole answer, holding an admission slot, for nobody."""
    from tests.test_server_zoo import browser_page

    ended: list[bool] = []
    with browser_page(_slow_engine(ended), "every-token") as (page, console_errors):
        page.evaluate("() => { window.addDecision = () => { throw new Error('cannot show this'); }; }")
        page.fill("#max-tokens", "200")
        page.click("#send")
        page.wait_for_function("document.getElementById('error').textContent.includes('cannot show this')",
                               timeout=60_000)
        _wait_until(lambda: bool(ended), timeout=15)
        assert ended == [False], "the generation ran to its end for a page that had stopped reading"


# ----------------------------------------------------------------------------- engine validation's codes


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(toy_engine())) as url:
        yield url


TOOLS = [{"type": "function", "function": {"name": "get", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize(("extra", "param", "code"), [
    # the engine's validation: code null, where the request's own validation said invalid_type/invalid_value
    ({"response_format": {"type": "bogus"}}, "response_format.type", "invalid_value"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}},
     "response_format.json_schema.schema", "invalid_type"),
    ({"tools": [{"type": "function", "function": {"name": 5}}]}, "tools.0.function.name", "invalid_type"),
    # two problems: the param was the first's, the code ('Field required' found anywhere) the second's
    ({"tools": [{"type": "function", "function": {"name": 5}}], "response_format": {"type": "json_schema"}},
     "tools.0.function.name", "invalid_type"),
    # a value holding the text the code was read from
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "x: Field required"}}},
     "tool_choice", "invalid_value"),
    ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema", "missing_required_parameter"),
])
def test_engine_validation_codes_come_from_the_problem_named(base_url: str, extra: dict[str, Any], param: str,
                                                             code: str) -> None:
    error = error_of(base_url, extra)
    assert (error["param"], error["code"]) == (param, code), error


# ----------------------------------------------------------------------------- message fields

CALL = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}


def _conversation(assistant: dict[str, Any], tool: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, **assistant},
            tool if tool is not None else {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]


@pytest.mark.parametrize(("messages", "path"), [
    # a misspelt key: the calls it held were dropped without a word
    (_conversation({"toolCalls": [CALL]}), "messages[1].toolCalls"),
    (_conversation({"tool_call": [CALL]}), "messages[1].tool_call"),
    ([{"role": "user", "Content": "hi"}], "messages[0].Content"),
    (_conversation({"tool_calls": [{"id": "c1", "type": "function", "functions": CALL["function"]}]}),
     "messages[1].tool_calls[0].functions"),
    (_conversation({"tool_calls": [{**CALL, "function": {"name": "get", "argument": "{}"}}]}),
     "messages[1].tool_calls[0].function.argument"),
    # two letters swapped, the commonest typo (a ratio below 0.9: served with the calls or text dropped)
    ([{"role": "user", "contnet": "hi"}], "messages[0].contnet"),
    (_conversation({"tool_clals": [CALL]}), "messages[1].tool_clals"),
    (_conversation({"tool_calls": [{**CALL, "function": {"name": "get", "arguemnts": "{}"}}]}),
     "messages[1].tool_calls[0].function.arguemnts"),
])
def test_a_misspelt_message_key_is_refused_by_name(base_url: str, messages: list[dict[str, Any]], path: str) -> None:
    error = error_of(base_url, {"messages": messages, "tools": TOOLS})
    assert error["message"].startswith(f"Unknown parameter: '{path}'."), error
    assert error["code"] == "unknown_parameter" and error["param"] == path.replace("[", ".").replace("]", ""), error


@pytest.mark.parametrize(("extra", "param"), [
    ({"messages": _conversation({"tool_calls": [CALL]})}, None),
    ({"messages": _conversation({"tool_calls": [CALL]}, {"role": "tool", "content": "sunny"})},
     "messages.2.tool_call_id"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}},
     "response_format.json_schema.name"),
    # under another key the field was served as absent: a call without its arguments, a message without its text
    ({"messages": _conversation({"tool_calls": [{**CALL, "function": {"name": "get", "args": "{}"}}]})},
     "messages.1.tool_calls.0.function.arguments"),
    ({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "text": "hi"}]}, "messages.1.content"),
])
def test_fields_openai_requires_are_required(base_url: str, extra: dict[str, Any], param: str | None) -> None:
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    if param is None:  # the same request with the field: served
        assert response.status_code == 200, response.text
        return
    error = response.json()["error"]
    assert (response.status_code, error["param"], error["code"]) == (400, param, "missing_required_parameter"), error


def test_a_replayed_conversation_is_served_whatever_its_provider_added(base_url: str) -> None:
    """What clients send back from earlier responses: every key of the openai package's message types,
    request and response (``annotations``, ``refusal``, ``audio``; the ``parse()`` helpers' ``parsed`` and
    ``parsed_arguments``), vLLM's ``reasoning``/``reasoning_content``, LiteLLM's ``provider_specific_fields``,
    a streamed call's ``index``: e627b1a refused the response types' keys with a 400."""
    from openai.types import chat

    kinds = [getattr(chat, name) for name in dir(chat) if name.startswith(("ChatCompletion", "ParsedChatCompletion"))
             and name.endswith(("MessageParam", "Message")) and isinstance(getattr(chat, name), type)]
    defined = {key for kind in kinds for key in getattr(kind, "model_fields", None) or kind.__annotations__}
    assert {"annotations", "refusal", "parsed", "audio", "tool_calls"} <= defined, defined
    read = {"role", "content", "name", "tool_calls", "tool_call_id"}
    assistant: dict[str, Any] = {key: None for key in defined - read}
    assistant.update(content="checking", name="helper", reasoning="The user wants the weather.",
                     context={"citations": []},  # Azure OpenAI "On Your Data": no misspelt content
                     reasoning_content="The user wants the weather.", provider_specific_fields={},
                     annotations=[], tool_calls=[{**CALL, "index": 0, "function": {**CALL["function"],
                                                                                  "parsed_arguments": {}}}])
    response = post(base_url, {"model": MODEL, "messages": _conversation(assistant), "max_tokens": 2})
    assert response.status_code == 200, response.text


def test_langchain_messages_are_served(base_url: str) -> None:
    """LangChain's ChatOpenAI writes a conversation with calls and results as OpenAI's dicts, as sent."""
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage
    from langchain_openai.chat_models.base import _convert_message_to_dict

    messages = [SystemMessage("Be brief."), HumanMessage("Weather?"),
                AIMessage("", tool_calls=[{"name": "get", "args": {}, "id": "c1", "type": "tool_call"}]),
                ToolMessage("sunny", tool_call_id="c1")]
    response = post(base_url, {"model": MODEL, "messages": [_convert_message_to_dict(m) for m in messages],
                               "max_tokens": 2})
    assert response.status_code == 200, response.text


# ----------------------------------------------------------------------------- a member's failure

MEMBER_URL = "http://10.1.2.3:8081"
OTHER_URL = "http://10.9.9.9:9090"  # another internal address the reason names (a redirect's target)


def _failing_engine(monkeypatch: pytest.MonkeyPatch, after: int = 0) -> EnsembleEngine:
    """Every-token whose member 'b' fails as a remote backend does (a MemberError naming its URL) on its
    calls after the first ``after`` of each request (the toy members are shared: patched for the test only)."""
    members = toy_members()
    original = members[1].new_session

    def new_session() -> Any:
        session = original()
        calls = [0]
        for name in ("sync", "step", "rows_at"):
            method = getattr(session, name)

            def failing(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                calls[0] += 1
                if calls[0] > after:
                    raise MemberError("b", MEMBER_URL, f"connection refused ({MEMBER_URL}/completion), "
                                                       f"after a redirect to {OTHER_URL}/completion and to "
                                                       "//10.9.9.9:9090/x (Server at 10.1.2.3 Port 8081)")
                return _method(*args, **kwargs)

            setattr(session, name, failing)
        return session

    monkeypatch.setattr(members[1], "new_session", new_session)
    return EnsembleEngine(members, method="every-token", max_new_tokens=200)


def test_a_member_failure_is_a_502_without_its_url(caplog: pytest.LogCaptureFixture,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """It was a 500 'internal error: MemberError: member 'b' at http://...' (an internal address in the
    answer) and an 'Exception in ASGI application' traceback in the log for every request."""
    body = {"model": MODEL, "messages": USER, "max_tokens": 3}
    with caplog.at_level(logging.ERROR), serve_in_background(create_app(_failing_engine(monkeypatch))) as url:
        answers = [post(url, body), post(url, {**body, "stream": True}),
                   httpx.post(f"{url}/v1/completions", json={"model": MODEL, "prompt": "Sofia", "max_tokens": 3},
                              timeout=60)]
    for response in answers:
        assert response.status_code == 502, response.text
        assert response.json()["error"] == {
            "message": "member 'b' is unavailable: connection refused (<its URL>/completion), after a redirect to "
                       "<a URL> and to <a URL> (Server at <its host> Port 8081)", "type": "server_error",
            "param": None, "code": "member_unavailable"}
    logged = [record for record in caplog.records if record.levelno >= logging.ERROR]
    assert not [r for r in logged if "Exception in ASGI application" in r.getMessage() or r.exc_info], logged
    assert sum(MEMBER_URL in r.getMessage() for r in logged) == 3, [r.getMessage() for r in logged]


def test_a_member_failure_mid_stream_is_reported_without_its_url(monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"model": MODEL, "messages": USER, "max_tokens": 200, "stream": True}
    with serve_in_background(create_app(_failing_engine(monkeypatch, after=25))) as url:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            payloads = [json.loads(p) for p in sse_payloads(response) if p != "[DONE]"]
    contents = [p for p in payloads if p.get("choices") and p["choices"][0]["delta"].get("content")]
    errors = [p["error"] for p in payloads if "error" in p]
    assert contents and len(errors) == 1, payloads  # the failure came after some of the answer
    assert "member 'b' is unavailable" in errors[0]["message"] and "10." not in errors[0]["message"], errors
    assert errors[0]["code"] == "member_unavailable", errors  # as the same failure's 502 says


def test_a_member_url_with_credentials_is_logged_without_them(caplog: pytest.LogCaptureFixture) -> None:
    from shared_engine.server.app import _unavailable

    with caplog.at_level(logging.ERROR):
        told = _unavailable(MemberError("b", "http://user:secret@10.1.2.3:8081", "HTTP 500"))
    assert str(told) == "member 'b' is unavailable: HTTP 500"
    assert [r.getMessage() for r in caplog.records] == ["member 'b' at http://10.1.2.3:8081 failed: HTTP 500"]


@pytest.mark.parametrize("choice", [{"type": "auto"}, {"type": "none"}])
def test_an_anthropic_style_choice_that_calls_nothing_needs_no_tools(base_url: str, choice: dict[str, str]) -> None:
    """The engine reads {"type": "auto"|"none"} as the strings (1ba6eea); the server still refused them
    without tools ("tool_choice is only allowed when tools are specified"), serving the strings."""
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, "tool_choice": choice})
    assert response.status_code == 200, response.text
    error = error_of(base_url, {"messages": USER, "tool_choice": {"type": "any"}})
    assert error["param"] == "tool_choice", error
