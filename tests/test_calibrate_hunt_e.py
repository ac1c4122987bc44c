"""Calibrate's profile (hunt e): ``calibrate(out=...)`` from Python wrote nothing, a hand-edited
profile with nonsensical fit numbers loaded, a fit on one question was not warned about, and an ARC
dev file's malformed line was dropped without a word."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from shared_engine import calibration
from shared_engine.calibration import calibrate
from shared_engine.cli import main
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.datasets import load_arc, load_gsm8k, load_qa
from shared_engine.members import HFMember
from shared_engine.profile import EnsembleProfile, FitInfo
from tests.test_calibration import SHOTS, _rows
from tests.toy import registered_members, toy_member

RELIABLE_QUESTIONS = 20  # fewer are warned about


def _train(tmp_path: Path, n: int = 3) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(SHOTS + n)))
    return path


def _toys() -> list[HFMember]:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


def test_the_python_entry_point_writes_the_profile_to_out(tmp_path: Path) -> None:
    """``calibrate(..., out=path)`` checked ``out`` and returned the profile without writing it."""
    out = tmp_path / "p.json"
    profile = calibrate(_toys(), "gsm8k", str(_train(tmp_path)), limit=1, progress=False, out=out)
    assert EnsembleProfile.load(out) == profile
    with pytest.raises(InvalidRequestError, match="does not exist"):  # checked before fitting, as the CLI does
        calibrate(_toys(), "gsm8k", str(_train(tmp_path)), limit=1, progress=False, out=tmp_path / "no" / "p.json")


def test_the_cli_writes_the_profile_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI and the Python entry point share one writer: the file is written once, not twice."""
    written: list[Path] = []
    save = EnsembleProfile.save

    def counting(self: EnsembleProfile, path: str | Path) -> None:
        written.append(Path(path))
        save(self, path)

    monkeypatch.setattr(EnsembleProfile, "save", counting)
    out = tmp_path / "p.json"
    with registered_members(_toys()):
        assert main(["calibrate", "--models", "a,b", "--data", str(_train(tmp_path)), "--limit", "1",
                     "--out", str(out), "--no-progress"]) == 0
    assert written == [out] and EnsembleProfile.load(out).members == ["a", "b"]


def _saved(tmp_path: Path, change: dict[str, Any], fitted: dict[str, Any]) -> Path:
    profile = EnsembleProfile(
        members=["a", "b"], weights=[0.25, 0.75], drafter="b", drafter_confidence=0.6,
        fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=3, asked=3, method="test", spans=9,
                       positions=5, nll_per_byte={"a": 1.2, "b": 0.7}, log_likelihood=-12.5,
                       threshold_accuracy={"none": 0.4, "0.5": 0.6}))
    values = json.loads(profile.model_dump_json())
    values.update(change)
    values["fitted"].update(fitted)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(values))
    return path


@pytest.mark.parametrize(("change", "fitted", "field"), [
    ({}, {"questions": -5}, "fitted.questions"),
    ({}, {"questions": 0}, "fitted.questions"),
    ({}, {"asked": 0}, "fitted.asked"),
    ({}, {"asked": 2}, "more than asked"),
    ({}, {"spans": -1}, "fitted.spans"),
    ({}, {"positions": -3}, "fitted.positions"),
    ({}, {"nll_per_byte": {"a": -0.5, "b": 0.7}}, "fitted.nll_per_byte.a"),
    ({}, {"threshold_accuracy": {"none": 1.5}}, "fitted.threshold_accuracy.none"),
    ({}, {"threshold_accuracy": {"none": -0.1}}, "fitted.threshold_accuracy.none"),
    ({"weights": [-0.5, 1.5]}, {}, "weights"),
    ({"drafter_confidence": 1.5}, {}, "drafter_confidence"),
    ({"drafter_confidence": -0.2}, {}, "drafter_confidence"),
])
def test_a_hand_edited_profile_with_nonsensical_fit_numbers_is_refused_naming_the_field(
        tmp_path: Path, change: dict[str, Any], fitted: dict[str, Any], field: str) -> None:
    """``fitted.questions: -5`` (or 0, a negative count, an accuracy above 1) loaded as a fit."""
    assert EnsembleProfile.load(_saved(tmp_path, {}, {})).fitted.questions == 3  # the unedited one loads
    with pytest.raises(InvalidRequestError, match="not a valid profile") as caught:
        EnsembleProfile.load(_saved(tmp_path, change, fitted))
    assert field in str(caught.value)


