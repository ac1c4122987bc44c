"""Engine events -> OpenAI chat completions (one streamed chunk per committed text delta, or one
completion object), with the ensemble's decisions riding along in the ``ensemble`` extension.

Which engine events become decisions: every ``ensemble`` event (a token fusion) and every voted
AdaFuse span (``adafuse`` with ``fused=True``). AdaFuse's confident spans, where the leader wrote
on without a vote, are listed only when the request asks for ``"ensemble_events": "all"``;
otherwise they show only in the stats (``spans - fused_spans``) and in the chunks' ``span``."""

from __future__ import annotations

import time
from bisect import bisect_right
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Literal

from ..errors import EngineClosedError, EnsembleError
from ..events import AdaFuseEvent, EnsembleEvent, Event, FinishEvent, TokenEvent, ToolCallEvent, Usage
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
    TextChoice,
    TextCompletion,
    ToolCallDelta,
    ToolCallOut,
    as_decision,
)
from .sse import sse


class MemberUnavailable(EnsembleError, RuntimeError):
    """A member's failure as a client may read it: the member's name and the reason, not the backend's
    URL (an internal address). Raised in the MemberError's place once it is logged, with the URL."""


Listing = bool | Literal["all"]

CUT_SHORT = "the server shut down before the answer was finished"
"""The engine ends a request as ``cancelled`` only when it is closed: the server shutting down."""


def unreadable_call_text(call: ToolCallEvent) -> str:
    """A call the engine could not read goes back as the text the members wrote (OpenAI's
    ``tool_calls`` has no place for it): with the tags they wrote (``ToolCallEvent.tags``), no
    others; a close tag added to a call the length cap cut read as if the members had closed it."""
    opened = "" if call.tags == "none" else "<tool_call>\n"
    return f"{opened}{call.raw}\n</tool_call>" if call.tags == "both" else f"{opened}{call.raw}"


def listed(event: EnsembleEvent | AdaFuseEvent, listing: Listing) -> bool:
    """Whether ``event`` is a decision the client asked to see (see the module docstring)."""
    if isinstance(event, AdaFuseEvent):
        return bool(listing) and (event.fused or listing == "all")
    return bool(listing)


def span_of(spans: list[int], position: int) -> int | None:
    """The AdaFuse span (its start, of ``spans`` in order) holding the token at ``position``: text
    held back as a possible stop's start comes after a later span's decision, yet is its own span's."""
    index = bisect_right(spans, position)
    return spans[index - 1] if index else None


def text_positions(token: TokenEvent, sent: int | None, fusions: list[int], span: int | None) -> list[int]:
    """``EnsembleDelta.positions`` of a text chunk: the tokens after the last one sent (``sent``) up
    to this one wrote no text of their own, so they hold the first bytes of a character this text
    completes (their fusions would link to nothing otherwise); and text that a fused choice wrote as
    several drafter tokens (source ``ensemble`` outside an AdaFuse span) comes from the last fusion
    at or before it, the only one whose decision exists (its later tokens were not fused)."""
    first = token.position if sent is None or sent >= token.position else sent + 1
    positions = set(range(first, token.position + 1))
    fusion = span_of(fusions, token.position) if token.source == "ensemble" and span is None else None
    if fusion is not None:
        positions.add(fusion)
    return sorted(positions)


Shape = Literal["chat", "text"]
"""``chat``: chat completion chunks/objects; ``text``: legacy ``text_completion`` ones (no tool calls:
a raw prompt takes no tools)."""


