"""One check of a chat request: the server runs the engine's (``acheck_request``), not a copy of it.

The server's ``chat_completions`` repeated the engine's validation in its own ``checked()`` (normalize the
messages, validate the parameters and the output options, build the plan), and the engine checked a
structured request again in ``astream``: a tool list's schemas were checked twice per request (tenths of
a second each on the two-worker schema pool). The errors the client gets are the same as before: the
expected answers below are what the server answered before the change (400 with the same message,
``param`` and ``code``; 503 ``server_shutting_down`` with Retry-After for a closed engine; a bad request
still a 400 from a closed engine), streamed and not.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import httpx
import jsonschema
import pytest

import shared_engine.engine as engine_module
from shared_engine import EnsembleEngine
from shared_engine.errors import EngineClosedError, InvalidParametersError, InvalidRequestError
from shared_engine.offload import SCHEMA_THREAD_PREFIX
from shared_engine.server import create_app
from shared_engine.tools import OutputOptions
from tests.test_server import USER, toy_engine

if TYPE_CHECKING:
    from shared_engine.engine import CheckedRequest

TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}}}}}


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "object"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


NESTED = ("invalid_value", None, "the request is nested too deeply to be read")
BAD_REQUESTS: dict[str, tuple[dict[str, Any], tuple[str, str | None, str]]] = {
    # name: (the request's fields, (code, param, the message's start)) as the server answered before
    "bad tool schema": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "nope"}}}]},
                        ("invalid_value", "tools.0.function.parameters",
                         "invalid parameters: tools.0.function.parameters: not a valid JSON schema")),
    "tool_choice naming no tool": ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
                                   ("invalid_value", "tool_choice", "tool_choice {'type': 'function', 'function': "
                                    "{'name': 'nope'}} is not 'auto', 'none', 'required' or one of the tools ['f']")),
    "bad response_format schema": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "bogus"}}}}, ("invalid_value", "response_format.json_schema",
                                                      "invalid parameters: response_format.json_schema: not a valid")),
    "unknown response_format": ({"response_format": {"type": "yaml"}},
                                ("invalid_value", "response_format.type", "invalid parameters: response_format.type")),
    "too many stops": ({"stop": ["a"] * 10}, ("invalid_value", "stop", "stop: Value error, at most 4 stop sequences")),
    "schema nested too deeply": ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": _deep(400)}}}, NESTED),
    "tool nested too deeply": ({"tools": [{"type": "function", "function": {"name": "f", "parameters": _deep(400)}}]},
                               NESTED),
    "empty messages": ({"messages": [{"role": "user", "content": ""}]},
                       ("invalid_value", None, "every message is empty")),
}


@pytest.fixture(scope="module")
def engine() -> Iterator[EnsembleEngine]:
    with toy_engine() as opened:
        yield opened


@pytest.fixture(scope="module")
def closed() -> EnsembleEngine:
    engine = toy_engine()
    engine.close()
    return engine


async def _post(engine: EnsembleEngine, body: dict[str, Any]) -> httpx.Response:
    app = create_app(engine, model_name="m")
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        return await client.post("/v1/chat/completions", json={"model": "m", "messages": USER, "max_tokens": 2,
                                                               **body})


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("is_closed", [False, True], ids=["open", "closed"])
@pytest.mark.parametrize("case", BAD_REQUESTS)
async def test_a_bad_request_gets_the_400_it_got_before(case: str, is_closed: bool, stream: bool,
                                                        engine: EnsembleEngine, closed: EnsembleEngine) -> None:
    """A request that cannot be served is a 400 whether the engine is open or closed (a retry would
    fail the same way), with the message, param and code the server's own check gave."""
    body, (code, param, message) = BAD_REQUESTS[case]
    reply = await _post(closed if is_closed else engine, {**body, "stream": stream})
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert (error["code"], error["param"], error["type"]) == (code, param, "invalid_request_error")
    assert error["message"].startswith(message), error["message"]
    assert "retry-after" not in reply.headers


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("extra", [{}, {"tools": [TOOL]}, {"response_format": {"type": "json_object"}}],
                         ids=["plain", "tools", "response_format"])
