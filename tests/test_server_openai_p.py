"""The server against OpenAI's own behaviour (hunt/fix 237): completions checked as chat is (the engine's
``acheck_request``, served as checked), ``CheckedRequest`` exported, an empty raw prompt refused with the
reason, an unknown ``tool_choice`` string refused as OpenAI refuses it, and the 429's code OpenAI's."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Iterator
from typing import Any

import httpx
import openai
import pytest

import shared_engine
import shared_engine.engine as engine_module
from shared_engine import EnsembleEngine
from shared_engine.errors import InvalidRequestError
from shared_engine.events import Event
from shared_engine.server import create_app
from tests.test_server import USER, toy_engine

MODEL = "m"
TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}


@pytest.fixture(scope="module")
def engine() -> Iterator[EnsembleEngine]:
    with toy_engine() as opened:
        yield opened


async def _post(engine: EnsembleEngine, path: str, body: dict[str, Any], **app: Any) -> httpx.Response:
    served = create_app(engine, model_name=MODEL, **app)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://t") as client:
        return await client.post(path, json={"model": MODEL, "max_tokens": 2, **body})


# ----------------------------------------------------------------------------- 1: completions' check


@pytest.mark.parametrize(("prompt", "stream"), [("Sofia walked", False), ("Sofia walked", True),
                                               (["Sofia walked", "Tom ran"], False)])  # a list is not streamed
async def test_completions_are_checked_by_acheck_request_and_served_as_checked(
        stream: bool, prompt: str | list[str], engine: EnsembleEngine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The synchronous ``check_request`` ran on the event loop and ``astream`` checked each prompt again;
    now each prompt is checked once, by ``acheck_request``, and ``astream`` gets what it returned."""
    def sync_check(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the synchronous check ran on the event loop")

    served: list[object] = []
    astream = EnsembleEngine.astream

    def recording(self: EnsembleEngine, request: Any, **params: Any) -> AsyncGenerator[Event, None]:
        served.append(request)
        return astream(self, request, **params)

    monkeypatch.setattr(EnsembleEngine, "check_request", sync_check)
    monkeypatch.setattr(EnsembleEngine, "astream", recording)
    reply = await _post(engine, "/v1/completions", {"prompt": prompt, "stream": stream})
    assert reply.status_code == 200, reply.text
    prompts = prompt if isinstance(prompt, list) else [prompt]
    assert [type(r) for r in served] == [engine_module.CheckedRequest] * len(prompts)
    assert [r.messages[0]["content"] for r in served] == prompts  # type: ignore[attr-defined]


@pytest.mark.parametrize("stream", [False, True])
async def test_a_bad_completion_is_a_400_from_a_closed_engine_too(stream: bool) -> None:
    """As chat's: a request that cannot be served is a 400 whether the engine is open or not (a retry
    fails the same way); the synchronous check looked at the engine first, a 503 "retry later" (loop_guard 4:
    under the engine's own minimum, 8 bytes, which the request model does not know)."""
    closed = toy_engine()
    closed.close()
    reply = await _post(closed, "/v1/completions", {"prompt": "Sofia", "stream": stream, "loop_guard": 4})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == "loop_guard"
    good = await _post(closed, "/v1/completions", {"prompt": "Sofia", "stream": stream})
    assert good.status_code == 503 and good.headers["retry-after"] == "5"


# ----------------------------------------------------------------------------- 2: the export


def test_checked_request_is_exported() -> None:
    """``acheck_request`` returns it and the server types with it: public API, importable from the package."""
    from shared_engine import CheckedRequest

    assert CheckedRequest is engine_module.CheckedRequest
    assert "CheckedRequest" in shared_engine.__all__


# ----------------------------------------------------------------------------- 3: an empty raw prompt


@pytest.mark.parametrize(("prompt", "stream"), [("", False), ("", True), (["Sofia", ""], False)])
async def test_an_empty_completion_prompt_is_refused_saying_why(prompt: str | list[str], stream: bool,
                                                                engine: EnsembleEngine) -> None:
    """OpenAI generates from "": here a member whose tokenizer adds no start token (Qwen2.5, SmolLM2: ""
    encodes to no token) has nothing to continue from. The 400 said only 'the prompt is empty'."""
    reply = await _post(engine, "/v1/completions", {"prompt": prompt, "stream": stream})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["type"]) == ("prompt", "invalid_value", "invalid_request_error")
    assert error["message"].startswith(engine_module.EMPTY_RAW_PROMPT), error
    assert "no start token" in error["message"]
    if isinstance(prompt, list):
        assert error["message"].endswith("(prompt 1 of the list)")


