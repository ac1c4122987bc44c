"""Rows in one batch for a llama.cpp member, measured against one decode step per row (docs/speed.md,
"On few-shot prompts"). llama-server has no prompt log-probabilities, so the engine asks one decode step
per row; its ``/embeddings`` endpoint with pooling ``none`` returns every prompt token's final-norm
hidden state from one batched pass, and the GGUF's own output layer (dequantized here to float32) turns
them into every row at once. This script serves each member with embeddings on and prints one JSON line
per member: the time for the rows both ways, each twice (the decode steps through the engine's own
``LlamaCppMember.score_at``), the output layer's dequantization time, and how the rows agree (top-1,
|Δp| on the top 5, per-token NLL).

    python scripts/one_pass_rows.py
    python scripts/one_pass_rows.py --models gemma-3-270m --tokens 700 --first 300

Architectures whose logits are exactly the final-norm state times the output weight only (llama, qwen2,
gemma3 here; Gemma 2 would need its soft-capping). Reads a BBH few-shot block from the benchmark data.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from shared_engine.data_paths import data_dir
from shared_engine.members.llamacpp import LlamaCppMember, LocalLlamaServer
from shared_engine.members.remote import load_tokenizer
from shared_engine.members.topk import TopK, topk_rows
from shared_engine.zoo import gguf_path


def output_weight(gguf: str) -> torch.Tensor:
    from gguf import GGUFReader
    from gguf.quants import dequantize

    tensors = {t.name: t for t in GGUFReader(gguf).tensors}
    tensor = tensors.get("output.weight") or tensors["token_embd.weight"]
    hidden, vocab = (int(n) for n in tensor.shape[:2])
    return torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).reshape(vocab, hidden).astype("float32"))


def one_pass_rows(member: LlamaCppMember, weight: torch.Tensor, ids: list[int], first: int, k: int) -> list[TopK]:
    """One embeddings pass, then the output layer here; each row keeps the next token's exact probability."""
    hidden = torch.tensor(member.client.post("/embeddings", {"content": ids, "id_slot": 0})[0]["embedding"])
    entries = []
    for start in range(first - 1, len(ids) - 1, 64):
        logp = torch.log_softmax(hidden[start:min(start + 64, len(ids) - 1)] @ weight.T, dim=-1)
        values, top = logp.topk(k, dim=-1)
        for row in range(logp.shape[0]):
            row_ids, row_values = top[row].tolist(), values[row].tolist()
            nxt = ids[start + row + 1]
            if nxt not in row_ids:
                row_ids, row_values = row_ids + [nxt], row_values + [float(logp[row, nxt])]
            entries.append(TopK(row_ids, row_values))
    return entries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,gemma-3-270m")
    parser.add_argument("--tokens", type=int, default=700, help="prompt tokens (of a BBH few-shot block)")
    parser.add_argument("--first", type=int, default=300, help="the first row asked (tokens before it: prefilled)")
    parser.add_argument("--top-k", type=int, default=20)
    args = parser.parse_args()
    text = (data_dir() / "bbh" / "cot-prompts" / "date_understanding.txt").read_text()
    for name in args.models.split(","):
        name = name.strip()
        server = LocalLlamaServer(gguf_path(name, progress=False), n_ctx=4096, slots=1, embeddings=True)
        member = LlamaCppMember(name, server.url, load_tokenizer(name), server=server, context_window=4096)
        ids = member.server_tokenize(text)[:args.tokens]
        began = time.perf_counter()
        weight = output_weight(str(server.gguf))
        dequantize_s = time.perf_counter() - began
        times: dict[str, list[float]] = {"decode_steps": [], "one_pass": []}
        rows: dict[str, list[TopK]] = {}
        for _ in range(2):
            for how in times:
                began = time.perf_counter()
                # decode steps: the engine's own scoring (its session's first call reads ids[:first] from 0)
                rows[how] = (member.score_at(ids, list(range(args.first, len(ids))), slot=0, fresh=True)
                             if how == "decode_steps" else one_pass_rows(member, weight, ids, args.first, args.top_k))
                times[how].append(round(time.perf_counter() - began, 2))
        vocab = weight.shape[0]
        decoded, batched = (torch.softmax(topk_rows(rows[h], vocab), -1) for h in ("decode_steps", "one_pass"))
        top5 = decoded.topk(5, dim=-1).indices
        diff = (decoded.gather(1, top5) - batched.gather(1, top5)).abs()
        target = torch.tensor(ids[args.first:]).unsqueeze(1)
        both = (("decode_steps", decoded), ("one_pass", batched))
        nll = {h: -torch.log(p.gather(1, target)).squeeze(1) for h, p in both}
        print(json.dumps({"member": name, "prompt_tokens": len(ids), "rows": len(ids) - args.first,
                          "seconds": times, "dequantize_s": round(dequantize_s, 2),
                          "top1_agreement": round(float((decoded.argmax(-1) == batched.argmax(-1)).float().mean()), 3),
                          "top5_abs_dp_mean": round(float(diff.mean()), 4),
                          "top5_abs_dp_max": round(float(diff.max()), 3),
                          "nll_sum": {h: round(float(v.sum()), 1) for h, v in nll.items()}}), flush=True)
        member.close()


if __name__ == "__main__":
    main()
