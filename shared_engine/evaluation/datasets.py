"""Benchmark loaders: read the published files as they are and return typed records.

Every loader takes a path (a file, or a folder where the benchmark is a folder of files) and
returns a :class:`Dataset`: the records in file order plus the number of rows skipped and why, so a
report can say exactly what was measured. The files are not cleaned beforehand; the quirks are
handled here (MMLU-Redux: ``;`` or ``,`` delimiters, a Mac Roman file, varying column order,
un-normalised ``error_type`` labels).
"""

from __future__ import annotations

import ast
import csv
import io
import json
import re
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import zip_longest
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import InvalidRequestError
from .scoring import usable_aliases

LETTERS = "ABCDEFGHIJ"


class Choice(BaseModel):
    model_config = ConfigDict(frozen=True)
    label: str
    text: str


class Record(BaseModel):
    """One benchmark question with its reference answer(s)."""

    model_config = ConfigDict(frozen=True)
    id: str = Field(description="Stable within the file: resumed runs match samples by it.")
    question: str
    answers: list[str] = Field(description="Gold answer, or every accepted alias (NQ, TriviaQA, SQuAD).")
    choices: list[Choice] = Field(default_factory=list, description="Multiple choice options, labelled A, B, ...")
    group: str | None = Field(None, description="Subject (MMLU-Redux), task (BBH), subject (MATH-500).")
    solution: str | None = Field(None, description="Worked solution where the file has one.")


class Layout(NamedTuple):
    """Where a benchmark's data lies in the data folder and what else ``--data`` may name, for the error
    that a ``--data`` holding none of it gets (``/tmp`` said "benchmark file not found: /tmp")."""

    inside: str  # the file (or files) in the data folder: "gsm8k/test.jsonl", "bbh/*.json"
    kind: str    # a file that may be given instead: "a GSM8K .jsonl file"
    also: str = ""  # what else --data takes, for a first run without the data folder ("sample")

    @property
    def folder(self) -> str:
        """The benchmark's folder in the data folder ("gsm8k", "bbh")."""
        return self.inside.split("/")[0]

    def hint(self) -> str:
        return f"--data takes the data folder, the {self.folder} folder or {self.kind}{self.also}"


LAYOUTS = {
    "gsm8k": Layout("gsm8k/test.jsonl", "a GSM8K .jsonl file",
                    "; --data sample runs the GSM8K sample the package ships"),
    "math500": Layout("math500/test.jsonl", "a MATH-500 .jsonl file"),
    "arc-challenge": Layout("arc_challenge/test.jsonl", "an ARC .jsonl file"),
    "mmlu-redux": Layout("mmlu_redux/*.csv", "one subject's MMLU-Redux .csv file"),
    "bbh": Layout("bbh/*.json", "one BBH task's .json file"),
    "nq": Layout("nq_open/test.jsonl", "an NQ-open .jsonl file"),
    "triviaqa": Layout("triviaqa/test.jsonl", "a TriviaQA .jsonl file"),
    "squad": Layout("squad/test.jsonl", "a SQuAD .jsonl file"),
}
"""As ``benchmarks.get_benchmark`` looks for them (FLORES: ``flores_layout``)."""


def flores_layout(pair: str) -> Layout:
    return Layout(f"flores/{pair}.jsonl", f"a FLORES {pair}.jsonl file")


class RowError(InvalidRequestError):
    """A row holding the expected keys whose content is no record of this benchmark (a GSM8K answer
    without ``####``): ``_row_shape`` names the file and row, which the loader knows and the check not."""


class Dataset(BaseModel):
    name: str
    source: str
    records: list[Record]
    skipped: dict[str, int] = Field(default_factory=dict, description="Rows left out, by reason.")


