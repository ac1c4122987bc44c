"""The small, bounded thread pool that a request's structured-output setup runs on.

Validating output options (jsonschema over every tool's parameter schema) and building a schema's
decoding constraint (its patterns' automata: 0.7-1.6 s for a pydantic model of 20 nested models)
run off the event loop. On the loop's default executor (``asyncio.to_thread``: 6 workers on a
2-core machine) a dozen such requests filled every worker, and a plain request's member loading and
prompt rendering queued behind them (its start delayed by seconds). Here they have their own two
workers: schema work waits for schema work only, and requests with no schemas skip the pool.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, ParamSpec, TypeVar

SCHEMA_WORKERS = 2
"""Schema jobs run at once: few, so that they cannot take the machine's cores from decoding."""
SCHEMA_THREAD_PREFIX = "safe-ensemble-schema"
"""The pool's thread names begin with this (a traceback or profiler names the work)."""

P = ParamSpec("P")
T = TypeVar("T")

_pool: ThreadPoolExecutor | None = None
_lock = threading.Lock()


def carries_schemas(tools: Any, response_format: Any) -> bool:
    """Whether a request's output options give schema work (tools to check, a format's constraint to
    build): such a request's setup runs on the schema pool; any other's is cheap, done where it is."""
    return bool(tools) or response_format is not None


def schema_executor() -> ThreadPoolExecutor:
    """The process's schema pool, made at its first use (an import starts no thread)."""
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(SCHEMA_WORKERS, thread_name_prefix=SCHEMA_THREAD_PREFIX)
        return _pool


async def run_schema_work(fn: Callable[P, T], /, *args: P.args, **kwargs: P.kwargs) -> T:
    """``asyncio.to_thread`` on the schema pool: ``fn`` runs in the caller's context (its context
    variables), and a caller cancelled meanwhile stops waiting (the job itself runs to its end)."""
    loop = asyncio.get_running_loop()
    call = functools.partial(contextvars.copy_context().run, fn, *args, **kwargs)
    return await loop.run_in_executor(schema_executor(), call)


def shutdown_schema_executor() -> None:
    """Stop the pool: queued jobs are dropped, running ones finish; a later job makes a new pool. Also run
    at exit, where concurrent.futures has already waited for the pool's jobs (as for the default executor's:
    a schema job is seconds at most)."""
    global _pool
    with _lock:
        pool, _pool = _pool, None
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)


def _forget_in_child() -> None:
    """A forked child has none of its parent's threads: the parent's pool would queue work forever."""
    global _pool, _lock
    _pool, _lock = None, threading.Lock()


atexit.register(shutdown_schema_executor)
os.register_at_fork(after_in_child=_forget_in_child)
