"""The benchmark registry: for each name, where its data is, how to load, prompt and score it.

``--data`` may point at the data folder, the benchmark's folder or file, or a file of the same
format elsewhere; exemplar files (GSM8K train, ARC dev, BBH cot-prompts, AdaFuse prompt files) are
looked for next to it first, then in the default data folder.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol

from ..data_paths import GSM8K_SAMPLE, find_data_dir, not_found
from ..errors import InvalidRequestError
from . import datasets, prompts, scoring
from .datasets import Dataset, Record
from .math_answers import score_math
from .scoring import Score

BENCHMARKS = ("gsm8k", "math500", "arc-challenge", "mmlu-redux", "bbh", "nq", "triviaqa", "squad", "flores")
FLORES_PAIRS = ("en-de", "de-en", "en-ro")
_FLORES_PROMPTS = {"en-de": "flores_en2deu_prompt.txt", "de-en": "flores_deu2en_prompt.txt",
                   "en-ro": "flores_en2ron_prompt.txt"}
_QA = {"nq": "nq_prompt.txt", "triviaqa": "triviaqa_prompt.txt", "squad": "squad_prompt.txt"}
"""Each open-QA benchmark's few-shot prompt file (its data: ``datasets.LAYOUTS``)."""


class Scorer(Protocol):
    """How a benchmark scores an output. ``finish``: why its generation stopped, where the caller knows
    it ("length": cut at the token cap), so fallbacks that would read a half-written answer (GSM8K's last
    number, a bare option letter) stay off there; None scores as before the finish reason was passed."""

    def __call__(self, output: str, record: Record, finish: str | None = None, /) -> Score: ...


@dataclass(frozen=True)
class Benchmark:
    name: str
    path: Path
    metric: str                       # "accuracy", "exact_match" (with F1) or "chrf" (with BLEU)
    max_new_tokens: int
    load: Callable[[Path], Dataset]
    messages: Callable[[Record], list[dict[str, str]]]
    score: Scorer
    stop: tuple[str, ...] = ()
    exclude: Callable[[Record], bool] | None = field(default=None)   # e.g. a record used as an exemplar
    exemplars: Path | None = None     # the file the few-shot exemplars are read from (never to be overwritten)
    prompt_sources: tuple[Path, ...] = ()  # what else the prompts read (BBH's cot-prompts, an AdaFuse prompt file)

    def dataset(self) -> Dataset:
        data = self.load(self.path)
        if self.exclude is None:
            return data
        kept = [r for r in data.records if not self.exclude(r)]
        skipped = dict(data.skipped)
        if len(kept) < len(data.records):
            skipped["exemplar in the few-shot prompt"] = len(data.records) - len(kept)
        return data.model_copy(update={"records": kept, "skipped": skipped})


SAMPLE = "sample"
"""``--data sample``: the GSM8K sample the package ships (its first 32 test questions), found from any
folder (a path into the package works only from a clone's root)."""


def _main_path(data: str | None, relative: str) -> Path:
    if data == SAMPLE and not Path(data).exists():
        if relative != "gsm8k/test.jsonl":
            raise InvalidRequestError("--data sample: the package ships a GSM8K sample only "
                                      "(other benchmarks need the data folder)")
        return GSM8K_SAMPLE
    if data is None:
        root = find_data_dir()
        if root is None:
            raise not_found()
        return root / relative
    given = Path(data).expanduser()
    if given.is_dir():
        for candidate in (given / relative, given / Path(relative).name):
            if candidate.exists() or candidate.is_symlink():  # a link to data not fetched: the loader says so
                return candidate
    return given


def _aux(main: Path, beside: str, default_relative: str) -> Path:
    """An exemplar file next to the data (``beside`` relative to the data's folder), else the default."""
    folder = main if main.is_dir() else main.parent
    candidates = [folder / beside]
    root = find_data_dir()
    if root is not None:
        candidates.append(root / default_relative)
    return next((c for c in candidates if c.exists()), candidates[0])


