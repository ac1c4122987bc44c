"""``safe-ensemble calibrate``: fit member weights, the drafter and ``drafter_confidence`` on a
labelled training/dev split and save them as a profile (profile.py).

Everything is teacher-forced (no generation, so it is cheap): each member reads the benchmark's
own prompt (the evaluation's few-shot messages, through its own chat template) followed by the
reference answer written the way the evaluation's exemplars are (GSM8K: the worked solution,
``The answer is N.``; ARC: ``The answer is (X) <option>.``), in ONE forward pass per member and
question. From the log-probabilities of the answer's tokens:

- **weights**: the mixture weights that maximise the likelihood of the reference answers, span by
  span between the byte offsets where every member has a token boundary (where SAFE fuses), under
  the weighted mean of the members' probabilities (what fusion computes); EM, weighting.py.
- **drafter**: the member with the lowest NLL per byte of the reference answers.
- **drafter_confidence**: at every fusable position (a shared boundary) the engine's fusion
  (UniTE, fusion.py) is run on the members' distributions with the fitted weights; a choice is
  right when the reference continues with it. The threshold (or None: always fuse, the paper's
  rule) that makes the most choices right is kept (``weighting.best_threshold``). Distributions
  are stored as their top ``STORED_TOP_K`` (the rest spread evenly, as for top-K server members)
  to keep memory flat; sharpening and the consensus skip are left out (they rarely change an
  argmax), so this is an estimate of the round's choice, stated as such in the profile.

Questions used as few-shot exemplars in the evaluation's prompt are skipped, and a test split is
refused: a profile must never be fitted on the questions it is evaluated on. A question longer than
a member's context window is left out, with a warning naming it, and the next question is read in
its place: ``--limit N`` fits on N questions where the split has them (fewer: a warning says how many).
A fit on fewer than 20 questions is warned about: its weights are unreliable (one question gave a member
weight 0.999997).

Ctrl-C while the questions are read fits on those read so far (a second Ctrl-C stops the fit) and
exits 130, as an interrupted eval does. The profile says so (``fitted.interrupted``, fitted on
``fitted.questions`` of ``fitted.asked``) and is written to --out where no file is there yet; an
existing file at --out (an earlier, full profile) is kept, and the partial fit is written beside it
as NAME.interrupted.json (move it over --out to use it). Interrupted before the first question is
read, nothing is written. A profile is written whole or not at all.
"""

from __future__ import annotations

import argparse
import logging
import math
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

from tqdm import tqdm

from .data_paths import find_data_dir, not_found
from .engine_args import check_output_file
from .errors import ContextLengthError, EnsembleError, InvalidRequestError
from .evaluation import prompts
from .evaluation.benchmarks import SAMPLE, Benchmark, get_benchmark
from .evaluation.datasets import Record
from .loading import loading_notice
from .members import load_member, with_backend
from .profile import EnsembleProfile, FitInfo, local_sources, member_keys

if TYPE_CHECKING:  # the fitting's own imports (torch, the token tables) wait for a fit: `--help` is instant
    import torch

    from .alignment import TokenizedText
    from .members import Member, Session
    from .members.topk import TopK

_log = logging.getLogger(__name__)

CALIBRATION_SPLITS = {"gsm8k": "gsm8k/train.jsonl", "arc-challenge": "arc_challenge/dev.jsonl"}
"""The labelled non-test split of each benchmark calibrate supports, under the data folder."""

CALIBRATE_BACKEND = "transformers"
"""How calibrate runs a model named without a backend prefix, a zoo name included (elsewhere llama.cpp):
transformers gives every position's full distribution; llama.cpp only its top 20, and a reference token
outside them gets the rest's even share (SmolLM2 on one GSM8K train answer: -96.4 nats against the exact
-88.3, one token 6.2 nats off), which the weights, the drafter and the threshold would be fitted on."""