def _jsonl(path: Path, skipped: Counter[str], malformed: list[tuple[int, str]] | None = None
           ) -> Iterator[dict[str, Any]]:
    """JSON lines. A record whose string holds a raw line break spans lines and is read as one
    (TriviaQA has one); a line that is only the tail of such a record, whose head is not
    in the file (the 70% split cut it off), is skipped and counted, and noted in ``malformed``
    (its line number and why) for a reader that refuses it (``_rows``)."""
    pending, start = "", 0

    def skip(why: str) -> None:
        skipped["malformed line"] += 1
        if malformed is not None:
            malformed.append((start, why))

    with path.open(encoding="utf-8-sig", newline="\n") as f:  # a BOM made the first row "malformed"
        for number, line in enumerate(_utf8_lines(f, path), 1):
            if not line.strip():
                continue
            if pending and line.lstrip().startswith("{"):  # a head whose tail never came
                skip("a record not closed before the next line")
                pending = ""
            if not pending:
                start = number
            pending += line
            try:
                yield json.loads(pending, strict=False)
            except json.JSONDecodeError as err:
                if "Unterminated string" in err.msg and pending.lstrip().startswith("{"):
                    continue
                skip(err.msg)
            pending = ""
    if pending.strip():
        skip("a record not closed at the end of the file")


def _utf8_lines(lines: Iterator[str], path: Path) -> Iterator[str]:
    """The file's lines; a file that is not UTF-8 text is an error naming it (a UnicodeDecodeError
    traceback from every eval and calibrate that read it)."""
    try:
        yield from lines
    except UnicodeDecodeError:
        raise InvalidRequestError(f"{path} is not UTF-8 text (benchmark files are UTF-8 JSON lines)") from None


def _rows(path: Path, keys: tuple[str, ...], skipped: Counter[str], layout: Layout,
          strict: bool = True) -> Iterator[tuple[int, dict[str, Any]]]:
    """Numbered JSON rows holding ``keys``; an error if the file has none (not this format). ``strict`` (a
    file with no cut records: GSM8K, MATH-500, ARC, FLORES) refuses a malformed line once the file is read,
    naming the file and line as the GSM8K exemplars' reader does: an ARC dev file's broken line was
    skipped, a count calibrate never shows, and the fit read fewer questions than the file holds. Not
    strict (the open-QA files, TriviaQA's cut record): skipped and counted, as the eval report shows."""
    count = 0
    malformed: list[tuple[int, str]] = []
    for row in _jsonl(_need_file(path, layout), skipped, malformed):
        if not isinstance(row, dict) or any(k not in row for k in keys):
            skipped["missing fields"] += 1
            continue
        yield count, row
        count += 1
    if count == 0:
        raise InvalidRequestError(f"{path}: no JSON lines with the fields {list(keys)} (not {layout.kind}?)")
    if strict and malformed:
        line, why = malformed[0]
        more = f" (and {len(malformed) - 1} more malformed line(s))" if len(malformed) > 1 else ""
        raise InvalidRequestError(f"{path}, line {line}: not JSON ({why}){more}; one JSON record per line is read")


@contextmanager
def _row_shape(where: str) -> Iterator[None]:
    """A row that holds the expected keys with the wrong shape inside (an ARC option without its
    ``label``, a number where the question's text goes) is an error naming its file and row: it was
    a KeyError/TypeError/ValidationError traceback out of ``eval`` and ``calibrate``. A ``RowError`` (a
    check that knows no row) gets the same prefix."""
    try:
        yield
    except RowError as err:
        raise InvalidRequestError(f"{where}: {err}") from None
    except (KeyError, IndexError, TypeError, AttributeError, ValidationError) as err:
        detail = f"no {err}" if isinstance(err, KeyError) else str(err).splitlines()[0]
        raise InvalidRequestError(f"{where}: a row of the wrong shape ({type(err).__name__}: {detail})") from None


def _need_file(path: Path, layout: Layout) -> Path:
    """``path`` if it is a file; else an error saying what was looked for and what ``--data`` takes. A
    link to a missing file (git-annex data not fetched) says so: ``ls`` lists it, "not found" misled."""
    if path.is_dir():
        _no_data(path, layout)
    _not_dangling(path)
    if not path.is_file():
        raise InvalidRequestError(f"benchmark file not found: {path} ({layout.hint()})")
    return path


