"""Calibrate and the evaluation's exemplar files (hunt d): --out over the file the prompt's few-shot
exemplars come from, a blank or malformed line in that file, and --limit beyond what the split has."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from shared_engine.calibration import calibrate
from shared_engine.cli import main
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation import prompts
from shared_engine.members import HFMember
from tests.toy import registered_members, toy_member

SHOTS = 4


def _rows(n: int, start: int = 0) -> list[dict[str, str]]:
    rows = []
    for i in range(start, start + n):
        a, b = 3 + i, 11 + 2 * i
        rows.append({"question": f"Sofia has {a} apples and buys {b} more. How many apples does she have?",
                     "answer": f"She has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    return rows


def _jsonl(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


def _toys() -> list[HFMember]:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


def test_out_over_the_prompts_exemplar_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """--data another file: the data folder's gsm8k/train.jsonl still gives the prompt's exemplars, and
    --out naming it replaced it with the profile; every later eval and calibrate there crashed."""
    root = tmp_path / "root"
    (root / "gsm8k").mkdir(parents=True)
    exemplars = root / "gsm8k" / "train.jsonl"
    exemplars.write_text(_jsonl(_rows(SHOTS + 2)))
    mine = tmp_path / "mine" / "dev.jsonl"
    mine.parent.mkdir()
    mine.write_text(_jsonl(_rows(6, start=50)))
    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(root))
    before = exemplars.read_text()
    with registered_members(_toys()):
        assert main(["calibrate", "--models", "a,b", "--data", str(mine), "--limit", "1",
                     "--out", str(exemplars), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and "few-shot exemplars" in err and str(exemplars) in err
    assert exemplars.read_text() == before
    with pytest.raises(InvalidRequestError, match="few-shot exemplars"):  # the Python entry point too
        calibrate(_toys(), "gsm8k", str(mine), limit=1, progress=False, out=root / "gsm8k" / ".." / "gsm8k" /
                  "train.jsonl")


def test_blank_lines_in_the_exemplar_file_are_skipped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A blank first line was read as the first exemplar: JSONDecodeError traceback from eval and calibrate."""
    plain, blank = tmp_path / "plain" / "train.jsonl", tmp_path / "blank" / "train.jsonl"
    for path in (plain, blank):
        path.parent.mkdir()
    plain.write_text(_jsonl(_rows(SHOTS + 4)))
    blank.write_text("\n" + "\n".join(json.dumps(r) + "\n" for r in _rows(SHOTS + 4)))
    assert prompts.gsm8k_shots(blank) == prompts.gsm8k_shots(plain) and len(prompts.gsm8k_shots(blank)) == SHOTS
    with registered_members(_toys()):
        assert main(["calibrate", "--models", "a,b", "--data", str(blank), "--limit", "1",
                     "--out", str(tmp_path / "p.json"), "--no-progress"]) == 0


