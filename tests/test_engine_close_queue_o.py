"""A close while structured requests queue on the schema pool: the queued constraint builds are skipped (each
request ends cancelled before its first round), so aclose() does not wait for builds nobody uses."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest

import shared_engine.tools as tools_module
from shared_engine import EnsembleEngine
from shared_engine.offload import SCHEMA_WORKERS
from tests.toy import registered_members, toy_member

RESPONSE_FORMAT = {"type": "json_schema", "json_schema": {"name": "p", "schema": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


async def test_a_close_skips_the_constraint_builds_still_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    hold, builds = threading.Event(), []
    real = tools_module.start_state

    def held(*args: Any) -> Any:
        builds.append(threading.current_thread().name)
        hold.wait(10)
        return real(*args)

    monkeypatch.setattr(tools_module, "start_state", held)
    toys = [toy_member("toy-skip-a", "byte_level"), toy_member("toy-skip-b", "metaspace", seed=1)]
    with registered_members(toys) as names:
        engine = EnsembleEngine(names, method="safe", max_new_tokens=2)
        await engine.agenerate("warm")  # loaded: the requests below reach their builds at once
        tasks = [asyncio.create_task(engine.agenerate("Where?", response_format=RESPONSE_FORMAT))
                 for _ in range(SCHEMA_WORKERS + 4)]
        for _ in range(1000):  # until every schema worker is held
            if len(builds) >= SCHEMA_WORKERS:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.2)  # the others reach the pool's queue
        closing = asyncio.create_task(engine.aclose())
        await asyncio.sleep(0.05)
        hold.set()
        await closing
        results = await asyncio.gather(*tasks)
    assert [r.finish_reason for r in results] == ["cancelled"] * len(tasks)
    assert len(builds) == SCHEMA_WORKERS, builds  # the queued ones were not built after the close
