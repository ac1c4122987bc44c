"""Small fixes: a denied option letter read as the multiple-choice answer by a fallback, and a profile whose
``version`` is a JSON boolean loaded as version 1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.scoring import extract_choice, score_choice
from shared_engine.profile import EnsembleProfile, FitInfo


@pytest.mark.parametrize(("output", "expected"), [
    # the cue skips the denial; the bare-(X) fallback then found the denial's own "(A)" and read A
    ("The answer is not (A), since x.", None),
    ("The answer isn't (A).", None),
    ("The answer is not (a), since (a) fails.", None),
    # the option fallback read the denied letter too
    ("The answer is not (A). Option A is wrong.", None),
    ("The answer is not (A). Therefore (A).", None),
    # the first-line rule read it ("A." leads the first line)
    ("A. The answer is not A", None),
    # with the denied letter out, the one left is the answer (read as no answer before: two bare letters)
    ("The answer is not (A) but (B).", "B"),
    ("The answer is not (A), it is (B).", "B"),
    ("The answer is not A or B. (A) and (B) fail; (C).", "C"),
])
def test_a_denied_letter_is_not_read_as_the_answer(output: str, expected: str | None) -> None:
    assert extract_choice(output, "ABCD") == expected


def test_a_denial_does_not_change_what_a_cue_or_another_letter_states() -> None:
    assert extract_choice("The answer is (B). The answer is not (A).", "ABCD") == "B"
    assert extract_choice("The answer is not A. B is correct.", "ABCD") == "B"
    assert extract_choice("The answer is not obvious. (C)", "ABCD") == "C"  # a denial naming no letter
    assert extract_choice("The answer is not Applicable here. (A)", "ABCD") == "A"  # a word, not the letter A
    assert score_choice("The answer is not (A), since x.", "B", "ABCD").value == 0.0


def _profile_values(tmp_path: Path) -> tuple[Path, dict[str, object]]:
    path = tmp_path / "profile.json"
    EnsembleProfile(members=["a", "b"], weights=[0.3, 0.7], drafter="b", drafter_confidence=0.7,
                    fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="test")).save(path)
    return path, json.loads(path.read_text())


def test_a_boolean_profile_version_is_refused_as_no_whole_number(tmp_path: Path) -> None:
    """"version": true (a hand edit) loaded as version 1 (lax int), false was refused as "1 or more"."""
    path, values = _profile_values(tmp_path)
    for flag in (True, False):
        path.write_text(json.dumps({**values, "version": flag}))
        with pytest.raises(InvalidRequestError, match=r"profile version must be a whole number \(this "
                                                      rf"safe-ensemble reads 1\), got {flag!r}"):
            EnsembleProfile.load(path)
    path.write_text(json.dumps({**values, "version": 1}))
    assert EnsembleProfile.load(path).version == 1
