"""Command line: ``safe-ensemble run`` streams an answer, ``safe-ensemble bench`` measures speed,
``safe-ensemble serve`` runs the OpenAI-compatible server, ``safe-ensemble eval`` measures accuracy
on a benchmark, ``safe-ensemble calibrate`` fits member weights, drafter and drafter_confidence on a
train/dev split into a profile (``--profile``).

Wiring and the ``run`` command only: ``bench`` (bench.py), ``serve`` (server/command.py), ``eval``
(evaluation/cli.py) and ``calibrate`` (calibration.py) each export ``add_parser(subparsers)`` and
``run(args)``; the engine flags they share live in engine_args.py. Nothing imports this module.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from . import bench, calibration
from .engine_args import OneLineErrorParser, add_engine_args, default_method, engine_from_args
from .errors import EnsembleError
from .evaluation import cli as eval_command
from .loading import load_with_notice
from .member_flags import BACKEND_HELP
from .members import LOCAL_BACKENDS
from .options import METHODS
from .server import command as serve_command

if TYPE_CHECKING:
    from .engine import EnsembleEngine

_HIGHLIGHT, _RESET = "\033[1;33m", "\033[0m"


def _add_run_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    run = sub.add_parser("run", help="stream one answer")
    add_engine_args(run)
    run.add_argument("--backend", choices=LOCAL_BACKENDS, help=BACKEND_HELP)
    run.add_argument("--method", choices=METHODS, help="default: safe (single with one model)")
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--seed", type=int)
    run.add_argument("--stop", action="append", help="stop string (repeatable)")
    run.add_argument("--events", action="store_true", help="print every event as a JSON line")
    run.add_argument("--no-color", action="store_true", help="do not highlight ensembled tokens")
    run.add_argument("--raw", action="store_true",
                     help="the prompt is text to continue, in no chat format (as /v1/completions reads it)")
    run.add_argument("prompt")


def _run(args: argparse.Namespace) -> int:
    """Check the request and load the members on the main thread, where Ctrl-C stops the load at once
    (loaded in a worker, Ctrl-C cancelled the run and ``asyncio.run`` then waited for the load to end);
    only the answer streams on the event loop."""
    method = args.method or default_method(args.models)
    engine = engine_from_args(args, method)
    params = {"temperature": args.temperature, "top_p": args.top_p, "seed": args.seed, "stop": args.stop or [],
              "raw_prompt": args.raw}
    engine.check_request(args.prompt, **params)  # a bad request fails before the members load
    load_with_notice(engine)
    return asyncio.run(_stream(args, engine, method, params))


async def _stream(args: argparse.Namespace, engine: EnsembleEngine, method: str, params: dict[str, Any]) -> int:
    color = sys.stdout.isatty() and not args.no_color
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
            print(flush=True)  # the answer's line ends on stdout too (`run ... > answer.txt`)
            print(f"\n[{method}] finish={event.reason} tokens={stats.tokens} "
                  f"ensembled={stats.ensembled_tokens} ({stats.ensemble_rate:.1%}) "
                  f"drafted={stats.drafted_tokens} accepted={stats.accepted_tokens} "
                  f"forwards={stats.forward_passes} ttft={stats.time_to_first_token_s or 0:.2f}s "
                  f"{stats.tokens_per_s:.1f} tok/s", file=sys.stderr)
    return 0


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": _run, "bench": bench.run, "serve": serve_command.run, "eval": eval_command.run,
    "calibrate": calibration.run,
}


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="safe-ensemble", description=__doc__.split("\n\n")[0])
    # the subcommands' parsers are OneLineErrorParsers; the modules adding them need only ArgumentParser's API
    sub = cast("argparse._SubParsersAction[argparse.ArgumentParser]",
               parser.add_subparsers(dest="command", required=True))
    _add_run_parser(sub)
    bench.add_parser(sub)
    serve_command.add_parser(sub)
    eval_command.add_parser(sub)
    calibration.add_parser(sub)  # `safe-ensemble calibrate`: shared_engine/calibration.py
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _COMMANDS[args.command](args)
    except EnsembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
