"""What batching buys a llama.cpp server on this machine: N greedy completions decoding at once, one
per slot of one in-process server, against one alone. One JSON line per member and N: the decode
tokens per second summed over the N requests, the ratio to N = 1, and the server's own milliseconds
per decoded token.

    python scripts/decode_batch_cost.py
    python scripts/decode_batch_cost.py --models qwen2.5-coder-0.5b-instruct --levels 1,2,4,8 --tokens 128

Why it matters (docs/speed.md, "Load"): the load benchmark asks for tokens/s at 4 clients >= 2.5x
one client. With llama.cpp members concurrent requests only gain through the server batching their
decode steps (one slot each, one decode for all active slots); each prompt is read first in its slot and
only the decoding is timed, so this is the most the load benchmark's ratio can reach here, whatever the
engine and HTTP server around it do.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from shared_engine.members.llamacpp import LocalLlamaServer
from shared_engine.zoo import gguf_path

PROMPTS = [f"Write a short story about a {thing}. Use simple words." for thing in
           ("lighthouse keeper", "lost cat", "robot gardener", "mountain village", "river boat",
            "night train", "bakery", "snow day")]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct,gemma-3-270m")
    parser.add_argument("--levels", default="1,2,4", help="numbers of requests decoding at once (1 is always "
                                                          "measured: vs_one is relative to it)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens each request decodes")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="server threads (default: every core)")
    args = parser.parse_args(argv)
    levels = sorted({1, *(int(n) for n in args.levels.split(",") if n.strip())})  # vs_one needs N = 1 first
    if max(levels) > len(PROMPTS):
        raise SystemExit(f"decode_batch_cost: at most {len(PROMPTS)} requests at once")
    for name in args.models.split(","):
        server = LocalLlamaServer(gguf_path(name.strip(), progress=False), n_ctx=1024, slots=max(levels),
                                  threads=args.threads)
        client = httpx.Client(base_url=server.url, timeout=600)
        prompts = [client.post("/tokenize", json={"content": p}).json()["tokens"] for p in PROMPTS]

        def complete(slot: int, client: httpx.Client = client, prompts: list[list[int]] = prompts) -> dict:
            body = {"prompt": prompts[slot], "n_predict": args.tokens, "temperature": 0, "ignore_eos": True,
                    "id_slot": slot, "cache_prompt": True}
            return client.post("/completion", json=body).json()

        for slot in range(max(levels)):  # each slot reads its prompt once, untimed
            client.post("/completion", json={"prompt": prompts[slot], "n_predict": 1, "id_slot": slot,
                                             "cache_prompt": True})
        alone = 0.0  # N = 1's rate: levels start with 1
        for level in levels:
            rates, step_ms = [], []
            for _ in range(args.repeats):
                with ThreadPoolExecutor(level) as pool:
                    began = time.perf_counter()
                    results = list(pool.map(complete, range(level)))
                    wall = time.perf_counter() - began
                rates.append(sum(int(r["tokens_predicted"]) for r in results) / wall)
                step_ms += [float(r["timings"]["predicted_per_token_ms"]) for r in results]
            rate = statistics.median(rates)
            alone = alone or rate
            print(json.dumps({"member": name, "requests_at_once": level, "decode_tokens_per_s": round(rate, 2),
                              "vs_one": round(rate / alone, 2),
                              "server_ms_per_token_each": round(statistics.median(step_ms), 1)}), flush=True)
        client.close()
        server.close()


if __name__ == "__main__":
    main()
