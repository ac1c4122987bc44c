"""``llama_index.llms.safe_ensemble``: the import path LlamaIndex users look for (a PEP 420 namespace
portion: neither ``llama_index/`` nor ``llama_index/llms/`` has an ``__init__.py``, so this merges
with llama-index-core's ``llama_index`` package). The code lives in ``llamaindex_ensemble``."""

from llamaindex_ensemble import (
    EnsembleDecisionEvent,
    EnsembleFinishEvent,
    EnsembleLLM,
    EnsembleSpanEvent,
    EnsembleStepEvent,
    __version__,
    to_engine_messages,
)

__all__ = [
    "EnsembleDecisionEvent", "EnsembleFinishEvent", "EnsembleLLM", "EnsembleSpanEvent", "EnsembleStepEvent",
    "__version__", "to_engine_messages",
]