def _choice_score(output: str, record: Record, finish: str | None = None, /) -> Score:
    options = {c.label: c.text for c in record.choices}  # a letter stated with another option's text: none
    return scoring.score_choice(output, record.answers[0], "".join(options), options, finish=finish)


def is_translation(run_bench: str) -> bool:
    """Whether a run's benchmark (its config's ``bench``: ``flores-<pair>`` for translation) is
    scored by chrF, without loading its data (the folder may be read on a machine without it)."""
    return run_bench == "flores" or run_bench.startswith("flores-")


def _asked(sample: dict[str, Any]) -> str:
    """The question as a stored sample asked it: its prompt's last user message."""
    users = [m.get("content", "") for m in sample.get("prompt") or [] if m.get("role") == "user"]
    return users[-1] if users else ""


def _stored_choice(output: str, sample: dict[str, Any]) -> Score:
    """As ``_choice_score``, with the options read back from the question's ``(X) text`` lines."""
    options = dict(re.findall(r"^\(([A-J])\) (.*)$", _asked(sample), flags=re.MULTILINE))
    return scoring.score_choice(output, sample["gold"][0], "".join(options) or datasets.LETTERS, options or None,
                                finish=sample.get("finish_reason"))


def _stored_bbh(output: str, sample: dict[str, Any]) -> Score | None:
    return None if datasets.is_option_text(_asked(sample), sample["gold"][0]) else scoring.score_bbh(
        output, sample["gold"][0], finish=sample.get("finish_reason"))


def _stored_qa(output: str, sample: dict[str, Any]) -> Score | None:
    return scoring.score_qa(output, sample["gold"]) if scoring.usable_aliases(sample["gold"]) else None


def _stored_translation(output: str, sample: dict[str, Any]) -> Score:
    """Sentence chrF of the translation read from the output now: 3df941b stopped reading a code fence or
    a lead-in line as the translation, so a run stored before it would keep the wrapper's lower chrF. A
    stored extraction that reading it now keeps keeps its stored chrF (sentence chrF is the slow part)."""
    hypothesis = scoring.extract_translation(output)
    stored = sample.get("value")
    if hypothesis == sample.get("extracted") and isinstance(stored, int | float) and not isinstance(stored, bool):
        return Score(extracted=hypothesis, correct=False, value=float(stored))
    return scoring.score_translation(output, sample["gold"][0])


_STORED: dict[str, Callable[[str, dict[str, Any]], Score | None]] = {
    "gsm8k": lambda out, s: scoring.score_number(out, s["gold"][0], finish=s.get("finish_reason")),
    "math500": lambda out, s: score_math(out, s["gold"][0]),
    "arc-challenge": _stored_choice, "mmlu-redux": _stored_choice, "bbh": _stored_bbh,
    "nq": _stored_qa, "triviaqa": _stored_qa, "squad": _stored_qa,
}


def stored_scorer(run_bench: str) -> Callable[[str, dict[str, Any]], Score | None] | None:
    """How a stored sample (a samples.jsonl row: its output, gold and prompt) is scored now, without
    the data folder: ``eval compare`` re-scores every run with it, so runs scored before a scoring fix
    and after it are compared by the same rules. The scorer gives None for a question no longer scored
    (a BBH gold that is an option's text, a QA row without a usable alias). Translation reads each
    translation again (``_stored_translation``): the corpus chrF is then computed from these."""
    return _stored_translation if is_translation(run_bench) else _STORED.get(run_bench)


def flores_pair(data: str | None, pair: str | None) -> str:
    """The FLORES pair run: ``pair``, else the one a ``--data`` file named ``PAIR.jsonl`` holds, else en-de.
    A pair that disagrees with the file's name is refused: the file would be asked with the other
    direction's prompt and scored against the wrong side's references."""
    named = Path(data).expanduser() if data and data != "sample" else None
    from_file = named.stem if named is not None and named.suffix == ".jsonl" and named.stem in FLORES_PAIRS else None
    if pair is not None and from_file is not None and pair != from_file:
        raise InvalidRequestError(f"--pair {pair} disagrees with --data {data} (the {from_file} file): "
                                  f"drop --pair, or give the {pair}.jsonl file")
    return pair or from_file or "en-de"


