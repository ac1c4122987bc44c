"""A failed member's step is awaited whole: with ``on_member_failure="degrade"`` the request goes on
without the failed member, and a surviving member's session must not be driven by its job of the failed
step and the next step's job at once (``shared_engine/gather.py``). Toy members, seconds."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

from shared_engine import EnsembleEngine, MemberError
from shared_engine.gather import gather_all
from tests.toy import toy_member


class _ServerLike:
    """A toy member run as a remote one is: each job in a fresh thread, no lock of its own."""

    def __init__(self, inner: Any, name: str, fail_after: int | None = None, slow_s: float = 0.0) -> None:
        self._inner, self.name, self.fail_after, self.slow_s = inner, name, fail_after, slow_s
        self.calls = self.active = self.overlaps = 0
        self._lock = threading.Lock()

    def __getattr__(self, key: str) -> Any:
        return getattr(self._inner, key)

    def new_session(self) -> Any:
        return self._inner.new_session()

    async def run(self, fn: Any, *args: Any) -> Any:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise MemberError(self.name, "http://x", "server died")

        def job() -> Any:
            with self._lock:
                self.active += 1
                self.overlaps += self.active > 1
            try:
                time.sleep(self.slow_s)
                return fn(*args)
            finally:
                with self._lock:
                    self.active -= 1

        return await asyncio.to_thread(job)


def test_a_surviving_verifier_is_never_driven_by_two_jobs_at_once() -> None:
    drafter = toy_member("a", "byte_level", "llama", 0)
    failing = _ServerLike(toy_member("b", "metaspace", "gpt2", 1), "v1", fail_after=3)
    slow = _ServerLike(toy_member("c", "byte_level", "gpt2", 2), "v2", slow_s=0.3)
    engine = EnsembleEngine([drafter, failing, slow], method="safe", drafter=0, drafter_confidence=None,
                            on_member_failure="degrade", max_new_tokens=20)
    result = engine.generate("Hello Sofia", keep_events=True)
    assert list(result.events[-1].failed_members) == ["v1"] and result.stats.tokens > 0
    assert slow.overlaps == 0


def test_gather_all_waits_for_every_job_before_raising_the_first_failure() -> None:
    finished: list[str] = []

    async def fails() -> str:
        raise ValueError("first")

    async def slow() -> str:
        await asyncio.sleep(0.05)
        finished.append("slow")
        return "slow"

    async def main() -> None:
        try:
            await gather_all(fails(), slow())
        except ValueError as err:
            assert str(err) == "first" and finished == ["slow"]
        else:  # pragma: no cover
            raise AssertionError("the failure was not raised")
        assert await gather_all(slow(), slow()) == ["slow", "slow"]

    asyncio.run(main())
