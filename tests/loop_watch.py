"""How long the event loop froze while a block ran: the tests that check that blocking work (a load, a
member's close) stays off the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


@asynccontextmanager
async def loop_gaps(tick_s: float = 0.01) -> AsyncIterator[list[float]]:
    """Ticks every ``tick_s`` while the block runs and yields the gaps between ticks (their max is the
    longest freeze; [0.0] to start, so ``max`` works on a block shorter than one tick)."""
    gaps = [0.0]

    async def tick() -> None:
        last = time.monotonic()
        while True:
            await asyncio.sleep(tick_s)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    ticking = asyncio.create_task(tick())
    try:
        yield gaps
    finally:
        ticking.cancel()