THRESHOLD_GRID = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95)
STORED_TOP_K = 64
DEFAULT_QUESTIONS = 50
RELIABLE_QUESTIONS = 20
"""Fewer questions fitted on are warned about: weights fitted on one question (N=1) came out 0.999997 for
one member, a fit to that answer rather than to the members."""
LOGPROB_FLOOR = -100.0
"""A reference token a member gives no probability (-inf) counts as this log-probability in its NLL
per byte (the drafter choice; a profile holds finite numbers only); the weights see it as 0."""


def reference_answer(bench: str, record: Record) -> str:
    """The answer as the evaluation's exemplars write it (what a member is prompted to produce)."""
    if bench == "gsm8k":
        if not record.solution or "####" not in record.solution:
            raise InvalidRequestError(f"GSM8K record {record.id} has no worked solution")
        body, final = record.solution.rsplit("####", 1)
        return f"{re.sub(r'<<[^>]*>>', '', body).strip()}\nThe answer is {final.strip()}."
    answer = record.answers[0]
    text = next(c.text for c in record.choices if c.label == answer)
    return f"The answer is ({answer}) {text}."


def calibration_records(bench: str, data: str | None,
                        limit: int | None) -> tuple[Path, list[Record], Benchmark]:
    """The labelled records to fit on (exemplars and a test split refused; the first ``limit``, None:
    all), the data path and the benchmark whose prompts are used."""
    if bench not in CALIBRATION_SPLITS:
        raise InvalidRequestError(f"calibrate supports {sorted(CALIBRATION_SPLITS)}, not {bench!r}")
    root = find_data_dir()
    if data is None:
        if root is None:
            raise InvalidRequestError(f"{not_found()} (a GSM8K train / ARC dev file)")  # names where it looked
        path = _split_file(bench, [root / CALIBRATION_SPLITS[bench]], f"the data folder {root}")
    else:
        path = _given_split(bench, data)
    tests = _test_splits(bench, path, root)
    named_test = re.search(r"(^|[_\-.])test($|[_\-.])", path.stem.lower()) is not None
    if named_test or any(_same_file(path, test) for test in tests):
        raise InvalidRequestError(f"{path} is a test split: calibrate on training/dev data "
                                  f"({CALIBRATION_SPLITS[bench]}), never on the questions evaluated")
    benchmark = get_benchmark(bench, data=str(path))
    records = benchmark.load(path).records
    shots = {user for user, _ in _exemplars(benchmark)}
    kept = [r for r in records if _prompt_question(bench, r) not in shots]
    if not kept:
        raise InvalidRequestError(f"{path} has no questions left after removing the prompt's exemplars")
    evaluated = {_question_text(r) for test in tests for r in benchmark.load(test).records}
    fit = [r for r in kept if _question_text(r) not in evaluated]
    if len(fit) < len(kept):  # a renamed copy of the test split, or a question both splits share
        _log.warning("calibrate: %d of %d questions in %s are test questions (%s); left out",
                     len(kept) - len(fit), len(kept), path, ", ".join(map(str, tests)))
    if not fit:
        raise InvalidRequestError(f"every question in {path} is a test question: calibrate on training/dev "
                                  f"data ({CALIBRATION_SPLITS[bench]}), never on the questions evaluated")
    return path, fit[:limit] if limit is not None else fit, benchmark


def _given_split(bench: str, data: str) -> Path:
    """The split ``--data`` names: a file, the data folder (as eval's ``--data``) or the benchmark's own
    folder. ``sample`` (eval's packaged GSM8K sample) is refused for what it is, test questions; a
    folder without the split names both paths looked for: "--data /tmp" said "benchmark file not
    found: /tmp/train.jsonl", and ``sample`` "not found" with eval's hint to use ``--data sample``."""
    split = CALIBRATION_SPLITS[bench]
    path = Path(data).expanduser()
    if data == SAMPLE and not path.exists():
        raise InvalidRequestError(f"--data sample: the GSM8K sample the package ships is test questions (for "
                                  f"`eval --data sample`), and calibrate never fits on the questions evaluated; "
                                  f"{_split_help(bench)}")
    if path.is_dir():
        return _split_file(bench, [path / split, path / Path(split).name], f"the folder {path}")
    return _split_file(bench, [path], "--data")


