"""The server's contract with its clients, where it once broke: the live page (one generation at a
time, served under a prefix), OpenAI's response shape (nulls kept, one ``created`` per stream), the
``ensemble`` extension (stats whatever ``ensemble_events`` says, dropped members), request limits
and encodings, OpenAI's refusals, ``GET /v1/models/{id}`` and the ``serve`` command's arguments.
Toy members or scripted decoding throughout (fast)."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import openai
import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from shared_engine.events import EnsembleEvent, Event, FinishEvent, Stats, TokenEvent
from shared_engine.options import GenerationParams
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from shared_engine.server.completions import collect, stream_chunks
from shared_engine.tools import OutputPlan
from tests.test_server import MODEL, USER, post, sse_payloads, toy_engine
from tests.test_server_tools import WEATHER, ScriptedDecoding
from tests.test_server_zoo import browser


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(toy_engine())) as url:
        yield url


def streamed(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200, response.read()
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    return [json.loads(p) for p in payloads[:-1]]


# ----------------------------------------------------------------------------- the live page


def test_page_runs_one_generation_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl+Enter (or a second click while the model line was loading) during a generation started
    a second request: both answers interleaved in the one answer box, and the first to end disabled
    Stop while the other still ran."""
    from shared_engine.members.hf import HFSession

    engine = toy_engine()
    expected = toy_engine().generate([{"role": "user", "content": "hi"}], max_new_tokens=40).text
    forward = HFSession._forward

    def slow_forward(self: HFSession, feed: list[int], rows: int) -> Any:  # the toy answer takes ~0.7 s:
        time.sleep(0.1)  # a loaded machine finished it before the second send, which then rightly ran
        return forward(self, feed, rows)

    monkeypatch.setattr(HFSession, "_forward", slow_forward)
    with browser(create_app(engine)) as (url, page):
        requests: list[str] = []
        page.on("request", lambda r: requests.append(r.url) if "chat/completions" in r.url else None)
        page.goto(f"{url}/")
        page.wait_for_function("document.getElementById('model').textContent.includes('every-token')")
        page.fill("#prompt", "hi")
        page.fill("#max-tokens", "40")
        page.evaluate("() => { send(); send(); }")  # the second, as Ctrl+Enter or a double click would
        page.focus("#prompt")
        page.keyboard.press("Control+Enter")
        assert not page.is_disabled("#stop")
        page.wait_for_selector("#stats[data-done]", timeout=60_000)
        page.wait_for_function("!document.getElementById('send').disabled")
        assert len(requests) == 1, requests
        assert page.inner_text("#answer") == expected
        assert page.is_disabled("#stop")


class RootPath:
    """A proxy that forwards only its prefix to the app, seen as uvicorn --root-path shows it: the
    prefix stays in the path and is named as the root path."""

    def __init__(self, app: ASGIApp, root: str) -> None:
        self.app, self.root = app, root

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not scope["path"].startswith(self.root):
            await PlainTextResponse("not forwarded", 404)(scope, receive, send)
            return
        await self.app(scope if scope["type"] != "http" else {**scope, "root_path": self.root}, receive, send)


@pytest.mark.parametrize(("how", "path"), [
    ("mount", "/ens/"), ("mount", "/ens"), ("root_path", "/ens"), ("root_path", "/ens/"), ("plain", "/")])
def test_page_works_under_a_prefix(how: str, path: str) -> None:
    """Mounted under /ens (or behind a proxy with a root path), the page's absolute fetches of
    /health and /v1/chat/completions missed the app: "server unreachable", then a 404 on Send."""
    inner = create_app(toy_engine())
    app: ASGIApp = {"mount": lambda: Starlette(routes=[Mount("/ens", app=inner)]),
                    "root_path": lambda: RootPath(inner, "/ens"), "plain": lambda: inner}[how]()
    with browser(app) as (url, page):
        page.goto(f"{url}{path}")
        page.wait_for_function("document.getElementById('model').textContent.includes('every-token')",
                               timeout=30_000)
        page.fill("#max-tokens", "4")
        page.click("#send")
        page.wait_for_selector("#stats[data-done]", timeout=60_000)
        assert page.inner_text("#error") == "" and page.inner_text("#answer")


# ----------------------------------------------------------------------------- response shape


CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'


