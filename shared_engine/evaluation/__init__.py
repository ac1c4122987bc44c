"""Evaluation harness: the papers' benchmarks, accuracy vs speed, resumable runs, comparison plots.

``datasets`` loads the published files, ``prompts`` renders them as chat messages, ``scoring`` and
``math_answers`` extract and score answers, ``benchmarks`` ties the three together per benchmark,
``runner`` runs an engine over one (JSONL per sample, summary.json), ``compare`` tabulates and plots runs.
"""

from .benchmarks import BENCHMARKS, Benchmark, get_benchmark
from .prompts import PROMPT_VERSION
from .runner import RunConfig, Sample, evaluate, summarize, wilson_interval

__all__ = ["BENCHMARKS", "PROMPT_VERSION", "Benchmark", "RunConfig", "Sample", "evaluate", "get_benchmark",
           "summarize", "wilson_interval"]