def test_the_engine_says_why_an_empty_raw_prompt_is_refused(engine: EnsembleEngine) -> None:
    with pytest.raises(InvalidRequestError, match="no start token"):
        engine.check_request("", raw_prompt=True)


# ----------------------------------------------------------------------------- 4: tool_choice strings


@pytest.mark.parametrize("tools", [[TOOL], None], ids=["tools", "no tools"])
@pytest.mark.parametrize("choice", ["any", "f", "sometimes"])
async def test_an_unknown_tool_choice_string_is_a_400_listing_the_values(choice: str, tools: list[Any] | None,
                                                                         engine: EnsembleEngine) -> None:
    """'any' was served as 'required' (a 200); OpenAI refuses every string but none, auto and required."""
    body = {"messages": USER, "tool_choice": choice, **({"tools": tools} if tools else {})}
    reply = await _post(engine, "/v1/chat/completions", body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["param"], error["code"], error["type"]) == ("tool_choice", "invalid_value", "invalid_request_error")
    assert f'invalid value "{choice}"' in error["message"], error
    assert '"none", "auto", "required"' in error["message"], error


@pytest.mark.parametrize("choice", ["auto", "none", "required", {"type": "function", "function": {"name": "f"}}])
async def test_openais_tool_choices_are_still_served(choice: str | dict[str, Any], engine: EnsembleEngine) -> None:
    """Not refused for the choice (a forced call's prompt may outgrow a toy's 512-token window: that 400 is
    the prompt's)."""
    reply = await _post(engine, "/v1/chat/completions", {"messages": USER, "tools": [TOOL], "tool_choice": choice})
    assert reply.status_code == 200 or reply.json()["error"]["code"] == "context_length_exceeded", reply.text


# ----------------------------------------------------------------------------- 5: the 429


async def test_a_full_server_is_openais_429(engine: EnsembleEngine) -> None:
    """The code was 'too_many_requests'; OpenAI's (and its SDK's error types') is 'rate_limit_exceeded'."""
    served = create_app(engine, model_name=MODEL, max_active=1, max_waiting=0)
    served.state.admission.admit()  # the one place, taken
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://t") as http:
        reply = await http.post("/v1/chat/completions", json={"model": MODEL, "messages": USER, "max_tokens": 2})
        assert reply.status_code == 429 and reply.headers["retry-after"] == "1"
        error = reply.json()["error"]
        assert (error["type"], error["code"]) == ("rate_limit_error", "rate_limit_exceeded"), error
        client = openai.AsyncOpenAI(base_url="http://t/v1", api_key="unused", http_client=http,  # type: ignore[arg-type]
                                    max_retries=0)
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2)  # type: ignore[arg-type]
        assert refused.value.code == "rate_limit_exceeded"


async def test_a_bad_later_prompt_to_a_closed_engine_is_a_400_not_a_retry() -> None:
    # review of 53f1d0e: the first prompt passed its check, then the closed engine's 503 'retry later' left
    # the loop before prompt 1 (empty) was read; the SDK retried a request that can never succeed
    closed = toy_engine()
    closed.close()
    served = create_app(closed, model_name="m")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=served), base_url="http://t") as client:
        reply = await client.post("/v1/completions", json={"model": "m", "prompt": ["Sofia", ""], "max_tokens": 2})
        assert reply.status_code == 400, reply.text
        assert reply.json()["error"]["message"].endswith("(prompt 1 of the list)")
        good = await client.post("/v1/completions", json={"model": "m", "prompt": ["Sofia", "Tom"], "max_tokens": 2})
        assert good.status_code == 503 and good.headers["retry-after"] == "5"
