"""LlamaIndex adapter for safe-ensemble: ``EnsembleLLM`` plus the ensemble instrumentation events.

    from llama_index.llms.safe_ensemble import EnsembleLLM   # or: from llamaindex_ensemble import EnsembleLLM
    llm = EnsembleLLM(models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"], max_tokens=128)
"""

from importlib import metadata

try:
    import llama_index.core  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("llamaindex_ensemble needs llama-index-core: pip install -e '.[llamaindex]' in a clone") from err

from .base import EnsembleLLM, to_engine_messages
from .events import EnsembleDecisionEvent, EnsembleFinishEvent, EnsembleSpanEvent, EnsembleStepEvent

try:
    __version__ = metadata.version("safe-ensemble")
except metadata.PackageNotFoundError:  # pragma: no cover - running from a source tree
    __version__ = ""

__all__ = [
    "EnsembleDecisionEvent", "EnsembleFinishEvent", "EnsembleLLM", "EnsembleSpanEvent", "EnsembleStepEvent",
    "__version__", "to_engine_messages",
]
