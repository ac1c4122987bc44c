"""Which member fits each benchmark's prompts best, by three measures: the NLL per byte of the whole
message content, of the example answers only (the assistant turns: what ``drafter="auto"`` reads)
and of the rest (system and user turns). Printed as one JSON line per benchmark.

    python scripts/drafter_fit_probe.py                        # Qwen, Gemma, SmolLM2; 8 prompts each
    python scripts/drafter_fit_probe.py --models a,b --prompts 4 --benchmarks gsm8k,triviaqa

docs/methods.md ("Which member drafts") compares these with the best single member measured on each
benchmark: only the example answers' NLL picked it everywhere. Zero-shot benchmarks have no example
answers (their ``answers`` is null). Reads the benchmark data (``SAFE_ENSEMBLE_DATA`` or ../shared).

``--strides 4,8`` also reports, per benchmark, how often ``drafter="auto"`` would pick the member it picks
reading every answer token if it read every k-th one (a way to save rows where a member pays per row,
i.e. llama.cpp; measured, not used: docs/speed.md, "On few-shot prompts"), over every phase of the sample
(token 0, 1, .., k-1 first) and for every set of two or more of the members (``same_choice``: agreeing /
decisions; ``worst_regret``: where they differ, how much higher the NLL per byte of every answer token is
for the member the sample picked). Prompts that share a few-shot block share the decision, so with
``--strides`` each block is read once (``blocks``).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics

from shared_engine.auto_weights import answer_tokens, example_answers, prefill_nlls
from shared_engine.evaluation.benchmarks import get_benchmark
from shared_engine.members import load_member
from shared_engine.members.chat import normalize_messages
from shared_engine.weighting import content_spans, fit_of, tokens_inside

# transformers members: exact distributions (zoo names alone would run on llama.cpp)
ZOO = tuple(f"transformers:{name}" for name in ("qwen2.5-coder-0.5b-instruct", "gemma-3-270m", "smollm2-135m-instruct"))
BENCHMARKS = ("gsm8k", "arc-challenge", "squad", "triviaqa", "nq", "bbh", "flores:en-de", "flores:de-en",
              "flores:en-ro", "mmlu-redux", "math500")


def count_agreement(samples: dict[tuple[int, int], dict[str, float]], names: list[str],
                    agree: dict[int, list[float]]) -> None:
    """Add to ``agree[k]`` (same, decisions, worst regret) for every (stride k, phase) sample and every
    set of two or more members: is the lowest NLL per byte the member's that reads every answer token,
    and if not, how much worse (relative, by every token) is the member the sample picked?"""
    full_fits = samples[(1, 0)]
    for size in range(2, len(names) + 1):
        for subset in itertools.combinations(names, size):
            full = min(subset, key=full_fits.__getitem__)
            for (k, _phase), fits in samples.items():
                if k > 1:
                    picked = min(subset, key=fits.__getitem__)
                    agree[k][0] += picked == full
                    agree[k][1] += 1
                    agree[k][2] = max(agree[k][2], full_fits[picked] / full_fits[full] - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--prompts", type=int, default=8, help="prompts per benchmark (the first of the data)")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="names; flores:PAIR for a FLORES pair")
    parser.add_argument("--strides", default="", help="e.g. 4,8: drafter='auto''s choice reading every k-th "
                                                     "answer token, against reading every one")
    args = parser.parse_args()
    strides = [int(s) for s in args.strides.split(",") if s.strip() and int(s) > 1]
    names = args.models.split(",")
    members = [load_member(n, progress=False) for n in names]
    for spec in args.benchmarks.split(","):
        name, _, pair = spec.partition(":")
        bench = get_benchmark(name, pair=pair or "en-de")
        fits: dict[str, dict[str, list[float]]] = {n: {"all": [], "answers": [], "rest": []} for n in names}
        agree: dict[int, list[float]] = {k: [0, 0, 0.0] for k in strides}  # same, decisions, worst regret
        seen: set[tuple[str, ...]] = set()
        for record in bench.dataset().records[:args.prompts]:
            messages = normalize_messages(bench.messages(record))
            block = tuple(example_answers(messages))
            if strides and block in seen:  # the same few-shot block: the same decision, count it once
                continue
            parts = {"all": messages, "answers": [m for m in messages if m["role"] == "assistant"],
                     "rest": [m for m in messages if m["role"] != "assistant"]}
            samples: dict[tuple[int, int], dict[str, float]] = {}  # (stride, phase) -> member -> NLL per byte
            for name_, member in zip(names, members):
                ids = member.prompt_ids(messages)
                pieces = [member.table.pieces[t] for t in ids]
                lengths = [len(piece) for piece in pieces]
                rendered = member.table.to_bytes(ids)
                nlls = prefill_nlls(member.new_session(), ids)
                every = answer_tokens(member, ids, list(block))
                for key in [(1, 0)] + [(k, phase) for k in strides for phase in range(k)]:
                    samples.setdefault(key, {})[name_] = fit_of(nlls, lengths, every[key[1]::key[0]]).nll_per_byte
                for part, chosen in parts.items():
                    spans = content_spans(rendered, [str(m["content"]) for m in chosen])
                    fit = fit_of(nlls, lengths, tokens_inside(pieces, spans))
                    if fit.num_bytes:
                        fits[name_][part].append(fit.nll_per_byte)
            if strides and all(math.isfinite(v) for v in samples[(1, 0)].values()):  # every member saw them
                seen.add(block)
                count_agreement(samples, names, agree)
        row = {n: {part: round(statistics.mean(v), 4) if v else None for part, v in parts_.items()}
               for n, parts_ in fits.items()}
        line: dict = {"benchmark": spec, "nll_per_byte": row}
        if strides and agree[strides[0]][1]:
            line["same_choice"] = {f"stride {k}": f"{same:.0f}/{total:.0f}" for k, (same, total, _) in agree.items()}
            line["worst_regret"] = {f"stride {k}": round(regret, 4) for k, (_, _, regret) in agree.items()}
            line["blocks"] = len(seen)
        print(json.dumps(line), flush=True)


if __name__ == "__main__":
    main()
