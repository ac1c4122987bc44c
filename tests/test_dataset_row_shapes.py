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
