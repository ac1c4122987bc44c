"""Server hunt 2026-12-07e (toy members): a tool result that answers no call, more stop sequences than
OpenAI allows, a second Ctrl+C while `serve` shuts down, and a member's error page echoed to the client."""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from shared_engine.errors import MemberError
from shared_engine.server import create_app
from shared_engine.server.app import _unavailable
from shared_engine.server.background import serve_in_background
from tests.test_server import MODEL, USER, post, sse_payloads_iter, toy_engine
from tests.test_server_shutdown import _wait_until, serving


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(toy_engine())) as url:
        yield url


# ----------------------------------------------------------------------------- tool results

def _call(call_id: str | None) -> dict[str, Any]:
    call = {"type": "function", "function": {"name": "get", "arguments": "{}"}}
    return call if call_id is None else {"id": call_id, **call}


def _calls(*ids: str | None) -> dict[str, Any]:
    return {"role": "assistant", "content": None, "tool_calls": [_call(i) for i in ids]}


def _result(call_id: str) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": "sunny"}


@pytest.mark.parametrize(("messages", "param"), [
    # no call at all before the result
    ([*USER, {"role": "assistant", "content": "ok"}, _result("c1")], "messages.2.tool_call_id"),
    # a call, but not this one
    ([*USER, _calls("c1"), _result("c2")], "messages.2.tool_call_id"),
    # the call comes after its result
    ([*USER, _result("c1"), _calls("c1"), _result("c1")], "messages.1.tool_call_id"),
    # the second result of two calls answers neither
    ([*USER, _calls("c1", "c2"), _result("c1"), _result("c3")], "messages.3.tool_call_id"),
])
def test_a_tool_result_that_answers_no_call_is_refused(base_url: str, messages: list[dict[str, Any]],
                                                       param: str) -> None:
    """It was served (HTTP 200), the result in the prompt as an answer to nothing; OpenAI refuses it with a
    400 ("messages with role 'tool' must be a response to a preceeding message with 'tool_calls'")."""
    response = post(base_url, {"model": MODEL, "messages": messages, "max_tokens": 2})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"], error["type"]) == (param, "invalid_value", "invalid_request_error"), error
    assert "must be a response to a preceding message with 'tool_calls'" in error["message"], error


@pytest.mark.parametrize("messages", [
    [*USER, _calls("c1"), _result("c1")],
    [*USER, _calls("c1", "c2"), _result("c2"), _result("c1")],
    # ids repeat across turns (clients that number their calls per turn)
    [*USER, _calls("c1"), _result("c1"), {"role": "user", "content": "And tomorrow?"}, _calls("c1"), _result("c1")],
    # an earlier turn's call answered after a later turn (the answer stands where the client put it)
    [*USER, _calls("c1"), {"role": "user", "content": "Go on."}, _result("c1")],
    # a call replayed without its id: it may be the one answered
    [*USER, _calls(None), _result("c9")],
])
def test_a_tool_result_that_answers_an_earlier_call_is_served(base_url: str, messages: list[dict[str, Any]]) -> None:
    response = post(base_url, {"model": MODEL, "messages": messages, "max_tokens": 2})
    assert response.status_code == 200, response.text


