"""Server-sent events whose producer is cancelled the moment the client goes away.

Starlette's own ``StreamingResponse`` stops sending on a disconnect but does not promise to
*close* the body iterator, and under ASGI 2.4 it notices a disconnect only at the next send.
Here the disconnect is watched for during the whole response, the producer task is cancelled
(which interrupts an await inside the engine, so no further model work is scheduled), and the
body iterator is always closed, so the engine stream's ``finally`` blocks run at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import aclosing, suppress
from typing import Any, TypeVar

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

T = TypeVar("T")


class ClientGone(Exception):
    """The client disconnected before the work finished; the work was cancelled."""


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def cancel_on_disconnect(receive: Receive, work: Awaitable[T]) -> T:
    """Await ``work``; if the client disconnects first, cancel it and raise ``ClientGone``."""
    task = asyncio.ensure_future(work)
    watch = asyncio.ensure_future(_disconnected(receive))
    try:
        await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not task.done():
            task.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await task
    if task.cancelled():
        raise ClientGone()
    return task.result()


def sse(data: str) -> str:
    """One SSE message carrying a JSON (or ``[DONE]``) payload."""
    return f"data: {data}\n\n"


class EventStreamResponse(StreamingResponse):
    """``text/event-stream`` over an async iterator of SSE messages; see the module docstring."""

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[str], on_close: Callable[[], Any] | None = None) -> None:
        super().__init__(content, headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with aclosing(self.body_iterator):  # type: ignore[type-var]
                await cancel_on_disconnect(receive, self.stream_response(send))
        except (ClientGone, OSError):
            pass  # the client is gone: nothing left to send
        finally:
            if self._on_close is not None:
                self._on_close()
