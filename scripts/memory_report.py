"""Memory of an ensemble engine: resident set size after loading the members and at peak while it
answers, printed as JSON (issue #10, "Resources").

    python scripts/memory_report.py                      # the three zoo members, SAFE, 32 tokens
    python scripts/memory_report.py --models a,b --max-new-tokens 64 --json memory.json

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


def measure(models: list[str], method: str, max_new_tokens: int, prompt: str) -> dict:
    import torch  # imported before the baseline: the report is about the engine, not the libraries

    from shared_engine import EnsembleEngine

    baseline = rss_mb()
    engine = EnsembleEngine(models, method=method)
    start = time.perf_counter()
    members = engine.members  # loads (once per process)
    load_s = time.perf_counter() - start
    gc.collect()
    after_load = rss_mb()
    # Weights are memory-mapped from the safetensors files and paged in on first use: one forward
    # of every member makes them resident, so the answer's own overhead is measured separately.
    with torch.inference_mode():
        for member in members:
            member.model(input_ids=torch.tensor([[0]]))
    resident = rss_mb()
    weights = {m.name: round(sum(p.numel() * p.element_size() for p in m.model.parameters()) / 2**20, 1)
               for m in members}

    hwm_reset = reset_peak()
    with PeakSampler() as sampler:
        result = engine.generate(prompt, max_new_tokens=max_new_tokens)
    peak = max(sampler.peak, _status_mb("VmHWM") if hwm_reset else 0.0)
    after_answer = rss_mb()

    engine.close()
    second = EnsembleEngine(models, method=method)
    shared = all(a is b for a, b in zip(second.members, members))
    again = second.generate(prompt, max_new_tokens=max_new_tokens)
    gc.collect()
    return {
        "models": models,
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
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    report = measure([m.strip() for m in args.models.split(",") if m.strip()], args.method,
                     args.max_new_tokens, args.prompt)
    text = json.dumps(report, indent=2)
    if args.json:
        Path(args.json).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