def _not_dangling(path: Path) -> None:
    """A link to a missing file (git-annex data not fetched) is an error saying so, whether named or found
    in a folder (BBH, MMLU-Redux): ``ls`` lists it, and "not found" or a FileNotFoundError traceback misled."""
    if path.is_symlink() and not path.exists():
        raise InvalidRequestError(f"{path} is a link to a missing file ({path.readlink()}: data not fetched? "
                                  f"with git-annex, 'git annex get {path.name}' in its folder)")


def _no_data(folder: Path, layout: Layout) -> NoReturn:
    """A folder holding none of the benchmark's files (``get_benchmark`` looked in it for ``layout.inside``
    and for its last part): it said "benchmark file not found: /tmp" of a folder that exists."""
    raise InvalidRequestError(f"{folder}: a folder, but it holds neither {layout.inside} nor "
                              f"{Path(layout.inside).name} ({layout.hint()})")


# --- GSM8K ---------------------------------------------------------------------------------------

def gsm8k_final_answer(solution: str) -> str:
    """The number after ``####`` in a GSM8K worked solution, without thousands separators."""
    if "####" not in solution:
        raise RowError(f"GSM8K solution without '####': {solution[-80:]!r} (is this a GSM8K file?)")
    return solution.rsplit("####", 1)[1].strip().replace(",", "")


def load_gsm8k(path: Path) -> Dataset:
    records, skipped = [], Counter[str]()
    for i, row in _rows(path, ("question", "answer"), skipped, LAYOUTS["gsm8k"]):
        with _row_shape(f"{path} row {i}"):
            records.append(Record(id=str(i), question=row["question"], answers=[gsm8k_final_answer(row["answer"])],
                                  solution=row["answer"]))
    return Dataset(name="gsm8k", source=str(path), records=records, skipped=dict(skipped))


# --- MATH-500 ------------------------------------------------------------------------------------

def load_math500(path: Path) -> Dataset:
    records, skipped = [], Counter[str]()
    for i, row in _rows(path, ("problem", "answer"), skipped, LAYOUTS["math500"]):
        with _row_shape(f"{path} row {i}"):
            records.append(Record(id=row.get("unique_id") or str(i), question=row["problem"],
                                  answers=[row["answer"]], group=row.get("subject"), solution=row.get("solution")))
    return Dataset(name="math500", source=str(path), records=records, skipped=dict(skipped))


# --- ARC -----------------------------------------------------------------------------------------

def _arc_label(label: str, where: str) -> str:
    """Numeric labels (some NYSED items use 1-4) become letters, as in the re-keyed test file. A number
    with no letter ("0" was read as "J", "11" an IndexError) is an error naming the row; only ASCII
    digits are numbers ("²" passed ``isdigit`` and ``int`` raised a ValueError traceback)."""
    if not re.fullmatch(r"[0-9]+", label):
        return label
    if not 1 <= int(label) <= len(LETTERS):
        raise InvalidRequestError(f"{where}: a row of the wrong shape (label {label!r} is no option number "
                                  f"1-{len(LETTERS)})")
    return LETTERS[int(label) - 1]


