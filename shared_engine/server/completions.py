"""Engine events -> OpenAI chat completions (one streamed chunk per committed text delta, or one
completion object), with the ensemble's decisions riding along in the ``ensemble`` extension.

Which engine events become decisions: every ``ensemble`` event (a token fusion) and every voted
AdaFuse span (``adafuse`` with ``fused=True``). AdaFuse's confident spans, where the leader wrote
on without a vote, are listed only when the request asks for ``"ensemble_events": "all"``;
otherwise they show only in the stats (``spans - fused_spans``) and in the chunks' ``span``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Literal

from ..events import AdaFuseEvent, EnsembleEvent, Event, FinishEvent
from .openai_schema import (
    AssistantMessage,
    ChatCompletion,
    ChatCompletionChunk,
    Choice,
    ChunkChoice,
    Decision,
    Delta,
    EnsembleDelta,
    EnsembleSummary,
    ErrorBody,
    ErrorDetail,
    Usage,
    as_decision,
    finish_reason,
)
from .sse import sse


Listing = bool | Literal["all"]


def listed(event: EnsembleEvent | AdaFuseEvent, listing: Listing) -> bool:
    """Whether ``event`` is a decision the client asked to see (see the module docstring)."""
    if isinstance(event, AdaFuseEvent):
        return bool(listing) and (event.fused or listing == "all")
    return bool(listing)


async def stream_chunks(events: AsyncIterator[Event], *, completion_id: str, model: str,
                        include_usage: bool, ensemble_events: Listing) -> AsyncIterator[str]:
    """SSE messages for a streamed completion, ending with ``data: [DONE]``.

    Closing this iterator closes ``events`` (and so the engine stream under it)."""

    def chunk(delta: Delta, reason: str | None = None, ensemble: EnsembleDelta | None = None) -> str:
        choice = ChunkChoice(delta=delta, finish_reason=finish_reason(reason) if reason else None)
        body = ChatCompletionChunk(id=completion_id, model=model, choices=[choice],
                                   ensemble=ensemble if ensemble_events else None)
        return sse(body.model_dump_json(exclude={"ensemble"} if body.ensemble is None else None))

    pending: list[Decision] = []
    span: int | None = None  # AdaFuse: the span being committed
    async with aclosing(events):  # type: ignore[type-var]
        yield chunk(Delta(role="assistant", content=""))
        try:
            async for event in events:
                if isinstance(event, AdaFuseEvent):
                    span = event.position
                if isinstance(event, EnsembleEvent | AdaFuseEvent):
                    if listed(event, ensemble_events):
                        pending.append(as_decision(event))
                elif event.type == "token":
                    yield chunk(Delta(content=event.text),
                                ensemble=EnsembleDelta(source=event.source, position=event.position,
                                                       span=span, decisions=pending))
                    pending = []
                elif event.type == "finish":
                    yield chunk(Delta(), event.reason, EnsembleDelta(decisions=pending, stats=event.stats))
                    if include_usage:
                        usage = ChatCompletionChunk(id=completion_id, model=model, choices=[],
                                                    usage=Usage.from_stats(event.stats))
                        yield sse(usage.model_dump_json(exclude={"ensemble"}))
        except Exception as err:  # noqa: BLE001 - the status line is sent; report in-stream
            error = ErrorBody(error=ErrorDetail(message=f"generation failed: {err}", type="server_error"))
            yield sse(error.model_dump_json())
            return
    yield sse("[DONE]")


async def collect(events: AsyncIterator[Event], *, completion_id: str, model: str, method: str,
                  members: list[str], ensemble_events: Listing) -> ChatCompletion:
    """The whole completion at once (non-streamed requests)."""
    decisions: list[Decision] = []
    finish: FinishEvent | None = None
    async with aclosing(events):  # type: ignore[type-var]
        async for event in events:
            if isinstance(event, EnsembleEvent | AdaFuseEvent) and listed(event, ensemble_events):
                decisions.append(as_decision(event))
            elif event.type == "finish":
                finish = event
    if finish is None:  # pragma: no cover - the engine always ends with finish
        raise RuntimeError("the engine stream ended without a finish event")
    return ChatCompletion(
        id=completion_id, model=model,
        choices=[Choice(message=AssistantMessage(content=finish.text), finish_reason=finish_reason(finish.reason))],
        usage=Usage.from_stats(finish.stats),
        ensemble=EnsembleSummary(method=method, members=members, decisions=decisions, stats=finish.stats))