def _split_file(bench: str, candidates: list[Path], where: str) -> Path:
    """The first of ``candidates`` that is a file (or a link, which the loader names if it is dangling);
    else an error naming every path looked for and what to give."""
    for candidate in candidates:
        if candidate.is_file() or candidate.is_symlink():
            return candidate
    looked = " nor ".join(str(c) for c in candidates)
    _no_split(bench, f"--data {looked}: no such file" if where == "--data" else f"{where}: no {looked}")


def _no_split(bench: str, what: str) -> NoReturn:
    raise InvalidRequestError(f"calibration data not found ({what}); {_split_help(bench)}")


def _split_help(bench: str) -> str:
    """What calibrate reads: the labelled training/dev split, where it lies and how to name it."""
    split = CALIBRATION_SPLITS[bench]
    return (f"calibrate fits on the labelled {split} of the benchmark data: pass --data with the data folder "
            f"(holding {split}), its {split.split('/')[0]} folder or the file itself, or set SAFE_ENSEMBLE_DATA "
            "to the data folder and leave --data out")


def _test_splits(bench: str, path: Path, root: Path | None) -> list[Path]:
    """The test files whose questions are never fitted on: the data folder's and one beside ``path``."""
    candidates = [get_benchmark(bench).path] if root is not None else []
    candidates.append(path.parent / "test.jsonl")
    found: list[Path] = []
    for test in candidates:
        if test.is_file() and not any(_same_file(test, f) for f in found):
            found.append(test)
    return found


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def _exemplars(benchmark: Benchmark) -> Sequence[tuple[str, str]]:
    """The (user, assistant) few-shot pairs the benchmark's prompt carries (the last user turn is the question)."""
    messages = benchmark.messages(Record(id="probe", question="?", answers=["A"]))
    users = [m["content"] for m in messages if m["role"] == "user"][:-1]
    assistants = [m["content"] for m in messages if m["role"] == "assistant"]
    return list(zip(users, assistants))


def _prompt_question(bench: str, record: Record) -> str:
    return record.question if bench == "gsm8k" else prompts.format_choices(record)


def _question_text(record: Record) -> str:
    """A test question as it is compared: its text, whitespace normalised, options aside (ARC's dev and
    test splits share questions whose options differ by a plural)."""
    return " ".join(record.question.split())


@dataclass
class _Reading:
    """One member's teacher-forced reading of one reference answer."""

    text: TokenizedText
    logprobs: list[float]
    tops: dict[int, TopK]  # at token starts that are shared boundaries: the stored top-K


def teacher_forced(member: Member, session: Session, messages: list[dict[str, str]], answer: bytes,
                   keep_at: set[int] | None = None, top_k: int = STORED_TOP_K) -> _Reading:
    """Blocking: ``member`` reads prompt + answer in one forward; the log-probability of each answer
    token and, at the byte offsets in ``keep_at``, the top-K of its distribution there. One
    ``session`` serves every question: the few-shot prefix they share stays in its KV cache."""
    import torch

    from .alignment import TokenizedText
    from .members.topk import TopK
    from .weighting import token_nlls

    text = TokenizedText(member.table)
    text.set_text(answer)
    prompt = member.prompt_ids(messages)
    if len(prompt) + len(text.ids) > member.context_window:  # checked here: the forward fails with an IndexError
        raise ContextLengthError(f"the prompt ({len(prompt)} tokens) and reference answer ({len(text.ids)}) exceed "
                                 f"{member.name}'s context window of {member.context_window} tokens")
    rows = session.sync(prompt + text.ids, len(prompt))  # rows predicting text.ids, then the next
    logprobs = (-token_nlls(rows[:-1], text.ids)).tolist()
    if any(math.isnan(lp) for lp in logprobs):  # the caller refuses the member by name (TopK would refuse NaN)
        return _Reading(text, logprobs, {})
    tops = {}
    for offset in keep_at or ():
        index = text.index_at(offset)
        if index is None or index >= len(text.ids):
            continue
        logp = torch.log_softmax(rows[index].float(), dim=-1)
        values, ids = torch.topk(logp, min(top_k, logp.shape[0]))
        tops[offset] = TopK(ids.tolist(), values.tolist())
    return _Reading(text, logprobs, tops)


