"""What real clients of the server ran into (hunt o, the openai SDKs): a browser app on the official JS SDK
(its X-Stainless-* headers on every request) had its CORS preflight refused; a 503 at shutdown carried no
Retry-After (the client's retries gave up within a second); top_p=0, which OpenAI takes, was a 400."""

from __future__ import annotations

import httpx

from shared_engine.errors import EngineClosedError
from shared_engine.server import create_app
from shared_engine.server.app import _shutting_down
from shared_engine.server.background import serve_in_background
from shared_engine.server.openai_schema import ChatCompletionRequest
from tests.test_server import MODEL, USER, toy_engine

STAINLESS = "authorization, content-type, x-stainless-os, x-stainless-lang, x-stainless-timeout"


def test_a_preflight_naming_the_sdk_headers_passes_for_an_allowed_origin() -> None:
    app = "https://app.example"
    with serve_in_background(create_app(toy_engine(), allowed_origins=[app])) as url:
        preflight = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": app, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": STAINLESS})
        assert preflight.status_code == 200, preflight.text
        assert "x-stainless-timeout" in preflight.headers["access-control-allow-headers"].lower()
        other = httpx.options(f"{url}/v1/chat/completions", headers={
            "Origin": "https://evil.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": STAINLESS})
        assert "access-control-allow-origin" not in other.headers  # only the origins allowed


def test_the_shutdown_503_says_when_to_retry() -> None:
    response = _shutting_down(EngineClosedError("the engine is closed")).response()
    assert response.status_code == 503 and response.headers["retry-after"] == "5"


def test_top_p_zero_is_greedy() -> None:
    request = ChatCompletionRequest.model_validate({"model": MODEL, "messages": USER, "top_p": 0, "temperature": 1})
    params = request.generation_params()
    assert params["temperature"] == 0.0 and "top_p" not in params
    with serve_in_background(create_app(toy_engine())) as url:
        body = {"model": MODEL, "messages": USER, "max_tokens": 4}
        greedy = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).json()
        zero = httpx.post(f"{url}/v1/chat/completions", json={**body, "top_p": 0, "temperature": 1.5, "seed": 3},
                          timeout=60).json()
        assert zero["choices"][0]["message"]["content"] == greedy["choices"][0]["message"]["content"]