@pytest.mark.parametrize(("line", "says"), [
    ("{not json", "not JSON"),
    ('{"question": "How many?"}', 'no "question" and "answer"'),
    ("[1, 2]", 'no "question" and "answer"'),
    ('{"question": "How many?", "answer": "Seven."}', '"#### N"'),
])
def test_a_malformed_exemplar_line_is_one_error_line_naming_file_and_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], line: str,
        says: str) -> None:
    """A malformed line among the first rows was a JSONDecodeError or KeyError traceback from eval and calibrate."""
    folder = tmp_path / "gsm8k"
    folder.mkdir()
    rows = _rows(SHOTS + 4)
    train = folder / "train.jsonl"
    train.write_text(_jsonl(rows[:1]) + line + "\n" + _jsonl(rows[1:]))
    (folder / "test.jsonl").write_text(_jsonl(_rows(2, start=80)))
    with pytest.raises(InvalidRequestError, match="line 2") as caught:
        prompts.gsm8k_shots(train)
    assert str(train) in str(caught.value) and says in str(caught.value)
    with registered_members(_toys()):
        assert main(["eval", "--bench", "gsm8k", "--models", "a,b", "--data", str(folder), "--limit", "1",
                     "--max-new-tokens", "2", "--no-progress", "--out", str(tmp_path / "ev")]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {train}, line 2: ") and err.count("\n") == 1 and "Traceback" not in err
        mine = tmp_path / "mine" / "dev.jsonl"  # no train split beside it: the data folder's gives the exemplars
        mine.parent.mkdir()
        mine.write_text(_jsonl(_rows(4, start=50)))
        monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path))
        assert main(["calibrate", "--models", "a,b", "--data", str(mine), "--limit", "1",
                     "--out", str(tmp_path / "p.json"), "--no-progress"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: {train}, line 2: ") and "Traceback" not in err


def _arc_row(i: int, answer: str) -> dict[str, object]:
    return {"id": f"q{i}", "question": {"stem": f"Question {i}?", "choices": [
        {"text": f"option {label}", "label": label} for label in "ABCD"]}, "answerKey": answer}


@pytest.mark.parametrize("bad", [
    '{"id": "x", "question": {"stem": "Which?"}, "answerKey": "A"}',                    # no choices
    '{"id": "x", "question": {"stem": "Which?", "choices": [{"text": "t"}]}, "answerKey": "A"}',  # no label
])
def test_an_arc_exemplar_file_with_a_broken_row_is_an_error_naming_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    """A dev row without choices or labels was a KeyError traceback from every ARC eval."""
    folder = tmp_path / "arc_challenge"
    folder.mkdir()
    dev = folder / "dev.jsonl"
    dev.write_text("\n" + bad + "\n" + "".join(json.dumps(_arc_row(i, "ABCD"[i % 4])) + "\n" for i in range(8)))
    with pytest.raises(InvalidRequestError, match="row 0: a row of the wrong shape") as caught:
        prompts.arc_shots(dev)
    assert str(dev) in str(caught.value)
    test = folder / "test.jsonl"
    test.write_text(json.dumps({"question": "Which one?", "options": [{"label": "A", "text": "x"},
                                {"label": "B", "text": "y"}], "answer": "A"}) + "\n")
    with registered_members(_toys()):
        assert main(["eval", "--bench", "arc-challenge", "--models", "a,b", "--data", str(test), "--limit", "1",
                     "--max-new-tokens", "2", "--no-progress", "--out", str(tmp_path / "ev")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {dev} row 0: a row of the wrong shape") and "Traceback" not in err


def test_an_arc_exemplar_file_with_blank_lines_gives_all_four_letters(tmp_path: Path) -> None:
    """ARC's reader skipped blank lines already (the split's loader does); kept so the fix above keeps it."""
    dev = tmp_path / "dev.jsonl"
    dev.write_text("\n\n" + "\n".join(json.dumps(_arc_row(i, "ABCD"[i % 4])) for i in range(8)) + "\n")
    shots = prompts.arc_shots(dev)
    assert [answer.split(")")[0] for _, answer in shots] == [f"The answer is ({x}" for x in "ABCD"]


def test_a_limit_beyond_the_split_says_how_many_it_fits_on(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--limit 50 on a split with 3 questions left fitted on 3 without a word."""
    train = tmp_path / "train.jsonl"
    train.write_text(_jsonl(_rows(SHOTS + 3)))
    with registered_members(_toys()), caplog.at_level(logging.WARNING, logger="shared_engine.calibration"):
        assert main(["calibrate", "--models", "a,b", "--data", str(train), "--limit", "50",
                     "--out", str(tmp_path / "p.json"), "--no-progress"]) == 0
    notices = [r.getMessage() for r in caplog.records if "--limit" in r.getMessage()]
    assert len(notices) == 1 and "--limit 50" in notices[0] and "has 3 question(s)" in notices[0]
    caplog.clear()
    with registered_members(_toys()), caplog.at_level(logging.WARNING, logger="shared_engine.calibration"):
        assert main(["calibrate", "--models", "a,b", "--data", str(train), "--limit", "2",
                     "--out", str(tmp_path / "p2.json"), "--no-progress"]) == 0
    assert not [r for r in caplog.records if "--limit" in r.getMessage()]  # within the split: no notice
