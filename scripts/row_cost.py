"""What one scoring row costs each llama.cpp member: a server task with ``n_predict: 1`` that extends the
slot's prompt by one token (how ``score_at`` asks, llama.cpp having no prompt log-probabilities), by
prompt length and by ``n_probs``. One JSON line per member, median milliseconds per row.

    python scripts/row_cost.py
    python scripts/row_cost.py --models gemma-3-270m --lengths 20,200,600

Why it matters (docs/speed.md, "On translation prompts"): a verifier's rows are SAFE's cost on top of
the drafter, so a partner whose row costs as much as the drafter's decode step caps SAFE's speed at
1 / (1 + rows per token x row cost / drafter's step), whatever the engine does.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from shared_engine.members import load_member

TEXT = ("The quick brown fox jumps over the lazy dog while the committee discusses the annual budget "
        "and the weather in the northern provinces remains cold for most of the winter season. ") * 20


def row_ms(member: object, ids: list[int], start: int, n_probs: int, rows: int) -> float:
    """Median milliseconds of ``rows`` one-token extensions of ``ids[:start]`` in slot 0."""
    post = member.client.post  # type: ignore[attr-defined]
    base = {"n_predict": 1, "n_probs": n_probs, "temperature": 0, "id_slot": 0}
    post("/completion", {**base, "prompt": ids[:start], "cache_prompt": False})
    times = []
    for end in range(start + 1, start + rows + 1):
        began = time.perf_counter()
        post("/completion", {**base, "prompt": ids[:end], "cache_prompt": True})
        times.append(time.perf_counter() - began)
    return round(1000 * statistics.median(times), 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,gemma-3-270m,smollm2-135m-instruct")
    parser.add_argument("--lengths", default="20,200,600", help="prompt lengths in tokens")
    parser.add_argument("--n-probs", default="20,1,0", help="n_probs values (at the first length)")
    parser.add_argument("--rows", type=int, default=20)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    for name in args.models.split(","):
        member = load_member(f"llamacpp:{name.strip()}", progress=False)
        ids = member.server_tokenize(TEXT)  # type: ignore[attr-defined]
        if len(ids) < max(lengths) + args.rows:
            raise SystemExit(f"row_cost: the text has {len(ids)} tokens; use shorter --lengths")
        row = {"member": name, "vocabulary": len(member.table.pieces),
               "ms_per_row_by_prompt_length": {n: row_ms(member, ids, n, 20, args.rows) for n in lengths},
               "ms_per_row_by_n_probs": {k: row_ms(member, ids, lengths[0], k, args.rows)
                                         for k in map(int, args.n_probs.split(","))}}
        print(json.dumps(row), flush=True)
        member.close()  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
