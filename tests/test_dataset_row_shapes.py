"""Benchmark files whose rows hold the expected keys with the wrong shape inside: each is one readable
error naming the file and row (InvalidRequestError, which `eval` and `calibrate` print as one line), not
a KeyError/TypeError/ValidationError traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation import datasets

GOOD_ARC = {"id": "q0", "question": {"stem": "Which is a metal?",
                                     "choices": [{"label": "A", "text": "iron"}, {"label": "B", "text": "wood"}]},
            "answerKey": "A"}


def _jsonl(tmp_path: Path, *rows: object) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("bad", [
    {"question": {"stem": "Which?", "choices": [{"text": "iron"}]}, "answerKey": "A"},  # option without label
    {"question": {"choices": [{"label": "A", "text": "iron"}]}, "answerKey": "A"},  # no stem
    {"question": {"stem": "Which?", "choices": None}, "answerKey": "A"},  # choices not a list
    {"question": {"stem": "Which?", "choices": [{"label": "11", "text": "iron"}]}, "answerKey": "A"},  # 11: no letter
], ids=["no-label", "no-stem", "choices-null", "label-out-of-range"])
def test_arc_row_of_the_wrong_shape_names_its_row(tmp_path: Path, bad: dict) -> None:
    path = _jsonl(tmp_path, GOOD_ARC, bad)
    with pytest.raises(InvalidRequestError, match=r"data\.jsonl row 1: a row of the wrong shape"):
        datasets.load_arc(path)


@pytest.mark.parametrize(("loader", "bad"), [
    (datasets.load_gsm8k, {"question": 17, "answer": "so #### 3"}),
    (datasets.load_math500, {"problem": "1+1?", "answer": ["2"]}),
    (lambda p: datasets.load_qa(p, "nq-open"), {"question": ["who?"], "answer": "x"}),
], ids=["gsm8k", "math500", "qa"])
def test_json_lines_rows_of_the_wrong_shape_name_their_row(tmp_path: Path, loader, bad: dict) -> None:
    path = _jsonl(tmp_path, bad)
    with pytest.raises(InvalidRequestError, match=r"data\.jsonl row 0: a row of the wrong shape"):
        loader(path)


@pytest.mark.parametrize("question", [["not", "text"], 7, None], ids=["list", "number", "null"])
def test_bbh_example_of_the_wrong_shape_names_its_example(tmp_path: Path, question: object) -> None:
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"examples": [{"input": question, "target": "(A)"}]}), encoding="utf-8")
    with pytest.raises(InvalidRequestError, match=r"task\.json example 0: a row of the wrong shape"):
        datasets.load_bbh(path)


def test_well_formed_rows_still_load(tmp_path: Path) -> None:
    dataset = datasets.load_arc(_jsonl(tmp_path, GOOD_ARC))
    assert [(r.question, r.answers, [c.label for c in r.choices]) for r in dataset.records] == [
        ("Which is a metal?", ["A"], ["A", "B"])]


@pytest.mark.parametrize(("loader", "answers"), [
    (datasets.load_gsm8k, ["x\n#### 1", "y\n#### 2"]),
    (lambda p: datasets.load_qa(p, "nq-open"), ["Paris", ["Rome", "Roma"]]),  # a GSM8K file is refused there
], ids=["gsm8k", "qa"])
def test_a_json_lines_file_with_a_bom_keeps_its_first_row(tmp_path: Path, loader, answers: list) -> None:
    """Read as plain UTF-8, the BOM made the first line invalid JSON: the row was skipped as malformed."""
    rows = [{"question": "Q1?", "answer": answers[0]}, {"question": "Q2?", "answer": answers[1]}]
    path = tmp_path / "data.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps(r) + "\n" for r in rows).encode())
    dataset = loader(path)
    assert [r.question for r in dataset.records] == ["Q1?", "Q2?"] and dataset.skipped == {}


def test_a_bbh_task_file_with_a_bom_loads(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps({"examples": [{"input": "Is it?", "target": "Yes"}]}).encode())
    assert [r.answers for r in datasets.load_bbh(path).records] == [["Yes"]]


@pytest.mark.parametrize("target", [None, ["A"], {"answer": "A"}], ids=["null", "list", "object"])
def test_a_bbh_target_that_is_not_text_names_its_example(tmp_path: Path, target: object) -> None:
    """Read with str(), null was the gold "None" and a list "['A']": questions no answer could match."""
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"examples": [{"input": "Is it?", "target": "Yes"}, {"input": "Q", "target": target}]}),
                    encoding="utf-8")
    with pytest.raises(InvalidRequestError, match=r"task\.json example 1: a row of the wrong shape"):
        datasets.load_bbh(path)


def test_a_numeric_bbh_target_is_its_text(tmp_path: Path) -> None:
    path = tmp_path / "task.json"
    path.write_text(json.dumps({"examples": [{"input": "How many?", "target": 12}]}), encoding="utf-8")
    assert [r.answers for r in datasets.load_bbh(path).records] == [["12"]]


def _arc(answer: object, *labels: str) -> dict:
    return {"question": "Which?", "options": [{"label": x, "text": f"t{j}"} for j, x in enumerate(labels)],
            "answer": answer}


@pytest.mark.parametrize(("bad", "match"), [
    (_arc("", "A", "B"), "empty answer key"),  # was the gold "A"
    (_arc(None, "A", "B"), "empty answer key"),
    (_arc("1", "0", "1"), "label '0' is no option number"),  # "0" was "J"
    (_arc("A", "1", "2") | {"answer": "0"}, "label '0' is no option number"),
    (_arc("A", "\u00b2", "B"), "answer 'A' is not an option label"),  # "²": a ValueError traceback
], ids=["empty", "null", "label-zero", "answer-zero", "superscript"])
def test_an_arc_row_with_no_usable_key_names_its_row(tmp_path: Path, bad: dict, match: str) -> None:
    path = _jsonl(tmp_path, _arc("B", "A", "B"), bad)
    with pytest.raises(InvalidRequestError, match=rf"data\.jsonl row 1: .*{match}"):
        datasets.load_arc(path)


def test_arc_numbers_and_missing_option_labels_still_read(tmp_path: Path) -> None:
    dataset = datasets.load_arc(_jsonl(tmp_path, _arc("4", "1", "2", "3", "4"), _arc("B", "", "")))
    assert [(r.answers, [c.label for c in r.choices]) for r in dataset.records] == [
        (["D"], ["A", "B", "C", "D"]), (["B"], ["A", "B"])]
