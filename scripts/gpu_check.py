"""GPU readiness check: single, SAFE and AdaFuse over two members on a device and dtype, against
the CPU float32 run of the same members, plus ``model.generate`` for the drafter alone.

    python scripts/gpu_check.py                                   # cuda, bfloat16, two zoo members
    python scripts/gpu_check.py --device cpu --max-new-tokens 8   # the same path on this CPU

The device run differs from the CPU one only in ``MemberConfig(device=..., dtype=...)``; every
device-dependent step is in shared_engine/members/devices.py. Greedy text is compared with the
float32 CPU run (bfloat16 rounds logits, so a late near-tie may flip a token: the report gives
the common prefix in characters, not just equal/unequal). Tokens/s of the engine's ``single``
method are printed next to ``model.generate`` of the same model, so the engine's per-token
overhead is visible (``single_vs_generate``; ``safe_vs_single``, ``adafuse_vs_single``).

The default prompt is bench's first GSM8K question with its step-by-step instruction: a long answer,
so tokens/s is measured over ``--max-new-tokens`` tokens (a short "42" timed two tokens, noise). A
method that stopped before ``--max-new-tokens`` is named in ``short_runs``. Tokens/s is the median
of ``--repeats`` timed runs. On CUDA each method's (and ``model.generate``'s) peak GPU memory,
its load included, is reported. A method that fails (out of memory, a dtype error) is reported
with its error and the others still run; exit code 1 then, 2 if the device is missing, else 0.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from pathlib import Path

from _report import emit_report  # scripts/_report.py: this folder is on sys.path when run

ZOO = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
METHODS = ("single", "safe", "adafuse")


def default_prompt() -> str:
    """bench's default workload, its first GSM8K question asked step by step: an answer longer than
    any ``--max-new-tokens`` this check uses, so every method is timed over as many tokens."""
    from shared_engine.bench import gsm8k_questions

    return gsm8k_questions(None, 1)[0]


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _error(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _reset_peak(device: str) -> None:
    """Start a method's GPU peak here (the peak is per process otherwise: the first method's would
    be every later one's)."""
    import torch

    if device.startswith("cuda"):
        gc.collect()  # the previous method's members, released at its close
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _add_peak(row: dict, device: str) -> dict:
    import torch

    if device.startswith("cuda"):
        row["gpu_max_allocated_mb"] = round(torch.cuda.max_memory_allocated(device) / 2**20, 1)
    return row


def run_methods(models: list[str], device: str, dtype: str, prompt: str, max_new_tokens: int,
                repeats: int = 3) -> dict:
    """Each method's greedy answer and speed (median of ``repeats`` runs) with every member on
    ``device`` in ``dtype``; a method that fails gives its error, and the next one still runs."""
    from shared_engine import EnsembleEngine, MemberConfig

    members = [MemberConfig(model=m, device=device, dtype=dtype) for m in models]
    results: dict = {}
    for method in METHODS:
        engine = None
        try:
            _reset_peak(device)
            engine = EnsembleEngine(members, method=method, max_new_tokens=max_new_tokens)
            engine.generate(prompt, max_new_tokens=2)  # warm-up: loads, and first-call kernels (CUDA)
            runs = [engine.generate(prompt) for _ in range(repeats)]
            result = runs[-1]
            results[method] = _add_peak({
                "text": result.text, "tokens": result.stats.tokens,
                "tokens_per_s": round(statistics.median(r.stats.tokens_per_s for r in runs), 2),
                "runs_tokens_per_s": [round(r.stats.tokens_per_s, 2) for r in runs],
                "ensemble_rate": round(result.stats.ensemble_rate, 3)}, device)
        except Exception as err:  # an OOM or dtype error in one method must not lose the rest
            results[method] = {"error": _error(err)}
            try:
                _add_peak(results[method], device)
            except RuntimeError:  # after a CUDA error every CUDA call may fail; the error is what matters
                pass
        finally:
            if engine is not None:
                engine.close()
    return results


