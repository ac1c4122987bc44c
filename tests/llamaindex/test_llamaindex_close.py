"""EnsembleLLM lets go of its members: close(), aclose(), garbage collection, copies (tiny toy members, seconds)."""

from __future__ import annotations

import asyncio
import copy
import gc
import threading
import time
from collections.abc import Iterator

import pytest
from llama_index.core.base.llms.types import ChatMessage

from llamaindex_ensemble import EnsembleLLM
from shared_engine import EngineClosedError
from shared_engine.members import _HOLDERS
from tests.toy import registered_members, toy_member


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    """Two toy members under registry names, so each EnsembleLLM's engine holds them in the registry."""
    toys = [toy_member("toy-li-close-a", "byte_level"), toy_member("toy-li-close-b", "metaspace", seed=1)]
    with registered_members(toys) as registered:
        yield registered


def holders(names: list[str]) -> list[int]:
    return [_HOLDERS.get(f"transformers:{name}", 0) for name in names]


def test_dropped_llms_release_their_members(names: list[str]) -> None:
    """60 dropped EnsembleLLMs left 60 holds on each member before (loaded for good)."""
    before = holders(names)
    for _ in range(5):
        llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
        llm.complete("Hi")
        assert holders(names) == [n + 1 for n in before]
        del llm
        gc.collect()
    assert holders(names) == before


def test_close_releases_and_a_closed_llm_says_so(names: list[str]) -> None:
    before = holders(names)
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
    llm.complete("Hi")
    llm.close()
    assert holders(names) == before
    llm.close()  # twice is fine
    with pytest.raises(EngineClosedError, match="EnsembleLLM is closed"):
        llm.complete("Hi")
    with pytest.raises(EngineClosedError, match="EnsembleLLM is closed"):
        llm.stream_complete("Hi")


async def test_aclose_releases(names: list[str]) -> None:
    before = holders(names)
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
    await llm.acomplete("Hi")
    await llm.aclose()
    assert holders(names) == before
    await llm.aclose()
    with pytest.raises(EngineClosedError):
        await llm.acomplete("Hi")


def test_copies_hold_the_engine_until_the_last_goes(names: list[str]) -> None:
    before = holders(names)
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
    shallow, deep = llm.model_copy(), copy.deepcopy(llm)
    llm.complete("Hi")
    llm.close()
    assert shallow.complete("Hi").text == deep.complete("Hi").text  # still working
    del shallow
    gc.collect()
    assert holders(names) == [n + 1 for n in before]
    deep.close()
    assert holders(names) == before
    assert copy.copy(deep)._closed  # a copy of a closed LLM is closed


# A close while a call runs: the engine ends the request as ``cancelled``, which EnsembleLLM passed on as a
# whole answer ('1, 2, 3,' or '', raw["finish_reason"] 'stop', no error); now the call raises
# EngineClosedError (a stream after the deltas it gave).
CUT = "closed while this call ran; the partial answer is not an answer"
LONG = 400  # far more than a toy writes before the close reaches its next round


async def test_acomplete_closed_as_it_runs_raises(names: list[str]) -> None:
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=LONG)
    await llm.acomplete("Hi", max_tokens=1)  # members loaded
    call = asyncio.create_task(llm.acomplete("Sofia visited Berlin"))
    while not llm.engine.live_requests:
        await asyncio.sleep(0)
    await llm.aclose()
    with pytest.raises(EngineClosedError, match=CUT):
        await call


async def test_astream_chat_closed_mid_answer_raises_after_its_deltas(names: list[str]) -> None:
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=LONG)
    deltas: list[str] = []
    with pytest.raises(EngineClosedError, match=CUT):
        async for response in await llm.astream_chat([ChatMessage(role="user", content="Sofia visited Berlin")]):
            deltas.append(response.delta or "")
            if len(deltas) == 1:
                llm.close()
    assert deltas


@pytest.mark.parametrize("streamed", [False, True])
def test_complete_and_stream_complete_closed_from_another_thread_raise(names: list[str], streamed: bool) -> None:
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=LONG)
    llm.complete("Hi", max_tokens=1)
    engine, outcome = llm.engine, []

    def call() -> None:
        try:
            outcome.append([r.delta for r in llm.stream_complete("Sofia visited Berlin")] if streamed
                           else llm.complete("Sofia visited Berlin"))
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    worker = threading.Thread(target=call)
    worker.start()
    while not engine.live_requests and worker.is_alive():
        time.sleep(0.001)
    llm.close()
    worker.join(30)
    assert isinstance(outcome[0], EngineClosedError) and CUT in str(outcome[0]), outcome
