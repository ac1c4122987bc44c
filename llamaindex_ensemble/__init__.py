"""LlamaIndex adapter for safe-ensemble: ``EnsembleLLM`` plus the ensemble instrumentation events.

    from llamaindex_ensemble import EnsembleLLM
    llm = EnsembleLLM(models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"], max_tokens=128)
"""

try:
    import llama_index.core  # noqa: F401
except ImportError as err:  # pragma: no cover - depends on the install
    raise ImportError("llamaindex_ensemble needs llama-index-core: pip install 'safe-ensemble[llamaindex]'") from err

from .base import EnsembleLLM, to_engine_messages
from .events import EnsembleDecisionEvent, EnsembleFinishEvent, EnsembleSpanEvent, EnsembleStepEvent
from .tools import parse_tool_calls, tools_system_prompt

__all__ = [
    "EnsembleDecisionEvent", "EnsembleFinishEvent", "EnsembleLLM", "EnsembleSpanEvent", "EnsembleStepEvent",
    "parse_tool_calls",
    "to_engine_messages", "tools_system_prompt",
]
