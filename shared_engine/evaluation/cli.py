"""``safe-ensemble eval``: run a benchmark, or ``eval compare DIR...`` to tabulate and plot runs.

    safe-ensemble eval --bench gsm8k --models qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct \\
        --method safe --limit 100 --out runs/gsm8k-safe [--resume]
    safe-ensemble eval compare runs/gsm8k-* --plots runs/plots
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path

from ..engine_args import add_engine_args, default_method, engine_from_args
from ..errors import InvalidRequestError
from ..member_flags import BACKEND_HELP, member_configs
from ..members import LOCAL_BACKENDS
from ..members.spec import default_backend, parse_member_spec, split_prefix, with_backend
from ..options import METHODS, GenerationParams
from .benchmarks import BENCHMARKS, FLORES_PAIRS, get_benchmark
from .runner import CONFIG, SAMPLES, SUMMARY, RunConfig, check_start, evaluate


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("eval", help="accuracy / speed of a method on a benchmark (or: eval compare DIR...)",
                            description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_engine_args(parser)
    for group in parser._mutually_exclusive_groups:  # --models/--members: not needed by `eval compare`;
        group.required = False                          # checked in run
    parser.set_defaults(max_new_tokens=None)
    parser.add_argument("--bench", choices=BENCHMARKS)
    parser.add_argument("--backend", choices=LOCAL_BACKENDS, help=BACKEND_HELP)
    parser.add_argument("--method", choices=METHODS, help="default: safe (single with one model)")
    parser.add_argument("--pair", choices=FLORES_PAIRS,
                        help="flores language pair (default: the --data file's, named PAIR.jsonl; else en-de)")
    parser.add_argument("--limit", type=int, help="first N questions (BBH / MMLU-Redux: interleaved over tasks)")
    parser.add_argument("--data", help="benchmark file or folder (default: $SAFE_ENSEMBLE_DATA or ../shared/data); "
                                         "'sample': the GSM8K sample the package ships")
    parser.add_argument("--out", help="output folder (default: eval-runs/BENCH-METHOD-MODELS, "
                                          "with -PROFILE (the file's name) after it under --profile)")
    parser.add_argument("--resume", action="store_true", help="continue a run: skip questions already answered")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress output: no loading notice, no bar per question, no bars of the zoo's "
                             "one-time GGUF verification or conversion")
    commands = parser.add_subparsers(dest="eval_command")
    compare = commands.add_parser("compare", help="table and PNG plots of several eval folders")
    compare.add_argument("dirs", nargs="+", help="folders holding summary.json")
    compare.add_argument("--plots", help="folder for the PNG plots (default: plots/ beside the runs, in the "
                                         "folder that holds them all)")
    compare.add_argument("--json", help="also write the rows as JSON here")
    compare.add_argument("--baseline", help="one of the folders: count per question where each run wins / loses")
    compare.add_argument("--by-group", action="store_true",
                         help="with --baseline: the paired count within each group too (BBH task, MMLU-Redux subject)")


def _short(model: str) -> str:
    backend, name = split_prefix(model)
    return Path(name).name.split("-")[0] + (f"@{backend}" if backend else "")


def _as_run(models: list[str], backend: str | None) -> list[str]:
    """The models as the run records them: a bare name that ``--backend`` runs on another backend
    than its default (``--backend transformers`` for a zoo name) carries that backend, so the run is
    neither resumed as nor compared with the default backend's run (the answers differ)."""
    if backend is None:
        return models
    recorded = []
    for model in models:
        prefix, target = split_prefix(model)
        moved = prefix is None and parse_member_spec(model, backend).backend != default_backend(target)
        recorded.append(with_backend(model, backend) if moved else model)
    return recorded


def _drafter(args: argparse.Namespace, drafter: str | int | None) -> str:
    """The drafter's model; ``drafter`` is the engine's resolved option (a profile may have set it):
    an index, a model or a member's display name."""
    if drafter is None:
        return args.models[0]
    if isinstance(drafter, int) or drafter.isdigit():
        return args.models[int(drafter)]
    named = {c.name: c.model for c in member_configs(args, args.backend) if c.name}
    return named.get(drafter, drafter)


def default_plots_dir(dirs: list[Path]) -> Path:
    """``plots/`` in the folder that holds every compared run (not the current folder: run from a
    checkout, that left an untracked ``eval-plots/`` there)."""
    parents = [d.resolve().parent for d in dirs]
    common = Path(os.path.commonpath(parents)) if parents else Path.cwd()
    return common / "plots"