@dataclass
class _Evidence:
    spans: list[torch.Tensor] = field(default_factory=list)
    nll: list[float] = field(default_factory=list)
    num_bytes: int = 0
    questions: int = 0  # read by every member
    asked: int = 0  # the questions it set out to read
    interrupted: bool = False  # Ctrl-C: ``questions`` of ``asked`` were read
    unscored: list[int] = field(default_factory=list)  # per member: reference tokens given no probability
    positions: list[tuple[bytes, dict[int, TopK]]] = field(default_factory=list)  # (continuation, tops by member)


def collect(members: Sequence[Member], bench: str, records: Sequence[Record], benchmark: Benchmark,
            progress: bool = True, limit: int | None = None) -> _Evidence:
    """Teacher-force every member on the records in order until ``limit`` of them (None: all) are read
    (a progress bar per question); a question too long for a member's window is left out and the
    next one read in its place, so ``--limit N`` gets N where the split has them."""
    asked = len(records) if limit is None else limit
    wanted = min(asked, len(records))
    if wanted < asked:  # said before minutes of reading: the profile is fitted on fewer than asked
        _log.warning("calibrate: --limit %d, but the split has %d question(s) to fit on (the prompt's exemplars "
                     "and test questions left out); fitting on those", asked, wanted)
    evidence = _Evidence(nll=[0.0] * len(members), unscored=[0] * len(members), asked=wanted)
    sessions = [m.new_session() for m in members]
    too_long: list[tuple[str, str]] = []
    interrupted = False
    bar = tqdm(total=wanted, desc=f"calibrate {bench}", unit="q", disable=not progress, file=sys.stderr)
    try:
        for record in records:
            if evidence.questions >= wanted:
                break
            try:
                _read_one(members, sessions, bench, record, benchmark, evidence)
            except ContextLengthError as err:  # one long question does not end the fit (nothing of it was kept)
                too_long.append((record.id, str(err)))
                continue
            bar.update()
    except KeyboardInterrupt:  # Ctrl-C: the questions read (20 min at the default 50) are fitted, not lost
        if not evidence.questions:
            raise
        interrupted = True
        _log.warning("calibrate: interrupted after %d of %d questions; fitting on those (Ctrl-C again to stop)",
                     evidence.questions, wanted)
    finally:
        bar.close()
        for session in sessions:
            close = getattr(session, "close", None)
            if close is not None:
                close()
    evidence.interrupted = interrupted
    if too_long and not evidence.questions:
        raise ContextLengthError(f"no question fits: on question {too_long[0][0]}, {too_long[0][1]}")
    if too_long:
        short = "" if evidence.questions >= asked or interrupted else \
            f"; no more questions in the split: fitted on {evidence.questions} of the {asked} asked"
        _log.warning("calibrate: %d of %d questions left out, longer than a member's context window (%s; "
                     "question %s: %s)%s", len(too_long), len(too_long) + evidence.questions,
                     ", ".join(i for i, _ in too_long), too_long[0][0], too_long[0][1], short)
    return evidence