async def stream_chunks(events: AsyncIterator[Event], *, completion_id: str, model: str,
                        include_usage: bool, ensemble_events: Listing, shape: Shape = "chat",
                        echo: str = "") -> AsyncIterator[str]:
    """SSE messages for a streamed completion, ending with ``data: [DONE]``. ``echo`` (text shape):
    the prompt, sent first.

    Closing this iterator closes ``events`` (and so the engine stream under it)."""

    created = int(time.time())  # one value for the whole response, as OpenAI sends it

    def chunk(delta: Delta, finish: FinishEvent | None = None, ensemble: EnsembleDelta | None = None) -> str:
        # ensemble_events only decides which decisions are listed (``pending``); the extension's
        # source/position and the final chunk's stats, format_error and failed_members always come.
        reason = finish.openai_finish_reason if finish else None
        body: ChatCompletionChunk | TextCompletion
        if shape == "text":
            body = TextCompletion(id=completion_id, created=created, model=model, ensemble=ensemble,
                                  choices=[TextChoice(text=delta.content or "", finish_reason=reason)])
        else:
            body = ChatCompletionChunk(id=completion_id, created=created, model=model, ensemble=ensemble,
                                       choices=[ChunkChoice(delta=delta, finish_reason=reason)])
        return sse(body.model_dump_json(exclude={"ensemble"} if body.ensemble is None else None))

    def usage_chunk(usage: Usage) -> str:
        body = TextCompletion(id=completion_id, created=created, model=model, choices=[], usage=usage) \
            if shape == "text" else ChatCompletionChunk(id=completion_id, created=created, model=model,
                                                         choices=[], usage=usage)
        return sse(body.model_dump_json(exclude={"ensemble"}))

    pending: list[Decision] = []
    spans: list[int] = []  # AdaFuse: the positions where the spans so far start
    fusions: list[int] = []  # the positions of the token fusions so far, in order
    sent: int | None = -1  # the last position a text chunk named (None: unknown, after a tool call)
    calls_sent = 0  # tool_calls[].index of the next valid call (unreadable ones go out as text)
    async with aclosing(events):  # type: ignore[type-var]
        if shape == "chat":
            yield chunk(Delta(role="assistant", content=""))
        elif echo:
            yield chunk(Delta(content=echo))
        try:
            async for event in events:
                if isinstance(event, AdaFuseEvent):
                    spans.append(event.position)
                elif isinstance(event, EnsembleEvent):
                    fusions.append(event.position)
                if isinstance(event, EnsembleEvent | AdaFuseEvent):
                    if listed(event, ensemble_events):
                        pending.append(as_decision(event))
                elif event.type == "token" and event.source == "prefix":  # the prefill ("{" of a JSON answer):
                    # no answer position of its own, so no decision about position 0 is matched to it
                    yield chunk(Delta(content=event.text), ensemble=EnsembleDelta(source="prefix", positions=[]))
                elif event.type == "token":
                    span = span_of(spans, event.position)
                    yield chunk(Delta(content=event.text),
                                ensemble=EnsembleDelta(source=event.source, position=event.position, span=span,
                                                       positions=text_positions(event, sent, fusions, span),
                                                       decisions=pending))
                    pending = []
                    sent = max(event.position, sent) if sent is not None else event.position
                elif event.type == "format_retry":  # a new answer: its positions start again, and what is
                    # still pending is the rejected one's (the engine holds an attempt's decisions back with
                    # its text: none come, but a decision about another answer's position is never listed)
                    pending, spans, fusions, sent = [], [], [], -1
                elif isinstance(event, ToolCallEvent):
                    sent = None  # the call's tokens sent no text: the next text holds none of theirs
                    if event.error is None:  # numbered as the answer's list numbers them: the valid calls only
                        call = ToolCallDelta(index=calls_sent, **ToolCallOut.from_event(event).model_dump())
                        calls_sent += 1
                        yield chunk(Delta(tool_calls=[call]))
                    else:  # unreadable: the client sees what the members wrote, as text
                        yield chunk(Delta(content=unreadable_call_text(event)))
                elif event.type == "finish":
                    yield chunk(Delta(), event, EnsembleDelta(decisions=pending, stats=event.stats,
                                                              format_error=event.format_error,
                                                              stop_string=event.stop_string,
                                                              failed_members=event.failed_members))
                    if include_usage:
                        yield usage_chunk(event.usage)
                    if event.reason == "cancelled":  # not a whole answer, though OpenAI's reason says "stop"
                        cut = ErrorDetail(message=CUT_SHORT, type="server_error", code="server_shutting_down")
                        yield sse(ErrorBody(error=cut).model_dump_json())
        except Exception as err:  # noqa: BLE001 - the status line is sent; report in-stream
            code = "member_unavailable" if isinstance(err, MemberUnavailable) else None  # as its 502 says
            error = ErrorBody(error=ErrorDetail(message=f"generation failed: {err}", type="server_error", code=code))
            yield sse(error.model_dump_json())
            return
    yield sse("[DONE]")