def test_an_openai_client_conversation_with_calls_is_served(base_url: str) -> None:
    """The openai client's own round trip: the assistant message it got back, replayed with its results."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    answer = client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)  # type: ignore[arg-type]
    replayed = answer.choices[0].message.model_dump(exclude_none=True)
    replayed["tool_calls"] = [_call("call_0"), _call("call_1")]
    messages = [*USER, replayed, _result("call_0"), _result("call_1")]
    second = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=2)  # type: ignore[arg-type]
    assert second.choices[0].finish_reason in ("length", "stop", "tool_calls")


# ----------------------------------------------------------------------------- stop sequences


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_more_than_four_stop_sequences_are_refused(base_url: str, path: str) -> None:
    """Five were served; OpenAI allows four and refuses more with a 400."""
    body: dict[str, Any] = {"model": MODEL, "max_tokens": 2, "stop": ["a1", "b2", "c3", "d4", "e5"]}
    body.update({"messages": USER} if path.endswith("chat/completions") else {"prompt": "Sofia"})
    response = httpx.post(f"{base_url}{path}", json=body, timeout=60)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("stop", "invalid_value"), error
    assert "at most 4 stop sequences" in error["message"], error
    body["stop"] = body["stop"][:4]
    assert httpx.post(f"{base_url}{path}", json=body, timeout=60).status_code == 200


# ----------------------------------------------------------------------------- a member's error page


def test_a_member_error_page_is_cut_short_for_the_client(caplog: pytest.LogCaptureFixture) -> None:
    """A backend's HTML error page came back whole in the 502's message (here 5,000 characters); the client
    gets its start and an ellipsis, the log the whole reason."""
    page = "<!DOCTYPE html><html><body>" + "Service unavailable. " * 250 + "</body></html>"
    with caplog.at_level(logging.ERROR):
        told = str(_unavailable(MemberError("b", "http://10.1.2.3:8081",
                                            f"POST /completion answered HTTP 500: {page}")))
    assert told.startswith("member 'b' is unavailable: POST /completion answered HTTP 500: <!DOCTYPE html>"), told
    assert told.endswith("…") and len(told) < 300, told
    assert page in caplog.records[0].getMessage()


def test_a_short_member_reason_is_told_whole() -> None:
    reason = "POST /completion answered HTTP 500: " + "x" * 150
    assert str(_unavailable(MemberError("b", "http://10.1.2.3:8081", reason))) == \
        f"member 'b' is unavailable: {reason}"


# ----------------------------------------------------------------------------- a second Ctrl+C


def test_a_second_ctrl_c_exits_without_a_traceback(tmp_path: Path) -> None:
    """The second Ctrl+C (during the running stream's grace) made uvicorn skip the app's lifespan shutdown;
    the lifespan task, left waiting, was cancelled at exit and logged an 'asyncio.exceptions.CancelledError'
    traceback."""
    with serving(tmp_path) as (server, url, log):
        streamed: list[str] = []
        body = {"model": MODEL, "messages": USER, "max_tokens": 400, "stream": True}

        def stream() -> None:
            try:
                with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
                    streamed.extend(sse_payloads_iter(response))
            except httpx.HTTPError:
                pass  # a forced exit may cut it: not what this test is about

        running = threading.Thread(target=stream)
        running.start()
        _wait_until(lambda: len(streamed) >= 3)
        server.send_signal(signal.SIGINT)
        _wait_until(lambda: "Shutting down:" in log.read_text())  # the first is being handled: the grace runs
        server.send_signal(signal.SIGINT)
        assert server.wait(timeout=60) == 0, log.read_text()
        running.join(timeout=60)
    output = log.read_text()
    assert "Traceback" not in output and "CancelledError" not in output, output
    assert "Application shutdown complete." in output, output


@pytest.mark.parametrize("pad", range(222, 240))
def test_the_cut_never_leaves_half_a_placeholder(pad: int) -> None:
    """Cut after the masking, 'see <its UR…' read as a broken address (review of 92ce12b): a placeholder is
    told whole or not at all, and the address never."""
    url = "http://10.0.0.5:8081/v1"
    told = str(_unavailable(MemberError("m", url, "x" * pad + f" see {url}/x and //10.9.9.9/y for details")))
    assert "10.0.0.5" not in told and "10.9.9.9" not in told
    tail = told.removesuffix("…")
    opened = tail.rfind("<")
    assert opened <= tail.rfind(">"), told[-40:]


@pytest.mark.parametrize(("url", "reason", "told"), [
    ("http://its:80", "see http://its:80/x: the queue itself is full", "see <its URL>/x: the queue itself is full"),
    ("http://a:80", "Bad gateway at a", "Bad gateway at <its host>"),
    ("http://llm-b.internal:8081", "Server at llm-b.internal Port 8081 (not llm-b.internal2)",
     "Server at <its host> Port 8081 (not llm-b.internal2)"),
])
def test_the_host_is_masked_as_a_whole_name(url: str, reason: str, told: str) -> None:
    """A host such as 'its' or 'a' was replaced inside words and inside the placeholders themselves
    ('see <<its host> URL>', 'd<its host>t'; review of d379dd4)."""
    assert str(_unavailable(MemberError("m", url, reason))) == f"member 'm' is unavailable: {told}"


@pytest.mark.parametrize("closed", [True, False])
def test_a_request_cancelled_by_a_forced_shutdown_is_one_line_not_a_traceback(
        closed: bool, caplog: pytest.LogCaptureFixture) -> None:
    """With a stream still running at a second Ctrl+C, asyncio.run cancelled its task at exit and uvicorn
    logged 'Exception in ASGI application' with a CancelledError traceback (1 run in ~8 of the test
    above). Once shutting down the cancellation ends the request quietly; before, it is not swallowed."""
    from shared_engine.server.admission import Admission
    from shared_engine.server.app import QuietForcedShutdown

    async def cut(scope: Any, receive: Any, send: Any) -> None:
        raise asyncio.CancelledError

    admission = Admission(1, 0)
    if closed:
        admission.close()
    app = QuietForcedShutdown(cut, admission)
    scope = {"type": "http", "method": "POST", "path": "/v1/chat/completions"}
    with caplog.at_level(logging.INFO):
        if closed:
            asyncio.run(app(scope, None, None))  # type: ignore[arg-type]
            assert "POST /v1/chat/completions cut off" in caplog.text
        else:
            with pytest.raises(asyncio.CancelledError):
                asyncio.run(app(scope, None, None))  # type: ignore[arg-type]


def test_a_response_cut_off_at_shutdown_is_ended() -> None:
    """Swallowed, a cancellation left a started response open and uvicorn logged 'ASGI callable returned
    without completing response' (review of 839ed53): the response is ended with an empty last body."""
    from shared_engine.server.admission import Admission
    from shared_engine.server.app import QuietForcedShutdown

    async def streaming(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        raise asyncio.CancelledError

    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    admission = Admission(1, 0)
    admission.close()
    asyncio.run(QuietForcedShutdown(streaming, admission)({"type": "http", "path": "/v1/completions"}, None, send))  # type: ignore[arg-type]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert len(sent) == 3