def generate_baseline(model: str, device: str, dtype: str, prompt: str, max_new_tokens: int,
                      repeats: int = 3) -> dict:
    """``model.generate`` (greedy, KV cache) for one member: the speed a plain transformers user sees.
    Tokens are counted as the engine counts them: up to, not including, the first EOS."""
    import torch

    from shared_engine.members import MemberConfig, load_member
    from shared_engine.members.devices import input_device

    _reset_peak(device)
    member = load_member(MemberConfig(model=model, device=device, dtype=dtype), progress=False)
    ids = torch.tensor([member.prompt_ids([{"role": "user", "content": prompt}])],
                       device=input_device(member.model))
    kwargs = {"do_sample": False, "pad_token_id": next(iter(member.eos_ids), 0)}
    member.model.generate(ids, max_new_tokens=2, **kwargs)  # warm-up
    rates = []
    for _ in range(repeats):
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
        start = time.perf_counter()
        out = member.model.generate(ids, max_new_tokens=max_new_tokens, **kwargs)
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)
        seconds = time.perf_counter() - start
        new = out[0, ids.shape[1]:].tolist()
        new = new[:next((i for i, t in enumerate(new) if t in member.eos_ids), len(new))]
        rates.append(len(new) / seconds)
    return _add_peak({"model": model, "tokens": len(new), "tokens_per_s": round(statistics.median(rates), 2),
                      "runs_tokens_per_s": [round(r, 2) for r in rates],
                      "text": member.tokenizer.decode(new, skip_special_tokens=True),
                      "placement": member.placement}, device)


def _ratio(rows: dict, a: str, b: str) -> float | None:
    speed, base = rows.get(a, {}).get("tokens_per_s"), rows.get(b, {}).get("tokens_per_s")
    return round(speed / base, 3) if speed and base else None


def check(models: list[str], device: str, dtype: str, prompt: str, max_new_tokens: int, repeats: int = 3) -> dict:
    from shared_engine.members.devices import check_device

    check_device(device)  # a clear error before anything loads
    reference = run_methods(models, "cpu", "float32", prompt, max_new_tokens, repeats)
    target = run_methods(models, device, dtype, prompt, max_new_tokens, repeats)
    methods: dict = {}
    failed = []
    for method in METHODS:
        ref, got = reference[method], target[method]
        row = methods[method] = {key: value for key, value in got.items() if key != "runs_tokens_per_s"}
        if "error" in ref:
            row["reference_error"] = ref["error"]
            failed.append(f"{method} (cpu float32)")
        if "error" in got:
            failed.append(method)
        if "error" in ref or "error" in got:
            continue
        row.update({"same_text": got["text"] == ref["text"],
                    "common_prefix_chars": _common_prefix(got["text"], ref["text"]),
                    "reference_text": ref["text"], "reference_tokens_per_s": ref["tokens_per_s"],
                    "runs_tokens_per_s": got["runs_tokens_per_s"]})
    try:
        baseline = generate_baseline(models[0], device, dtype, prompt, max_new_tokens, repeats)
    except Exception as err:  # the methods' results are reported all the same
        baseline = {"model": models[0], "error": _error(err)}
        failed.append("drafter_generate")
    speeds = {**methods, "generate": baseline}
    short = [name for name, row in speeds.items() if "tokens" in row and row["tokens"] < max_new_tokens]
    import torch

    return {"device": device, "dtype": dtype, "reference": "cpu float32", "models": models,
            "prompt": prompt, "max_new_tokens": max_new_tokens, "repeats": repeats, "methods": methods,
            "drafter_generate": baseline,
            "safe_vs_single": _ratio(speeds, "safe", "single"),
            "adafuse_vs_single": _ratio(speeds, "adafuse", "single"),
            "single_vs_generate": _ratio(speeds, "single", "generate"),
            "short_runs": short,  # stopped (EOS) before max_new_tokens: tokens/s over few tokens is noise
            "failed": failed,
            "torch": torch.__version__, "cuda": torch.version.cuda, "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:1, cpu, ... (default: cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--models", default=",".join(ZOO), help="two members, comma-separated (the first drafts)")
    parser.add_argument("--prompt", help="default: bench's first GSM8K question, asked step by step")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method; tokens/s is their median")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    from shared_engine.errors import EnsembleError

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if len(models) != 2:
        parser.error("--models: give exactly two members")
    try:
        report = check(models, args.device, args.dtype, args.prompt or default_prompt(), args.max_new_tokens,
                       max(1, args.repeats))
    except EnsembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    code = emit_report(report, args.json)
    if report["failed"]:
        print(f"error: failed: {', '.join(report['failed'])} (see the report)", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
