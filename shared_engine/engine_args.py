"""Engine flags and engine construction, shared by every command (``run``, ``bench``, ``serve``, ``eval``).

A leaf of the command line: the commands import it, it imports only the engine, so no command
imports another and nothing imports ``cli.py``. A new engine flag goes into ``add_engine_args`` and
``engine_from_args`` and reaches every command at once.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

from .errors import InvalidRequestError
from .member_flags import add_member_args, member_configs

if TYPE_CHECKING:
    from .engine import EnsembleEngine


class OneLineErrorParser(argparse.ArgumentParser):
    """One ``error:`` line for a mistyped flag or value, not the whole usage block above it (the
    subcommands' parsers are of this class too: ``add_subparsers`` makes them of the parent's).
    ``help_command``: where the options are listed (default: this parser's own ``--help``)."""

    help_command: str | None = None

    def error(self, message: str) -> NoReturn:
        where = self.help_command or f"{self.prog} --help"
        self.exit(2, f"{self.prog}: error: {message} (`{where}` lists the options)\n")


def weights_arg(value: str) -> list[float] | str:
    """``--weights 2,1``: one number per model; ``--weights auto``: per request (PackLLM-sim)."""
    if value.strip() == "auto":
        return "auto"
    try:
        weights = [float(w) for w in value.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError("comma-separated numbers, one per model, e.g. 2,1, or auto") from None
    if not all(math.isfinite(w) and w >= 0 for w in weights) or sum(weights) <= 0:
        raise argparse.ArgumentTypeError(f"weights must be finite, non-negative and not all zero, got {value}")
    return weights


def add_engine_args(parser: argparse.ArgumentParser, members_required: bool = True) -> None:
    """The flags that configure an ``EnsembleEngine`` (read back by ``engine_from_args``)."""
    add_member_args(parser, members_required)  # --models or --members FILE, --device, --dtype, ...
    parser.add_argument("--drafter", help="member that drafts (its name or index), or auto: per request, the "
                                          "member that best predicts the prompt's example answers (its few-shot "
                                          "turns; none: the first member). Default: auto for safe, the first "
                                          "member for the others")
    parser.add_argument("--fit-cache", metavar="FILE",
                        help="drafter auto: keep the members' fits of the prompt's example answers in this SQLite "
                             "file, so the next run does not score a few-shot block again (eval: default "
                             "OUT/answer-fits.sqlite)")
    parser.add_argument("--weights", type=weights_arg,
                        help="fusion weight of each model, in --models order, e.g. 2,1 (default: see "
                             "--drafter-weight), or auto: per request, from how well each model fits the "
                             "prompt (PackLLM-sim)")
    parser.add_argument("--drafter-weight", type=float,
                        help="with no --weights: the drafter's weight relative to each other model's 1 "
                             "(default for safe: twice the others together, i.e. 2 with two models, 4 with "
                             "three; else 1 = equal); with --profile: instead of the profile's weights")
    parser.add_argument("--weights-temperature", type=float, default=1.0,
                        help="--weights auto: softmax temperature over the prompt losses (default 1)")
    parser.add_argument("--profile", help="a profile from `safe-ensemble calibrate`: its weights, drafter and "
                                          "drafter confidence fill those not given here (--drafter-weight "
                                          "counts as weights given)")
    parser.add_argument("--draft-length", type=int, default=5,
                        help="tokens drafted per round (SAFE's gamma; default 5); adaptive: the first round's")
    parser.add_argument("--draft-schedule", choices=["fixed", "adaptive"], default="adaptive",
                        help="safe: fixed draft length, or adaptive: +2 after a round committed whole, -1 after "
                             "a fusion changed a token, within [1, --max-draft-length], and a draft ends after a "
                             "token the drafter gives less than --drafter-confidence (0.4 without one)")
    parser.add_argument("--max-draft-length", type=int, default=16, help="adaptive: the longest draft (default 16)")
    parser.add_argument("--overlap", choices=["auto", "on", "off"], default="auto",
                        help="safe: the drafter drafts the next round while the verifiers score this one "
                             "(the same answers); auto (default): on where a member is a server at a URL (vLLM, "
                             "SGLang, llama.cpp), off where all run in this process on its cores (docs/speed.md)")
    parser.add_argument("--fusion", choices=["unite", "gac"], help="default: gac for gac-threshold, else unite")
    parser.add_argument("--sharpen", choices=["heur", "heur-bytes", "geom", "none"],
                        help="default: heur for safe, else none; heur-bytes: the released code's pooling (every byte "
                             "extension; onto a whitespace-only candidate only ' ' is skipped there, all here)")
    parser.add_argument("--max-new-tokens", type=int,
                        help="answer length cap, in the drafter's tokens; a prompt that leaves no room for it is "
                             "refused. Unset (run, and serve's max_tokens of a chat request that sends none, "
                             "/v1/completions keeping OpenAI's 16): 256, or less where the prompt leaves less "
                             "room in a member's context window (the answer then ends with finish 'length' where "
                             "the window is full, as vLLM's or llama-server's would, not refused). Default 128 "
                             "for bench; eval: each benchmark's own")
    parser.add_argument("--drafter-confidence", type=confidence_arg,
                        help="safe: skip fusion where the drafter's probability is >= this (default 0.5); "
                             "none: the paper's consensus rule alone")
    parser.add_argument("--plausibility", type=confidence_arg,
                        help="fusion commits only a candidate the drafter gives at least this fraction of its "
                             "most likely candidate's probability (e.g. 0.1); none: off")
    parser.add_argument("--loop-guard", type=loop_guard_arg,
                        help="bytes an exact repetition at the answer's end may reach before no token may "
                             "repeat it further (e.g. 64), or none: off (the default)")
    parser.add_argument("--uncertainty", choices=["margin", "entropy"], default="margin",
                        help="adafuse: how a member's uncertainty is measured")
    parser.add_argument("--threshold", type=float,
                        help="adafuse: sure when margin >= this (default 0.7) or entropy <= this (0.6)")
    parser.add_argument("--max-words", type=int, default=3, help="adafuse: words per confident span")
    parser.add_argument("--num-candidates", type=int, default=3,
                        help="adafuse: continuations each member proposes where unsure")
    parser.add_argument("--candidate-temperature", type=float, default=0.0,
                        help="adafuse: sample candidates past their first token at this temperature")
    parser.add_argument("--vote", choices=["always", "uncertain"], default="always",
                        help="adafuse: vote every round (the released code) or only where every member is unsure")


def _number_or_none(cast: type[float] | type[int], what: str) -> Callable[[str], float | int | str]:
    """An argparse type: a number (``cast``), or ``none`` / ``off`` (kept as ``"none"``: the flag was
    given, and means None, unlike a flag left out)."""
    def parse(text: str) -> float | int | str:
        if text.strip().lower() in ("none", "off"):
            return "none"
        try:
            return cast(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} or 'none', got {text!r}") from None
    return parse


confidence_arg = _number_or_none(float, "a probability")
"""``--drafter-confidence``: a probability, or ``none`` for the paper's consensus rule alone."""
loop_guard_arg = _number_or_none(int, "a number of bytes")
"""``--loop-guard``: a length in bytes, or ``none`` for no guard."""


def default_method(models: list[str]) -> str:
    """The method when ``--method`` is not given: ``single`` for one model, else ``safe``."""
    return "single" if len(models) == 1 else "safe"


def method_default_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The flags whose default depends on the method (options.METHOD_DEFAULTS), only those given:
    each method's own default applies unless a flag says otherwise (``none`` = None)."""
    flags = ("fusion", "sharpen", "drafter_confidence", "drafter_weight", "plausibility", "loop_guard")
    return {k: None if v == "none" else v for k in flags if (v := getattr(args, k)) is not None}


def answer_length_flag(args: argparse.Namespace) -> dict[str, int]:
    """``--max-new-tokens`` where given (bench and eval fill theirs in), else nothing: an engine given
    none keeps its answer length unset, so a prompt that leaves less than the default 256 tokens of
    room is answered until the smallest window is full instead of refused (``EnsembleEngine``'s
    ``max_new_tokens``)."""
    return {} if args.max_new_tokens is None else {"max_new_tokens": args.max_new_tokens}


def engine_from_args(args: argparse.Namespace, method: str, backend: str | None = None,
                     fit_cache: str | None = None, progress: bool = True) -> EnsembleEngine:
    """An engine from ``add_engine_args``' flags; ``backend`` (default: ``args.backend``, else each
    model's default, ``default_backend``) runs the model names that carry no backend prefix; ``fit_cache``
    stands where ``--fit-cache`` is not given; ``progress``: the zoo's bars while members load (a
    command's ``--no-progress``: False). Members load on first request."""
    from .engine import EnsembleEngine  # torch and the members: not for --help or a usage error

    chosen = backend or getattr(args, "backend", None)
    backend = chosen if isinstance(chosen, str) or chosen is None else chosen[0]
    return EnsembleEngine(member_configs(args, backend), method=method, progress=progress,
                          drafter=args.drafter, weights=args.weights,
                          weights_temperature=args.weights_temperature, profile=args.profile,
                          fit_cache=getattr(args, "fit_cache", None) or fit_cache,
                          draft_length=args.draft_length, draft_schedule=args.draft_schedule,
                          max_draft_length=args.max_draft_length, overlap=args.overlap,
                          **method_default_flags(args), **answer_length_flag(args),
                          uncertainty=args.uncertainty, threshold=args.threshold, max_words=args.max_words,
                          num_candidates=args.num_candidates, candidate_temperature=args.candidate_temperature,
                          vote=args.vote)


def check_output_file(out: Path, flag: str, what: str) -> None:
    """``flag``'s file (``what`` it holds) can be written: checked before minutes of work, not after."""
    if out.is_dir():
        raise InvalidRequestError(f"{flag} {out} is a folder: give the {what} file name")
    folder = out.parent
    if not folder.is_dir():
        raise InvalidRequestError(f"{flag} {out}: the folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (out.exists() and not os.access(out, os.W_OK)):
        raise InvalidRequestError(f"{flag} {out} cannot be written (permission denied)")
