"""A structured-output answer asked again shows only the accepted attempt's decisions. Each attempt
numbers its positions from 0, and every attempt's ``ensemble`` / ``adafuse`` events reached the
caller while only the accepted one's text did: a 4-token JSON answer cut by max_new_tokens (asked 3
times) came with 12 token decisions, positions 0-3 three times over, while ``stats.ensembled_tokens``
said 4 (the server's chunks, streamed and whole, and the engine's own stream, which LangChain's and
LlamaIndex's custom events translate); AdaFuse's first chunk carried the first attempt's span@0 and
the second's. The engine holds an attempt's decisions with its text and releases them with the
accepted attempt, in their order; the server drops decisions still pending at a ``format_retry``.
Random toy members (their JSON is cut by the small max_new_tokens, so every attempt is rejected)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.events import (
    AdaFuseEvent,
    Candidate,
    EnsembleEvent,
    Event,
    FinishEvent,
    FormatRetryEvent,
    Stats,
    TokenEvent,
)
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from shared_engine.server.completions import collect, stream_chunks
from tests.toy import toy_member

USER = [{"role": "user", "content": "Sofia walked to the park"}]
SCHEMA = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
    "type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"]}}}
MODELS = {"every-token": "every-token-ensemble", "adafuse": "adafuse-ensemble"}
MAX_TOKENS = {"every-token": 4, "adafuse": 6}


@pytest.fixture(scope="module", params=["every-token", "adafuse"])
def engine(request: pytest.FixtureRequest) -> Iterator[EnsembleEngine]:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    with EnsembleEngine(members, method=request.param, max_new_tokens=MAX_TOKENS[request.param]) as eng:
        yield eng


def _fused(stats: dict[str, Any] | Stats, method: str) -> int:
    """The decisions an answer made: token fusions, or AdaFuse's spans (every one listed)."""
    stats = stats if isinstance(stats, dict) else stats.model_dump()
    return stats["spans"] if method == "adafuse" else stats["ensembled_tokens"]


async def _events(engine: EnsembleEngine) -> list[Event]:
    return [event async for event in engine.astream(USER, response_format=SCHEMA)]


def test_the_engine_streams_the_accepted_attempts_decisions_only(engine: EnsembleEngine) -> None:
    events = asyncio.run(_events(engine))
    finish = events[-1]
    assert isinstance(finish, FinishEvent) and finish.format_error  # every attempt cut: asked again
    assert [e.attempt for e in events if isinstance(e, FormatRetryEvent)] in ([1], [1, 2])  # while it fits
    decisions = [e for e in events if isinstance(e, EnsembleEvent | AdaFuseEvent)]
    positions = [d.position for d in decisions]
    assert len(decisions) == _fused(finish.stats, engine.options.method) > 0
    assert len(set(positions)) == len(positions)
    # the accepted attempt's events come after the last format_retry, each decision before its text
    last_retry = max(i for i, e in enumerate(events) if isinstance(e, FormatRetryEvent))
    assert all(events.index(d) > last_retry for d in decisions)
    tokens = {e.position: i for i, e in enumerate(events) if isinstance(e, TokenEvent) and e.source != "prefix"}
    assert all(events.index(d) < tokens[d.position] for d in decisions if d.position in tokens)
    # agenerate's kept events are the stream's
    result = engine.generate(USER, response_format=SCHEMA, keep_events=True)
    kept = [e.position for e in result.events if isinstance(e, EnsembleEvent | AdaFuseEvent)]
    assert len(kept) == _fused(result.stats, engine.options.method) and len(set(kept)) == len(kept)


def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    with httpx.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}, timeout=120) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def test_the_server_lists_the_accepted_attempts_decisions_only(engine: EnsembleEngine) -> None:
    method = engine.options.method
    body = {"model": MODELS[method], "messages": USER, "response_format": SCHEMA, "ensemble_events": "all"}
    with serve_in_background(create_app(engine)) as url:
        whole = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120).json()
        chunks = _stream(url, body)
    summary = whole["ensemble"]
    assert summary["format_error"] and whole["usage"]["completion_tokens"] > summary["stats"]["tokens"]  # retried
    positions = [d["position"] for d in summary["decisions"]]
    assert len(positions) == _fused(summary["stats"], method) > 0 and len(set(positions)) == len(positions)

    streamed = [c["ensemble"] for c in chunks if c.get("ensemble")]
    positions = [d["position"] for e in streamed for d in e.get("decisions", [])]
    assert len(positions) == _fused(streamed[-1]["stats"], method) > 0 and len(set(positions)) == len(positions)
    for extension in streamed:  # each decision comes with a text chunk that holds its position (its span)
        for decision in extension.get("decisions", []):
            held = [extension.get("span")] if method == "adafuse" else extension.get("positions") or []
            assert decision["position"] in held, (decision["position"], extension)


def _decision(position: int) -> EnsembleEvent:
    return EnsembleEvent(position=position, offset=position, sharpened=False, chosen="x", drafted="x",
                         changed=False, candidates=[Candidate(text="x", member_probs={"a": 1.0}, fused=1.0)])


async def _rejected_then_accepted() -> AsyncIterator[Event]:
    """A stream whose rejected attempt's decision came out (before the engine held them back)."""
    stats = Stats(tokens=1, ensembled_tokens=1)
    yield _decision(0)
    yield FormatRetryEvent(attempt=1, error="not valid JSON", text="x", stats=stats)
    yield _decision(0)
    yield TokenEvent(text="{}", source="ensemble", position=0)
    yield FinishEvent(reason="eos", text="{}", stats=stats)


def test_the_server_drops_the_decisions_of_an_answer_asked_again() -> None:
    async def streamed() -> list[str]:
        return [c async for c in stream_chunks(_rejected_then_accepted(), completion_id="c", model="m",
                                               include_usage=False, ensemble_events=True)]

    chunks = [json.loads(c[6:]) for c in asyncio.run(streamed()) if c.startswith("data: {")]
    assert [d["position"] for c in chunks for d in (c.get("ensemble") or {}).get("decisions", [])] == [0]
    whole = asyncio.run(collect(_rejected_then_accepted(), completion_id="c", model="m", method="every-token",
                                members=["a"], ensemble_events=True))
    assert whole.ensemble is not None and [d.position for d in whole.ensemble.decisions] == [0]
