"""Fixtures for the LlamaIndex adapter tests: event capture, a scripted engine, toy and real LLMs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

import pytest
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from pydantic import Field

from cookbooks.llamaindex_rag import minilm_embedding
from llamaindex_ensemble import EnsembleLLM
from shared_engine.events import Candidate, EnsembleEvent, FinishEvent, Stats, TokenEvent
from shared_engine.tools import OutputOptions, OutputPlan

QWEN, SMOL = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
REAL_PAIR = [QWEN, SMOL]


class EventCollector(BaseEventHandler):
    """Records every instrumentation event (attached to the root dispatcher)."""

    events: list[BaseEvent] = Field(default_factory=list)

    @classmethod
    def class_name(cls) -> str:
        return "EventCollector"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        self.events.append(event)

    def named(self, *names: str) -> list[BaseEvent]:
        return [e for e in self.events if e.class_name() in names]


@pytest.fixture
def collector() -> Iterator[EventCollector]:
    root = get_dispatcher()
    handler = EventCollector()
    root.add_event_handler(handler)
    try:
        yield handler
    finally:
        root.event_handlers.remove(handler)


class ScriptedEngine:
    """Stands in for ``EnsembleEngine``: replays scripted answers as engine events, one per call.

    Each answer is split into the given pieces; an ensemble decision is emitted before the
    second piece, so instrumentation and stats can be checked without any model. Tool and format
    options go through the engine's own answer shaping (``shared_engine.tools``), as in the engine.
    """

    def __init__(self, answers: Sequence[Sequence[str]]) -> None:
        self.answers = [list(a) for a in answers]
        self.requests: list[tuple[list[dict[str, str]], dict[str, Any]]] = []

    async def astream(self, messages: Any, **params: Any) -> AsyncIterator[Any]:
        output = {k: params[k] for k in OutputOptions.model_fields if k in params}
        shaper = OutputPlan(OutputOptions(**output)).shaper()  # raises on bad options, as the engine does
        self.requests.append((list(messages), params))
        async for event in self._raw():
            for shaped in shaper.on_event(event):
                if shaped.type == "finish":
                    for held in shaper.release():
                        yield held
                yield shaped

    async def _raw(self) -> AsyncIterator[Any]:
        pieces = self.answers[min(len(self.requests), len(self.answers)) - 1]
        for i, piece in enumerate(pieces):
            if i == 1:
                yield EnsembleEvent(position=i, offset=len("".join(pieces[:i]).encode()), sharpened=False,
                                    candidates=[Candidate(text=piece, member_probs={"a": 0.6, "b": 0.2}, fused=0.4)],
                                    chosen=piece, drafted=piece, changed=False)
            await asyncio.sleep(0)
            yield TokenEvent(text=piece, source="ensemble" if i == 1 else "draft", position=i)
        text = "".join(pieces)
        stats = Stats(prompt_tokens=7, tokens=len(pieces), ensembled_tokens=int(len(pieces) > 1),
                      accepted_tokens=len(pieces), ensemble_rate=float(len(pieces) > 1) / max(len(pieces), 1))
        yield FinishEvent(reason="eos", text=text, stats=stats)


def scripted_llm(*answers: Sequence[str], **kwargs: Any) -> tuple[EnsembleLLM, ScriptedEngine]:
    """An ``EnsembleLLM`` whose engine is a ``ScriptedEngine`` (no model is ever loaded)."""
    llm = EnsembleLLM(models=["drafter", "verifier"], context_window=4096, **kwargs)
    engine = ScriptedEngine(answers)
    llm._engine = engine  # type: ignore[assignment]
    return llm, engine


@pytest.fixture(scope="session")
def toy_members() -> list[Any]:
    """Two tiny random models with different tokenizers (ChatML byte-level BPE, SentencePiece)."""
    from tests.toy import toy_member

    return [toy_member("toy-bpe", "byte_level", "llama", 0), toy_member("toy-sp", "metaspace", "llama", 1)]


@pytest.fixture(scope="session")
def real_llm() -> EnsembleLLM:
    """Qwen2.5-Coder-0.5B drafts, SmolLM2-135M verifies; short answers keep the suite fast."""
    llm = EnsembleLLM(models=REAL_PAIR, method="safe", max_tokens=24)
    _ = llm.metadata  # load both members once, outside any timed test body
    return llm


@pytest.fixture(scope="session")
def minilm() -> Any:  # the cookbook's embedding model, one copy
    return minilm_embedding()
