"""safe-ensemble's engine: several LLMs with different tokenizers answering as one.

Knows nothing of LangChain or LlamaIndex; the adapters in ``langchain_ensemble`` and
``llamaindex_ensemble`` wrap ``EnsembleEngine``.
"""

from .engine import EnsembleEngine, GenerationResult
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

__all__ = [
    "AdaFuseEvent", "CacheSyncEvent", "ContextLengthError", "DraftEvent", "EngineClosedError", "EngineOptions",
    "EnsembleEngine", "EnsembleError", "EnsembleEvent", "Event", "FinishEvent", "FormatRetryEvent", "GenerationParams",
    "GenerationResult", "InvalidRequestError", "MemberConfig", "MemberDefaults", "MemberError", "SpanCandidate",
    "Stats", "TokenEvent", "ToolCallEvent", "Usage", "VerifyEvent",
]
