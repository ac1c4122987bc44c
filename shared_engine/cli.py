"""Command line: ``safe-ensemble run`` streams an answer, ``safe-ensemble bench`` measures speed,
``safe-ensemble serve`` runs the OpenAI-compatible server (shared_engine/server),
``safe-ensemble eval`` measures accuracy on a benchmark (shared_engine/evaluation/).

Argument parsing and printing only; all logic lives in the engine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys

from . import calibration
from .engine import EnsembleEngine
from .errors import EnsembleError
from .members import LOCAL_BACKENDS, with_backend
from .options import METHODS
from .server.command import add_serve_command

_HIGHLIGHT, _RESET = "\033[1;33m", "\033[0m"


def _models(value: str) -> list[str]:
    models = [m.strip() for m in value.split(",") if m.strip()]
    if not models:
        raise argparse.ArgumentTypeError("give at least one model")
    return models


def _backends(value: str) -> list[str]:
    backends = [b.strip() for b in value.split(",") if b.strip()]
    unknown = [b for b in backends if b not in LOCAL_BACKENDS]
    if not backends or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(LOCAL_BACKENDS)}")
    return backends


def _weights(value: str) -> list[float] | str:
    if value.strip() == "auto":
        return "auto"
    try:
        return [float(w) for w in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated numbers, one per model, e.g. 2,1, or auto") from None


def _add_engine_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models", type=_models, required=True,
                        help="comma-separated zoo names, local HF folders, .gguf paths or member specs "
                             "such as llamacpp:NAME, vllm:URL#TOKENIZER (see README, Remote members)")
    parser.add_argument("--drafter", help="member that drafts (default: the first)")
    parser.add_argument("--weights", type=_weights,
                        help="fusion weight of each model, in --models order, e.g. 2,1 (default: equal), or "
                             "auto: per request, from how well each model fits the prompt (PackLLM-sim)")
    parser.add_argument("--weights-temperature", type=float, default=1.0,
                        help="--weights auto: softmax temperature over the prompt losses (default 1)")
    parser.add_argument("--profile", help="a profile from `safe-ensemble calibrate`: its weights, drafter and "
                                          "drafter confidence fill those not given here")
    parser.add_argument("--draft-length", type=int, default=5)
    parser.add_argument("--fusion", choices=["unite", "gac"], default="unite")
    parser.add_argument("--sharpen", choices=["heur", "geom", "none"], default="heur")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--drafter-confidence", type=float,
                        help="safe: skip fusion where the drafter's probability is >= this (e.g. 0.5)")
    parser.add_argument("--uncertainty", choices=["margin", "entropy"], default="margin",
                        help="adafuse: how a member's uncertainty is measured")
    parser.add_argument("--threshold", type=float,
                        help="adafuse: sure when margin >= this (default 0.7) or entropy <= this (0.6)")
    parser.add_argument("--max-words", type=int, default=3, help="adafuse: words per confident span")
    parser.add_argument("--num-candidates", type=int, default=3,
                        help="adafuse: continuations each member proposes where unsure")
    parser.add_argument("--candidate-temperature", type=float, default=0.0,
                        help="adafuse: sample candidates past their first token at this temperature")


def _engine(args: argparse.Namespace, method: str, backend: str | None = None) -> EnsembleEngine:
    chosen = backend or getattr(args, "backend", None) or "transformers"
    backend = chosen if isinstance(chosen, str) else chosen[0]
    models = [with_backend(m, backend) for m in args.models]
    return EnsembleEngine(models, method=method, drafter=args.drafter, weights=args.weights,
                          weights_temperature=args.weights_temperature, profile=args.profile,
                          draft_length=args.draft_length,
                          fusion=args.fusion, sharpen=None if args.sharpen == "none" else args.sharpen,
                          drafter_confidence=args.drafter_confidence, max_new_tokens=args.max_new_tokens,
                          uncertainty=args.uncertainty, threshold=args.threshold, max_words=args.max_words,
                          num_candidates=args.num_candidates, candidate_temperature=args.candidate_temperature)


async def _run(args: argparse.Namespace) -> int:
    method = args.method or ("single" if len(args.models) == 1 else "safe")
    engine = _engine(args, method)
    color = sys.stdout.isatty() and not args.no_color
    params = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed, "stop": args.stop or []}
    async for event in engine.astream(args.prompt, **params):
        if args.events:
            print(event.model_dump_json(), flush=True)
        elif event.type == "token":
            text = event.text
            if event.source == "ensemble" and color:
                text = f"{_HIGHLIGHT}{text}{_RESET}"
            print(text, end="", flush=True)
        elif event.type == "finish":
            stats = event.stats
            print(f"\n\n[{method}] finish={event.reason} tokens={stats.tokens} "
                  f"ensembled={stats.ensembled_tokens} ({stats.ensemble_rate:.1%}) "
                  f"drafted={stats.drafted_tokens} accepted={stats.accepted_tokens} "
                  f"forwards={stats.forward_passes} ttft={stats.time_to_first_token_s or 0:.2f}s "
                  f"{stats.tokens_per_s:.1f} tok/s", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="safe-ensemble", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="stream one answer")
    _add_engine_args(run)
    run.add_argument("--backend", choices=LOCAL_BACKENDS, default="transformers",
                     help="how zoo names without a backend prefix run (default: transformers)")
    run.add_argument("--method", choices=METHODS, help="default: safe (single with one model)")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int)
    run.add_argument("--stop", action="append", help="stop string (repeatable)")
    run.add_argument("--events", action="store_true", help="print every event as a JSON line")
    run.add_argument("--no-color", action="store_true", help="do not highlight ensembled tokens")
    run.add_argument("prompt")

    bench = sub.add_parser("bench", help="drafter alone vs SAFE vs every-token vs AdaFuse on the same prompts")
    _add_engine_args(bench)
    bench.add_argument("--prompts", type=int, default=4, help="number of GSM8K questions")
    bench.add_argument("--data", help="a GSM8K-format JSONL file (default: ../shared/data/gsm8k/test.jsonl)")
    bench.add_argument("--methods", default="single,safe,every-token,adafuse")
    bench.add_argument("--json", help="write the results here")
    bench.add_argument("--backend", type=_backends, default=["transformers"],
                       help="how zoo names without a prefix run: transformers, llamacpp, or both "
                            "(transformers,llamacpp) to measure them in one run")
    bench.set_defaults(max_new_tokens=128)

    add_serve_command(sub, _add_engine_args)
    from .evaluation.cli import add_eval_parser  # `safe-ensemble eval`: shared_engine/evaluation/
    add_eval_parser(sub)
    calibration.add_parser(sub)  # `safe-ensemble calibrate`: shared_engine/calibration.py
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "run":
            return asyncio.run(_run(args))
        if args.command == "serve":
            from .server.command import serve
            return serve(args, _engine(args, args.method))
        if args.command == "calibrate":
            return calibration.run(args)
        if args.command == "eval":
            from .evaluation.cli import run_eval_command
            return run_eval_command(args)
        from .bench import run_bench
        results = run_bench(args)
        text = json.dumps(results, indent=2)
        if args.json:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        print(text)
        return 0
    except EnsembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
