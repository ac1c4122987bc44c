"""Sync callers of the async engine: ``run_sync`` (a coroutine's result) and ``iterate_sync`` (an async
stream's items), both safe inside a running event loop (they run the loop on a helper thread there).

``engine.generate``/``engine.stream`` and the LangChain/LlamaIndex adapters' sync calls go through them;
their own module, so that the engine's module holds the engine.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Coroutine, Generator
from typing import Any, TypeVar

T = TypeVar("T")


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine to completion from sync code, also when a loop is already running here."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    result: list[T] = []
    error: list[BaseException] = []

    def target() -> None:
        try:
            result.append(asyncio.run(coro))
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(exc)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join()
    if error:
        raise error[0]
    return result[0]


_DONE = object()


def iterate_sync(agen: AsyncIterator[T]) -> Generator[T, None, None]:
    """Drive an async iterator on a helper thread and hand its items over one by one.

    Closing the iterator early (``close()``, a ``break``, garbage collection, a KeyboardInterrupt in the
    consumer) cancels the pump's task, so the stream stops at the await it is in: waiting for its next
    item instead kept the engine calling members whose answers nobody read, and ``close()`` blocked until
    then (seconds against a slow server). The stream's own ``finally`` still runs (``aclose``), so the
    engine releases its sessions and admission before ``close()`` returns."""
    items: queue.Queue[Any] = queue.Queue(maxsize=64)
    stop = threading.Event()
    running: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = []

    async def pump() -> None:
        task = asyncio.current_task()
        assert task is not None
        running.append((asyncio.get_running_loop(), task))
        try:
            if stop.is_set():  # closed before the pump started: the consumer's cancel may have missed it
                return
            async for item in agen:
                if stop.is_set():  # closed: a burst of items with no await between them (one step's
                    break  # tokens) would wait for a reader gone, and the cancel lands only at an await
                items.put(item)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            if not (isinstance(exc, asyncio.CancelledError) and stop.is_set()):  # not the consumer's own cancel
                items.put(exc)
        finally:
            await _aclose(agen)
            items.put(_DONE)

    thread = threading.Thread(target=lambda: asyncio.run(pump()), daemon=True)
    thread.start()
    try:
        while (item := items.get()) is not _DONE:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()  # before reading ``running``: the pump appends, then reads ``stop``
        if running:
            _cancel_soon(*running[0])
        if threading.current_thread() is thread:  # collected by the gc on the pump's own thread: waiting for
            _drain(items)  # it would wait for itself forever; the cancel lands when this step yields (room
        else:  # left in the queue for the item and the _DONE it may still put)
            while thread.is_alive():  # let the stream's finally run (its items are dropped)
                try:
                    items.get(timeout=0.05)
                except queue.Empty:
                    pass


def _drain(items: queue.Queue[Any]) -> None:
    while True:
        try:
            items.get_nowait()
        except queue.Empty:
            return


def _cancel_soon(loop: asyncio.AbstractEventLoop, task: asyncio.Task[None]) -> None:
    """Cancel ``task`` from another thread; a loop already closed has nothing left to cancel."""
    try:
        loop.call_soon_threadsafe(task.cancel)
    except RuntimeError:
        pass


async def _aclose(agen: AsyncIterator[Any]) -> None:
    """Run the iterator's ``finally`` where it has one to run (an async generator left mid-way)."""
    aclose = getattr(agen, "aclose", None)
    if aclose is not None:
        await aclose()
