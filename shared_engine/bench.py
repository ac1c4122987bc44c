"""``safe-ensemble bench``: drafter alone, SAFE and every-token on the same prompts, one process.

Speed is reported as ratios measured in one run (the machine is shared and noisy). Every method
uses the same members, the same cache machinery and the same prompts; a warm-up request runs
first so one-time costs (token tables, the first forward) are not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .engine import EnsembleEngine
from .errors import InvalidRequestError

COT_INSTRUCTION = "Solve the problem step by step, then give the final number after '####'."


def default_data_dir() -> Path:
    """Benchmark data: $SAFE_ENSEMBLE_DATA, else ../shared/data beside the repository."""
    env = os.environ.get("SAFE_ENSEMBLE_DATA")
    candidates = [Path(env)] if env else []
    candidates += [Path.cwd().parent / "shared" / "data", Path(__file__).resolve().parents[2] / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path
    raise InvalidRequestError("benchmark data not found: set SAFE_ENSEMBLE_DATA or pass --data")


def gsm8k_questions(path: str | None, limit: int) -> list[str]:
    file = Path(path) if path else default_data_dir() / "gsm8k" / "test.jsonl"
    with file.open() as f:
        rows = [json.loads(line) for _, line in zip(range(limit), f)]
    return [f"{row['question']}\n{COT_INSTRUCTION}" for row in rows]


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """One backend: the results as before. Several (``--backend transformers,llamacpp``): each
    backend's results under ``backends`` plus ``<method>_<backend>_vs_<first backend>`` ratios."""
    backends = list(getattr(args, "backend", None) or ["transformers"])
    if isinstance(backends, str):
        backends = [backends]
    if len(backends) == 1:
        return _run_backend(args, backends[0])
    by_backend = {b: _run_backend(args, b) for b in backends}
    results: dict[str, Any] = {"backends": by_backend, "note": "measured in one process, one after the other"}
    base = backends[0]
    for other in backends[1:]:
        for method, row in by_backend[other]["methods"].items():
            reference = by_backend[base]["methods"].get(method, {}).get("tokens_per_s")
            if reference:
                key = f"{method.replace('-', '_')}_{other}_vs_{base}"
                results[key] = round(row["tokens_per_s"] / reference, 3)
    return results


def _run_backend(args: argparse.Namespace, backend: str) -> dict[str, Any]:
    prompts = gsm8k_questions(args.data, args.prompts)
    methods = [m.strip() for m in args.methods.split(",") if m.strip()]
    results: dict[str, Any] = {"models": args.models, "backend": backend, "prompts": len(prompts),
                               "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
                               "fusion": args.fusion, "sharpen": args.sharpen,
                               "drafter_confidence": args.drafter_confidence, "methods": {}}
    for method in methods:
        from .cli import _engine  # one place builds engines from CLI arguments

        engine = _engine(args, method, backend)
        engine.generate("Say hi.", max_new_tokens=4)  # warm-up: loads members, builds token tables
        tokens = elapsed = ensembled = spans = fused_spans = 0.0
        forwards: dict[str, int] = {}
        for prompt in tqdm(prompts, desc=method, file=sys.stderr):
            stats = engine.generate(prompt).stats
            tokens += stats.tokens
            elapsed += stats.elapsed_s
            ensembled += stats.ensembled_tokens
            spans += stats.spans
            fused_spans += stats.fused_spans
            for name, count in stats.forward_passes.items():
                forwards[name] = forwards.get(name, 0) + count
        results["methods"][method] = {
            "tokens": int(tokens), "elapsed_s": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 3) if elapsed else 0.0,
            "ensemble_rate": round(ensembled / tokens, 4) if tokens else 0.0,
            "forward_passes": forwards,
            "fusion": engine.options.fusion, "sharpen": engine.options.sharpen,  # each method's own defaults
            **({"fused_span_rate": round(fused_spans / spans, 4)} if spans else {}),
            "forward_passes_per_token": {k: round(v / tokens, 3) for k, v in forwards.items()} if tokens else {},
        }
    by_method = results["methods"]
    for method, key in (("single", "single"), ("safe", "safe"), ("every-token", "every_token"),
                        ("adafuse", "adafuse")):
        if method in by_method:
            results[f"{key}_tokens_per_s"] = by_method[method]["tokens_per_s"]
    if "safe" in by_method:
        results["safe_ensemble_rate"] = by_method["safe"]["ensemble_rate"]
        if "single" in by_method and by_method["single"]["tokens_per_s"]:
            results["safe_vs_single"] = round(by_method["safe"]["tokens_per_s"] / by_method["single"]["tokens_per_s"], 3)
        if "every-token" in by_method and by_method["every-token"]["tokens_per_s"]:
            results["safe_vs_every_token"] = round(
                by_method["safe"]["tokens_per_s"] / by_method["every-token"]["tokens_per_s"], 3)
    if "adafuse" in by_method:
        results["adafuse_fused_span_rate"] = by_method["adafuse"].get("fused_span_rate", 0.0)
        if "single" in by_method and by_method["single"]["tokens_per_s"]:
            results["adafuse_vs_single"] = round(
                by_method["adafuse"]["tokens_per_s"] / by_method["single"]["tokens_per_s"], 3)
    results["forward_passes_per_token"] = {m: r["forward_passes_per_token"] for m, r in by_method.items()}
    return results
