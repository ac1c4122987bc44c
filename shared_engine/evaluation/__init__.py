"""Evaluation harness: the papers' benchmarks, accuracy vs speed, resumable runs, comparison plots.

``datasets`` loads the published files, ``prompts`` renders them as chat messages, ``scoring`` and
``math_answers`` extract and score answers, ``benchmarks`` ties the three together per benchmark,
``runner`` runs an engine over one (JSONL per sample, summary.json), ``compare`` tabulates and plots runs.
The names load on first use (``shared_engine/lazy.py``): the scorers need no engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import exports, lazy_attributes

if TYPE_CHECKING:
    from .benchmarks import BENCHMARKS, Benchmark, get_benchmark
    from .prompts import PROMPT_VERSION
    from .runner import RunConfig, Sample, evaluate, summarize, wilson_interval

_EXPORTS = exports(benchmarks=("BENCHMARKS", "Benchmark", "get_benchmark"), prompts=("PROMPT_VERSION",),
                   runner=("RunConfig", "Sample", "evaluate", "summarize", "wilson_interval"))
__all__ = ["BENCHMARKS", "PROMPT_VERSION", "Benchmark", "RunConfig", "Sample", "evaluate", "get_benchmark",
           "summarize", "wilson_interval"]
__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)
