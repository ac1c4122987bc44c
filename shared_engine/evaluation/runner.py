"""Run an engine over a benchmark: per-sample JSONL as it goes, resumable, then ``summary.json``.

``DIR/config.json`` records what the run is (benchmark, models, method, engine options,
max_new_tokens, prompt version); ``DIR/samples.jsonl`` gets one line per answered question,
flushed at once, so an interrupted run loses at most the question in flight and ``resume=True``
continues with the questions not yet in the file (greedy decoding makes the result the same as an
uninterrupted run). An interrupted run (Ctrl-C) writes the summary of the answers so far, marked
``interrupted``. On resume the stored answers are scored again with the current scorer, a
question that failed for a passing reason (a member's server timing out) is asked again, and the
summary is always recomputed from the whole JSONL.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import os
import signal
import sys
import threading
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from .. import errors
from ..errors import EnsembleError, InvalidRequestError
from ..events import mean_draft_length
from ..loading import load_with_notice
from ..options import EngineOptions
from .benchmarks import Benchmark
from .datasets import Dataset, Record, unread
from .prompts import PROMPT_VERSION
from .scoring import corpus_translation

if TYPE_CHECKING:
    from ..engine import EnsembleEngine

log = logging.getLogger(__name__)

SAMPLES, SUMMARY, CONFIG = "samples.jsonl", "summary.json", "config.json"
LOCK = ".lock"
"""Held (``flock``) while an eval writes the folder: a second writer is refused, ``compare`` says the run is
still going. The kernel releases it when its process dies, so a killed run's file never blocks."""

try:
    import fcntl
except ImportError:  # no flock (Windows): runs are not locked
    fcntl = None  # type: ignore[assignment]


def _replace_file(path: Path, data: bytes) -> None:
    """Write ``path`` whole or not at all: a kill while it is written leaves the old file, not a cut one."""
    partial = path.with_name(path.name + ".part")
    partial.write_bytes(data)
    os.replace(partial, path)


