"""``llm.close()`` while one of the model's calls runs: the engine ends the request as ``cancelled``, which
ChatEnsemble passed on as a whole answer ('1, 2, 3,', finish_reason 'stop', no error) on every path; now
the call raises ``EngineClosedError`` (a stream after the chunks it gave), as ChatOpenAI raises when its
client is closed mid-request. Toy members (seconds)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackHandler, BaseCallbackHandler
from langchain_core.messages import AIMessageChunk

from langchain_ensemble import ChatEnsemble
from shared_engine import EngineClosedError
from tests.toy import registered_members, toy_member

PROMPT = "Sofia visited Berlin"
MAX_TOKENS = 400  # far more than a toy writes before the close reaches its next round
CUT = "closed while this call ran; the partial answer is not an answer"


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    toys = [toy_member("toy-lc-midclose-a", "byte_level"), toy_member("toy-lc-midclose-b", "metaspace", seed=1)]
    with registered_members(toys) as registered:
        yield registered


def model(names: list[str]) -> ChatEnsemble:
    return ChatEnsemble(models=names, method="every-token", max_tokens=MAX_TOKENS)


class CloseOnFirstToken(BaseCallbackHandler):
    """Closes the model at its first token: a close that lands while ``invoke`` runs."""

    def __init__(self, llm: ChatEnsemble) -> None:
        self.llm = llm

    def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.llm.close()


class FirstToken(AsyncCallbackHandler):
    def __init__(self) -> None:
        self.seen = asyncio.Event()

    async def on_llm_new_token(self, token: str, **kwargs: Any) -> None:
        self.seen.set()


def test_invoke_closed_mid_answer_raises(names: list[str]) -> None:
    llm = model(names)
    with pytest.raises(EngineClosedError, match=CUT):
        llm.invoke(PROMPT, config={"callbacks": [CloseOnFirstToken(llm)]})


async def test_ainvoke_closed_mid_answer_raises(names: list[str]) -> None:
    """The reported case: a task's ``ainvoke`` and a ``close()`` meanwhile gave a cut answer."""
    llm = model(names)
    first = FirstToken()
    call = asyncio.create_task(llm.ainvoke(PROMPT, config={"callbacks": [first]}))
    await asyncio.wait_for(first.seen.wait(), 30)
    llm.close()
    with pytest.raises(EngineClosedError, match=CUT):
        await call


async def test_ainvoke_closed_as_it_starts_raises(names: list[str]) -> None:
    """A close before the first token gave an empty answer with finish_reason 'stop'."""
    llm = model(names)
    await llm.ainvoke(PROMPT, max_tokens=1)  # members loaded
    engine = llm._engine()
    call = asyncio.create_task(llm.ainvoke(PROMPT))
    while not engine.live_requests:
        await asyncio.sleep(0)
    llm.close()
    with pytest.raises(EngineClosedError, match=CUT):
        await call


async def test_astream_closed_mid_answer_raises_after_its_chunks(names: list[str]) -> None:
    llm = model(names)
    chunks: list[AIMessageChunk] = []
    with pytest.raises(EngineClosedError, match=CUT):
        async for chunk in llm.astream(PROMPT):
            chunks.append(chunk)
            if len(chunks) == 1:
                llm.close()
    assert chunks and not any(c.response_metadata for c in chunks)  # no final chunk: it would claim a finish


def test_stream_in_a_thread_closed_from_another_raises(names: list[str]) -> None:
    llm = model(names)
    started, closed = threading.Event(), threading.Event()
    outcome: list[object] = []

    def consume() -> None:
        try:
            for chunk in llm.stream(PROMPT):
                started.set()
                closed.wait(30)
                outcome.append(chunk)
        except Exception as exc:  # noqa: BLE001 - checked below
            outcome.append(exc)

    worker = threading.Thread(target=consume)
    worker.start()
    assert started.wait(30)
    llm.close()
    closed.set()
    worker.join(30)
    assert isinstance(outcome[-1], EngineClosedError) and CUT in str(outcome[-1])


async def test_a_closed_model_whose_engine_another_holds_finishes_its_call(names: list[str]) -> None:
    """Models of one configuration share an engine: closing one leaves the engine running for the other,
    so the closed model's running call finishes its answer (as README says); new calls are refused."""
    llm, other = model(names), model(names)
    chunks: list[AIMessageChunk] = []
    async for chunk in llm.astream(PROMPT, max_tokens=8):
        chunks.append(chunk)
        if len(chunks) == 1:
            llm.close()
    assert chunks[-1].response_metadata["engine_finish_reason"] != "cancelled"
    with pytest.raises(EngineClosedError, match="ChatEnsemble is closed"):
        await llm.ainvoke(PROMPT)
    assert (await other.ainvoke(PROMPT, max_tokens=2)).response_metadata["engine_finish_reason"] == "length"
    other.close()
