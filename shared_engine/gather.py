"""Awaiting the members' concurrent jobs of one step.

``asyncio.gather`` raises the first failure at once and leaves the other jobs running. A member's job
runs in a thread on that member's session; with ``on_member_failure="degrade"`` the request goes on
without the failed member, and the next step would drive a surviving member's session while its job
of the failed step still runs (two threads on one KV cache). So every job is awaited first.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar, cast

T = TypeVar("T")


async def gather_all(*jobs: Awaitable[T]) -> list[T]:
    """The jobs' results in order, once every job has ended; then the first failure is raised."""
    results = await asyncio.gather(*jobs, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return cast("list[T]", results)