def get_benchmark(name: str, data: str | None = None, pair: str | None = None) -> Benchmark:
    if name == "gsm8k":
        path = _main_path(data, datasets.LAYOUTS["gsm8k"].inside)
        train = _aux(path, "train.jsonl", "gsm8k/train.jsonl")
        return Benchmark(name, path, "accuracy", 512, datasets.load_gsm8k,
                         partial(prompts.gsm8k_messages, train_file=train),
                         lambda out, r, finish=None: scoring.score_number(out, r.answers[0], finish=finish),
                         stop=("\nQuestion:",),
                         exemplars=train)
    if name == "math500":
        path = _main_path(data, datasets.LAYOUTS["math500"].inside)
        return Benchmark(name, path, "accuracy", 1024, datasets.load_math500, prompts.math_messages,
                         lambda out, r, finish=None: score_math(out, r.answers[0]))
    if name == "arc-challenge":
        path = _main_path(data, datasets.LAYOUTS["arc-challenge"].inside)
        dev = _aux(path, "dev.jsonl", "arc_challenge/dev.jsonl")
        return Benchmark(name, path, "accuracy", 128, datasets.load_arc,
                         partial(prompts.arc_messages, dev_file=dev), _choice_score, exemplars=dev)
    if name == "mmlu-redux":
        path = _main_path(data, datasets.LAYOUTS["mmlu-redux"].folder)
        return Benchmark(name, path, "accuracy", 384, datasets.load_mmlu_redux, prompts.mmlu_messages, _choice_score)
    if name == "bbh":
        path = _main_path(data, datasets.LAYOUTS["bbh"].folder)
        cot = _aux(path, "cot-prompts", "bbh/cot-prompts")
        return Benchmark(name, path, "accuracy", 384, datasets.load_bbh, partial(prompts.bbh_messages, cot_dir=cot),
                         lambda out, r, finish=None: scoring.score_bbh(out, r.answers[0], finish=finish),
                         stop=("\nQ:",), prompt_sources=(cot,))
    if name in _QA:
        prompt_name = _QA[name]
        path = _main_path(data, datasets.LAYOUTS[name].inside)
        prompt = _aux(path, f"../prompts/adafuse/{prompt_name}", f"prompts/adafuse/{prompt_name}")
        return Benchmark(name, path, "exact_match", 32, partial(datasets.load_qa, name=name),
                         partial(prompts.qa_messages, prompt_file=prompt),
                         lambda out, r, finish=None: scoring.score_qa(out, r.answers), stop=("\nQuestion:",),
                         exclude=lambda r: prompts.in_prompt(r, prompt), prompt_sources=(prompt,))
    if name == "flores":
        pair = flores_pair(data, pair)
        if pair not in FLORES_PAIRS:
            raise InvalidRequestError(f"unknown FLORES pair {pair!r}; choose one of {FLORES_PAIRS}")
        # a folder without the pair's file stays the folder: the loader's no-data error names what it lacks
        path = _main_path(data, datasets.flores_layout(pair).inside)
        prompt = _aux(path, f"../prompts/adafuse/{_FLORES_PROMPTS[pair]}", f"prompts/adafuse/{_FLORES_PROMPTS[pair]}")
        return Benchmark(f"flores-{pair}", path, "chrf", 256, partial(datasets.load_flores, pair=pair),
                         partial(prompts.flores_messages, prompt_file=prompt),
                         lambda out, r, finish=None: scoring.score_translation(out, r.answers[0]),
                         prompt_sources=(prompt,))
    raise InvalidRequestError(f"unknown benchmark {name!r}; choose one of {BENCHMARKS}")

