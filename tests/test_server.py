"""The OpenAI-compatible server on tiny random members (fast): wire format, errors, concurrency,
cancellation on disconnect and admission control. Each test talks to a real uvicorn server on a
free loopback port; the real-model tests (official clients, the page in a browser) are in
test_server_zoo.py."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from shared_engine import EnsembleEngine
from shared_engine.members import HFMember
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.toy import fitted_member, toy_member

MODEL = "every-token-ensemble"
USER = [{"role": "user", "content": "Sofia walked to the park"}]


def toy_members() -> list[HFMember]:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


def toy_engine() -> EnsembleEngine:
    return EnsembleEngine(toy_members(), method="every-token", max_new_tokens=24)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(toy_engine())) as url:
        yield url


def post(base_url: str, body: bytes | dict[str, Any]) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(f"{base_url}/v1/chat/completions", content=content,
                      headers={"Content-Type": "application/json"}, timeout=60)


def sse_payloads(response: httpx.Response) -> list[str]:
    return [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]


# ----------------------------------------------------------------------------- wire format


def test_streamed_and_whole_answers_match_the_engine(base_url: str) -> None:
    expected = toy_engine().generate(USER, max_new_tokens=12)
    whole = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 12}).json()
    assert whole["object"] == "chat.completion"
    assert whole["choices"][0]["message"] == {"role": "assistant", "content": expected.text}
    assert whole["choices"][0]["finish_reason"] == "length"
    assert whole["usage"] == {"prompt_tokens": expected.stats.prompt_tokens, "completion_tokens": 12,
                              "total_tokens": expected.stats.prompt_tokens + 12}
    assert len(whole["ensemble"]["decisions"]) == expected.stats.ensembled_tokens >= 1
    assert whole["ensemble"]["members"] == ["a", "b"]

    with httpx.stream("POST", f"{base_url}/v1/chat/completions", timeout=60,
                      json={"model": MODEL, "messages": USER, "max_tokens": 12, "stream": True,
                            "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"])
    assert text == expected.text
    final, usage = chunks[-2], chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length" and final["choices"][0]["delta"] == {}
    assert final["ensemble"]["stats"]["tokens"] == 12
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 12
    decisions = [d for c in chunks for d in (c.get("ensemble") or {}).get("decisions", [])]
    positions = [d["position"] for d in decisions]
    assert len(positions) == expected.stats.ensembled_tokens and positions == sorted(set(positions))
    assert {"candidates", "chosen", "sharpened", "changed"} <= decisions[0].keys()
    assert {d["kind"] for d in decisions} == {"token"} and {d["type"] for d in decisions} == {"ensemble"}


def test_text_parts_and_the_developer_role_are_read_like_plain_messages(base_url: str) -> None:
    plain = post(base_url, {"model": MODEL, "max_tokens": 6, "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sofia walked \nto the park"}]})
    parts = post(base_url, {"model": MODEL, "max_tokens": 6, "messages": [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "Sofia walked "},
                                     {"type": "text", "text": "to the park"}]}]})
    assert plain.status_code == parts.status_code == 200
    assert parts.json()["choices"] == plain.json()["choices"]
    # OpenAI's neutral defaults, which some clients always send, change nothing (non-zero ones are a 400)
    neutral = post(base_url, {"model": MODEL, "max_tokens": 6, "frequency_penalty": 0, "presence_penalty": 0.0,
                              "logit_bias": {}, "messages": [
                                  {"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "Sofia walked \nto the park"}]})
    assert neutral.status_code == 200 and neutral.json()["choices"] == plain.json()["choices"]


def test_the_loop_guard_extension_is_a_per_request_parameter(base_url: str) -> None:
    plain = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 8}).json()
    off = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 8, "loop_guard": 0}).json()
    guarded = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 8, "loop_guard": 16})
    assert off["choices"] == plain["choices"] and guarded.status_code == 200
    assert "loop_breaks" in guarded.json()["ensemble"]["stats"]


def test_ensemble_events_can_be_turned_off(base_url: str) -> None:
    whole = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 4, "ensemble_events": False}).json()
    assert whole["ensemble"]["decisions"] == [] and whole["ensemble"]["stats"]["tokens"] == 4


def test_models_health_and_page(base_url: str) -> None:
    models = httpx.get(f"{base_url}/v1/models").json()
    assert models["object"] == "list" and [m["id"] for m in models["data"]] == [MODEL]
    health = httpx.get(f"{base_url}/health").json()
    assert health["status"] == "ok" and health["members"] == ["a", "b"]
    assert health["drafter"] == ("auto" if health["method"] == "safe" else "a")  # the page shows it
    assert health["load"]["active"] == 0
    page = httpx.get(f"{base_url}/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert "v1/chat/completions" in page.text  # relative to the page: the app may be mounted under a prefix
    assert "http://" not in page.text and "https://" not in page.text  # nothing fetched from elsewhere


# ----------------------------------------------------------------------------- AdaFuse spans


def adafuse_engine(**options: Any) -> EnsembleEngine:
    # A margin threshold of 1.0 is never reached by random members: every span is voted on.
    return EnsembleEngine(toy_members(), method="adafuse", threshold=1.0, max_new_tokens=24, **options)


def test_adafuse_spans_are_span_decisions_streamed_and_whole() -> None:
    expected = adafuse_engine().generate(USER, max_new_tokens=10)
    assert expected.stats.fused_spans == expected.stats.spans >= 1
    body = {"model": "adafuse-ensemble", "messages": USER, "max_tokens": 10}
    with serve_in_background(create_app(adafuse_engine())) as url:
        whole = post(url, body).json()
        with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True},
                          timeout=60) as response:
            chunks = [json.loads(p) for p in sse_payloads(response)[:-1]]
    assert whole["choices"][0]["message"]["content"] == expected.text
    decisions = whole["ensemble"]["decisions"]
    assert len(decisions) == expected.stats.fused_spans
    for d in decisions:
        assert d["kind"] == "span" and d["type"] == "adafuse" and d["fused"] is True
        assert set(d["member_uncertainty"]) == {"a", "b"} and d["leader"] in ("a", "b")
        assert d["candidates"] and d["chosen"] in [c["text"] for c in d["candidates"]]
        for c in d["candidates"]:
            assert set(c["member_nll"]) == {"a", "b"} and c["proposed_by"]
        scores = [c["score"] for c in d["candidates"]]
        assert scores == sorted(scores)  # lowest (best) first; greedy: the best one is chosen
        assert d["chosen"] == d["candidates"][0]["text"]

    streamed = [d for c in chunks for d in (c.get("ensemble") or {}).get("decisions", [])]
    assert streamed == decisions
    texts = [c for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")]
    assert "".join(c["choices"][0]["delta"]["content"] for c in texts) == expected.text
    starts = {d["position"] for d in decisions}
    # Every piece of text names its span, a voted one here, and comes after that span's decision.
    seen: set[int] = set()
    for c in chunks:
        ext = c.get("ensemble") or {}
        seen |= {d["position"] for d in ext.get("decisions", [])}
        if c["choices"] and c["choices"][0]["delta"].get("content"):
            assert ext["span"] in starts and ext["span"] in seen and ext["span"] <= ext["position"]
            assert ext["source"] == "ensemble"


def test_text_held_back_by_a_stop_prefix_is_streamed_under_its_own_span() -> None:
    # With stop ".\u2603" every span ending in "." holds its "." back (a possible start of the
    # stop) until the next span's text shows it is none; it was sent in that next span's first chunk,
    # labelled with the next span and position, so the live page marked it as the next decision's.
    conversation = [{"role": "user", "content": "Say hello"},
                    {"role": "assistant", "content": "Hello there, Sofia. Bye now. \n"}]
    members = [fitted_member("fa", "byte_level", conversation, 80), fitted_member("fb", "metaspace", conversation, 80)]
    engine = EnsembleEngine(members, method="adafuse", max_new_tokens=30, max_words=1)
    body = {"model": "adafuse-ensemble", "messages": conversation[:1], "max_tokens": 30, "stream": True,
            "stop": [".\u2603"], "ensemble_events": "all"}
    with serve_in_background(create_app(engine)) as url:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
            chunks = [json.loads(p) for p in sse_payloads(response)[:-1]]
    chosen: dict[int, str] = {}
    texts: dict[int, str] = {}
    for c in chunks:
        ext = c.get("ensemble") or {}
        chosen |= {d["position"]: d["chosen"] for d in ext.get("decisions", [])}
        if c["choices"] and c["choices"][0]["delta"].get("content"):
            later = [start for start in chosen if start > ext["span"]]
            assert ext["span"] <= ext["position"] < min(later, default=ext["position"] + 1)
            texts[ext["span"]] = texts.get(ext["span"], "") + c["choices"][0]["delta"]["content"]
    held = [start for start, text in chosen.items() if text.endswith(".")]
    assert held and max(held) < max(chosen)  # the case happened: a "." held back, then a span after it
    spans = sorted(start for start, text in chosen.items() if text != "<eos>")
    assert sorted(texts) == spans and all(texts[start] == chosen[start] for start in spans[:-1])
    # the last span, " \n" then EOS: the "\n" is dropped as the start of a turn marker
    assert chosen[spans[-1]].startswith(texts[spans[-1]])


def test_confident_adafuse_spans_are_listed_only_on_request() -> None:
    engine = EnsembleEngine(toy_members(), method="adafuse", threshold=0.0, vote="uncertain",
                            max_new_tokens=8)  # always sure: the leader writes alone
    body = {"model": "adafuse-ensemble", "messages": USER, "max_tokens": 8}
    with serve_in_background(create_app(engine)) as url:
        default = post(url, body).json()["ensemble"]
        everything = post(url, {**body, "ensemble_events": "all"}).json()["ensemble"]
        assert post(url, {**body, "ensemble_events": "some"}).status_code == 400
    assert default["decisions"] == [] and default["stats"]["fused_spans"] == 0
    assert len(everything["decisions"]) == everything["stats"]["spans"] >= 1
    assert all(d["kind"] == "span" and not d["fused"] and len(d["candidates"]) == 1
               for d in everything["decisions"])


def test_health_names_the_drafter_or_says_safe_chooses_it_per_request() -> None:
    with serve_in_background(create_app(EnsembleEngine(toy_members(), method="safe", max_new_tokens=4))) as url:
        assert httpx.get(f"{url}/health").json()["drafter"] == "auto"
    named = EnsembleEngine(toy_members(), method="safe", drafter=1, max_new_tokens=4)
    with serve_in_background(create_app(named)) as url:
        assert httpx.get(f"{url}/health").json()["drafter"] == "b"


def test_page_lists_confident_spans_when_asked() -> None:
    """The page in headless Chromium (the real-model page tests are in test_server_zoo.py)."""
    from tests.test_server_zoo import ARTIFACTS, browser_page

    engine = EnsembleEngine(toy_members(), method="adafuse", threshold=0.0, vote="uncertain",
                            max_new_tokens=8)  # always sure: the leader writes alone
    with browser_page(engine, "adafuse") as (page, console_errors):
        page.check("#all-spans")
        page.fill("#max-tokens", "6")
        page.click("#send")
        page.wait_for_selector("#stats[data-done]", timeout=60_000)
        spans, voted = map(int, page.inner_text(".stat:has-text('spans / voted') b").split(" / "))
        cards = page.locator("#decisions .decision")
        assert voted == 0 and cards.count() == spans >= 1
        assert all("confident" in text and "(leader)" in text for text in cards.all_inner_texts())
        assert page.locator("#answer .tok.voted").count() == 0
        assert page.locator("#answer .tok.confident").count() >= 1
        page.locator("#answer .tok.confident").first.click()
        assert page.locator("#decisions .decision.focus").count() == 1
        page.screenshot(path=str(ARTIFACTS / "server_page_confident_spans.png"))
        assert not console_errors, console_errors


# ----------------------------------------------------------------------------- errors

GOOD = {"model": MODEL, "messages": USER}


@pytest.mark.parametrize(("body", "param", "code"), [
    (b'{"model": ', None, "invalid_json"),
    (b'{"model": "\xff\xfe"}', None, "invalid_encoding"),
    (b"[1, 2]", None, "invalid_type"),
    ({"messages": USER}, "model", "missing_required_parameter"),
    ({"model": MODEL}, "messages", "missing_required_parameter"),
    ({**GOOD, "messages": []}, "messages", "invalid_value"),
    ({**GOOD, "messages": "hi"}, "messages", "invalid_type"),
    ({**GOOD, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role", "invalid_value"),
    ({**GOOD, "messages": [{"role": "user", "content": 3}]}, "messages.0.content", None),
    ({**GOOD, "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
     "messages.0.content", None),
    ({**GOOD, "messages": [{"role": "user", "content": "  "}]}, None, None),
    ({**GOOD, "max_tokens": -1}, "max_tokens", "invalid_value"),
    ({**GOOD, "max_tokens": 0}, "max_tokens", "invalid_value"),
    ({**GOOD, "max_tokens": "5"}, "max_tokens", "invalid_type"),
    ({**GOOD, "max_completion_tokens": -3}, "max_completion_tokens", "invalid_value"),
    ({**GOOD, "temperature": -0.1}, "temperature", "invalid_value"),
    ({**GOOD, "temperature": "hot"}, "temperature", "invalid_type"),
    ({**GOOD, "top_p": -0.1}, "top_p", "invalid_value"),  # 0 is greedy, as OpenAI takes it
    ({**GOOD, "top_p": 1.5}, "top_p", "invalid_value"),
    ({**GOOD, "seed": 1.5}, "seed", "invalid_type"),
    ({**GOOD, "stop": ""}, "stop", "invalid_value"),
    ({**GOOD, "stop": [1]}, "stop", None),
    ({**GOOD, "n": 2}, "n", "invalid_value"),
    ({**GOOD, "stream": "yes"}, "stream", "invalid_type"),
    ({**GOOD, "functions": [{"name": "f"}]}, "functions", "unsupported_parameter"),
    ({**GOOD, "frequency_penalty": 0.5}, "frequency_penalty", "unsupported_parameter"),
    ({**GOOD, "presence_penalty": -1}, "presence_penalty", "unsupported_parameter"),
    ({**GOOD, "logit_bias": {"42": 5}}, "logit_bias", "unsupported_parameter"),
    ({**GOOD, "loop_guard": -1}, "loop_guard", "invalid_value"),
    ({**GOOD, "loop_guard": 4}, None, None),  # the engine's own minimum, 8 bytes
    ({**GOOD, "top_logprobs": 2}, "top_logprobs", "unsupported_parameter"),
    ({**GOOD, "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "g"}, None, None),
    ({**GOOD, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 3}}}},
     None, None),
    ({**GOOD, "max_tokens": 100000}, "max_tokens", "context_length_exceeded"),
    ({**GOOD, "max_tokens": 100000, "stream": True}, "max_tokens", "context_length_exceeded"),
    ({**GOOD, "max_completion_tokens": 100000, "max_tokens": 8}, "max_completion_tokens", "context_length_exceeded"),
    ({**GOOD, "messages": [{"role": "user", "content": "Sofia walked " * 400}]}, "messages",
     "context_length_exceeded"),
])
def test_malformed_requests_get_openai_style_400s(base_url: str, body: bytes | dict[str, Any],
                                                  param: str | None, code: str | None) -> None:
    response = post(base_url, body)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error" and error["message"]
    if param is not None:
        assert error["param"] == param or error["param"].startswith(param + "."), error
    if code is not None:
        assert error["code"] == code, error
    if code == "context_length_exceeded" and param != "messages":  # the field the client sent, not the engine's
        assert error["message"].startswith(f"{error['param']} (100000) alone fills"), error


def test_official_client_sees_typed_errors(base_url: str) -> None:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.NotFoundError) as not_found:
        client.chat.completions.create(model="gpt-4o", messages=USER)  # type: ignore[arg-type]
    assert not_found.value.code == "model_not_found" and MODEL in not_found.value.message
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=MODEL, messages=USER, top_p=2.0)  # type: ignore[arg-type]
    assert bad.value.param == "top_p"
    for route in ("/nope", "/v1/chat/completions"):
        response = httpx.get(f"{base_url}{route}")
        assert response.status_code in (404, 405) and "error" in response.json()


# ----------------------------------------------------------------------------- concurrency


async def test_four_concurrent_streams_give_the_sequential_answers(base_url: str) -> None:
    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0)
    prompts = ["Sofia walked to the park", "Hello Tom!", "What is 3 + 4?", "def add(a, b):"]

    async def ask(prompt: str) -> tuple[str, float, float]:
        stream = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=24, stream=True)
        parts, first = [], None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
                parts.append(chunk.choices[0].delta.content)
        return "".join(parts), first or 0.0, time.perf_counter()

    sequential = [(await ask(p))[0] for p in prompts]
    concurrent = await asyncio.gather(*(ask(p) for p in prompts))
    assert [text for text, _, _ in concurrent] == sequential
    # They really ran together: every stream had text before any of them was done.
    assert max(first for _, first, _ in concurrent) < min(done for _, _, done in concurrent)
    await client.close()


# ----------------------------------------------------------------------------- cancellation


def _count_runs(monkeypatch: pytest.MonkeyPatch, members: list[HFMember]) -> list[int]:
    """Count every piece of model work the engine schedules on ``members`` (forwards run there)."""
    calls = [0]
    for member in members:
        original = member.run

        async def counted(fn: Any, *args: Any, _original: Any = original) -> Any:
            calls[0] += 1
            return await _original(fn, *args)

        monkeypatch.setattr(member, "run", counted)
    return calls


def _wait_until(condition: Any, timeout: float = 60.0) -> None:
    """Poll until ``condition`` holds; the timeout only bounds a hang (sized for two busy cores)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_disconnect_mid_stream_cancels_the_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    members = toy_members()
    runs = _count_runs(monkeypatch, members)
    app = create_app(EnsembleEngine(members, method="every-token"), max_active=1, max_waiting=0)
    admission = app.state.admission
    with serve_in_background(app) as url:
        body = {"model": MODEL, "messages": USER, "max_tokens": 400, "stream": True}
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            contents = 0
            for payload in sse_payloads_iter(response):
                chunk = json.loads(payload)
                contents += bool(chunk["choices"] and chunk["choices"][0]["delta"].get("content"))
                if contents == 3:
                    break
        # The client is gone: the slot comes back and no more model work is scheduled.
        _wait_until(lambda: admission.load().active == 0)
        settled = runs[0]
        time.sleep(0.5)
        assert runs[0] == settled
        assert settled < 50, f"{settled} member calls: the 400-token generation was not cut short"
        # The next request is served at once (the slot is free; nothing else is running).
        started = time.perf_counter()
        response = post(url, {"model": MODEL, "messages": USER, "max_tokens": 4})
        assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
        assert time.perf_counter() - started < 60  # served, not queued behind the dropped stream