def _read_one(members: Sequence[Member], sessions: Sequence[Session], bench: str, record: Record,
              benchmark: Benchmark, evidence: _Evidence) -> None:
    """Add one question's evidence: span log-probabilities, NLLs and fusable positions."""
    from .alignment import TokenizedText, shared_boundaries
    from .weighting import segment_logprobs

    messages = benchmark.messages(record)
    answer = reference_answer(bench, record).encode("utf-8")
    texts = []
    for member in members:
        text = TokenizedText(member.table)
        text.set_text(answer)
        texts.append(text)
    common = shared_boundaries(answer, texts)
    inner = set(common[:-1])
    readings = [teacher_forced(m, s, messages, answer, inner) for m, s in zip(members, sessions)]
    for member, reading in zip(members, readings):  # now, not after every question is read
        if any(math.isnan(lp) for lp in reading.logprobs):
            raise InvalidRequestError(
                f"member {member.name} gives NaN log-probabilities on question {record.id} (a numeric "
                "overflow in its forward, e.g. float16): load it in bfloat16 or float32 to calibrate it")
    spans = segment_logprobs([r.text.ends for r in readings], [r.logprobs for r in readings], common)
    nlls = [sum(max(lp, LOGPROB_FLOOR) for lp in r.logprobs) for r in readings]
    unscored = [sum(lp == -math.inf for lp in r.logprobs) for r in readings]
    positions = [(answer[offset:], {i: r.tops[offset] for i, r in enumerate(readings)})
                 for offset in common[:-1] if all(offset in r.tops for r in readings)]
    # added last, together: a Ctrl-C while the members read leaves the evidence of whole questions only
    evidence.spans.append(spans)
    evidence.nll = [total - nll for total, nll in zip(evidence.nll, nlls)]
    evidence.unscored = [total + n for total, n in zip(evidence.unscored, unscored)]
    evidence.num_bytes += len(answer)
    evidence.positions.extend(positions)
    evidence.questions += 1


def fit_profile(members: Sequence[Member], names: Sequence[str], evidence: _Evidence, bench: str, data: Path,
                questions: int, grid: Sequence[float] = THRESHOLD_GRID) -> EnsembleProfile:
    """Weights (EM), drafter (lowest NLL/byte) and drafter_confidence (most right choices) from the evidence;
    the profile records how many questions were asked for and whether the reading was cut short."""
    import torch

    from .alignment import EOS_KEY
    from .fusion import MemberDist, make_fuser
    from .members.topk import topk_rows
    from .weighting import best_threshold, mixture_weights

    spans = torch.cat(evidence.spans)
    try:
        mixture = mixture_weights(spans)
    except ValueError as err:  # no span any member gives a probability
        raise InvalidRequestError(f"calibrate cannot fit weights: {err}") from None
    per_byte = [n / evidence.num_bytes for n in evidence.nll]
    for name, count in zip(names, evidence.unscored):
        if count:
            _log.warning("calibrate: member %s gives %d reference-answer token(s) no probability; its weight "
                         "sees them as 0, its NLL per byte counts each as %g nats", name, count, -LOGPROB_FLOOR)
    # a profile holds finite numbers only (JSON writes inf/NaN as null, which every surface refuses)
    broken = [n for n, w, b in zip(names, mixture.weights, per_byte) if not (math.isfinite(w) and math.isfinite(b))]
    if broken:
        raise InvalidRequestError(f"calibrate: member(s) {', '.join(broken)} gave no finite weight or NLL "
                                  "on the reference answers; nothing was written")
    drafter = min(range(len(members)), key=lambda i: per_byte[i])
    order = [drafter] + [i for i in range(len(members)) if i != drafter]
    weights = torch.tensor([mixture.weights[i] for i in order], dtype=torch.float32)
    fuse = make_fuser("unite", 10)
    top_probs, drafter_right, fused_right = [], [], []
    for continuation, tops in evidence.positions:
        dists = [MemberDist(names[i], members[i].table, topk_rows([tops[i]], members[i].table.vocab_size)[0],
                            STORED_TOP_K) for i in order]
        fused = fuse(dists, weights)
        key = fused.keys[int(torch.argmax(fused.fused))] if fused.keys else b""  # none: not a right choice
        top = tops[drafter]
        best = max(range(len(top.ids)), key=lambda j: top.logprobs[j])
        piece = members[drafter].table.pieces[top.ids[best]]
        top_probs.append(float(torch.tensor(top.logprobs[best]).exp()))
        drafter_right.append(bool(piece) and continuation.startswith(piece))
        fused_right.append(key != EOS_KEY and bool(key) and continuation.startswith(key))
    confidence, accuracy = (best_threshold(top_probs, drafter_right, fused_right, grid) if top_probs
                            else (None, {}))
    read = "; ".join(f"{name} ({member_reading(member)})" for name, member in zip(names, members))
    method = ("weights: maximum-likelihood mixture of the members' probabilities of the reference "
              "answers, spans between shared token boundaries (EM); drafter: lowest NLL per byte; "
              "drafter_confidence: most right choices at fusable positions between keeping the "
              f"drafter's top token (prob >= c) and UniTE fusion with the fitted weights (each member's top-"
              f"{STORED_TOP_K} stored, no sharpening or consensus skip); grid " + ", ".join(f"{c:g}" for c in grid)
              + f". Members read: {read}")
    return EnsembleProfile(
        members=list(names), weights=[round(w, 6) for w in mixture.weights], drafter=names[drafter],
        drafter_confidence=confidence,
        fitted=FitInfo(bench=bench, data=str(data), questions=questions, asked=evidence.asked or None,
                       interrupted=evidence.interrupted, spans=int(spans.shape[0]),
                       positions=len(top_probs), method=method,
                       nll_per_byte={n: round(v, 5) for n, v in zip(names, per_byte)},
                       log_likelihood=(round(mixture.log_likelihood, 3) if math.isfinite(mixture.log_likelihood)
                                       else None),
                       threshold_accuracy={k: round(v, 4) for k, v in accuracy.items()}))