async def test_a_closed_engine_is_a_503_with_retry_after(stream: bool, extra: dict[str, Any],
                                                         closed: EnsembleEngine) -> None:
    reply = await _post(closed, {**extra, "stream": stream})
    assert reply.status_code == 503, reply.text
    assert reply.headers["retry-after"] == "5"
    assert reply.json()["error"] == {"message": "the engine is closed; retry later", "type": "server_error",
                                     "param": None, "code": "server_shutting_down"}


@pytest.mark.parametrize("stream", [False, True])
async def test_the_server_answers_with_the_engines_check(stream: bool, engine: EnsembleEngine,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The server has no check of its own: what the engine's acheck_request raises is the answer, as
    _engine_error maps it (param and code from the error's location and kind)."""
    seen: list[dict[str, Any]] = []

    async def refusing(messages: Any, **params: Any) -> CheckedRequest:
        seen.append(params)
        raise InvalidParametersError("invalid parameters: tools: the engine says no", loc="tools", kind="value_error")

    monkeypatch.setattr(engine, "acheck_request", refusing)
    reply = await _post(engine, {"tools": [TOOL], "temperature": 0.5, "stream": stream})
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"] == {"message": "invalid parameters: tools: the engine says no",
                                     "type": "invalid_request_error", "param": "tools", "code": "invalid_value"}
    assert len(seen) == 1 and seen[0]["tools"] and seen[0]["temperature"] == 0.5


@pytest.mark.parametrize("stream", [False, True])
async def test_a_served_request_checks_its_tools_once(stream: bool, engine: EnsembleEngine,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The server checked the tool list's schemas, then astream checked them again: twice per request."""
    checks: list[Any] = []
    real = jsonschema.validators.validator_for

    def counting(schema: Any, *args: Any, **kwargs: Any) -> Any:
        if schema == TOOL["function"]["parameters"]:
            checks.append(schema)
        return real(schema, *args, **kwargs)

    monkeypatch.setattr(jsonschema.validators, "validator_for", counting)
    reply = await _post(engine, {"tools": [TOOL], "tool_choice": "none", "stream": stream})
    assert reply.status_code == 200, reply.text
    assert len(checks) == 1


async def test_the_check_runs_on_the_schema_pool_only_with_schemas(engine: EnsembleEngine,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    threads: list[str] = []
    real = engine_module.validated

    def recording(model: Any, **values: Any) -> Any:
        if model is OutputOptions:
            threads.append(threading.current_thread().name)
        return real(model, **values)

    monkeypatch.setattr(engine_module, "validated", recording)
    await engine.acheck_request(USER, tools=[TOOL])
    await engine.acheck_request(USER, response_format={"type": "json_object"})
    await engine.acheck_request(USER, temperature=0.5)
    assert [name.startswith(SCHEMA_THREAD_PREFIX) for name in threads] == [True, True, False]
    assert threads[2] == threading.current_thread().name  # nothing slow to check: no hop


async def test_astream_serves_a_checked_request_as_checked(engine: EnsembleEngine) -> None:
    checked = await engine.acheck_request(USER, max_new_tokens=3, tools=[TOOL], tool_choice="none")
    assert checked.gen.max_new_tokens == 3 and checked.messages == USER
    served = await engine.agenerate(checked)
    direct = await engine.agenerate(USER, max_new_tokens=3, tools=[TOOL], tool_choice="none")
    assert (served.text, served.finish_reason, served.stats.tokens) == (
        direct.text, direct.finish_reason, direct.stats.tokens)


async def test_a_checked_request_takes_no_other_keyword_nor_another_engine(engine: EnsembleEngine) -> None:
    """A keyword given beside a checked request was never checked: refused, not dropped or applied unchecked."""
    checked = await engine.acheck_request(USER, max_new_tokens=3)
    with pytest.raises(InvalidRequestError, match="temperature given beside it"):
        await engine.agenerate(checked, temperature=0.5)
    with pytest.raises(InvalidRequestError, match="tools given beside it"):
        await engine.agenerate(checked, tools=[TOOL])
    with toy_engine() as other:
        with pytest.raises(InvalidRequestError, match="checked by another engine"):
            await other.agenerate(checked)


async def test_acheck_request_checks_the_request_before_the_engines_state(closed: EnsembleEngine) -> None:
    with pytest.raises(InvalidRequestError, match="top_p: Input should be less than or equal to 1"):
        await closed.acheck_request(USER, top_p=2)
    with pytest.raises(EngineClosedError):
        await closed.acheck_request(USER, tools=[TOOL])
