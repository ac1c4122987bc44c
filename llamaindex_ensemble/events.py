"""Ensemble decisions as LlamaIndex instrumentation events.

They go through ``llama_index.core.instrumentation`` (dispatcher ``llamaindex_ensemble``, a child
of the root dispatcher), carry the ``span_id`` of the LLM call that produced them (the same span as
that call's ``LLMChatStartEvent``/``LLMCompletionStartEvent``), and are sent while the answer
streams, so a handler sees each decision before the tokens that follow it:

    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llamaindex_ensemble import EnsembleDecisionEvent, EnsembleFinishEvent

    class PrintDecisions(BaseEventHandler):
        @classmethod
        def class_name(cls) -> str:
            return "PrintDecisions"

        def handle(self, event, **kwargs):
            if isinstance(event, EnsembleDecisionEvent):
                print(event.span_id, event.chosen, event.candidates[0].member_probs)

    get_dispatcher().add_event_handler(PrintDecisions())   # the root dispatcher sees every event
"""

from __future__ import annotations

from typing import Any

from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.events import BaseEvent
from pydantic import Field

from shared_engine.events import Candidate, SpanCandidate, Stats

dispatcher = get_dispatcher("llamaindex_ensemble")


class EnsembleDecisionEvent(BaseEvent):
    """Fusion ran at one position (the engine's ``ensemble`` event)."""

    model_name: str
    position: int = Field(description="Index in the answer (drafter tokens) of the fused token.")
    offset: int = Field(description="Byte offset in the answer where the fused token starts.")
    chosen: str = Field(description="The text fusion chose.")
    drafted: str | None = Field(None, description="What the drafter had proposed, if anything.")
    changed: bool = Field(description="The fused choice differs from the drafted token.")
    sharpened: bool
    candidates: list[Candidate] = Field(description="Top candidates: each member's probability and the fused one.")

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleDecisionEvent"


class EnsembleSpanEvent(BaseEvent):
    """An AdaFuse decision (the engine's ``adafuse`` event): a confident member's span, or a span
    the members voted on."""

    model_name: str
    position: int = Field(description="Index in the answer (drafter tokens) where the span starts.")
    offset: int = Field(description="Byte offset in the answer where the span starts.")
    fused: bool = Field(description="True: voted on by every member; False: the leader was sure.")
    leader: str
    member_uncertainty: dict[str, float]
    candidates: list[SpanCandidate]
    chosen: str

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleSpanEvent"


class EnsembleFinishEvent(BaseEvent):
    """The answer is complete: why it stopped and the ensemble statistics (the engine's ``finish``)."""

    model_name: str
    reason: str = Field(description="stop | length | eos | cancelled | error")
    stats: Stats

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleFinishEvent"


class EnsembleStepEvent(BaseEvent):
    """Lower-level engine events (``draft``, ``verify``, ``cache_sync``); only with ``step_events=True``."""

    model_name: str
    name: str
    data: dict[str, Any]

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleStepEvent"