def member_reading(member: Member) -> str:
    """How a member's log-probabilities were read: its backend and whether its distributions are full
    or top-K (a top-K member's reference tokens outside its K are scored with the rest's even share)."""
    from .members import HFMember
    from .members.base import exact_support
    from .members.llamacpp import LlamaCppMember
    from .members.sglang import SGLangMember
    from .members.vllm import VLLMMember

    kinds = ((HFMember, "transformers"), (LlamaCppMember, "llamacpp"), (VLLMMember, "vllm"), (SGLangMember, "sglang"))
    backend = next((label for kind, label in kinds if isinstance(member, kind)), type(member).__name__)
    k = exact_support(member)
    return f"{backend}, full distributions" if k is None else \
        f"{backend}, top-{k} per position exact, the rest spread evenly"


def calibrate(models: Sequence[str | Member], bench: str = "gsm8k", data: str | None = None,
              limit: int = DEFAULT_QUESTIONS, backend: str | None = None, progress: bool = True,
              out: str | Path | None = None, *, save: bool = True) -> EnsembleProfile:
    """Fit a profile for ``models`` on ``bench``'s training/dev split (the Python entry point).
    ``backend``: how names without a prefix run (None: ``CALIBRATE_BACKEND``, transformers, whose
    distributions are exact; a member that gives top-K rows is warned about). ``out``: where the profile
    is saved (``save_profile``: a fit cut short never replaces a file there), refused before fitting if it
    cannot be written or is a file fitted on or held out (saving there would overwrite the split); the
    profile was returned unsaved before, so a script that read ``out`` next found nothing. ``save=False``
    checks ``out`` but leaves the writing to the caller (the CLI, which prints a profile it cannot write).
    Ctrl-C after the first question is read returns the profile fitted on the questions read,
    ``fitted.interrupted`` set (before it, KeyboardInterrupt)."""
    if out is not None:
        check_output_file(Path(out).expanduser(), "--out", "profile's")  # before minutes of fitting, not after
    profile = _fit(models, bench, data, limit, backend, progress, out)
    if out is not None and save:
        try:
            target = save_profile(profile, Path(out).expanduser())
        except OSError as err:
            raise InvalidRequestError(f"cannot write the profile to {out} ({err.strerror or err})") from None
        if target != Path(out).expanduser():  # the CLI says this on stderr itself
            _log.warning("calibrate: the fit was interrupted; the profile already at %s is kept, the partial fit "
                         "is in %s (move it over %s to use it)", out, target, out)
    return profile


