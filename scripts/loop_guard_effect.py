"""What the loop guard changes in an eval run that ran without it, without running it all again.

The guard (``loop_guard``, shared_engine/repetition.py) changes nothing until an exact repetition at
the answer's end reaches the limit: greedy answers without such a loop come out the same token for
token (``tests/test_loop_guard.py``). So the effect on a stored run is the effect on the answers
that do contain one. This script finds them (a superset: every answer with, at some byte, a loop
of the limit's length whose next byte repeats it), answers exactly those questions again with the
guard, plus ``--check`` answers without a loop as a control that they come out the same, and prints
per question before / after and the run's accuracy with the guard.

    python scripts/loop_guard_effect.py /work/eval-runs/p8/gsm8k-safe-default-qg --loop-guard 64 --check 3

Run it on the code the stored run was made with, on the same backend: llama.cpp answers depend on
how rows are batched, so another request shape could move near-ties (the control shows it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]  # a checkout

from _report import emit_report  # noqa: E402  (scripts/_report.py)

from shared_engine import EnsembleEngine  # noqa: E402
from shared_engine.evaluation.benchmarks import get_benchmark  # noqa: E402
from shared_engine.evaluation.runner import CONFIG, SAMPLES, RunConfig, _answer, read_samples  # noqa: E402
from shared_engine.members import MemberConfig  # noqa: E402
from shared_engine.repetition import continues_loop, loop_unit  # noqa: E402


def has_guarded_loop(text: str, limit: int) -> bool:
    """Whether the guard could act on ``text``: at some byte a loop of ``limit`` bytes is followed by
    a byte that repeats it (checked at every byte, so token boundaries need not be known)."""
    data = text.encode("utf-8")
    return any(continues_loop(loop_unit(data[:end], limit), data[end:end + 1]) for end in range(limit, len(data)))


def engine_for(config: RunConfig, loop_guard: int | None) -> EnsembleEngine:
    members = [MemberConfig(model=m, **config.member_options.get(m, {})) for m in config.models]
    return EnsembleEngine(members, method=config.method, **{**config.engine_options, "loop_guard": loop_guard})


def benchmark_of_run(stored: str, pair: str) -> tuple[str, str]:
    """The benchmark name and FLORES pair of a stored run: a FLORES run is stored as ``flores-<pair>``,
    so its own pair wins over ``--pair``."""
    if stored.startswith("flores-"):
        return "flores", stored.removeprefix("flores-")
    return stored, pair


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    run = Path(args.run)
    config = RunConfig.model_validate_json((run / CONFIG).read_text())
    name, pair = benchmark_of_run(config.bench, args.pair)
    bench = get_benchmark(name, args.data, pair)
    records = {r.id: r for r in bench.dataset().records}
    samples = read_samples(run / SAMPLES)
    looped = [s for s in samples if has_guarded_loop(s.output, args.loop_guard)]
    controls = [s for s in samples if s not in looped and s.error is None][:args.check]
    engine = engine_for(config, args.loop_guard)
    rows, after = [], {s.id: s.correct for s in samples}
    values = {s.id: s.value for s in samples}  # chrF per sentence on FLORES (the score, not correct)
    try:
        for kind, sample in [("loop", s) for s in looped] + [("control", s) for s in controls]:
            new = await _answer(engine, bench, config, records[sample.id])
            if kind == "loop":
                after[sample.id], values[sample.id] = new.correct, new.value
            rows.append({"id": sample.id, "kind": kind, "correct_before": sample.correct,
                         "correct_after": new.correct, "value_before": sample.value, "value_after": new.value,
                         "same_text": new.output == sample.output,
                         "finish_before": sample.finish_reason, "finish_after": new.finish_reason,
                         "loop_breaks": (new.stats or {}).get("loop_breaks", 0),
                         "tokens_before": (sample.stats or {}).get("tokens"),
                         "tokens_after": (new.stats or {}).get("tokens"), "output_after": new.output})
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    finally:
        engine.close()
    n = len(samples)
    won = sum(1 for r in rows if r["kind"] == "loop" and r["correct_after"] and not r["correct_before"])
    lost = sum(1 for r in rows if r["kind"] == "loop" and r["correct_before"] and not r["correct_after"])
    return {"run": str(run), "bench": config.bench, "method": config.method, "models": config.models,
            "loop_guard": args.loop_guard, "n": n, "answers_with_a_loop": len(looped),
            "accuracy_without": sum(s.correct for s in samples) / n, "accuracy_with": sum(after.values()) / n,
            "mean_value_without": sum(s.value for s in samples) / n, "mean_value_with": sum(values.values()) / n,
            "won": won, "lost": lost,
            "controls_identical": sum(r["same_text"] for r in rows if r["kind"] == "control"),
            "controls": len(controls), "questions": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="an eval run folder (config.json, samples.jsonl) made without the guard")
    parser.add_argument("--loop-guard", type=int, default=64, help="the guard's limit in bytes (default 64)")
    parser.add_argument("--check", type=int, default=2, help="answers without a loop to answer again as a control")
    parser.add_argument("--data", help="the benchmark's data file (default: as the eval finds it)")
    parser.add_argument("--pair", default="en-de", help="FLORES: the language pair (a run's own pair wins)")
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    return emit_report(asyncio.run(main_async(args)), args.json)


if __name__ == "__main__":
    raise SystemExit(main())