@contextlib.contextmanager
def writer_lock(out: Path) -> Iterator[None]:
    """Hold ``out``'s lock while a run writes it; a folder another eval is writing is refused."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # e.g. --out naming a file (a log)
        raise InvalidRequestError(f"--out {out}: cannot make the run's folder ({err.strerror})") from None
    if fcntl is None:
        yield
        return
    with (out / LOCK).open("a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            f.seek(0)
            holder = f.read().strip() or "?"
            raise InvalidRequestError(f"{out} is being written by another eval (pid {holder})") from None
        try:
            f.seek(0)
            f.truncate()
            f.write(f"{os.getpid()}\n")
            f.flush()
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def lock_holder(out: Path) -> str | None:
    """The pid of the eval writing ``out`` now (``"?"`` when unknown); None: nobody is."""
    if fcntl is None or not (out / LOCK).is_file():
        return None
    try:
        with (out / LOCK).open(encoding="utf-8") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except OSError:
                return f.read().strip() or "?"
            fcntl.flock(f, fcntl.LOCK_UN)
    except OSError:
        return None
    return None


class RunConfig(BaseModel):
    """What makes two runs comparable; ``resume`` refuses a directory written with another config."""

    # `http: {timeout_s: .inf}` (no deadline) is written as Infinity: JSON's default null reads back as
    # "the backend's default" (60 s remote), another setting, and the run could not be resumed
    model_config = ConfigDict(ser_json_inf_nan="constants")

    bench: str
    models: list[str]
    method: str
    max_new_tokens: int
    engine_options: dict[str, Any] = Field(default_factory=dict)
    member_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="Members run with options (device, dtype, ...), by model.")
    prompt_version: str = PROMPT_VERSION
    data: str | None = Field(None, description="The benchmark file or folder read, resolved (None: a run "
                                               "written before it was recorded).")
    data_sha256: str | None = Field(None, description="A hash of what ``data`` held (a folder: its files).")
    prompt_sha256: str | None = Field(
        None, description="A hash of the files the prompts read besides the data (few-shot exemplars: GSM8K "
                          "train, ARC dev, BBH cot-prompts, AdaFuse prompt files); None: none, or a run written "
                          "before it was recorded. Kept apart from ``data_sha256`` so that runs stored before "
                          "it still pair with new ones over the same data.")


def data_identity(path: Path) -> dict[str, str | None]:
    """``data`` and ``data_sha256`` of a benchmark file or folder (a folder's files by name and
    content; BBH's 27 files, MMLU-Redux's 57: a few MB; not a hidden file or backup no loader reads,
    ``datasets.unread``): a resume with another file is refused."""
    resolved = path.expanduser().resolve()
    digest = hashlib.sha256()
    try:
        if resolved.is_dir():
            _hash_files(digest, resolved, resolved.iterdir())
        else:
            digest.update(resolved.read_bytes())
    except OSError:
        return {"data": str(resolved), "data_sha256": None}
    return {"data": str(resolved), "data_sha256": digest.hexdigest()}


def _hash_files(digest: Any, folder: Path, found: Iterator[Path]) -> None:
    """Each file of ``found`` in ``folder`` by its name there and its content, in name order, but for what no
    loader or prompt reads (``datasets.unread``): the one way both hashes read a folder."""
    for file in sorted(f for f in found if f.is_file() and not unread(f.relative_to(folder))):
        digest.update(file.relative_to(folder).as_posix().encode() + b"\0" + file.read_bytes() + b"\0")


def prompt_files(bench: Benchmark) -> list[Path]:
    """The files and folders ``bench``'s prompts read besides its data: its ``exemplars`` and
    ``prompt_sources`` (BBH's cot-prompts folder, an AdaFuse prompt file), so that another exemplar file
    beside the same test file is another run (the data hash covers the test file alone)."""
    paths = [bench.exemplars] if bench.exemplars is not None else []
    return sorted({p.expanduser().resolve() for p in (*paths, *bench.prompt_sources)})


def prompt_identity(bench: Benchmark) -> dict[str, str | None]:
    """``prompt_sha256``: the content of ``prompt_files`` (a folder: its files by relative name, at any
    depth, but for what no prompt reads: hidden files and editor backups, ``datasets.unread``); None where the
    benchmark reads none, or one cannot be read (the prompt fails on it first)."""
    files = prompt_files(bench)
    if not files:
        return {"prompt_sha256": None}
    digest = hashlib.sha256()
    try:
        for path in files:
            digest.update(path.name.encode() + b"\0")  # by name, not place: a moved data folder resumes
            if path.is_dir():
                _hash_files(digest, path, path.rglob("*"))
            else:
                digest.update(b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return {"prompt_sha256": None}
    return {"prompt_sha256": digest.hexdigest()}


class Sample(BaseModel):
    id: str
    group: str | None = None
    prompt: list[dict[str, str]]
    output: str
    gold: list[str]
    extracted: str | None
    correct: bool
    value: float = Field(description="1/0, or sentence chrF/100 for translation.")
    f1: float | None = None
    finish_reason: str
    stats: dict[str, Any] | None = Field(None, description="The finish event's stats.")
    error: str | None = None
    prompt_version: str = PROMPT_VERSION


def wilson_interval(successes: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """95% Wilson score interval: sensible at 0 / n successes and small n, unlike the normal one."""
    if n == 0:
        return (0.0, 1.0)
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    return (max(0.0, centre - half), min(1.0, centre + half))


def _readable_lines(data: bytes) -> list[tuple[str, dict[str, Any]]]:
    """The complete lines of a samples file with what each holds (a JSON object). A line cut off by
    an interruption is skipped, also where the cut split a multi-byte character."""
    lines = []
    for raw in data.splitlines(keepends=True):
        try:
            line = raw.decode("utf-8")
            row = json.loads(line)
        except ValueError:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
            continue
        if isinstance(row, dict):
            lines.append((line if line.endswith("\n") else line + "\n", row))
    return lines


def sample_rows(path: Path) -> list[dict[str, Any]]:
    """What each complete line of a samples file holds (a run still going may end in a partial one)."""
    return [row for _, row in _readable_lines(path.read_bytes())]


def read_samples(path: Path) -> list[Sample]:
    """Complete lines of a samples file; a line cut off by an interruption is dropped (and removed)."""
    if not path.exists():
        return []
    data = path.read_bytes()
    samples, good = [], []
    for line, row in _readable_lines(data):
        try:
            samples.append(Sample.model_validate(row))
            good.append(line)
        except ValueError:
            continue
    kept = "".join(good).encode("utf-8")
    if kept != data:
        _replace_file(path, kept)
    return samples


def _mean_of(stats: list[dict[str, Any]], key: str) -> float:
    """The per-answer mean of a stats field (a missing or None value counts as 0), to 2 decimals."""
    return round(sum(s.get(key) or 0.0 for s in stats) / len(stats), 2) if stats else 0.0


def summarize(samples: list[Sample], config: RunConfig, bench: Benchmark, skipped: dict[str, int],
              total: int) -> dict[str, Any]:
    """The run's scores. A question that failed for a passing reason (``_is_transient``: a member's
    server timing out) is no answer: left out of ``n`` and every score, counted in ``transient_failures``
    (``--resume`` asks it again); one the engine rejects (``failures``) counts as wrong."""
    transient = sum(_is_transient(s) for s in samples)
    samples = [s for s in samples if not _is_transient(s)]
    n = len(samples)
    correct = sum(s.correct for s in samples)
    stats = [s.stats for s in samples if s.stats]
    tokens = sum(s["tokens"] for s in stats)
    elapsed = sum(s["elapsed_s"] for s in stats)
    ensembled = sum(s["ensembled_tokens"] for s in stats)
    # decided positions: every answer token, plus the EOS that ended an answer (it may have been fused)
    positions = tokens + sum(1 for s in samples if s.stats and s.finish_reason == "eos")
    low, high = wilson_interval(correct, n)
    summary: dict[str, Any] = {
        **config.model_dump(), "data": config.data or str(bench.path), "metric": bench.metric,
        "n": n, "of": total, "skipped": skipped, "correct": correct,
        "accuracy": round(correct / n, 4) if n else None,
        "ci95": [round(low, 4), round(high, 4)],
        "score": None,
        "ensemble_rate": round(ensembled / positions, 4) if positions else 0.0,
        "tokens_per_s": round(tokens / elapsed, 3) if elapsed else 0.0,
        "mean_time_to_first_token_s": _mean_of(stats, "time_to_first_token_s"),
        "mean_drafter_choice_s": _mean_of(stats, "drafter_choice_s"),
        "seconds_per_question": round(elapsed / len(stats), 2) if stats else 0.0,
        "mean_output_tokens": round(tokens / len(stats), 1) if stats else 0.0,
        "truncated": sum(s.finish_reason == "length" for s in samples),
        "failures": sum(s.error is not None for s in samples),
        "transient_failures": transient,
        "elapsed_s": round(elapsed, 1),
    }
    forwards: dict[str, int] = defaultdict(int)
    for s in stats:
        for member, count in (s.get("forward_passes") or {}).items():
            forwards[member] += count
    # cost that contention does not distort: forward passes per answer token, per member
    summary["forward_passes_per_token"] = {m: round(c / tokens, 3) for m, c in forwards.items()} if tokens else {}
    lengths: dict[int, int] = defaultdict(int)
    for s in stats:
        for length, rounds in (s.get("draft_lengths") or {}).items():
            lengths[int(length)] += rounds  # JSON keys are strings
    if lengths:
        summary["mean_draft_length"] = mean_draft_length(lengths)
    drafters = Counter(s["drafter"] for s in stats if s.get("drafter"))
    if len(drafters) > 1 or (drafters and config.engine_options.get("drafter") == "auto"):
        summary["drafters"] = dict(drafters.most_common())  # questions each member drafted
    if bench.metric == "exact_match":
        summary["f1"] = round(sum(s.f1 or 0.0 for s in samples) / n, 4) if n else None
    if bench.metric == "chrf":  # no right/wrong in translation: corpus chrF (and BLEU) instead
        summary.update(corpus_translation([s.extracted or "" for s in samples], [s.gold[0] for s in samples]))
        summary.update(score=summary["chrf"], accuracy=None, correct=None, ci95=None)
    else:
        summary["score"] = summary["accuracy"]
    groups: dict[str, list[bool]] = defaultdict(list)
    for sample in samples:
        if sample.group:
            groups[sample.group].append(sample.correct)
    if groups:
        summary["by_group"] = {g: {"n": len(v), "accuracy": round(sum(v) / len(v), 4)}
                               for g, v in sorted(groups.items())}
    return summary


def check_start(bench: Benchmark, out: Path, limit: int | None) -> tuple[Dataset, list[Record]]:
    """What a run's start fails on before anything is built, loaded or written (the CLI checks it before
    it builds the engine, whose fit cache makes the --out folder): ``limit``, the data and its first
    prompt (its exemplars' file missing), and ``out`` naming a file; the dataset and the records asked."""
    if limit is not None and limit < 1:
        raise InvalidRequestError(f"limit must be at least 1 question, got {limit}")
    dataset = bench.dataset()
    records: list[Record] = dataset.records[:limit] if limit is not None else dataset.records
    if records:  # a prompt that cannot be built (its exemplars' file missing) fails before anything is written
        bench.messages(records[0])  # or the members spend their load on it
    if out.exists() and not out.is_dir():
        raise InvalidRequestError(f"--out {out} is a file: give a folder for the run")
    # a folder under a file (run.log/sub): said of --out here, not by the fit cache (an option never given)
    above = next((folder for folder in out.parents if folder.exists()), None)
    if not out.exists() and above is not None and not above.is_dir():
        raise InvalidRequestError(f"--out {out}: cannot make the run's folder ({above} is a file)")
    return dataset, records


def _check_config(out: Path, config: RunConfig, resume: bool, bench: Benchmark) -> None:
    config_file, samples_file = out / CONFIG, out / SAMPLES
    answered = samples_file.exists() and samples_file.stat().st_size > 0
    if answered and not resume:
        raise InvalidRequestError(f"{samples_file} already has samples: pass --resume to continue it, or another --out")
    if resume and answered and not config_file.exists():  # the answers' settings unknown: they would mix
        raise InvalidRequestError(
            f"cannot resume {out}: {samples_file} has answers but there is no {config_file} saying which settings "
            f"(models, method, max_new_tokens, data) they were made with; start a new run with another --out")
    # a start that failed before any answer (a misspelt model) left its config: nothing to mix with
    if resume and answered:
        previous = RunConfig.model_validate_json(config_file.read_text())
        # options the engine gained since, at the run's method's defaults (not safe's), still match
        defaults = EngineOptions(method=config.method).model_dump()
        previous.engine_options |= {k: v for k, v in config.engine_options.items()
                                    if k not in previous.engine_options and v == defaults.get(k)}
        _match_data(previous, config, out)
        if previous != config:
            differences = _differences(previous.model_dump(), config.model_dump())
            exemplars = (f" (prompt_sha256: the few-shot exemplar files its prompts read differ now: "
                         f"{', '.join(str(p) for p in prompt_files(bench))})" if "prompt_sha256" in differences else "")
            raise InvalidRequestError(f"cannot resume {out}: it was run with different settings {differences}"
                                      f"{exemplars}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # e.g. --out naming a file (a log)
        raise InvalidRequestError(f"--out {out}: cannot make the run's folder ({err.strerror})") from None
    config_file.write_text(config.model_dump_json(indent=2) + "\n")


def _match_data(previous: RunConfig, config: RunConfig, out: Path) -> None:
    """The same data as the run read (its content, where both hashes are known: a moved data folder
    still resumes), in ``previous`` as in ``config`` so that only another file differs. A run written
    before the data (or its exemplar files' hash) was recorded resumes, with a warning: what it read is
    unknown."""
    if previous.data is None:
        log.warning("%s does not record which data file it read: resuming with %s", out, config.data)
        previous.data, previous.data_sha256 = config.data, config.data_sha256
    elif previous.data_sha256 and config.data_sha256 and previous.data_sha256 == config.data_sha256:
        previous.data = config.data
    elif previous.data_sha256 is None or config.data_sha256 is None:
        previous.data_sha256 = config.data_sha256  # a hash unknown: the path tells
    if previous.prompt_sha256 is None and config.prompt_sha256 is not None:  # written before it was recorded
        log.warning("%s does not record which few-shot exemplar files its prompts read: resuming with the "
                    "current ones", out)
        previous.prompt_sha256 = config.prompt_sha256


def _differences(before: dict[str, Any], now: dict[str, Any]) -> dict[str, Any]:
    """Each differing setting as (before, now); within a dict setting (engine_options: ~30 keys) only
    the keys that differ, so the one changed option is not lost in two whole dicts."""
    diff: dict[str, Any] = {}
    for key in before.keys() | now.keys():
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        diff[key] = _differences(old, new) if isinstance(old, dict) and isinstance(new, dict) else (old, new)
    return dict(sorted(diff.items()))


async def evaluate(engine: EnsembleEngine, bench: Benchmark, config: RunConfig, out: Path, *,
                   limit: int | None = None, resume: bool = False, progress: bool = True,
                   on_sample: Callable[[Sample], None] | None = None,
                   interruptible_load: bool = False) -> dict[str, Any]:
    """Answer the first ``limit`` questions (those not yet in ``out`` when resuming); return the summary.
    ``interruptible_load`` (the CLI, alone on its event loop): the members load on the main thread, not in a
    worker, so Ctrl-C stops the load at once (``asyncio.run`` waits for a worker's load to end first)."""
    dataset, records = check_start(bench, out, limit)
    if config.data is None:  # the file the questions come from: a resume with another one is refused
        config = config.model_copy(update=data_identity(bench.path))
    if config.prompt_sha256 is None:  # the exemplars the prompts read: a resume with others is refused
        config = config.model_copy(update=prompt_identity(bench))
    with writer_lock(out):
        return await _evaluate(engine, bench, config, out, dataset, records, resume=resume, progress=progress,
                               on_sample=on_sample, interruptible_load=interruptible_load)


async def _evaluate(engine: EnsembleEngine, bench: Benchmark, config: RunConfig, out: Path, dataset: Dataset,
                    records: list[Record], *, resume: bool, progress: bool,
                    on_sample: Callable[[Sample], None] | None, interruptible_load: bool) -> dict[str, Any]:
    """``evaluate`` with ``out`` locked."""
    _check_config(out, config, resume, bench)
    wanted = {r.id for r in records}
    samples_file = out / SAMPLES
    done = {s.id: s for s in _stored(read_samples(samples_file), records, bench, samples_file) if s.id in wanted}
    todo = [r for r in records if r.id not in done]
    correct = sum(s.value for s in done.values())  # running accuracy (mean sentence chrF for translation)
    # over the answers only, as the summary counts them: a question that failed for a passing reason (a member
    # timing out) is no wrong answer (all right + one timeout showed acc 0.750 beside a summary's 1.0);
    # ``_stored`` already leaves such failures out of ``done``
    answered = len(done)
    tokens = sum((s.stats or {}).get("tokens", 0) for s in done.values())
    elapsed = sum((s.stats or {}).get("elapsed_s", 0.0) for s in done.values())
    try:
        if todo:  # a member that cannot load fails the run here, not every question as an answer's failure
            await _load(engine, progress, interruptible_load)
        with tqdm(total=len(records), initial=len(done), desc=f"{config.bench} {config.method}", unit="q",
                  file=sys.stderr, disable=not progress, dynamic_ncols=True) as bar, \
                samples_file.open("a", encoding="utf-8") as f:
            for record in todo:
                sample = await _answer(engine, bench, config, record)
                f.write(sample.model_dump_json() + "\n")
                f.flush()
                done[sample.id] = sample
                correct += sample.value
                answered += not _is_transient(sample)
                tokens += (sample.stats or {}).get("tokens", 0)
                elapsed += (sample.stats or {}).get("elapsed_s", 0.0)
                bar.update(1)
                # translation: mean sentence chrF on the 0-100 scale the summary's corpus chrF is read in
                share = correct / max(answered, 1)
                running = "-" if not answered else f"{100 * share:.1f}" if bench.metric == "chrf" else f"{share:.3f}"
                bar.set_postfix({"chrF" if bench.metric == "chrf" else "acc": running,
                                 "tok/s": f"{tokens / elapsed:.1f}" if elapsed else "-"})
                if on_sample is not None:
                    on_sample(sample)
    except BaseException:  # Ctrl-C (a cancellation under asyncio.run), a crash: the summary of what is answered
        if done or (out / SUMMARY).exists():  # a summary left from before would count another set of answers
            _write_summary(out, done, records, dataset, config, bench, interrupted=True)
        raise
    return _write_summary(out, done, records, dataset, config, bench)


async def _load(engine: EnsembleEngine, notice: bool, interruptible: bool) -> None:
    """``load_with_notice``; ``interruptible`` on the main thread: there with Ctrl-C's own handler, which
    raises at once (asyncio.run's only cancels the run, which then waits for the load), and blocking the
    event loop meanwhile (nothing else runs on the CLI's). A process that ignores Ctrl-C (started in the
    background: ``eval ... &``) keeps ignoring it."""
    if not (interruptible and threading.current_thread() is threading.main_thread()) \
            or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        await asyncio.to_thread(load_with_notice, engine, notice)
        return
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        load_with_notice(engine, notice)
    finally:
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)


def _write_summary(out: Path, done: dict[str, Sample], records: list[Record], dataset: Dataset, config: RunConfig,
                   bench: Benchmark, interrupted: bool = False) -> dict[str, Any]:
    """``summary.json`` of the answers in ``done``. An interrupted run's counts what it answered so far,
    with ``interrupted`` and ``asked`` (the questions it was to answer), so that ``compare`` neither
    fails on a run without one nor reads one the answers have outgrown; ``--resume`` rewrites it."""
    ordered = [done[r.id] for r in records if r.id in done]
    summary = summarize(ordered, config, bench, dataset.skipped, len(dataset.records))
    if interrupted:
        summary.update(interrupted=True, asked=len(records))
    wanted = {r.id for r in records}
    samples = out / SAMPLES
    # resumed with a smaller limit: what the summary counts, for compare to pair the same
    rows = sample_rows(samples) if samples.exists() else []
    if any(row.get("id") not in wanted for row in rows):
        summary["ids"] = [s.id for s in ordered]
    # the lines it was written at: compare flags it out of date when the file holds another number (a run
    # resumed and killed before its summary, where ``ids`` hides the new answers)
    summary["sample_lines"] = len(rows)
    partial = out / (SUMMARY + ".part")  # a second Ctrl-C while it is written leaves the old file whole
    partial.write_text(json.dumps(summary, indent=2) + "\n")
    partial.replace(out / SUMMARY)
    return summary


def _stored(samples: list[Sample], records: list[Record], bench: Benchmark, file: Path) -> list[Sample]:
    """The stored answers to keep, scored again with the current scorer (a scoring fix needs no new
    generation), without those that failed for a passing reason (asked again, so a question's new
    answer is its only line). The file is rewritten, once, only if something changed."""
    by_id = {r.id: r for r in records}
    kept = [s for s in samples if not _is_transient(s)]
    if len(kept) != len(samples):
        log.warning("asking %d question(s) again that failed for a passing reason", len(samples) - len(kept))
    updated = []
    for sample in kept:
        record = by_id.get(sample.id)
        if record is not None and sample.error is None:
            score = bench.score(sample.output, record, sample.finish_reason)
            sample = sample.model_copy(update={"extracted": score.extracted, "correct": score.correct,
                                               "value": score.value, "f1": score.f1})
        updated.append(sample)
    if updated != samples:
        _replace_file(file, "".join(s.model_dump_json() + "\n" for s in updated).encode("utf-8"))
    return updated


def _is_transient(sample: Sample) -> bool:
    return is_transient_error(sample.error)


def is_transient_error(error: str | None) -> bool:
    """A failure the question itself does not cause: anything but an ``InvalidRequestError`` (e.g. a
    prompt longer than a member's context, which would fail the same way again), such as a member's
    server timing out or an engine closed under the run. Samples store the error as ``Class: text``."""
    if error is None:
        return False
    kind = getattr(errors, error.split(":", 1)[0], None)
    return not (isinstance(kind, type) and issubclass(kind, InvalidRequestError))


async def _answer(engine: EnsembleEngine, bench: Benchmark, config: RunConfig, record: Record) -> Sample:
    messages = bench.messages(record)
    base = {"id": record.id, "group": record.group, "prompt": messages, "gold": record.answers}
    try:
        result = await engine.agenerate(messages, max_new_tokens=config.max_new_tokens, stop=list(bench.stop))
    except EnsembleError as err:  # e.g. a prompt longer than a member's context: counted, not fatal
        return Sample(**base, output="", extracted=None, correct=False, value=0.0, finish_reason="error",
                      error=f"{type(err).__name__}: {err}")
    score = bench.score(result.text, record, result.finish_reason)
    return Sample(**base, output=result.text, extracted=score.extracted, correct=score.correct, value=score.value,
                  f1=score.f1, finish_reason=result.finish_reason, stats=result.stats.model_dump())