def sse_payloads_iter(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


def gated_members(monkeypatch: pytest.MonkeyPatch, gate: threading.Event) -> list[HFMember]:
    """Toy members whose model work waits for ``gate``: the first request holds the only slot."""
    members = toy_members()
    for member in members:
        original = member.run

        async def gated(fn: Any, *args: Any, _original: Any = original) -> Any:
            await asyncio.to_thread(gate.wait)
            return await _original(fn, *args)

        monkeypatch.setattr(member, "run", gated)
    return members


def test_overload_is_a_429_and_a_queued_client_that_leaves_frees_its_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gate = threading.Event()  # model work waits here, so the first request holds its slot
    members = gated_members(monkeypatch, gate)
    app = create_app(EnsembleEngine(members, method="every-token"), max_active=1, max_waiting=1)
    admission = app.state.admission
    body = {"model": MODEL, "messages": USER, "max_tokens": 4}
    with serve_in_background(app) as url:
        first: list[httpx.Response] = []
        running = threading.Thread(target=lambda: first.append(post(url, body)))
        running.start()
        _wait_until(lambda: admission.load().active == 1)

        gave_up: list[BaseException] = []

        def queued_client() -> None:  # waits for the slot, gives up after 1 s: a disconnect
            try:
                httpx.post(f"{url}/v1/chat/completions", json=body, timeout=1.0)
            except httpx.TimeoutException as err:
                gave_up.append(err)

        waiter = threading.Thread(target=queued_client)
        waiter.start()
        _wait_until(lambda: admission.load().waiting == 1)
        refused = post(url, body)
        assert refused.status_code == 429 and refused.headers["retry-after"] == "1"
        error = refused.json()["error"]
        assert error["type"] == "rate_limit_error" and "busy" in error["message"]
        waiter.join()
        assert gave_up, "the queued request should have been waiting"
        _wait_until(lambda: admission.load().waiting == 0)  # its place is free again

        gate.set()
        running.join(timeout=30)
        assert first and first[0].status_code == 200
        assert admission.load().active == 0
        assert post(url, body).status_code == 200


# ----------------------------------------------------------------------------- the command


def test_serve_command_serves_local_model_folders(tmp_path: Path) -> None:
    folders = []
    for name, member in zip(("toy-a", "toy-b"), toy_members()):
        folder = tmp_path / name
        member.model.save_pretrained(folder)
        member.tokenizer.save_pretrained(folder)
        folders.append(str(folder))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "shared_engine.cli", "serve", "--models", ",".join(folders),
               "--method", "every-token", "--port", str(port), "--max-new-tokens", "6"]
    server = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.communicate()[0]
            assert time.monotonic() < deadline, "the server did not come up"
            try:
                health = httpx.get(f"{url}/health", timeout=2).json()
                break
            except httpx.TransportError:
                time.sleep(0.2)
        assert health["members"] == ["toy-a", "toy-b"] and health["model"] == MODEL
        answer = post(url, {"model": MODEL, "messages": USER}).json()
        assert answer["usage"]["completion_tokens"] <= 6  # --max-new-tokens is the request default
    finally:
        server.send_signal(signal.SIGINT)
        output = server.communicate(timeout=30)[0]
    assert server.returncode == 0, output
    assert f"http://127.0.0.1:{port}/" in output