def _fit(models: Sequence[str | Member], bench: str, data: str | None, limit: int, backend: str | None,
         progress: bool, out: str | Path | None) -> EnsembleProfile:
    """``calibrate`` up to the profile: ``out`` is checked against the files read, not written."""
    if len(models) < 2:
        raise InvalidRequestError("calibrate needs at least two members")
    if limit < 1:
        raise InvalidRequestError("calibrate needs at least one question")
    path, records, benchmark = calibration_records(bench, data, None)  # collect reads ``limit`` that fit
    if out is not None:
        target = Path(out).expanduser()
        for read in (path, *_test_splits(bench, path, find_data_dir())):
            if _same_file(target, read):
                raise InvalidRequestError(f"--out {out} is the data file {read}: saving the profile there would "
                                          "overwrite it; give another file")
        shots = benchmark.exemplars  # beside the split or the data folder's: not the split, but every later
        if shots is not None and _same_file(target, shots):  # eval and calibrate there reads its first rows
            raise InvalidRequestError(f"--out {out} is {shots}, the file the prompt's few-shot exemplars are read "
                                      "from: saving the profile there would overwrite it; give another file")
    names = member_keys(models)
    if len(set(names)) != len(names):  # before loading any: a load takes seconds to minutes
        raise InvalidRequestError(f"calibrate needs distinct members, got {names}")
    to_load = [m for m in models if isinstance(m, str)]
    with loading_notice(to_load, progress and bool(to_load)):  # seconds to minutes, said as eval says it
        members = [load_member(with_backend(m, backend or CALIBRATE_BACKEND), progress) if isinstance(m, str) else m
                   for m in models]
    from .members.base import exact_support  # torch: loaded with the members, not for --help

    for name, member in zip(names, members):
        k = exact_support(member)
        if k is not None:  # before minutes of reading, not in the profile alone
            _log.warning("calibrate: member %s gives only its top-%d log-probabilities per position (%s): a reference "
                         "token outside them is scored with the rest's even share, so the weights, drafter and "
                         "drafter_confidence fitted are approximate; a model this machine runs is exact on "
                         "transformers (the default here; transformers:NAME)", name, k, member_reading(member))
    evidence = collect(members, bench, records, benchmark, progress, limit)
    if evidence.questions < RELIABLE_QUESTIONS:  # said with the --limit notice's voice, before the fit is used
        _log.warning("calibrate: fitted on %d question(s), fewer than %d: the weights, drafter and "
                     "drafter_confidence are unreliable (one question gave a member weight 0.999997); fit on "
                     "%d or more questions for a profile to use", evidence.questions, RELIABLE_QUESTIONS,
                     RELIABLE_QUESTIONS)
    profile = fit_profile(members, names, evidence, bench, path, evidence.questions)
    return profile.model_copy(update={"sources": local_sources(models)})


# --------------------------------------------------------------------------- command line


