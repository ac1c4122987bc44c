"""Does ``torch.compile`` of the decode step make a transformers member faster on this machine?

    python scripts/compile_report.py [--models a,b] [--tokens 32] [--repeats 2] [--json out.json]

Per member, all in one process and interleaved per repeat (so the ratios hold on a contended machine
even where the absolute figures do not), greedy, four ways:

- ``engine``: the engine's ``single`` method on the member as it loads by default (dynamic KV cache);
- ``engine_compiled``: the same with ``MemberConfig(compile=True)``: the forward through
  ``torch.compile(dynamic=True)``, so prefill, draft blocks and single tokens share one graph;
- ``generate`` / ``generate_compiled``: ``model.generate``, and transformers' own compiled path (a
  static cache and a ``CompileConfig``; on a CPU only with ``_compile_all_devices``), for reference.

Reported: ``compile_s`` (the first call of each compiled way, minus the first call of its eager way:
what a user waits once per process), ``tokens_per_s`` after that warm-up, ``speed_vs_eager`` (against
the eager way of the same kind) and whether the greedy output equals the eager way's. Prints JSON.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from _report import emit_report  # scripts/_report.py: this folder is on sys.path when run

ZOO = ["transformers:smollm2-135m-instruct", "transformers:qwen2.5-coder-0.5b-instruct"]
PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "What is the capital of France? Answer in one sentence."]
MODES = ("engine", "engine_compiled", "generate", "generate_compiled")


def _generate(model, ids, tokens: int, compiled: bool):  # noqa: ANN001, ANN202
    import torch
    from transformers import CompileConfig

    kwargs: dict = {"max_new_tokens": tokens, "min_new_tokens": tokens, "do_sample": False, "pad_token_id": 0}
    if compiled:
        config = CompileConfig(mode="default")  # "reduce-overhead" (its default) means CUDA graphs
        config._compile_all_devices = True  # the flag transformers reads to compile on a CPU too
        kwargs.update(cache_implementation="static", compile_config=config)
    else:
        kwargs["disable_compile"] = True
    with torch.inference_mode():
        out = model.generate(ids, **kwargs)
    return out[0, ids.shape[1]:].tolist()


def eager(mode: str) -> str:
    return mode.removesuffix("_compiled")


def member_report(model_name: str, tokens: int, repeats: int) -> dict:
    import torch

    from shared_engine import EnsembleEngine, MemberConfig

    engines = {compiled: EnsembleEngine([MemberConfig(model=model_name, compile=compiled)], method="single",
                                        max_new_tokens=tokens) for compiled in (False, True)}
    plain = engines[False].members[0]
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    id_rows = [torch.tensor([plain.prompt_ids(m)]) for m in messages]

    def one(mode: str, index: int) -> tuple[object, float, int]:
        """Output, seconds, tokens (the engine may stop at the end of turn; generate makes ``tokens``)."""
        start = time.perf_counter()
        if mode.startswith("engine"):
            result = engines[mode == "engine_compiled"].generate(messages[index])
            return result.text, time.perf_counter() - start, result.stats.tokens
        out = _generate(plain.model, id_rows[index], tokens, mode == "generate_compiled")
        return out, time.perf_counter() - start, tokens

    first = {mode: one(mode, 0)[1] for mode in MODES}  # warm-up: a compiled way compiles here
    seconds = dict.fromkeys(MODES, 0.0)
    produced = dict.fromkeys(MODES, 0)
    same = dict.fromkeys(MODES, 0)
    for _ in range(repeats):
        for index in range(len(PROMPTS)):
            outputs = {}
            for mode in MODES:  # interleaved: contention hits every way alike
                outputs[mode], took, made = one(mode, index)
                seconds[mode] += took
                produced[mode] += made
            for mode in MODES:
                same[mode] += int(outputs[mode] == outputs[eager(mode)])
    for engine in engines.values():
        engine.close()
    runs = repeats * len(PROMPTS)
    return {"model": model_name, "tokens": tokens, "runs_per_way": runs,
            **{mode: {"tokens_per_s": round(produced[mode] / seconds[mode], 2),
                      "speed_vs_eager": round(produced[mode] / seconds[mode] * seconds[eager(mode)]
                                              / produced[eager(mode)], 3),
                      "same_output_as_eager": f"{same[mode]}/{runs}",
                      **({"compile_s": round(first[mode] - first[eager(mode)], 1)}
                         if mode.endswith("_compiled") else {})} for mode in MODES}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    import torch

    report = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
              "members": [member_report(m.strip(), args.tokens, args.repeats)
                          for m in args.models.split(",") if m.strip()]}
    return emit_report(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
