"""float32 vs bfloat16 vs float16 members on this machine: speed, greedy agreement with float32,
weight memory, and whether an ensemble answers a GSM8K question the same in bfloat16.

    python scripts/dtype_report.py [--models a,b] [--tokens 24] [--gsm8k-tokens 200] [--json out.json]

Per member and dtype (all in one process, dtypes interleaved per prompt, so the ratios hold on a
contended machine even where the absolute figures do not):

- ``tokens_per_s``: ``model.generate`` greedy, ``--tokens`` new tokens per prompt;
- ``argmax_agreement``: teacher-forced over the float32 greedy continuation, the share of positions
  where this dtype's most likely token is float32's (1.0 = the same greedy path everywhere);
- ``same_greedy_text``: the free-running greedy continuation is identical to float32's.

Then a SAFE ensemble of the first two members answers GSM8K test question 0 in float32 and in
bfloat16 (``--gsm8k-tokens`` 0 skips it); the report gives both texts and the final numbers.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from _report import emit_report  # scripts/_report.py: this folder is on sys.path when run

ZOO = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct", "gemma-3-270m"]
DTYPES = ["float32", "bfloat16", "float16"]
PROMPTS = ["Write a Python function that checks whether a number is prime.",
           "What is the capital of France? Answer in one sentence."]


def _final_number(text: str) -> str | None:
    numbers = re.findall(r"-?\d[\d,]*\.?\d*", text)
    return numbers[-1].rstrip(".").replace(",", "") if numbers else None


def member_report(models: list[str], tokens: int) -> list[dict]:
    import torch

    from shared_engine.members import MemberConfig, load_member

    rows = []
    for model in models:
        members = {d: load_member(MemberConfig(model=model, dtype=d), progress=False) for d in DTYPES}
        seconds = dict.fromkeys(DTYPES, 0.0)
        produced = dict.fromkeys(DTYPES, 0)
        agree = dict.fromkeys(DTYPES, 0)
        same = dict.fromkeys(DTYPES, 0)
        positions = 0
        for prompt in PROMPTS:
            ids = torch.tensor([members["float32"].prompt_ids([{"role": "user", "content": prompt}])])
            continuations = {}
            for dtype in DTYPES:  # interleaved: contention hits every dtype alike
                member = members[dtype]
                start = time.perf_counter()
                with torch.inference_mode():
                    out = member.model.generate(ids, max_new_tokens=tokens, do_sample=False, eos_token_id=None,
                                                pad_token_id=0)
                seconds[dtype] += time.perf_counter() - start
                continuations[dtype] = out[0, ids.shape[1]:]
                produced[dtype] += continuations[dtype].numel()
            reference = continuations["float32"]
            forced = torch.cat([ids[0], reference]).unsqueeze(0)
            positions += reference.numel()
            for dtype in DTYPES:
                with torch.inference_mode():
                    logits = members[dtype].model(input_ids=forced).logits[0, ids.shape[1] - 1:-1]
                agree[dtype] += int((logits.argmax(-1) == reference).sum())
                same[dtype] += int(torch.equal(continuations[dtype], reference))
        for dtype in DTYPES:
            member = members[dtype]
            rows.append({
                "model": model, "dtype": dtype,
                "tokens_per_s": round(produced[dtype] / seconds[dtype], 2),
                "speed_vs_float32": round(seconds["float32"] / seconds[dtype], 2),
                "argmax_agreement": round(agree[dtype] / positions, 3),
                "same_greedy_text": f"{same[dtype]}/{len(PROMPTS)}",
                "weights_mb": round(sum(p.numel() * p.element_size() for p in member.model.parameters()) / 2**20, 1),
            })
        del members
    return rows


def gsm8k_report(models: list[str], max_new_tokens: int) -> dict:
    from shared_engine import EnsembleEngine
    from shared_engine.data_paths import gsm8k_file

    with gsm8k_file().open() as f:  # the data folder's test split, else the sample shipped in the package
        item = json.loads(f.readline())
    question = item["question"] + "\nSolve it step by step."
    gold = item["answer"].split("####")[-1].strip()
    answers = {}
    for dtype in ("float32", "bfloat16"):
        engine = EnsembleEngine(models, method="safe", dtype=dtype, max_new_tokens=max_new_tokens)
        result = engine.generate(question)
        answers[dtype] = {"final_number": _final_number(result.text), "tokens": result.stats.tokens,
                          "tokens_per_s": round(result.stats.tokens_per_s, 2),
                          "ensemble_rate": round(result.stats.ensemble_rate, 3), "text": result.text}
    return {"models": models, "gold": gold, "same_text": answers["float32"]["text"] == answers["bfloat16"]["text"],
            "same_final_number": answers["float32"]["final_number"] == answers["bfloat16"]["final_number"],
            **answers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--gsm8k-tokens", type=int, default=200)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
    import torch

    models = [m.strip() for m in args.models.split(",") if m.strip()]
    report: dict = {"torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                    "members": member_report(models, args.tokens)}
    if args.gsm8k_tokens:
        report["gsm8k_safe"] = gsm8k_report(models[:2], args.gsm8k_tokens)
    return emit_report(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