def test_a_calls_only_answer_keeps_openais_nulls() -> None:
    """A non-streamed answer was dumped without its None fields: a tool-calls-only message had no
    "content" key (OpenAI sends null), and choices[].logprobs and a decision's drafted were gone."""
    with serve_in_background(create_app(ScriptedDecoding([CALL]))) as url:
        whole = post(url, {"model": MODEL, "messages": USER, "tools": [WEATHER]}).json()
    message = whole["choices"][0]["message"]
    assert "content" in message and message["content"] is None
    assert message["tool_calls"][0]["function"]["name"] == "get_weather"
    assert "logprobs" in whole["choices"][0] and whole["choices"][0]["logprobs"] is None
    assert "format_error" in whole["ensemble"] and whole["ensemble"]["format_error"] is None


def test_a_decisions_null_drafted_is_sent() -> None:
    decision = EnsembleEvent(position=0, offset=0, candidates=[], sharpened=False, chosen="x", changed=False)

    async def events() -> AsyncIterator[Event]:
        yield decision
        yield TokenEvent(text="x", source="ensemble", position=0)
        yield FinishEvent(reason="eos", text="x", stats=Stats(prompt_tokens=1, tokens=1))

    whole = asyncio.run(collect(events(), completion_id="c", model=MODEL, method="every-token", members=["a"],
                                ensemble_events=True))
    # the app sends model_dump() of it
    sent = json.loads(json.dumps(whole.model_dump()))
    assert sent["ensemble"]["decisions"][0]["drafted"] is None and "drafted" in sent["ensemble"]["decisions"][0]
    with serve_in_background(create_app(toy_engine())) as url:
        answer = post(url, {"model": MODEL, "messages": USER, "max_tokens": 6}).json()
    assert all("drafted" in d for d in answer["ensemble"]["decisions"])
    assert answer["choices"][0]["logprobs"] is None and "logprobs" in answer["choices"][0]


def test_one_created_per_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every chunk read the clock: "created" changed between chunks of one stream."""
    clock = iter(range(1_000_000, 2_000_000))
    monkeypatch.setattr(time, "time", lambda: float(next(clock)))

    async def events() -> AsyncIterator[Event]:
        for i in range(3):
            yield TokenEvent(text=str(i), source="draft", position=i)
        yield FinishEvent(reason="eos", text="012", stats=Stats(prompt_tokens=1, tokens=3))

    async def chunks() -> list[str]:
        return [c async for c in stream_chunks(events(), completion_id="c", model=MODEL, include_usage=True,
                                               ensemble_events=True)]

    payloads = [json.loads(c[len("data: "):]) for c in asyncio.run(chunks()) if c.startswith("data: {")]
    assert len(payloads) == 6 and len({p["created"] for p in payloads}) == 1


# ----------------------------------------------------------------------------- the ensemble extension


def test_ensemble_events_false_still_sends_stats_and_format_error() -> None:
    """With "ensemble_events": false the streamed final chunk lost its stats and format_error (the
    non-streamed answer kept them; the flag only leaves the decisions out)."""
    with serve_in_background(create_app(ScriptedDecoding(['"name": 5']))) as url:
        body = {"model": MODEL, "messages": USER, "response_format": {"type": "json_object"},
                "ensemble_events": False}
        whole = post(url, body).json()["ensemble"]
        chunks = streamed(url, body)
    final = chunks[-1]["ensemble"]
    assert whole["format_error"] and final["format_error"] == whole["format_error"]
    assert final["stats"] == whole["stats"] and final["decisions"] == whole["decisions"] == []
    assert all(c.get("ensemble", {}).get("decisions", []) == [] for c in chunks)


class DroppingMember(ScriptedDecoding):
    """An answer during which member b was dropped (on_member_failure="degrade")."""

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncIterator[Event]:
        yield TokenEvent(text="Paris", source="draft", position=0)
        yield FinishEvent(reason="eos", text="Paris", stats=Stats(prompt_tokens=5, tokens=1),
                          failed_members={"b": "server down"})


def test_a_dropped_member_is_reported_streamed_and_whole() -> None:
    """A member dropped mid-answer under on_member_failure="degrade" was reported nowhere over HTTP."""
    with serve_in_background(create_app(DroppingMember(["unused"]))) as url:
        whole = post(url, {"model": MODEL, "messages": USER}).json()
        chunks = streamed(url, {"model": MODEL, "messages": USER})
    assert whole["ensemble"]["failed_members"] == {"b": "server down"}
    assert chunks[-1]["ensemble"]["failed_members"] == {"b": "server down"}
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_no_dropped_member_is_an_empty_map(base_url: str) -> None:
    whole = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2}).json()
    assert whole["ensemble"]["failed_members"] == {}
    assert streamed(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2})[-1]["ensemble"][
        "failed_members"] == {}


# ----------------------------------------------------------------------------- request limits and encodings


def test_a_chunked_body_past_the_limit_is_refused_as_it_arrives(base_url: str) -> None:
    """A chunked body (no Content-Length) was read whole before the 1 MiB check: 64 MiB sent and
    still no answer."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        piece = b"x" * (256 << 10)
        answer = b""
        for _ in range(32):  # up to 8 MiB, never the last chunk: only a server that stops early answers
            try:
                sock.settimeout(5)
                sock.sendall(b"%x\r\n" % len(piece) + piece + b"\r\n")
            except OSError:
                break
            sock.settimeout(0.1)
            try:
                answer = sock.recv(4096)
            except TimeoutError:
                continue
            if answer:
                break
        sock.settimeout(10)
        while b"}}" not in answer:  # the status line, then (perhaps apart) the error body
            try:
                more = sock.recv(4096)
            except (TimeoutError, OSError):
                break
            if not more:
                break
            answer += more
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"request_too_large" in answer


