"""Where SAFE's time goes over llama.cpp members, and what asking the verifier only for the rows the
drafter's confidence leaves undecided saves (#18). One process, the same GSM8K questions, in turn:
the drafter alone, SAFE asking for every row of each verified block (as before), SAFE at the default.

    python scripts/verify_cost.py                    # Qwen drafts, SmolLM2 verifies; 3 questions x 128 tokens
    python scripts/verify_cost.py --prompts 6 --repeats 2
    python scripts/verify_cost.py --models qwen2.5-coder-0.5b-instruct,gemma-3-270m --prompts-from flores:de-en

Per run it prints one JSON line: tokens/s, the split of the time (drafting, verifying, the rest) and
every scoring request the members' servers answered, grouped by how many rows it asked for: count,
seconds in all and milliseconds each, and each member's rows per answer token and milliseconds per
row (a session's first request includes its prompt). llama.cpp has no prompt log-probabilities, so each
row costs the server one task; the default asks only for the rows at positions below ``drafter_confidence``.
``same_answers_as_first``: the same answers as this run's first repeat; ``same_answers_as_every_row`` (the
default's line): the same answers as asking every row, in the same repeat.
The machine is shared and noisy: compare runs within one invocation only.
"""

from __future__ import annotations

import argparse
import collections
import json
import time
from typing import Any

from shared_engine import EnsembleEngine
from shared_engine.bench import GSM8K_COT, bench_prompts
from shared_engine.decoding import round as round_module
from shared_engine.members import MemberConfig, llamacpp

RUNS = ("single", "safe:every-row", "safe")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=1, help="run the three in turn this many times")
    parser.add_argument("--prompts-from", default=GSM8K_COT, help="as bench's: gsm8k-cot, or e.g. flores:de-en")
    parser.add_argument("--data", help="as bench's --data")
    parser.add_argument("--reuse-prompt-cache", action="store_true",
                        help="members extend a prompt their slot holds (a shared system prompt computed once)")
    args = parser.parse_args(argv)
    members = [MemberConfig(model=f"llamacpp:{m.strip()}", reuse_prompt_cache=args.reuse_prompt_cache)
               for m in args.models.split(",")]
    requests: dict[str, list[tuple[int, float]]] = collections.defaultdict(list)
    send = llamacpp.LlamaCppMember._request

    def timed(self: llamacpp.LlamaCppMember, prompts: list[list[int]], *rest: Any, **options: Any) -> Any:
        began = time.perf_counter()
        try:
            return send(self, prompts, *rest, **options)
        finally:
            requests[self.name].append((len(prompts), time.perf_counter() - began))

    llamacpp.LlamaCppMember._request = timed  # type: ignore[method-assign]
    undecided = round_module._undecided_offsets
    prompts, stop, _ = bench_prompts(args)
    answers: dict[str, list[str]] = {}  # each run's answers in its first repeat
    every_row: list[str] = []  # this repeat's answers of safe:every-row (RUNS has it before safe)
    for _ in range(args.repeats):
        for run in RUNS:
            method = run.split(":")[0]
            round_module._undecided_offsets = (lambda *a: None) if run.endswith("every-row") else undecided
            engine = EnsembleEngine(members[:1] if method == "single" else members, method=method)
            engine.generate("Say hi.", max_new_tokens=4)  # warm-up: servers started, token tables built
            requests.clear()
            tokens = elapsed = drafting = verifying = 0.0
            texts = []
            for prompt in prompts:
                stats = (result := engine.generate(prompt, max_new_tokens=args.max_new_tokens, stop=stop)).stats
                texts.append(result.text)
                tokens, elapsed = tokens + stats.tokens, elapsed + stats.elapsed_s
                drafting, verifying = drafting + stats.draft_s, verifying + stats.verify_s
            engine.close()
            row: dict[str, Any] = {
                "run": run, "tokens": int(tokens), "tokens_per_s": round(tokens / elapsed, 2),
                "time_s": {"draft": round(drafting, 2), "verify": round(verifying, 2),
                           "rest": round(elapsed - drafting - verifying, 2)},
                "same_answers_as_first": answers.setdefault(run, texts) == texts}  # this run's first repeat
            if run == "safe":  # the default asks fewer rows: the same answers as asking every row?
                row["same_answers_as_every_row"] = texts == every_row
            if run == "safe:every-row":
                every_row = texts
            for name, sent in requests.items():
                by_rows: dict[int, list[float]] = collections.defaultdict(list)
                for rows, seconds in sent:
                    by_rows[rows].append(seconds)
                row[name] = {f"{rows} rows": [len(s), round(sum(s), 2), round(1000 * sum(s) / len(s), 1)]
                             for rows, s in sorted(by_rows.items())}
                rows_sent = sum(rows for rows, _ in sent)
                row[name]["rows_per_token"] = round(rows_sent / tokens, 3) if tokens else 0.0
                row[name]["ms_per_row"] = round(1000 * sum(s for _, s in sent) / rows_sent, 1) if rows_sent else 0.0
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
