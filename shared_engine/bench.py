"""``safe-ensemble bench``: drafter alone, SAFE and every-token on the same prompts, one process.

Speed is reported as ratios measured in one run (the machine is shared and noisy). Every method
uses the same members, the same cache machinery and the same prompts; a warm-up request runs
first so one-time costs (token tables, the first forward) are not counted. The methods take turns
prompt by prompt (each first in turn), so a drift in the machine's speed falls on all of them, and a
variant's ratio to its method is also given per prompt (``per_prompt_vs_<method>``).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from .data_paths import gsm8k_file
from .engine_args import OneLineErrorParser, add_engine_args, check_output_file, engine_from_args
from .errors import InvalidRequestError
from .evaluation.benchmarks import get_benchmark
from .events import mean_draft_length
from .loading import load_with_notice
from .members import LOCAL_BACKENDS
from .options import METHODS, EngineOptions

if TYPE_CHECKING:
    from .engine import EnsembleEngine

COT_INSTRUCTION = "Solve the problem step by step, then give the final number after '####'."
GSM8K_COT = "gsm8k-cot"
Prompt = str | list[dict[str, str]]


def gsm8k_questions(path: str | None, limit: int) -> list[str]:
    """The first ``limit`` GSM8K questions: from ``path``, the full data, or the packaged sample. Blank
    lines are skipped; a line that is no JSON object with a ``question`` is an error naming the file and
    line (it was a JSONDecodeError or KeyError traceback, where eval and calibrate say one line)."""
    file = gsm8k_file(path)
    questions: list[str] = []
    try:
        with file.open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if len(questions) >= limit:
                    break
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as err:
                    raise InvalidRequestError(f"{file}, line {number}: not JSON ({err.msg}); --data takes a "
                                              'GSM8K-format JSONL file, one {"question": ...} per line') from None
                if not isinstance(row, dict) or not isinstance(row.get("question"), str):
                    raise InvalidRequestError(f"{file}, line {number}: no \"question\" string; --data takes a "
                                              'GSM8K-format JSONL file, one {"question": ...} per line')
                questions.append(f"{row['question']}\n{COT_INSTRUCTION}")
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{file} is not UTF-8 text; --data takes a GSM8K-format JSONL file") from None
    if not questions:
        raise InvalidRequestError(f"{file} holds no questions; --data takes a GSM8K-format JSONL file")
    return questions


def bench_prompts(args: argparse.Namespace) -> tuple[list[Prompt], list[str], str]:
    """The prompts the bench answers, the stop strings they are answered with, and where they came from.

    The default (``gsm8k-cot``) is GSM8K questions with a step-by-step instruction; ``--prompts-from
    NAME[:PAIR]`` takes an eval benchmark's first prompts exactly as ``safe-ensemble eval`` asks them
    (few-shot turns, system prompt and stop strings included), because speed depends on the workload:
    a translation is fused at ~20-25% of its positions, a GSM8K answer at ~5%."""
    source = getattr(args, "prompts_from", None) or GSM8K_COT
    if source == GSM8K_COT:
        return list(gsm8k_questions(args.data, args.prompts)), [], str(gsm8k_file(args.data))
    name, _, pair = source.partition(":")
    try:
        benchmark = get_benchmark(name, data=args.data, pair=pair or "en-de")
        records = benchmark.dataset().records[:args.prompts]
        prompts: list[Prompt] = [benchmark.messages(record) for record in records]
    except InvalidRequestError as error:
        raise InvalidRequestError(f"--prompts-from {source}: {error}") from None
    return prompts, list(benchmark.stop), str(benchmark.path)


def _backends(value: str) -> list[str]:
    backends = [b.strip() for b in value.split(",") if b.strip()]
    unknown = [b for b in backends if b not in LOCAL_BACKENDS]
    if not backends or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(LOCAL_BACKENDS)}")
    return backends


def method_entries(value: str) -> list[str]:
    """``--methods`` split into its entries at commas, except a comma inside an entry's flag value:
    a piece that names no method continues the entry before it when that entry sets flags, so
    ``single,safe:weights=2,1`` is single and ``safe:weights=2,1`` (it was an "unknown method '1'")."""
    entries: list[str] = []
    for piece in value.split(","):
        head = piece.split(":", 1)[0].strip()
        if entries and ":" in entries[-1] and head not in METHODS:
            entries[-1] += "," + piece
        elif piece.strip():
            entries.append(piece)
    return [entry.strip() for entry in entries]


def _method_list(value: str) -> str:
    """``--methods`` as given, refused when it names no method (``","`` ran nothing and then failed
    on the empty results, after the members had loaded)."""
    if not method_entries(value):
        raise argparse.ArgumentTypeError("name at least one method, e.g. single,safe")
    return value


def _at_least_one(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return number


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="drafter alone vs SAFE vs every-token vs AdaFuse on the same prompts")
    add_engine_args(bench)
    bench.add_argument("--prompts", type=_at_least_one, default=4, help="number of prompts (the first of the data)")
    bench.add_argument("--prompts-from", default=GSM8K_COT, metavar="NAME[:PAIR]",
                       help="gsm8k-cot (default: GSM8K questions with a step-by-step instruction), or an "
                            "eval benchmark's prompts as eval asks them, e.g. flores:de-en, triviaqa, bbh")
    bench.add_argument("--data", help="for gsm8k-cot a GSM8K-format JSONL file (default: the data folder's "
                            "gsm8k/test.jsonl, else the GSM8K sample shipped in the package); for a benchmark, "
                            "its file or the data folder (as eval's --data)")
    bench.add_argument("--methods", type=_method_list, default="single,safe,every-token,adafuse",
                       help="comma-separated (default: %(default)s); an entry may change engine flags for itself, e.g. "
                            "safe:draft-schedule=adaptive, and is then compared with its method (vs_safe, "
                            "same_answers_as_safe); a flag's value may hold commas (safe:weights=2,1). With "
                            "--drafter auto, single runs the first member")
    bench.add_argument("--repeats", type=_at_least_one, default=1,
                       help="answer every prompt this many times per method (ratios steadier on a noisy machine)")
    bench.add_argument("--json", help="write the results here")
    bench.add_argument("--backend", type=_backends,
                       help="how zoo names without a prefix run: llamacpp, transformers, or both "
                            "(transformers,llamacpp) to measure them in one run (default: each model's "
                            "default backend, llamacpp for zoo names)")
    bench.set_defaults(max_new_tokens=128)


def run(args: argparse.Namespace) -> int:
    """Measure, print the results as JSON and write them to ``--json`` if given (checked first; the
    results are printed before the file is written, so a failed write loses nothing)."""
    if args.json:
        args.json = str(Path(args.json).expanduser())  # --json=~/x.json: no shell expands ~ after '='
        check_output_file(Path(args.json), "--json", "results'")
    try:
        results = run_bench(args)
    except KeyboardInterrupt:  # before every method answered a prompt: it exited 130 without a word
        print(f"interrupted before every method answered a prompt: nothing measured"
              f"{f', nothing written to {args.json}' if args.json else ''}", file=sys.stderr)
        return 130
    text = json.dumps(results, indent=2)
    print(text, flush=True)
    if args.json:
        try:
            with open(args.json, "w") as f:
                f.write(text + "\n")
        except OSError as err:
            print(f"error: cannot write the results to {args.json} ({err.strerror or err}); they are printed above",
                  file=sys.stderr)
            return 2
    if args.json and not results.get("interrupted"):  # where they went, after a screenful of JSON
        print(f"results written to {args.json}", file=sys.stderr)
    if results.get("interrupted"):  # as eval: what was measured is kept, and the exit status says Ctrl-C
        print(f"interrupted: the results above cover the prompts every method answered before Ctrl-C"
              f"{f' (also in {args.json})' if args.json else ''}", file=sys.stderr)
        return 130
    return 0


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    """One backend (``--backend``, default: each model's own, ``default_backend``): the results.
    Several (``--backend transformers,llamacpp``): each backend's results under ``backends``, plus per
    method ``<method>_<backend>_vs_<first backend>`` (tokens/s ratio) and
    ``<method>_<backend>_agreement_with_<first backend>`` (how far the greedy answers agree: the same
    weights run by other kernels can flip a near-tie, after which the texts part)."""
    chosen = getattr(args, "backend", None) or [None]
    backends: list[str | None] = [chosen] if isinstance(chosen, str) else list(chosen)
    if len(backends) == 1:
        return _run_backend(args, backends[0])[0]
    runs: dict[str | None, tuple[dict[str, Any], dict[str, list[str]]]] = {}
    stopped, asked = False, list(backends)
    for b in backends:  # a Ctrl-C ends the run: the backends measured so far are reported
        try:
            runs[b] = _run_backend(args, b)
        except KeyboardInterrupt:  # before this backend measured a prompt
            if not runs:
                raise
            stopped = True
        if stopped or runs[b][0].get("interrupted"):
            stopped, backends = True, list(runs)
            break
    by_backend = {str(b): results for b, (results, _) in runs.items()}
    results: dict[str, Any] = {"backends": by_backend, "note": "measured in one process, one after the other"}
    if stopped:
        results["interrupted"] = True
        results["backends_asked"] = [str(b) for b in asked]
    base = str(backends[0])
    for other in map(str, backends[1:]):
        for method, row in by_backend[other]["methods"].items():
            key = f"{method.replace('-', '_')}_{other}"
            reference = by_backend[base]["methods"].get(method, {}).get("tokens_per_s")
            if reference:
                results[f"{key}_vs_{base}"] = round(row["tokens_per_s"] / reference, 3)
            base_answers, other_answers = runs[backends[0]][1].get(method), runs[other][1].get(method)
            if base_answers and other_answers:
                results[f"{key}_agreement_with_{base}"] = answer_agreement(base_answers, other_answers)
    return results


def answer_agreement(first: list[str], second: list[str]) -> dict[str, Any]:
    """How two runs' answers to the same prompts agree: how many are identical, and the mean share of
    each answer (in characters of the longer one) that the two have in common before they part."""
    shared = [1.0 if a == b else len(os.path.commonprefix([a, b])) / max(len(a), len(b))
              for a, b in zip(first, second, strict=True)]
    return {"identical": sum(a == b for a, b in zip(first, second, strict=True)), "answers": len(shared),
            "mean_shared_prefix": round(sum(shared) / len(shared), 3) if shared else 0.0}


class _Totals:
    """One method's counters summed over the bench's answers."""

    def __init__(self) -> None:
        self.tokens = self.elapsed = self.ensembled = self.spans = self.fused_spans = 0.0
        self.drafting = self.verifying = self.ahead = self.ahead_used = 0.0
        self.first_token_s, self.first_tokens = 0.0, 0  # seconds to the answers' first tokens, and how many
        self.choosing, self.answers = 0.0, 0  # drafter='auto': seconds the choice took (part of the first token's)
        self.forwards: dict[str, int] = {}
        self.lengths: dict[int, int] = {}

    def add(self, stats: Any) -> None:
        self.tokens += stats.tokens
        self.elapsed += stats.elapsed_s
        self.ensembled += stats.ensembled_tokens
        self.spans += stats.spans
        self.fused_spans += stats.fused_spans
        self.drafting += stats.draft_s
        self.verifying += stats.verify_s
        self.ahead += stats.ahead_drafts
        self.ahead_used += stats.ahead_drafts_used
        self.choosing += stats.drafter_choice_s
        self.answers += 1
        if stats.time_to_first_token_s is not None:
            self.first_token_s += stats.time_to_first_token_s
            self.first_tokens += 1
        for name, count in stats.forward_passes.items():
            self.forwards[name] = self.forwards.get(name, 0) + count
        for length, rounds in stats.draft_lengths.items():
            self.lengths[length] = self.lengths.get(length, 0) + rounds

    def row(self, options: EngineOptions) -> dict[str, Any]:
        tokens, elapsed = self.tokens, self.elapsed
        return {
            "tokens": int(tokens), "elapsed_s": round(elapsed, 3),
            "tokens_per_s": round(tokens / elapsed, 3) if elapsed else 0.0,
            **({"mean_time_to_first_token_s": round(self.first_token_s / self.first_tokens, 3)}
               if self.first_tokens else {}),
            **({"mean_drafter_choice_s": round(self.choosing / self.answers, 3)} if self.choosing else {}),
            **({"time_split_s": {"draft": round(self.drafting, 3), "verify": round(self.verifying, 3),
                                 "rest": round(elapsed - self.drafting - self.verifying, 3)}}
               if self.drafting else {}),
            "ensemble_rate": round(self.ensembled / tokens, 4) if tokens else 0.0,
            "forward_passes": self.forwards,
            "fusion": options.fusion, "sharpen": options.sharpen,  # each method's own defaults
            **({"fused_span_rate": round(self.fused_spans / self.spans, 4)} if self.spans else {}),
            "forward_passes_per_token": {k: round(v / tokens, 3) for k, v in self.forwards.items()} if tokens else {},
            **({"mean_draft_length": mean_draft_length(self.lengths),
                "draft_lengths": dict(sorted(self.lengths.items()))} if self.lengths else {}),
            **({"ahead_drafts": int(self.ahead), "ahead_drafts_used": int(self.ahead_used)} if self.ahead else {}),
        }


def paired_ratios(variant: list[float], base: list[float]) -> dict[str, Any]:
    """Per prompt, the variant's tokens/s over its method's (both answered it back to back): the
    geometric mean, the median and the range, and on how many prompts the variant was faster."""
    ratios = sorted(v / b for v, b in zip(variant, base, strict=True) if v and b)
    if not ratios:
        return {}
    middle = len(ratios) // 2
    median = ratios[middle] if len(ratios) % 2 else (ratios[middle - 1] + ratios[middle]) / 2
    return {"geometric_mean": round(math.exp(sum(map(math.log, ratios)) / len(ratios)), 3),
            "median": round(median, 3), "min": round(ratios[0], 3), "max": round(ratios[-1], 3),
            "faster_on": sum(r > 1 for r in ratios), "prompts": len(ratios)}


def parse_method(entry: str, args: argparse.Namespace) -> tuple[str, argparse.Namespace]:
    """A ``--methods`` entry: ``safe``, or a variant with engine flags changed, e.g.
    ``safe:draft-schedule=adaptive`` or ``safe:draft-schedule=adaptive:drafter-confidence=0.5`` (the
    flags of ``--help``, read by the same parser), so a lever on and off is measured in one run."""
    method, *overrides = entry.split(":")
    parser = OneLineErrorParser(prog=f"safe-ensemble bench --methods {entry}", add_help=False)
    parser.help_command = "safe-ensemble bench --help"  # the entry's flags are bench's
    add_engine_args(parser, members_required=False)
    flags = []
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep:  # a usage error as the entry's other ones (it was a bare line and exit status 1)
            parser.error(f"{override!r} in --methods is not flag=value")
        flags += [f"--{key.strip().replace('_', '-')}", value.strip()]
    method = method.strip()
    if method not in METHODS:  # before any member loads (run_bench parses every entry first)
        parser.error(f"unknown method {method!r} in --methods (choose from {', '.join(METHODS)})")
    return method, parser.parse_args(flags, namespace=copy.copy(args))  # unnamed flags keep args'


def _same_drafter(args: argparse.Namespace) -> tuple[argparse.Namespace, bool]:
    """``args`` with the drafter pinned to the first member where neither ``--drafter`` nor ``--profile``
    names one, and whether it was pinned. Single runs its drafter (the first member by default); SAFE's
    default ``drafter="auto"`` picks one per prompt, on a few-shot prompt maybe another member: its ratio
    to single would then divide two different models' speeds."""
    if args.drafter is not None or args.profile is not None:
        return args, False
    pinned = copy.copy(args)
    pinned.drafter = 0
    return pinned, True


def engine_settings(engine: EnsembleEngine) -> dict[str, Any]:
    """What a method ran with, read from its engine (flags, a profile and the method's defaults applied):
    the drafter (its label, or ``auto``: chosen per request), the weights (in member order, ``auto``, or
    None: ``drafter_weight`` for the drafter, 1 for each other), and SAFE's ``drafter_confidence``."""
    options = engine.options
    settings: dict[str, Any] = {"drafter": "auto" if options.drafter == "auto" else engine.labels[0]}
    if options.method != "single":
        settings["weights"] = options.weights
        if options.weights is None:
            settings["drafter_weight"] = options.drafter_weight_for(len(engine.member_specs))
    if options.method == "safe":
        settings["drafter_confidence"] = options.drafter_confidence
    if options.profile is not None:
        settings["profile"] = options.profile
    return settings


def _run_backend(args: argparse.Namespace, backend: str | None) -> tuple[dict[str, Any], dict[str, list[str]]]:
    """One backend's results, and each method's answers (for comparing backends)."""
    prompts, stop, source = bench_prompts(args)
    if len(prompts) < args.prompts:
        print(f"bench: {source} has only {len(prompts)} prompts", file=sys.stderr)
    entries = method_entries(args.methods)
    args, pinned = _same_drafter(args)
    results: dict[str, Any] = {"models": args.models, "backend": backend or "default", "prompts": len(prompts),
                               "prompts_from": getattr(args, "prompts_from", None) or GSM8K_COT,
                               "data": source, "stop": stop,
                               "max_new_tokens": args.max_new_tokens, "draft_length": args.draft_length,
                               "draft_schedule": args.draft_schedule,
                               "fusion": args.fusion, "sharpen": args.sharpen,
                               "drafter": None, "drafter_confidence": None, "drafter_weight": None,
                               "weights": None, "profile": args.profile,
                               "methods": {}}
    runs = [(entry, *parse_method(entry, args)) for entry in entries]  # a bad entry fails before any run
    single_pinned = False
    for index, (entry, method, method_args) in enumerate(runs):
        if method == "single" and method_args.drafter == "auto":  # single runs one member: the first
            runs[index] = (entry, method, argparse.Namespace(**{**vars(method_args), "drafter": 0}))
            single_pinned = True
    engines = {}
    for entry, method, method_args in runs:  # engines that ask for the same members share them
        engines[entry] = engine_from_args(method_args, method, backend)
        load_with_notice(engines[entry])
        engines[entry].generate("Say hi.", max_new_tokens=4)  # warm-up: loads members, builds token tables
    settings = {entry: engine_settings(engine) for entry, engine in engines.items()}
    # the run's settings as the engines hold them (flags, else the profile, else the method's defaults):
    # SAFE's where it runs, else the first method's
    reported = settings.get("safe") or settings[next(iter(settings))]
    results.update({key: reported.get(key) for key in ("drafter", "drafter_confidence", "drafter_weight", "weights")})
    if pinned:
        results["drafter_note"] = (
            "no --drafter or --profile: every method drafts with the first member, as single does, so the ratios "
            "compare methods drafting with the same model (SAFE's own default, drafter=auto, picks the drafter per "
            "prompt; measure it with a method entry such as safe:drafter=auto)")
    if single_pinned:
        results["single_drafter_note"] = (
            "drafter auto chooses among members per request; single runs one member, here the first, so the "
            "ratios to single compare the per-request choice with the first member alone")
    order, repeats = list(engines), max(1, getattr(args, "repeats", 1))
    # per prompt answered by every method (and repeat): each method's answers to it, first repeat first
    measured: list[dict[str, list[Any]]] = []
    with tqdm(total=len(prompts) * len(order) * repeats, desc="bench", file=sys.stderr) as bar:
        try:
            for i, prompt in enumerate(prompts):
                done: dict[str, list[Any]] = {entry: [] for entry in order}
                for repeat in range(repeats):
                    # every method answers this prompt before the next one, each first in turn: a drift of
                    # the machine's speed falls on all methods alike instead of on whichever ran last
                    shift = (i * repeats + repeat) % len(order)
                    for entry in order[shift:] + order[:shift]:
                        done[entry].append(engines[entry].generate(prompt, stop=stop))
                        bar.update()
                measured.append(done)  # whole prompts only: every method's numbers cover the same prompts
        except KeyboardInterrupt:  # Ctrl-C: the prompts measured so far are reported, not thrown away
            if not measured:
                raise
            results.update(interrupted=True, prompts=len(measured), prompts_asked=len(prompts))
    totals = {entry: _Totals() for entry in engines}
    answers: dict[str, list[str]] = {entry: [] for entry in engines}
    rates: dict[str, list[float]] = {entry: [] for entry in engines}  # tokens/s per prompt, for paired ratios
    for done in measured:
        for entry, replies in done.items():
            for reply in replies:
                totals[entry].add(reply.stats)
            answers[entry].append(replies[0].text)
            rates[entry].append(sum(r.stats.tokens / r.stats.elapsed_s if r.stats.elapsed_s else 0.0
                                    for r in replies) / len(replies))
    for entry in engines:
        results["methods"][entry] = {**totals[entry].row(engines[entry].options), **settings[entry]}
    results["repeats"] = repeats
    for entry, method, _ in runs:  # a variant against its method with the run's flags
        if entry != method and method in answers:
            row, reference = results["methods"][entry], results["methods"][method]["tokens_per_s"]
            row[f"vs_{method}"] = round(row["tokens_per_s"] / reference, 3) if reference else None
            row[f"same_answers_as_{method}"] = answers[entry] == answers[method]
            row[f"per_prompt_vs_{method}"] = paired_ratios(rates[entry], rates[method])
            single = results["methods"].get("single", {}).get("tokens_per_s")
            if single and method != "single":
                row["vs_single"] = round(row["tokens_per_s"] / single, 3)
    if "single" in rates:  # every ensemble method against the drafter alone, prompt by prompt
        for entry, method, _ in runs:
            if method != "single":
                results["methods"][entry]["per_prompt_vs_single"] = paired_ratios(rates[entry], rates["single"])
    by_method = results["methods"]
    for method, key in (("single", "single"), ("safe", "safe"), ("every-token", "every_token"),
                        ("adafuse", "adafuse")):
        if method in by_method:
            results[f"{key}_tokens_per_s"] = by_method[method]["tokens_per_s"]
    if "safe" in by_method:
        results["safe_ensemble_rate"] = by_method["safe"]["ensemble_rate"]
        if "single" in by_method and by_method["single"]["tokens_per_s"]:
            results["safe_vs_single"] = round(
                by_method["safe"]["tokens_per_s"] / by_method["single"]["tokens_per_s"], 3)
        if "every-token" in by_method and by_method["every-token"]["tokens_per_s"]:
            results["safe_vs_every_token"] = round(
                by_method["safe"]["tokens_per_s"] / by_method["every-token"]["tokens_per_s"], 3)
    if "adafuse" in by_method:
        results["adafuse_fused_span_rate"] = by_method["adafuse"].get("fused_span_rate", 0.0)
        if "single" in by_method and by_method["single"]["tokens_per_s"]:
            results["adafuse_vs_single"] = round(
                by_method["adafuse"]["tokens_per_s"] / by_method["single"]["tokens_per_s"], 3)
    results["forward_passes_per_token"] = {m: r["forward_passes_per_token"] for m, r in by_method.items()}
    return results, answers