def load_arc(path: Path) -> Dataset:
    """Both schemas: the re-keyed test file (``options``, ``answer``) and AI2's own (``question.stem``)."""
    records, skipped = [], Counter[str]()
    for i, row in _rows(path, ("question",), skipped, LAYOUTS["arc-challenge"]):
        with _row_shape(f"{path} row {i}"):
            if isinstance(row["question"], dict) and "answerKey" in row:  # AI2 schema (dev split)
                stem, options, answer = row["question"]["stem"], row["question"]["choices"], row["answerKey"]
            elif "options" in row and "answer" in row:
                stem, options, answer = row["question"], row["options"], row["answer"]
            else:
                raise InvalidRequestError(
                    f"{path} row {i}: neither ARC schema (options/answer or question.stem/answerKey)")
            where = f"{path} row {i}"
            choices = [Choice(label=_arc_label(str(o["label"]), where) or LETTERS[j], text=o["text"])
                       for j, o in enumerate(options)]
            if answer is None or not str(answer).strip():  # was read as the first option's label, "A"
                raise InvalidRequestError(f"{where}: a row of the wrong shape (empty answer key {answer!r})")
            answer = _arc_label(str(answer), where)
            if answer not in {c.label for c in choices}:
                raise InvalidRequestError(f"{path} row {i}: answer {answer!r} is not an option label")
            records.append(Record(id=str(row.get("id", i)), question=stem, answers=[answer], choices=choices))
    return Dataset(name="arc-challenge", source=str(path), records=records, skipped=dict(skipped))


# --- MMLU-Redux ----------------------------------------------------------------------------------

MMLU_SKIPPED_ERRORS = frozenset({"wrong groundtruth", "no correct answer"})
"""Annotated error types whose gold answer is known to be wrong (with no correct option, the gold
letter is wrong too): those questions are not scored."""


def normalize_error_type(label: str | None) -> str:
    """``Wrong Groundtruth`` / ``wrong_groundtruth`` / ``OK`` -> ``wrong groundtruth`` / ``ok``."""
    return re.sub(r"\s+", " ", (label or "").replace("_", " ")).strip().lower()


def _decode(raw: bytes) -> str:
    """UTF-8 (with or without BOM); the one Mac Roman annotation sheet otherwise."""
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return raw.decode("mac_roman")


def _parse_choices(value: str, where: str) -> list[str]:
    try:
        choices = ast.literal_eval(value.strip())
    except (ValueError, SyntaxError):
        raise InvalidRequestError(f"{where}: choices are not a list literal: {value[:80]!r}") from None
    if not isinstance(choices, (list, tuple)) or not choices:
        raise InvalidRequestError(f"{where}: choices are not a list: {value[:80]!r}")
    return [str(c) for c in choices]


def _mmlu_rows(path: Path) -> list[dict[str, str]]:
    text = _decode(path.read_bytes())
    header = text.split("\n", 1)[0]
    delimiter = ";" if header.count(";") > header.count(",") else ","
    reader = csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter)
    if not reader.fieldnames or not {"question", "choices", "answer"} <= {f.strip() for f in reader.fieldnames}:
        raise InvalidRequestError(f"{path}: not an MMLU-Redux sheet (no question, choices and answer columns; "
                                  f"first line {_clip(header)})")
    # columns are found by name (order varies); empty extra columns are dropped
    return [{(k or "").strip(): (v or "") for k, v in row.items() if k and k.strip()} for row in reader]


def _clip(text: str, limit: int = 80) -> str:
    """A file's line quoted for an error, cut at ``limit`` (a BBH task's whole JSON was a 61 KB message)."""
    return repr(text[:limit]) + (f" ... ({len(text)} characters)" if len(text) > limit else "")


def unread(relative: Path) -> bool:
    """A file in a data or prompt folder that nothing reads: hidden (``.DS_Store``, macOS's ``._task.json``,
    an editor's ``.task.txt.swp``, anything under a hidden folder) or a backup (``task.txt~``). The loaders
    skip it (``._task.json`` is no task: it failed the BBH load) and the run's hashes leave it out (it
    refused the resume of a run of hours), one rule for both, so a file read is always a file hashed."""
    return any(part.startswith(".") for part in relative.parts) or relative.name.endswith("~")


def _folder_files(folder: Path, pattern: str) -> list[Path]:
    """The files of ``folder`` matching ``pattern`` that are read (pathlib's glob matches hidden ones); a
    link among them to a missing file is an error naming it (``_not_dangling``)."""
    files = sorted(f for f in folder.glob(pattern) if not unread(Path(f.name)))
    for file in files:
        _not_dangling(file)  # one task's link not fetched: a FileNotFoundError traceback from the whole folder
    return files


