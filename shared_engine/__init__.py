"""safe-ensemble's engine: several LLMs with different tokenizers answering as one.

Knows nothing of LangChain or LlamaIndex; the adapters in ``langchain_ensemble`` and
``llamaindex_ensemble`` wrap ``EnsembleEngine``. The names below load on first use (``lazy.py``):
``from shared_engine import EnsembleEngine`` reads as ever, and the command line's ``--help`` does
not wait for torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import exports, lazy_attributes

if TYPE_CHECKING:
    from .engine import CheckedRequest, EnsembleEngine, GenerationResult
    from .errors import ContextLengthError, EngineClosedError, EnsembleError, InvalidRequestError, MemberError
    from .events import (
        AdaFuseEvent,
        CacheSyncEvent,
        DraftEvent,
        EnsembleEvent,
        Event,
        FinishEvent,
        FormatRetryEvent,
        SpanCandidate,
        Stats,
        TokenEvent,
        ToolCallEvent,
        Usage,
        VerifyEvent,
    )
    from .members import MemberConfig, MemberDefaults
    from .options import EngineOptions, GenerationParams

_EXPORTS = exports(
    engine=("CheckedRequest", "EnsembleEngine", "GenerationResult"),
    errors=("ContextLengthError", "EngineClosedError", "EnsembleError", "InvalidRequestError", "MemberError"),
    events=("AdaFuseEvent", "CacheSyncEvent", "DraftEvent", "EnsembleEvent", "Event", "FinishEvent",
            "FormatRetryEvent", "SpanCandidate", "Stats", "TokenEvent", "ToolCallEvent", "Usage", "VerifyEvent"),
    members=("MemberConfig", "MemberDefaults"),
    options=("EngineOptions", "GenerationParams"),
)
__all__ = [
    "AdaFuseEvent", "CacheSyncEvent", "CheckedRequest", "ContextLengthError", "DraftEvent", "EngineClosedError",
    "EngineOptions", "EnsembleEngine", "EnsembleError", "EnsembleEvent", "Event", "FinishEvent", "FormatRetryEvent",
    "GenerationParams", "GenerationResult", "InvalidRequestError", "MemberConfig", "MemberDefaults", "MemberError",
    "SpanCandidate", "Stats", "TokenEvent", "ToolCallEvent", "Usage", "VerifyEvent",
]
__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)