def test_an_infinite_log_likelihood_is_refused(tmp_path: Path) -> None:
    path = _saved(tmp_path, {}, {})
    path.write_text(path.read_text().replace('"log_likelihood": -12.5', '"log_likelihood": -Infinity'))
    with pytest.raises(InvalidRequestError, match="fitted.log_likelihood"):
        EnsembleProfile.load(path)


def test_a_fit_on_fewer_than_20_questions_is_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """One question (N=1) gave a member weight 0.999997 without a word."""
    with caplog.at_level(logging.WARNING, logger="shared_engine.calibration"):
        profile = calibrate(_toys(), "gsm8k", str(_train(tmp_path)), limit=1, progress=False)
    notices = [r.getMessage() for r in caplog.records if "unreliable" in r.getMessage()]
    assert profile.fitted.questions == 1 and len(notices) == 1
    assert "fitted on 1 question(s)" in notices[0] and f"fit on {RELIABLE_QUESTIONS} or more" in notices[0]
    assert calibration.RELIABLE_QUESTIONS == RELIABLE_QUESTIONS


def test_a_fit_on_enough_questions_is_not_warned_about(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="shared_engine.calibration"):
        profile = calibrate(_toys(), "gsm8k", str(_train(tmp_path, RELIABLE_QUESTIONS)), limit=RELIABLE_QUESTIONS,
                            progress=False)
    assert profile.fitted.questions == RELIABLE_QUESTIONS
    assert not [r for r in caplog.records if "unreliable" in r.getMessage()]


def _arc(i: int) -> str:
    return json.dumps({"id": f"q{i}", "answerKey": "ABCD"[i % 4],
                       "question": {"stem": f"Question {i}?", "choices": [{"label": x, "text": f"option {x}"}
                                                                          for x in "ABCD"]}})


@pytest.mark.parametrize(("broken", "line"), [
    ('{"id": "q9", "question": {"stem": broken', 3),  # not JSON
    ('{"id": "q9", "question": {"stem": "cut off', 3),  # a record never closed before the next
])
def test_a_malformed_line_in_an_arc_dev_file_is_an_error_naming_the_line(tmp_path: Path, broken: str,
                                                                         line: int) -> None:
    """It was skipped and counted, a count calibrate never shows: a fit on fewer questions than the file."""
    dev = tmp_path / "dev.jsonl"
    dev.write_text(_arc(0) + "\n\n" + broken + "\n" + _arc(1) + "\n")
    with pytest.raises(InvalidRequestError, match=f"line {line}: not JSON") as caught:
        load_arc(dev)
    assert str(dev) in str(caught.value)


def test_a_malformed_line_in_a_gsm8k_split_is_an_error_and_a_cut_triviaqa_record_is_still_counted(
        tmp_path: Path) -> None:
    train = tmp_path / "train.jsonl"
    rows = [json.dumps(r) for r in _rows(3)]
    train.write_text(rows[0] + "\n" + rows[1] + "\n" + "not json\n" + rows[2] + "\n")
    with pytest.raises(InvalidRequestError, match=f"{train}, line 3: not JSON"):
        load_gsm8k(train)
    qa = tmp_path / "triviaqa.jsonl"  # the tail of a record whose head the 70% split cut off: counted, as before
    qa.write_text('tail of a cut record", "answer": ["x"]}\n{"question": "Q?", "answer": ["Paris"]}\n')
    data = load_qa(qa, "triviaqa")
    assert [r.question for r in data.records] == ["Q?"] and data.skipped == {"malformed line": 1}