def load_mmlu_redux(path: Path) -> Dataset:
    """One subject CSV, or a folder of them (records interleaved across subjects, so ``--limit``
    samples every subject)."""
    files = _folder_files(path, "*.csv") if path.is_dir() else [_need_file(path, LAYOUTS["mmlu-redux"])]
    if not files:
        _no_data(path, LAYOUTS["mmlu-redux"])
    skipped: Counter[str] = Counter()
    per_subject: list[list[Record]] = []
    for file in files:
        subject = file.stem.removeprefix("mmlu_")
        records = []
        for i, row in enumerate(_mmlu_rows(file)):
            where = f"{file.name} row {i}"
            error = normalize_error_type(row.get("error_type"))
            if error in MMLU_SKIPPED_ERRORS:
                skipped[error] += 1
                continue
            choices = _parse_choices(row["choices"], where)
            answer = row["answer"].strip()
            if not answer.isdigit() or int(answer) >= len(choices):
                raise InvalidRequestError(
                    f"{where}: answer {answer!r} is not a 0-based index into {len(choices)} choices")
            records.append(Record(
                id=f"{subject}/{i}", question=row["question"].strip(), answers=[LETTERS[int(answer)]],
                choices=[Choice(label=LETTERS[j], text=c) for j, c in enumerate(choices)], group=subject))
        per_subject.append(records)
    return Dataset(name="mmlu-redux", source=str(path), records=_interleave(per_subject), skipped=dict(skipped))


def _interleave(groups: list[list[Record]]) -> list[Record]:
    return [r for batch in zip_longest(*groups) for r in batch if r is not None]


# --- BBH -----------------------------------------------------------------------------------------

def load_bbh(path: Path) -> Dataset:
    """One task JSON, or the folder of them (records interleaved across tasks)."""
    files = _folder_files(path, "*.json") if path.is_dir() else [_need_file(path, LAYOUTS["bbh"])]
    if not files:
        _no_data(path, LAYOUTS["bbh"])
    per_task, skipped = [], Counter[str]()
    for file in files:
        try:
            data = json.loads(file.read_text(encoding="utf-8-sig"))  # a BOM was "not one JSON document"
        except ValueError as err:  # e.g. another benchmark's JSON lines; UnicodeDecodeError is one too
            raise InvalidRequestError(f"{file}: not a BBH task file (not one JSON document: {err})") from None
        if not isinstance(data, dict) or not isinstance(data.get("examples"), list):
            raise InvalidRequestError(f"{file}: not a BBH task file (no 'examples')")
        records = []
        for i, ex in enumerate(data["examples"]):
            if not isinstance(ex, dict) or "input" not in ex or "target" not in ex:
                raise InvalidRequestError(f"{file} example {i}: not a BBH example (no 'input' and 'target')")
            with _row_shape(f"{file} example {i}"):
                _bbh_target(ex["target"])
                if is_option_text(ex["input"], str(ex["target"])):
                    skipped[BBH_OPTION_TEXT] += 1
                    continue
                records.append(Record(id=f"{file.stem}/{i}", question=ex["input"], answers=[str(ex["target"])],
                                      group=file.stem))
        per_task.append(records)
    return Dataset(name="bbh", source=str(path), records=_interleave(per_task), skipped=dict(skipped))


BBH_OPTION_TEXT = "gold is an option's text, not its letter"


def _bbh_target(target: object) -> None:
    """A target is text (a number is read as its text): null was scored against the gold "None", a
    list against "['A']", which no answer matches."""
    if not isinstance(target, (str, int, float)):
        raise TypeError(f"target {target!r} is not text")