async def _gather(events: AsyncIterator[Event], ensemble_events: Listing) -> tuple[FinishEvent, str, list[Decision]]:
    """A whole answer: its finish event, its text and the decisions listed."""
    decisions: list[Decision] = []
    finish: FinishEvent | None = None
    content: list[str] = []  # in the order the stream sends it: an unreadable call's text where it stood
    async with aclosing(events):  # type: ignore[type-var]
        async for event in events:
            if isinstance(event, EnsembleEvent | AdaFuseEvent) and listed(event, ensemble_events):
                decisions.append(as_decision(event))
            elif event.type == "token":
                content.append(event.text)
            elif isinstance(event, ToolCallEvent) and event.error is not None:
                content.append(unreadable_call_text(event))
            elif event.type == "format_retry":  # a new answer: decisions about the rejected one are not its
                decisions = []
            elif event.type == "finish":
                finish = event
    if finish is None:  # pragma: no cover - the engine always ends with finish
        raise RuntimeError("the engine stream ended without a finish event")
    if finish.reason == "cancelled":
        raise EngineClosedError(CUT_SHORT)
    return finish, "".join(content), decisions


def _summary(finish: FinishEvent, decisions: list[Decision], method: str, members: list[str]) -> EnsembleSummary:
    return EnsembleSummary(method=method, members=members, decisions=decisions, stats=finish.stats,
                           format_error=finish.format_error, stop_string=finish.stop_string,
                           failed_members=finish.failed_members)


async def collect(events: AsyncIterator[Event], *, completion_id: str, model: str, method: str,
                  members: list[str], ensemble_events: Listing) -> ChatCompletion:
    """The whole completion at once (non-streamed requests)."""
    finish, text, decisions = await _gather(events, ensemble_events)
    calls = [ToolCallOut.from_event(c) for c in finish.tool_calls if c.error is None]
    message = AssistantMessage(content=text or (None if calls else ""), tool_calls=calls or None)
    return ChatCompletion(
        id=completion_id, model=model,
        choices=[Choice(message=message, finish_reason=finish.openai_finish_reason)],
        usage=finish.usage, ensemble=_summary(finish, decisions, method, members))


async def collect_text(answers: Sequence[AsyncIterator[Event]], *, completion_id: str, model: str, method: str,
                       members: list[str], ensemble_events: Listing, echoes: Sequence[str]) -> TextCompletion:
    """A legacy completion: one choice per prompt (``answers`` run one after another), each with its
    ``ensemble`` summary; the usage is their sum. ``echoes``: each choice's text starts with it."""
    choices: list[TextChoice] = []
    usages: list[Usage] = []
    for index, (events, echo) in enumerate(zip(answers, echoes, strict=True)):
        finish, text, decisions = await _gather(events, ensemble_events)
        choices.append(TextChoice(index=index, text=echo + text, finish_reason=finish.openai_finish_reason,
                                  ensemble=_summary(finish, decisions, method, members)))
        usages.append(finish.usage)
    usage = Usage(prompt_tokens=sum(u.prompt_tokens for u in usages),
                  completion_tokens=sum(u.completion_tokens for u in usages),
                  total_tokens=sum(u.total_tokens for u in usages))
    return TextCompletion(id=completion_id, model=model, choices=choices, usage=usage)