def _models(value: str) -> list[str]:
    models = [m.strip() for m in value.split(",") if m.strip()]
    if len(models) < 2:
        raise argparse.ArgumentTypeError("give at least two comma-separated models")
    return models


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``safe-ensemble calibrate``."""
    from .members import LOCAL_BACKENDS

    parser = subparsers.add_parser(
        "calibrate", help="fit member weights, drafter and drafter_confidence on a train/dev split",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", choices=sorted(CALIBRATION_SPLITS), default="gsm8k")
    parser.add_argument("--models", type=_models, required=True,
                        help="comma-separated members, as for `run` (zoo names, folders, .gguf, specs)")
    parser.add_argument("--backend", choices=LOCAL_BACKENDS,
                        help="how models without a backend prefix run (default here: transformers, zoo names "
                             "too: the fit needs full distributions; llamacpp gives 20 log-probabilities a "
                             "position and is warned about)")
    parser.add_argument("--data", help="the labelled split (default: the data folder's "
                                       "gsm8k/train.jsonl or arc_challenge/dev.jsonl); never a test split")
    parser.add_argument("--limit", type=int, default=DEFAULT_QUESTIONS, help="questions to fit on")
    parser.add_argument("--out", required=True,
                        help="where to write the profile JSON; a fit cut short by Ctrl-C never replaces a file "
                             "there: it goes beside it, NAME.interrupted.json")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress output: no loading notice, no bar per question, no bars of the zoo's "
                             "one-time GGUF verification or conversion")
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    """Fit, save, print a summary; 2 on a clear error (the CLI's convention), 130 when Ctrl-C cut the
    fit short (the partial profile is saved, never over an existing file: ``interrupted_path``)."""
    try:
        out = Path(args.out).expanduser()  # `--out=~/p.json`: the shell expands no ~ after '='
        profile = calibrate(args.models, args.bench, args.data, args.limit, args.backend, not args.no_progress,
                            out=out, save=False)  # written below, once: a profile it cannot write is printed
    except EnsembleError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # after a question was read, collect fits on what was read instead
        print(f"interrupted: no profile was written to {args.out}", file=sys.stderr)
        return 130
    fitted = profile.fitted
    target = profile_target(profile, out)
    kept = target != out
    shown = str(target) if kept else args.out
    try:
        save_profile(profile, out)
    except OSError as err:  # the fit is not lost: it goes to stdout
        print(profile.model_dump_json(indent=2))
        print(f"error: cannot write the profile to {shown} ({err.strerror or err}); it is printed above",
              file=sys.stderr)
        return 2
    weights = ", ".join(f"{m}={w:.3g}" for m, w in zip(profile.members, profile.weights))  # 0.000189, not 0.000
    cut = f"interrupted after {fitted.questions} of {fitted.asked} questions: " if fitted.interrupted else ""
    print(f"{cut}{shown}: weights {weights}; drafter {profile.drafter}; drafter_confidence "
          f"{profile.drafter_confidence}; fitted on {fitted.questions} {args.bench} questions ({fitted.data})")
    if not fitted.interrupted:
        return 0
    where = (f"{shown}; the profile already at {args.out} is kept (move {shown} over it to use the partial fit)"
             if kept else f"{shown}, marked interrupted")
    print(f"interrupted: the profile fitted on the {fitted.questions} question(s) read is in {where}; "
          "calibrate again for the full fit", file=sys.stderr)
    return 130


def interrupted_path(out: Path) -> Path:
    """Where a fit cut short goes when ``out`` already holds a file: beside it (``p.json`` ->
    ``p.interrupted.json``), so Ctrl-C never swaps a full profile for one fitted on a few questions."""
    return out.with_name(f"{out.stem}.interrupted{out.suffix}")


def profile_target(profile: EnsembleProfile, out: Path) -> Path:
    """Where ``profile`` is saved for ``out``: ``out``, or beside it (``interrupted_path``) for a fit cut
    short where ``out`` already holds a file (an earlier profile: not replaced by a part)."""
    kept = profile.fitted.interrupted and (out.exists() or out.is_symlink())
    return interrupted_path(out) if kept else out


def save_profile(profile: EnsembleProfile, out: Path) -> Path:
    """Save ``profile`` for ``out`` (``profile_target``), whole or not at all; the file written. The one
    writer of both ``calibrate(out=...)`` and ``safe-ensemble calibrate --out``."""
    target = profile_target(profile, out)
    profile.save(target)
    return target
