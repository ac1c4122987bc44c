"""``safe-ensemble bench``: drafter alone, SAFE and every-token on the same prompts, one process.

Speed is reported as ratios measured in one run (the machine is shared and noisy). Every method
uses the same members, the same cache machinery and the same prompts; a warm-up request runs
first so one-time costs (token tables, the first forward) are not counted.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import sys
from typing import Any

from tqdm import tqdm

from .data_paths import gsm8k_file
from .decoding.report import mean_draft_length
from .engine_args import add_engine_args, engine_from_args, method_default_flags
from .members import LOCAL_BACKENDS
from .options import EngineOptions

COT_INSTRUCTION = "Solve the problem step by step, then give the final number after '####'."


def gsm8k_questions(path: str | None, limit: int) -> list[str]:
    """The first ``limit`` GSM8K questions: from ``path``, the full data, or the packaged sample."""
    file = gsm8k_file(path)
    with file.open() as f:
        rows = [json.loads(line) for _, line in zip(range(limit), f)]
    return [f"{row['question']}\n{COT_INSTRUCTION}" for row in rows]


def _backends(value: str) -> list[str]:
    backends = [b.strip() for b in value.split(",") if b.strip()]
    unknown = [b for b in backends if b not in LOCAL_BACKENDS]
    if not backends or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(LOCAL_BACKENDS)}")
    return backends


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="drafter alone vs SAFE vs every-token vs AdaFuse on the same prompts")
    add_engine_args(bench)
    bench.add_argument("--prompts", type=int, default=4, help="number of GSM8K questions")
    bench.add_argument("--data", help="a GSM8K-format JSONL file (default: the data folder's gsm8k/test.jsonl, "
                            "else the GSM8K sample shipped in the package)")
    bench.add_argument("--methods", default="single,safe,every-token,adafuse",
                       help="comma-separated; an entry may change engine flags for itself, e.g. "
                            "safe:draft-schedule=adaptive, and is then compared with its method (vs_safe, "
                            "same_answers_as_safe)")
    bench.add_argument("--json", help="write the results here")
    bench.add_argument("--backend", type=_backends,
                       help="how zoo names without a prefix run: llamacpp, transformers, or both "
                            "(transformers,llamacpp) to measure them in one run (default: each model's "
                            "default backend, llamacpp for zoo names)")
    bench.set_defaults(max_new_tokens=128)


def run(args: argparse.Namespace) -> int:
    """Measure, print the results as JSON and write them to ``--json`` if given."""
    text = json.dumps(run_bench(args), indent=2)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """One backend (``--backend``, default: each model's own, ``default_backend``): the results.
    Several (``--backend transformers,llamacpp``): each backend's results under ``backends``, plus per
    method ``<method>_<backend>_vs_<first backend>`` (tokens/s ratio) and
    ``<method>_<backend>_agreement_with_<first backend>`` (how far the greedy answers agree: the same
    weights run by other kernels can flip a near-tie, after which the texts part)."""
    chosen = getattr(args, "backend", None) or [None]
    backends: list[str | None] = [chosen] if isinstance(chosen, str) else list(chosen)
    if len(backends) == 1:
        return _run_backend(args, backends[0])[0]
    runs = {b: _run_backend(args, b) for b in backends}
    by_backend = {str(b): results for b, (results, _) in runs.items()}
    results: dict[str, Any] = {"backends": by_backend, "note": "measured in one process, one after the other"}
    base = str(backends[0])
    for other in map(str, backends[1:]):
        for method, row in by_backend[other]["methods"].items():
            key = f"{method.replace('-', '_')}_{other}"
            reference = by_backend[base]["methods"].get(method, {}).get("tokens_per_s")
            if reference:
                results[f"{key}_vs_{base}"] = round(row["tokens_per_s"] / reference, 3)
            base_answers, other_answers = runs[backends[0]][1].get(method), runs[other][1].get(method)
            if base_answers and other_answers:
                results[f"{key}_agreement_with_{base}"] = answer_agreement(base_answers, other_answers)
    return results


def answer_agreement(first: list[str], second: list[str]) -> dict[str, Any]:
    """How two runs' answers to the same prompts agree: how many are identical, and the mean share of
    each answer (in characters of the longer one) that the two have in common before they part."""
    shared = [1.0 if a == b else len(os.path.commonprefix([a, b])) / max(len(a), len(b))
              for a, b in zip(first, second, strict=True)]
    return {"identical": sum(a == b for a, b in zip(first, second, strict=True)), "answers": len(shared),
            "mean_shared_prefix": round(sum(shared) / len(shared), 3) if shared else 0.0}


def parse_method(entry: str, args: argparse.Namespace) -> tuple[str, argparse.Namespace]:
    """A ``--methods`` entry: ``safe``, or a variant with engine flags changed, e.g.
    ``safe:draft-schedule=adaptive`` or ``safe:draft-schedule=adaptive:drafter-confidence=0.5`` (the
    flags of ``--help``, read by the same parser), so a lever on and off is measured in one run."""
    method, *overrides = entry.split(":")
    flags = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:
            raise SystemExit(f"bench: {override!r} in --methods {entry!r} is not flag=value")
        flags += [f"--{key.strip().replace('_', '-')}", value.strip()]
    parser = argparse.ArgumentParser(prog=f"safe-ensemble bench --methods {entry}", add_help=False)
    add_engine_args(parser, members_required=False)
    return method.strip(), parser.parse_args(flags, namespace=copy.copy(args))  # unnamed flags keep args'


def _run_backend(args: argparse.Namespace, backend: str | None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """One backend's results, and each method's answers (for comparing backends)."""
    prompts = gsm8k_questions(args.data, args.prompts)
    if len(prompts) < args.prompts:
        print(f"bench: {gsm8k_file(args.data)} has only {len(prompts)} questions", file=sys.stderr)
    entries = [m.strip() for m in args.methods.split(",") if m.strip()]
    safe = EngineOptions(method="safe", **method_default_flags(args))  # what SAFE runs with: flags, else its defaults
    results: dict[str, Any] = {"models": args.models, "backend": backend or "default", "prompts": len(prompts),
                               "data": str(gsm8k_file(args.data)),
                               "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
                               "draft_schedule": args.draft_schedule,
                               "fusion": args.fusion, "sharpen": args.sharpen,
                               "drafter_confidence": safe.drafter_confidence,
                               "drafter_weight": safe.drafter_weight_for(len(args.models)),
                               "methods": {}}
    runs = [(entry, *parse_method(entry, args)) for entry in entries]  # a bad entry fails before any run
    answers: dict[str, list[str]] = {}
    for entry, method, method_args in runs:
        engine = engine_from_args(method_args, method, backend)
        engine.generate("Say hi.", max_new_tokens=4)  # warm-up: loads members, builds token tables
        tokens = elapsed = ensembled = spans = fused_spans = drafting = verifying = ahead = ahead_used = 0.0
        forwards: dict[str, int] = {}
        lengths: dict[int, int] = {}
        answers[entry] = []
        for prompt in tqdm(prompts, desc=entry, file=sys.stderr):
            answer = engine.generate(prompt)
            stats = answer.stats
            answers[entry].append(answer.text)
            tokens += stats.tokens
            elapsed += stats.elapsed_s
            ensembled += stats.ensembled_tokens
            spans += stats.spans
            fused_spans += stats.fused_spans
            drafting += stats.draft_s
            verifying += stats.verify_s
            ahead += stats.ahead_drafts
            ahead_used += stats.ahead_drafts_used
            for name, count in stats.forward_passes.items():
                forwards[name] = forwards.get(name, 0) + count
            for length, rounds in stats.draft_lengths.items():
                lengths[length] = lengths.get(length, 0) + rounds
        results["methods"][entry] = {
            "tokens": int(tokens), "elapsed_s": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 3) if elapsed else 0.0,
            **({"time_split_s": {"draft": round(drafting, 3), "verify": round(verifying, 3),
                                 "rest": round(elapsed - drafting - verifying, 3)}} if drafting else {}),
            "ensemble_rate": round(ensembled / tokens, 4) if tokens else 0.0,
            "forward_passes": forwards,
            "fusion": engine.options.fusion, "sharpen": engine.options.sharpen,  # each method's own defaults
            **({"fused_span_rate": round(fused_spans / spans, 4)} if spans else {}),
            "forward_passes_per_token": {k: round(v / tokens, 3) for k, v in forwards.items()} if tokens else {},
            **({"mean_draft_length": mean_draft_length(lengths), "draft_lengths": dict(sorted(lengths.items()))}
               if lengths else {}),
            **({"ahead_drafts": int(ahead), "ahead_drafts_used": int(ahead_used)} if ahead else {}),
        }
    for entry, method, _ in runs:  # a variant against its method with the run's flags
        if entry != method and method in answers:
            row, reference = results["methods"][entry], results["methods"][method]["tokens_per_s"]
            row[f"vs_{method}"] = round(row["tokens_per_s"] / reference, 3) if reference else None
            row[f"same_answers_as_{method}"] = answers[entry] == answers[method]
            single = results["methods"].get("single", {}).get("tokens_per_s")
            if single and method != "single":
                row["vs_single"] = round(row["tokens_per_s"] / single, 3)
    by_method = results["methods"]
    for method, key in (("single", "single"), ("safe", "safe"), ("every-token", "every_token"),
                        ("adafuse", "adafuse")):
        if method in by_method:
            results[f"{key}_tokens_per_s"] = by_method[method]["tokens_per_s"]
    if "safe" in by_method:
        results["safe_ensemble_rate"] = by_method["safe"]["ensemble_rate"]
        if "single" in by_method and by_method["single"]["tokens_per_s"]:
            results["safe_vs_single"] = round(
                by_method["safe"]["tokens_per_s"] / by_method["single"]["tokens_per_s"], 3)
        if "every-token" in by_method and by_method["every-token"]["tokens_per_s"]:
            results["safe_vs_every_token"] = round(
                by_method["safe"]["tokens_per_s"] / by_method["every-token"]["tokens_per_s"], 3)
    if "adafuse" in by_method:
        results["adafuse_fused_span_rate"] = by_method["adafuse"].get("fused_span_rate", 0.0)
        if "single" in by_method and by_method["single"]["tokens_per_s"]:
            results["adafuse_vs_single"] = round(
                by_method["adafuse"]["tokens_per_s"] / by_method["single"]["tokens_per_s"], 3)
    results["forward_passes_per_token"] = {m: r["forward_passes_per_token"] for m, r in by_method.items()}
    return results, answers