def test_many_http_disconnects_free_every_request_and_answers_stay_identical() -> None:
    """Reliability soak over HTTP: 40 streams dropped at random points (before the first byte,
    mid-stream); afterwards the engine holds no request (no sessions, no KV caches) and answers
    byte-identically to a fresh engine."""
    import random

    engine = toy_engine()
    fresh = toy_engine().generate(USER, max_new_tokens=24).text
    rng = random.Random(7)
    with serve_in_background(create_app(engine, max_active=2, max_waiting=8)) as url:
        body = {"model": MODEL, "messages": USER, "max_tokens": 200, "stream": True}
        for _ in range(40):
            stop_after = rng.randint(0, 6)
            with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
                for seen, _payload in enumerate(sse_payloads_iter(response)):
                    if seen >= stop_after:
                        break
        _wait_until(lambda: engine.live_requests == 0)
        answer = post(url, {"model": MODEL, "messages": USER, "max_tokens": 24}).json()
    assert answer["choices"][0]["message"]["content"] == fresh


def test_serve_loads_the_members_with_a_notice_before_it_prints_its_address(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """`safe-ensemble serve` said "serving ... on http://..." and then loaded for seconds to minutes
    inside uvicorn's start-up, silent: the address is printed once the members are loaded."""
    import uvicorn

    from shared_engine.cli import main
    from tests.toy import registered_members

    served: list[Any] = []

    def run(server: uvicorn.Server, sockets: list[socket.socket]) -> None:
        served.append(server.config.app)
        server.started = True

    monkeypatch.setattr(uvicorn.Server, "run", run)
    with registered_members(toy_members()) as names:
        assert main(["serve", "--models", ",".join(names), "--port", "0"]) == 0
    err = capsys.readouterr().err
    assert f"loading 2 members ({', '.join(names)}) ..." in err
    assert err.index("loaded in ") < err.index("serving `")
    assert served and served[0].state.engine.loaded
