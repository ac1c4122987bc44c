"""Which member fits each benchmark's prompts best, by three measures: the NLL per byte of the whole
message content, of the example answers only (the assistant turns: what ``drafter="auto"`` reads)
and of the rest (system and user turns). Printed as one JSON line per benchmark.

    python scripts/drafter_fit_probe.py                        # Qwen, Gemma, SmolLM2; 8 prompts each
    python scripts/drafter_fit_probe.py --models a,b --prompts 4 --benchmarks gsm8k,triviaqa

The README ("Which member drafts") compares these with the best single member measured on each
benchmark: only the example answers' NLL picked it everywhere. Zero-shot benchmarks have no example
answers (their ``answers`` is null). Reads the benchmark data (``SAFE_ENSEMBLE_DATA`` or ../shared).
"""

from __future__ import annotations

import argparse
import json
import statistics

from shared_engine.auto_weights import prefill_nlls
from shared_engine.evaluation.benchmarks import get_benchmark
from shared_engine.members import load_member
from shared_engine.members.chat import normalize_messages
from shared_engine.weighting import content_spans, fit_of, tokens_inside

# transformers members: exact distributions (zoo names alone would run on llama.cpp)
ZOO = tuple(f"transformers:{name}" for name in ("qwen2.5-coder-0.5b-instruct", "gemma-3-270m", "smollm2-135m-instruct"))
BENCHMARKS = ("gsm8k", "arc-challenge", "squad", "triviaqa", "nq", "bbh", "flores:en-de", "flores:de-en",
              "flores:en-ro", "mmlu-redux", "math500")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(ZOO))
    parser.add_argument("--prompts", type=int, default=8, help="prompts per benchmark (the first of the data)")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS), help="names; flores:PAIR for a FLORES pair")
    args = parser.parse_args()
    names = args.models.split(",")
    members = [load_member(n, progress=False) for n in names]
    for spec in args.benchmarks.split(","):
        name, _, pair = spec.partition(":")
        bench = get_benchmark(name, pair=pair or "en-de")
        fits: dict[str, dict[str, list[float]]] = {n: {"all": [], "answers": [], "rest": []} for n in names}
        for record in bench.dataset().records[:args.prompts]:
            messages = normalize_messages(bench.messages(record))
            parts = {"all": messages, "answers": [m for m in messages if m["role"] == "assistant"],
                     "rest": [m for m in messages if m["role"] != "assistant"]}
            for name_, member in zip(names, members):
                ids = member.prompt_ids(messages)
                lengths = [len(member.table.pieces[t]) for t in ids]
                rendered = member.table.to_bytes(ids)
                nlls = prefill_nlls(member.new_session(), ids)
                for part, chosen in parts.items():
                    spans = content_spans(rendered, [str(m["content"]) for m in chosen])
                    fit = fit_of(nlls, lengths, tokens_inside(lengths, spans))
                    if fit.num_bytes:
                        fits[name_][part].append(fit.nll_per_byte)
        row = {n: {part: round(statistics.mean(v), 4) if v else None for part, v in parts_.items()}
               for n, parts_ in fits.items()}
        print(json.dumps({"benchmark": spec, "nll_per_byte": row}), flush=True)


if __name__ == "__main__":
    main()
