"""Server hunt 2026-12-07d (toy members, the page in headless Chromium): the page and infinite AdaFuse
scores, error codes of engine-validated fields, message fields OpenAI requires or does not know, and a
member backend's failure."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from shared_engine import EnsembleEngine
from shared_engine.events import AdaFuseEvent, Event
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.test_server import MODEL, USER, _wait_until, post, toy_engine, toy_members

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


def error_of(base_url: str, extra: dict[str, Any]) -> dict[str, Any]:
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


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