def with_surrogate(body: dict[str, Any]) -> bytes:
    """``body`` as JSON, its "@" turned into the escape of a lone surrogate (valid JSON, not text)."""
    return json.dumps(body).replace("@", "\\ud800").encode()


_CALL_HISTORY = [{"role": "user", "content": "x"},
                 {"role": "assistant", "content": None, "tool_calls": [
                     {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": "@"}'}}]},
                 {"role": "tool", "tool_call_id": "1", "content": "ok"}]
_SCHEMA = {"type": "json_schema", "json_schema": {
    "name": "x", "schema": {"type": "object", "properties": {"@": {"type": "string"}}}}}


@pytest.mark.parametrize("body", [
    {"model": MODEL, "messages": USER, "tools": [{"type": "function", "function": {"name": "f", "description": "@"}}]},
    {"model": MODEL, "messages": _CALL_HISTORY},
    {"model": MODEL, "messages": USER, "response_format": _SCHEMA},
    {"model": "@", "messages": USER},
    {"model": MODEL, "messages": [{"role": "user", "content": "hi @"}]},
], ids=["tool description", "call arguments", "schema key", "model", "content"])
def test_lone_surrogates_anywhere_are_a_400(base_url: str, body: dict[str, Any]) -> None:
    """Lone surrogates (JSON escapes, not characters) outside message content gave a 500."""
    response = post(base_url, with_surrogate({**body, "max_tokens": 2}))
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_encoding"


def _nested_schema(depth: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


@pytest.mark.parametrize("body", [
    b'{"model": "x", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    json.dumps({"model": MODEL, "messages": USER, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": _nested_schema(150)}}}).encode(),
], ids=["past json's limit", "a schema past the engine's"])
def test_deep_nesting_is_a_400(base_url: str, body: bytes) -> None:
    """Deeply nested JSON gave a 500 RecursionError."""
    response = post(base_url, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] in ("invalid_json", "invalid_value")
    assert "nested too deeply" in response.json()["error"]["message"]


# ----------------------------------------------------------------------------- OpenAI's refusals and params


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": [], "tool_choice": "required"}, "tool_choice"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": False, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"loop_guard": 4}, "loop_guard"),  # the engine's own minimum, 8 bytes
    ({"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "g"}, "tool_choice"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
     "response_format.json_schema"),
    # was answered as free JSON (a 200): a client that forgot its schema was never told
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    # an invalid tool schema was accepted, and a forced call's arguments came out as noise
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 5}}}]},
     "tools.0.function.parameters"),
])
def test_openais_refusals_name_the_param(base_url: str, extra: dict[str, Any], param: str) -> None:
    """A forced tool_choice without tools and stream_options without streaming were accepted (OpenAI
    refuses both); the engine's validation errors came back with param null."""
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["param"] == param, response.json()


def test_a_field_the_engine_finds_missing_is_a_missing_parameter(base_url: str) -> None:
    """The engine's 'Field required' came back with code null (review of 69d7ccd)."""
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2,
                               "response_format": {"type": "json_schema"}})
    error = response.json()["error"]
    assert (error["param"], error["code"]) == ("response_format.json_schema", "missing_required_parameter"), error


