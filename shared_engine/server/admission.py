"""Admission control: at most ``max_active`` generations at once, ``max_waiting`` more queued,
and an immediate "overloaded" answer beyond that (a client should retry later, not hang). Once
``close()``d (the server shutting down) it refuses new requests and the queued ones at once."""

from __future__ import annotations

import asyncio
from typing import Self

from pydantic import BaseModel

from ..errors import EngineClosedError


class Overloaded(Exception):
    """Every active slot and every queue place is taken."""


def shutting_down() -> EngineClosedError:
    return EngineClosedError("the server is shutting down")


class Load(BaseModel):
    active: int
    waiting: int
    max_active: int
    max_waiting: int


class Admission:
    def __init__(self, max_active: int, max_waiting: int) -> None:
        if max_active < 1 or max_waiting < 0:
            raise ValueError("max_active must be >= 1 and max_waiting >= 0")
        self.max_active, self.max_waiting = max_active, max_waiting
        self._slots = asyncio.Semaphore(max_active)
        self._admitted = 0  # active + waiting
        self._active = 0
        self._closed = False

    def close(self) -> None:
        """Shutting down: ``admit()`` and every queued ticket raise ``EngineClosedError``; the running
        requests keep their slots."""
        if not self._closed:
            self._closed = True
            if self._admitted > self._active:  # wake the first queued ticket; each one wakes the next
                self._slots.release()

    @property
    def closed(self) -> bool:
        """Shutting down (``close`` was called)."""
        return self._closed

    def load(self) -> Load:
        return Load(active=self._active, waiting=self._admitted - self._active,
                    max_active=self.max_active, max_waiting=self.max_waiting)

    def admit(self) -> Ticket:
        """A place in the queue, or ``Overloaded``; the ticket must be closed (``async with``
        or ``close()``) even if it never runs."""
        if self._closed:
            raise shutting_down()
        if self._admitted >= self.max_active + self.max_waiting:
            # every place is taken; not the live split: a request admitted a moment ago is about to
            # take its free slot, not waiting
            raise Overloaded(f"its {self.max_active} running and {self.max_waiting} waiting places are all "
                             "taken; retry later")
        self._admitted += 1
        return Ticket(self)


class Ticket:
    """One admitted request: ``async with ticket`` waits for a slot and holds it."""

    def __init__(self, admission: Admission) -> None:
        self._admission = admission
        self._running = False
        self._closed = False

    async def __aenter__(self) -> Self:
        if self._admission._closed:
            raise shutting_down()
        await self._admission._slots.acquire()
        if self._admission._closed:  # woken by close(), or a slot came free after it: pass it on
            self._admission._slots.release()
            raise shutting_down()
        self._running = True
        self._admission._active += 1
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Give the slot and the queue place back (idempotent)."""
        if self._closed:
            return
        self._closed = True
        if self._running:
            self._running = False
            self._admission._active -= 1
            self._admission._slots.release()
        self._admission._admitted -= 1
