"""GPU readiness check: single, SAFE and AdaFuse over two members on a device and dtype, against
the CPU float32 run of the same members, plus ``model.generate`` for the drafter alone.

    python scripts/gpu_check.py                                   # cuda, bfloat16, two zoo members
    python scripts/gpu_check.py --device cpu --max-new-tokens 8   # the same path on this CPU

The device run differs from the CPU one only in ``MemberConfig(device=..., dtype=...)``; every
device-dependent step is in shared_engine/members/devices.py. Greedy text is compared with the
float32 CPU run (bfloat16 rounds logits, so a late near-tie may flip a token: the report gives
the common prefix in characters, not just equal/unequal). Tokens/s of the engine's ``single``
method are printed next to ``model.generate`` of the same model, so the engine's per-token
overhead is visible. Prints one JSON report; exit code 0 unless something failed to run.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from _report import emit_report  # scripts/_report.py: this folder is on sys.path when run

ZOO = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
PROMPT = "What is 17 + 25? Answer with the number."
METHODS = ("single", "safe", "adafuse")


def _common_prefix(a: str, b: str) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def run_methods(models: list[str], device: str, dtype: str, prompt: str, max_new_tokens: int) -> dict:
    """Each method's greedy answer and speed with every member on ``device`` in ``dtype``."""
    from shared_engine import EnsembleEngine, MemberConfig

    members = [MemberConfig(model=m, device=device, dtype=dtype) for m in models]
    results = {}
    for method in METHODS:
        engine = EnsembleEngine(members, method=method, max_new_tokens=max_new_tokens)
        engine.generate(prompt, max_new_tokens=2)  # warm-up: loads, and first-call kernels (CUDA)
        result = engine.generate(prompt)
        results[method] = {"text": result.text, "tokens": result.stats.tokens,
                           "tokens_per_s": round(result.stats.tokens_per_s, 2),
                           "ensemble_rate": round(result.stats.ensemble_rate, 3)}
        engine.close()
    return results


def generate_baseline(model: str, device: str, dtype: str, prompt: str, max_new_tokens: int) -> dict:
    """``model.generate`` (greedy, KV cache) for one member: the speed a plain transformers user sees."""
    import torch

    from shared_engine.members import MemberConfig, load_member
    from shared_engine.members.devices import input_device

    member = load_member(MemberConfig(model=model, device=device, dtype=dtype), progress=False)
    ids = torch.tensor([member.prompt_ids([{"role": "user", "content": prompt}])],
                       device=input_device(member.model))
    kwargs = {"do_sample": False, "pad_token_id": next(iter(member.eos_ids), 0)}
    member.model.generate(ids, max_new_tokens=2, **kwargs)  # warm-up
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    start = time.perf_counter()
    out = member.model.generate(ids, max_new_tokens=max_new_tokens, **kwargs)
    if ids.device.type == "cuda":
        torch.cuda.synchronize(ids.device)
    seconds = time.perf_counter() - start
    new = out[0, ids.shape[1]:].tolist()
    report = {"model": model, "tokens": len(new), "tokens_per_s": round(len(new) / seconds, 2),
              "text": member.tokenizer.decode(new, skip_special_tokens=True), "placement": member.placement}
    if ids.device.type == "cuda":
        report["gpu_max_allocated_mb"] = round(torch.cuda.max_memory_allocated(ids.device) / 2**20, 1)
    return report


def check(models: list[str], device: str, dtype: str, prompt: str, max_new_tokens: int) -> dict:
    from shared_engine.members.devices import check_device

    check_device(device)  # a clear error before anything loads
    reference = run_methods(models, "cpu", "float32", prompt, max_new_tokens)
    target = run_methods(models, device, dtype, prompt, max_new_tokens)
    methods = {}
    for method in METHODS:
        ref, got = reference[method], target[method]
        methods[method] = {
            "same_text": got["text"] == ref["text"],
            "common_prefix_chars": _common_prefix(got["text"], ref["text"]),
            "text": got["text"], "reference_text": ref["text"],
            "tokens_per_s": got["tokens_per_s"], "reference_tokens_per_s": ref["tokens_per_s"],
            "ensemble_rate": got["ensemble_rate"]}
    import torch

    return {"device": device, "dtype": dtype, "reference": "cpu float32", "models": models,
            "max_new_tokens": max_new_tokens, "methods": methods,
            "drafter_generate": generate_baseline(models[0], device, dtype, prompt, max_new_tokens),
            "torch": torch.__version__, "cuda": torch.version.cuda, "torch_threads": torch.get_num_threads()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:1, cpu, ... (default: cuda)")
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--models", default=",".join(ZOO), help="two members, comma-separated (the first drafts)")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    from shared_engine.errors import EnsembleError

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if len(models) != 2:
        parser.error("--models: give exactly two members")
    try:
        report = check(models, args.device, args.dtype, args.prompt, args.max_new_tokens)
    except EnsembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return emit_report(report, args.json)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