@pytest.mark.parametrize("extra", [
    {"stream": None}, {"ensemble_events": None}, {"tool_choice": "auto"}, {"tool_choice": "none"},
    {"stream": True, "stream_options": {"include_usage": None}}])
def test_nulls_and_neutral_values_are_accepted(base_url: str, extra: dict[str, Any]) -> None:
    """"stream": null (OpenAI's spec makes it nullable) was a 400."""
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 200, response.text


def test_models_retrieve(base_url: str) -> None:
    """client.models.retrieve(...) was a 404 for the served model too."""
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    card = client.models.retrieve(MODEL)
    assert card.id == MODEL and card.model_extra["members"] == ["a", "b"]  # type: ignore[index]
    with pytest.raises(openai.NotFoundError) as raised:
        client.models.retrieve("gpt-4o")
    assert raised.value.code == "model_not_found"


def test_models_retrieve_wants_the_api_key() -> None:
    with serve_in_background(create_app(toy_engine(), api_key="k")) as url:
        assert httpx.get(f"{url}/v1/models/{MODEL}").status_code == 401
        assert httpx.get(f"{url}/v1/models/{MODEL}", headers={"Authorization": "Bearer k"}).status_code == 200


def test_allowed_origins_let_a_browser_page_call_the_server() -> None:
    """A web app on another origin could not call the server from the browser (no CORS headers: the
    browser blocks the answer, and its preflight hit the key guard's 401). With ``allowed_origins``
    the preflight passes the guard, answers (errors too) carry the headers; other origins get none."""
    app = "https://app.example"
    with serve_in_background(create_app(toy_engine(), api_key="k", allowed_origins=[app])) as url:
        preflight = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": app, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == app
        assert "authorization" in preflight.headers["access-control-allow-headers"].lower()
        answer = httpx.post(f"{url}/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 3},
                            headers={"Origin": app, "Authorization": "Bearer k"}, timeout=60)
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == app
        refused = httpx.get(f"{url}/v1/models", headers={"Origin": app})  # no key: the 401 is readable
        assert refused.status_code == 401 and refused.headers["access-control-allow-origin"] == app
        other = httpx.get(f"{url}/v1/models", headers={"Origin": "https://evil.example", "Authorization": "Bearer k"})
        assert "access-control-allow-origin" not in other.headers
    with serve_in_background(create_app(toy_engine())) as url:  # the default: same origin only
        assert "access-control-allow-origin" not in httpx.get(f"{url}/health", headers={"Origin": app}).headers


# ----------------------------------------------------------------------------- the serve command


@pytest.mark.parametrize(("flags", "said"), [
    (["--max-waiting", "-1"], "--max-waiting: must be 0 or more"),
    (["--max-active", "0"], "--max-active: must be 1 or more"),
    (["--port", "99999"], "--port: must be from 0 to 65535"),
    (["--port", "eighty"], "--port: expected an integer"),
    (["--allowed-origins", "app.example"], "is not an origin: give scheme://host[:port]"),
    (["--allowed-origins", "https://app.example/chat"], "is not an origin"),
    (["--allowed-origins", ","], "give at least one origin"),
])
def test_serve_argument_errors_are_one_line(flags: list[str], said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """They were tracebacks, after the models had loaded."""
    from shared_engine.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "--models", "never-loaded-a,never-loaded-b", *flags])
    err = capsys.readouterr().err
    assert exited.value.code == 2 and said in err and len(err.strip().splitlines()) == 1, err


def test_serve_reads_allowed_origins() -> None:
    from shared_engine.cli import build_parser

    args = build_parser().parse_args(["serve", "--models", "a,b", "--allowed-origins",
                                      "https://app.example/, http://localhost:3000"])
    assert args.allowed_origins == ["https://app.example", "http://localhost:3000"]
    assert build_parser().parse_args(["serve", "--models", "a,b"]).allowed_origins == []


def test_serve_reports_a_port_in_use_before_loading(capsys: pytest.CaptureFixture[str]) -> None:
    """A port in use printed "serving on ..." after loading the models, then failed in uvicorn."""
    from shared_engine.cli import main

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--models", "never-loaded-a,never-loaded-b", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert f"cannot listen on 127.0.0.1:{port}" in err and "serving" not in err and "loading" not in err
