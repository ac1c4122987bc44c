"""A structured-output retry whose prompt no longer fits: each retry reads the request's prompt plus
every rejected answer and its correction, so a long rejected answer can leave a member no room. The
request then ends with the last attempt and its format_error, as after the last try; before, the
retry's start raised ContextLengthError and the answer was lost (the server: a 400 though the
request's own prompt fit; streamed: "generation failed" mid-stream). Toy members (512-token context
windows), answers scripted (``Fitted``: each attempt's start checks its prompt fits, as decoding's does)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.events import Event
from shared_engine.options import GenerationParams
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from shared_engine.tools import OutputPlan
from tests.test_server_tools import ScriptedDecoding

USER = [{"role": "user", "content": "Check."}]
JSON = {"type": "json_object"}


class Fitted(ScriptedDecoding):
    """Scripted answers, each attempt started as decoding starts it: refused where its prompt leaves a
    member no room for max_new_tokens (``_fitted_prompt_ids``)."""

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncIterator[Event]:
        await self._fitted_prompt_ids(messages, plan, gen)
        async for event in super()._decode(messages, plan, gen):
            yield event


def _long(words: int) -> str:
    """An answer after the prefilled ``{`` that is never valid JSON (its string is not closed), about
    two tokens a word on the toys."""
    return '"a": "' + "ab " * words


async def _collect(engine: EnsembleEngine, **options: Any) -> list[Event]:
    return [event async for event in engine.astream(USER, **options)]


def test_a_retry_that_does_not_fit_ends_with_the_answer_and_its_format_error() -> None:
    engine = Fitted([_long(250)])
    asyncio.run(engine.acheck_fits(USER, response_format=JSON))  # the request's own prompt fits
    events = asyncio.run(_collect(engine, response_format=JSON))
    finish = events[-1]
    assert finish.type == "finish" and not [e for e in events if e.type == "format_retry"]
    assert finish.text == "{" + _long(250) and finish.format_error.startswith("not valid JSON")
    assert "".join(e.text for e in events if e.type == "token") == finish.text  # released as an invalid answer is
    assert len(engine.prompts) == 1 and not finish.rejected_attempts


def test_retries_run_while_they_fit_and_the_last_that_ran_is_the_answer() -> None:
    # the first retry (one rejected answer in its prompt) fits; the second (two) would not
    engine = Fitted([_long(100), '"b": ' + "ab " * 100])
    events = asyncio.run(_collect(engine, response_format=JSON))
    finish = events[-1]
    assert [e.attempt for e in events if e.type == "format_retry"] == [1] and len(engine.prompts) == 2
    assert finish.text == '{"b": ' + "ab " * 100 and finish.format_error.startswith("not valid JSON")
    assert len(finish.rejected_attempts) == 1 and finish.usage.prompt_tokens == 10  # both attempts counted


@pytest.mark.parametrize("stream", [False, True])
def test_the_server_answers_with_the_format_error_not_a_400(stream: bool) -> None:
    engine = Fitted([_long(250)])
    body = {"model": "every-token-ensemble", "messages": USER, "response_format": JSON, "stream": stream}
    with serve_in_background(create_app(engine)) as url:
        if not stream:
            response = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60)
            assert response.status_code == 200, response.text
            whole = response.json()
            assert whole["choices"][0]["message"]["content"] == "{" + _long(250)
            assert whole["ensemble"]["format_error"].startswith("not valid JSON")
            return
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=60) as response:
            assert response.status_code == 200
            data = [line for line in response.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    chunks = [json.loads(line[6:]) for line in data[:-1]]
    assert not [c for c in chunks if "error" in c]  # before: "generation failed" after the first attempt
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]) == "{" + _long(250)
    assert chunks[-1]["ensemble"]["format_error"].startswith("not valid JSON")
