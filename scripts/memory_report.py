"""Memory of an ensemble engine: resident set size after loading the members and at peak while it
answers, printed as JSON (issue #10, "Resources").

    python scripts/memory_report.py                      # the three zoo members, SAFE, 32 tokens
    python scripts/memory_report.py --models a,b --max-new-tokens 64 --json memory.json
    python scripts/memory_report.py --dtype float32,bfloat16 [--device cuda]   # per member and dtype

With ``--dtype``, each (member, dtype) is also loaded alone in a fresh subprocess and its resident
memory reported (``per_member``): a process never returns all freed memory to the OS, so measuring
one after another in one process would blur the figures. On CUDA the GPU memory is reported too.

Weights are memory-mapped and paged in on first use, so "after_load" is small; one forward per
member makes them resident ("after_load_weights_resident") before the answer is measured.
Also shows that members are loaded once per process: a second engine over the same names adds no
memory, and closing the first engine leaves the members usable by the second. RSS is read from
/proc/self/status (Linux); the peak is the larger of VmHWM (reset before the answer where the
kernel allows it) and a 5 ms RSS sampler. Memory figures do not depend on CPU contention; the
times printed alongside do.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from _report import emit_report  # scripts/_report.py: this folder is on sys.path when run

if TYPE_CHECKING:
    from shared_engine.members import MemberConfig

ZOO = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"]
PROMPT = "Write a Python function that returns the n-th Fibonacci number, with a short docstring."


def _status_mb(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024  # kB -> MiB
    raise RuntimeError(f"{field} not in /proc/self/status")


def rss_mb() -> float:
    return _status_mb("VmRSS")


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where that is not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


class PeakSampler:
    """Samples RSS on a thread; ``peak`` is the largest value seen."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.peak = rss_mb()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_mb())
            self._stop.wait(self.period_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_mb())


def import_model_classes(configs: list[MemberConfig]) -> None:
    """Import each transformers member's model class before the baseline is read: transformers imports
    it lazily inside ``load_member``, and those ~150 MiB of library code are no member's memory."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    from shared_engine.zoo import resolve

    for config in configs:
        if config.spec.backend == "transformers":
            path = resolve(config.spec.target, progress=False).path
            MODEL_FOR_CAUSAL_LM_MAPPING[type(AutoConfig.from_pretrained(str(path)))]  # the lazy import


def measure_one(model: str, dtype: str, device: str) -> dict:
    """One member alone in this process: RSS (and GPU memory) once its weights are resident."""
    import torch

    from shared_engine.members import MemberConfig, load_member
    from shared_engine.members.devices import input_device

    config = MemberConfig(model=model, dtype=dtype, device=device)
    import_model_classes([config])
    baseline = rss_mb()
    member = load_member(config, progress=False)
    with torch.inference_mode():
        member.model(input_ids=torch.tensor([[0]], device=input_device(member.model)))
    gc.collect()
    report = {"model": model, "dtype": dtype, "device": device, "placement": member.placement,
              "rss_mb": round(rss_mb() - baseline, 1),
              "weights_mb": round(sum(p.numel() * p.element_size() for p in member.model.parameters()) / 2**20, 1)}
    if torch.device(device).type == "cuda":
        report["gpu_allocated_mb"] = round(torch.cuda.memory_allocated(device) / 2**20, 1)
    return report


def per_member(models: list[str], dtypes: list[str], device: str) -> list[dict]:
    """``measure_one`` for every (member, dtype), each in its own subprocess."""
    import subprocess

    rows = []
    for dtype in dtypes:
        for model in models:
            out = subprocess.run([sys.executable, __file__, "--one", model, "--dtype", dtype, "--device", device],
                                 capture_output=True, text=True, check=True).stdout
            rows.append(json.loads(out))
    return rows


def measure(models: list[str], method: str, max_new_tokens: int, prompt: str, dtype: str = "float32",
            device: str = "cpu") -> dict:
    import torch  # imported before the baseline: the report is about the engine, not the libraries

    from shared_engine import EnsembleEngine
    from shared_engine.members import MemberConfig
    from shared_engine.members.devices import input_device

    import_model_classes([MemberConfig(model=m, dtype=dtype, device=device) for m in models])
    baseline = rss_mb()
    engine = EnsembleEngine(models, method=method, dtype=dtype, device=device)
    start = time.perf_counter()
    members = engine.members  # loads (once per process)
    load_s = time.perf_counter() - start
    gc.collect()
    after_load = rss_mb()
    # Weights are memory-mapped from the safetensors files and paged in on first use: one forward
    # of every member makes them resident, so the answer's own overhead is measured separately.
    with torch.inference_mode():
        for member in members:
            member.model(input_ids=torch.tensor([[0]], device=input_device(member.model)))
    resident = rss_mb()
    weights = {m.name: round(sum(p.numel() * p.element_size() for p in m.model.parameters()) / 2**20, 1)
               for m in members}

    hwm_reset = reset_peak()
    with PeakSampler() as sampler:
        result = engine.generate(prompt, max_new_tokens=max_new_tokens)
    peak = max(sampler.peak, _status_mb("VmHWM") if hwm_reset else 0.0)
    after_answer = rss_mb()

    # Built while the first still holds the members: they are shared, not reloaded (closing the first
    # before would let the registry close them, and the second would load them again).
    second = EnsembleEngine(models, method=method, dtype=dtype, device=device)
    shared = all(a is b for a, b in zip(second.members, members))
    engine.close()  # the second still holds them: they stay loaded and usable
    again = second.generate(prompt, max_new_tokens=max_new_tokens)
    gc.collect()
    return {
        "models": models,
        "dtype": dtype,
        "device": device,
        "method": method,
        "max_new_tokens": max_new_tokens,
        "answer_tokens": result.stats.tokens,
        "rss_mb": {
            "baseline_after_imports": round(baseline, 1),
            "after_load": round(after_load, 1),
            "after_load_weights_resident": round(resident, 1),
            "peak_during_answer": round(peak, 1),
            "after_answer": round(after_answer, 1),
            "after_second_engine_answer": round(rss_mb(), 1),
        },
        "members_resident_mb": round(resident - baseline, 1),
        "answer_overhead_mb": round(peak - resident, 1),
        "weights_mb": weights,
        "second_engine_shares_members": shared,
        "second_engine_same_answer": again.text == result.text,
        "load_s": round(load_s, 1),
        "answer_s": round(result.stats.elapsed_s, 1),
        "peak_from": "max(VmHWM, 5 ms sampler)" if hwm_reset else "5 ms sampler",
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated member names")
    parser.add_argument("--method", default="safe")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--dtype", default=None,
                        help="comma-separated dtypes (float32, bfloat16, float16): per-member figures for each; "
                             "the ensemble is measured in the first (default float32, no per-member figures)")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:1, ...")
    parser.add_argument("--json", help="also write the report here")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # internal: measure this one member (per_member)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    dtypes = [d.strip() for d in (args.dtype or "float32").split(",") if d.strip()]
    if args.one:
        print(json.dumps(measure_one(args.one, dtypes[0], args.device)))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    report = measure(models, args.method, args.max_new_tokens, args.prompt, dtypes[0], args.device)
    if args.dtype is not None:  # given, even as the default float32: each (member, dtype) alone
        report["per_member"] = per_member(models, dtypes, args.device)
    return emit_report(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