def is_option_text(question: str, target: str) -> bool:
    """A target that is an option's text where the question lists lettered options: three BBH rows
    (movie_recommendation/163, ruin_names/99 and /144, whose options were split at commas upstream)
    that no answer can match, so they are not scored."""
    return "\n(A) " in question and not re.fullmatch(r"\([A-R]\)", target.strip())


# --- Open QA and translation ----------------------------------------------------------------------

QA_NO_ALIAS = "no alias left once normalised"
_PAIR_NAME = re.compile(r"[a-z]{2,3}-[a-z]{2,3}")
"""A translation file's name (FLORES: ``en-de.jsonl``)."""


def _gsm8k_solution(answers: list[str], name: str) -> None:
    """An alias holding GSM8K's ``####`` is a worked solution: --bench nq on gsm8k/test.jsonl loaded its
    923 rows, each solution an alias no answer matches. No open-QA answer holds the marker. A ``RowError``:
    ``_row_shape`` names the file and row."""
    if any("####" in a for a in answers):
        raise RowError(f"an answer holding GSM8K's '####' (a worked solution, not a {name} answer): is this a "
                       "GSM8K file? --bench gsm8k reads it")


def load_qa(path: Path, name: str) -> Dataset:
    """NQ-open, TriviaQA, SQuAD: ``question`` and ``answer`` (one string or a list of aliases). A file that
    is certainly another benchmark's (``--bench nq`` on a GSM8K or FLORES file: its solutions or sentences
    read as aliases) is an error."""
    records, skipped = [], Counter[str]()
    layout = LAYOUTS.get(name) or Layout(f"{name}/test.jsonl", "an open-QA .jsonl file")  # a name not registered
    alias_lists, ids = False, True
    for i, row in _rows(path, ("question", "answer"), skipped, layout, strict=False):  # TriviaQA's cut record
        alias_lists |= isinstance(row["answer"], list)
        ids &= "id" in row
        answers = row["answer"] if isinstance(row["answer"], list) else [row["answer"]]
        with _row_shape(f"{path} row {i}"):
            _gsm8k_solution([str(a) for a in answers], name)
        if not usable_aliases([str(a) for a in answers]):
            skipped[QA_NO_ALIAS] += 1  # e.g. NQ's "---": only an empty answer would match it
            continue
        with _row_shape(f"{path} row {i}"):
            records.append(Record(id=str(i), question=row["question"], answers=[str(a) for a in answers]))
    # squad on flores/en-de.jsonl: named as a pair, FLORES's id on every row, one sentence per answer (a QA
    # file of the user's own, "my-qa.jsonl" or "en-de.jsonl" without ids, is read)
    if records and ids and not alias_lists and _PAIR_NAME.fullmatch(path.stem):
        raise InvalidRequestError(f"{path}: a translation file (named as a language pair, an 'id' and one answer "
                                  f"sentence per row, no alias list), not {layout.kind}: --bench flores reads it")
    return Dataset(name=name, source=str(path), records=records, skipped=dict(skipped))


def load_flores(path: Path, pair: str) -> Dataset:
    """Rows of ``question`` and ``answer`` (the sentence pair) and ``id`` (every FLORES file has one; a file
    of the user's own without it is numbered by row). A GSM8K file is refused (--bench flores on
    gsm8k/test.jsonl loaded its questions as sentences): its answers hold '####'."""
    records, skipped = [], Counter[str]()
    for i, row in _rows(path, ("question", "answer"), skipped, flores_layout(pair)):
        if not isinstance(row["question"], str) or not isinstance(row["answer"], str):
            raise InvalidRequestError(f"{path} row {i}: not a FLORES file (a 'question' and an 'answer' "
                                      "sentence per row; an answer list is open QA's)")
        with _row_shape(f"{path} row {i}"):
            _gsm8k_solution([row["answer"]], "translation")
        records.append(Record(id=str(row.get("id", i)), question=row["question"], answers=[row["answer"]]))
    return Dataset(name=f"flores-{pair}", source=str(path), records=records, skipped=dict(skipped))