def _recorded_profile(profile: str | None, out: Path, resume: bool) -> str | None:
    """The profile as the run records it: its resolved path, so ``--resume`` with the same file spelled
    another way (p.json, ./p.json, its absolute path, ~/...) continues the run; a run that recorded
    another spelling of the same file (as given, before) keeps it."""
    if profile is None:
        return None
    here = Path(profile).expanduser().resolve()
    if resume:
        try:
            previous = json.loads((out / CONFIG).read_text())["engine_options"].get("profile")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            previous = None
        if isinstance(previous, str) and Path(previous).expanduser().resolve() == here:
            return previous
    return str(here)


FITS = "answer-fits.sqlite"
"""drafter='auto': the run's example-answer fits, beside its samples (``--fit-cache`` puts them elsewhere)."""


def run(args: argparse.Namespace) -> int:
    if args.eval_command == "compare":
        from .compare import compare_runs

        dirs = [Path(d) for d in args.dirs]
        print(compare_runs(dirs, Path(args.plots) if args.plots else default_plots_dir(dirs), args.json,
                           Path(args.baseline) if args.baseline else None, args.by_group))
        return 0
    if not args.bench or not args.models:
        raise InvalidRequestError("eval needs --bench and --models or --members (or: eval compare DIR...)")
    if args.pair is not None and args.bench != "flores":  # else ignored without a word: the user thinks it ran
        raise InvalidRequestError(f"--pair {args.pair} is a FLORES language pair: --bench {args.bench} has none "
                                  "(drop --pair, or give --bench flores)")
    method = args.method or default_method(args.models)
    bench = get_benchmark(args.bench, args.data, args.pair)
    if args.max_new_tokens is None:  # 0 is refused with the engine options, not read as "the default"
        args.max_new_tokens = bench.max_new_tokens
    # `single` runs the drafter alone (a profile may name it: the engine resolves which)
    single = engine_from_args(args, method, progress=not args.no_progress) if method == "single" else None
    given = [_drafter(args, single.options.drafter)] if single else args.models
    models = _as_run(given, args.backend)
    # a bf16 run is another run; a display name (MemberConfig.name) keys the stats and labels the run
    member_options = {c.model: c.model_dump(mode="json", exclude_none=True, exclude={"model"})
                      for c in member_configs(args, args.backend) if c.backend_options() or c.name}
    shown = [member_options.get(g, {}).get("name") or m for g, m in zip(given, models)]
    # a --profile run is another run than the plain one (other weights, drafter): its own folder
    profile = f"-{Path(args.profile).stem}" if args.profile else ""
    default = f"eval-runs/{bench.name}-{method}-{'+'.join(_short(m) for m in shown)}{profile}"
    out = Path(args.out or default).expanduser()  # `--out=~/run`: the shell expands no ~ after '='
    check_start(bench, out, args.limit)  # before the engine: its fit cache makes the folder
    # drafter='auto' keeps its fits beside the answers, so a run resumed in another process (tiers) finds its
    # few-shot blocks scored (EngineOptions drops the file where no drafter is chosen)
    engine = single or engine_from_args(args, method, fit_cache=str(out / FITS), progress=not args.no_progress)
    # the run's options (the loop guard too: it changes answers, the other generation parameters are the config's)
    options = engine.options.model_dump(exclude=set(GenerationParams.model_fields) - {"loop_guard"}
                                         | {"method", "fit_cache"})  # where fits are kept changes no choice
    options["profile"] = _recorded_profile(options.get("profile"), out, args.resume)
    config = RunConfig(bench=bench.name, models=models, method=method, max_new_tokens=args.max_new_tokens,
                       engine_options=options, member_options=member_options)
    try:
        summary = asyncio.run(evaluate(engine, bench, config, out, limit=args.limit, resume=args.resume,
                                       progress=not args.no_progress, interruptible_load=True))
    except KeyboardInterrupt:  # main exits 130 without a word: say that nothing answered is lost
        samples = out / SAMPLES
        if samples.is_file() and samples.stat().st_size:
            print(f"\ninterrupted: the answers so far are saved in {samples} ({SUMMARY} scores them, marked "
                  "interrupted); the same command with --resume continues", file=sys.stderr)
        raise
    score = summary["score"]
    ci = summary["ci95"]
    line = (f"{bench.name} {method} {'+'.join(shown)}: n={summary['n']} {bench.metric}="
            f"{score if score is not None else '-'}")
    if bench.metric != "chrf":
        line += f" (95% CI {ci[0]:.3f}-{ci[1]:.3f})"
    print(f"{line} ensemble_rate={summary['ensemble_rate']:.1%} {summary['tokens_per_s']} tok/s "
          f"truncated={summary['truncated']} failures={summary['failures']} skipped={summary['skipped']} -> {out}")
    if summary.get("transient_failures"):
        print(f"{summary['transient_failures']} question(s) failed for a passing reason: rerun with --resume")
    return 0
