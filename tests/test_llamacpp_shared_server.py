"""One llama.cpp server at a URL shared by several clients (two engines, a second ``safe-ensemble
serve``, a benchmark): a member that did not start the server pins no slot, since every client's own
pool would lease the same lowest slot (two processes both pinned slot 0: llama.cpp queued one behind
the other and each evicted the other's prefix cache). The stand-in places an unpinned call as
llama.cpp does, in the idle slot whose cached prompt shares the longest prefix."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from shared_engine import EnsembleEngine
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from tests.fixture_server import LlamaCppLike, serve
from tests.test_llamacpp_slots import PROMPTS, TOKENS, _prompt_ids, _toy, toy_next_logprobs


class PlacingLlamaCppLike(LlamaCppLike):
    """``LlamaCppLike`` that also places a call sent without ``id_slot`` as llama.cpp does (the idle
    slot holding the longest common prefix, else the least recently used one) and records what each
    call sent (``sent_slot``) and each call of several prompts sent without a slot (``spread``:
    llama.cpp would run each prompt in another idle slot, each computing its prefix anew)."""

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.sent_slot: list[int | None] = []
        self.spread = 0
        self._held: dict[int, list[int]] = {s: [] for s in range(self.slots)}
        self._used = dict.fromkeys(range(self.slots), 0)
        self._running: set[int] = set()
        self._clock = 0
        self._placing = threading.Lock()

    def __call__(self, method: str, path: str, body: Any) -> tuple[int, bytes]:
        if (method, path) != ("POST", "/completion"):
            return super().__call__(method, path, body)
        prompts = body["prompt"] if isinstance(body["prompt"][0], list) else [body["prompt"]]
        with self._placing:
            self.sent_slot.append(body.get("id_slot"))
            slot = body.get("id_slot")
            if slot is None:
                self.spread += len(prompts) > 1
                idle = [s for s in range(self.slots) if s not in self._running]
                slot = max(idle, key=lambda s: (_common(self._held[s], prompts[0]), -self._used[s]))
                if not _common(self._held[slot], prompts[0]):
                    slot = min(idle, key=lambda s: self._used[s])
            self._running.add(slot)
        try:
            return super().__call__(method, path, {**body, "id_slot": slot})
        finally:
            with self._placing:
                self._running.discard(slot)
                self._clock += 1
                self._held[slot], self._used[slot] = prompts[-1], self._clock


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class OwnedServer:
    """Stands for the ``LocalLlamaServer`` of a member that started its server (``from_gguf``)."""

    def __init__(self, url: str, slots: int) -> None:
        self.url, self.slots = url, slots

    def close(self) -> None:
        pass


def _tokenizer() -> LocalTokenizer:
    hf = _toy()
    return LocalTokenizer(hf.tokenizer, hf.table.vocab_size, frozenset(hf.table.eos_ids), 512)


@contextmanager
def shared(slots: int, clients: int = 2, **options: Any) -> Iterator[tuple[list[LlamaCppMember], PlacingLlamaCppLike]]:
    """``clients`` members on one stand-in URL, each as another process would make it."""
    server = PlacingLlamaCppLike(toy_next_logprobs(_toy()), slots, delay_s=0.02)  # type: ignore[arg-type]
    with serve(server) as (url, _):
        members = [LlamaCppMember(f"client-{i}", url, _tokenizer(), check_tokenizer=False, **options)
                   for i in range(clients)]
        try:
            yield members, server
        finally:
            for member in members:
                member.close()


def test_two_clients_of_one_server_at_a_url_pin_no_slot_and_run_at_once() -> None:
    with shared(slots=4) as (members, server):
        engines = [EnsembleEngine([member], method="single") for member in members]
        alone = [engine.generate(p, max_new_tokens=TOKENS).text for engine, p in zip(engines, PROMPTS)]
        server.sent_slot.clear()
        server.max_in_flight = 0

        async def both() -> list[str]:
            results = await asyncio.gather(*(e.agenerate(p, max_new_tokens=TOKENS) for e, p in zip(engines, PROMPTS)))
            return [r.text for r in results]

        assert asyncio.run(both()) == alone
        assert server.collisions == 0 and server.max_in_flight >= 2  # never queued behind each other
        assert set(server.sent_slot) == {None}  # neither client pinned slot 0 (or any)
        assert all(m.slots.size == 0 and m.new_session().slot is None for m in members)


def test_a_block_from_an_unpinned_session_runs_in_the_slot_its_first_prompt_got() -> None:
    """A block of rows sent without a slot would be spread over the idle slots (each prompt
    computing its prefix anew): its first prompt goes alone, the others to the slot it ran in."""
    with shared(slots=3, clients=1) as ([member], server):
        other = _prompt_ids(member, PROMPTS[1])
        member.new_session().sync(other, len(other))  # another request's prefix in some slot
        ids = _prompt_ids(member, PROMPTS[0])
        session = member.new_session()
        session.sync(ids, len(ids))
        session.step(5)
        session.sync(ids + [5, 6, 7, 8], len(ids) + 2)  # a block of 3 rows: 1 call alone, then 2 rows
        assert server.prompts_and_cache_of_call[1:] == [(1, False), (1, True), (1, True), (2, True)]
        assert server.spread == 0 and server.sent_slot[:4] == [None] * 4
        assert server.sent_slot[4] == server.slot_of_call[3] == server.slot_of_call[1]  # the request's own slot


def test_a_member_pins_slots_on_a_server_it_started_or_when_told_to() -> None:
    with shared(slots=2, clients=1, pin_slots=True) as ([member], server):
        session = member.new_session()
        ids = _prompt_ids(member, PROMPTS[0])
        session.sync(ids + [5, 6], len(ids))
        assert member.slots.size == 2 and session.slot == 0 and server.sent_slot == [0, 0]
    with shared(slots=2, clients=1) as ([at_url], server):
        started = LlamaCppMember("started", at_url.url, _tokenizer(), context_window=512, check_tokenizer=False,
                                 server=OwnedServer(at_url.url, 2))  # type: ignore[arg-type]
        assert started.pin_slots and started.slots.size == 2 and started.new_session().slot == 0
        assert not at_url.pin_slots and at_url.slots.size == 0
        started.close()
