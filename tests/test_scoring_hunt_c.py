"""Scoring gaps a read-only hunt found (option fallbacks, reasons after a stated number, BBH denials, answer lead-ins,
translation labels): each case here failed on the scorer before its fix; the "still" tests pin the neighbouring
behaviour the fixes keep."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import (
    extract_choice,
    extract_number,
    extract_short_answer,
    extract_translation,
    score_bbh,
    score_qa,
)

GERMAN = "Am Montag gaben Wissenschaftler bekannt, dass sie ein neues Diagnosewerkzeug erfunden haben."


@pytest.mark.parametrize("output, expected", [
    ("B. Photosynthesis\n\nExplanation: Option A is wrong because plants do not eat.", "B"),
    ("(B) photosynthesis\nOption A (respiration) releases energy, so it is not it.", "B"),
    ("B\n\nChoice D is tempting but wrong.", "B"),
    ("C) 4 m/s\n\nWhy not option A? Because the speed doubles.", "C"),
])
def test_choice_the_first_line_beats_a_later_option_mention(output: str, expected: str) -> None:
    """The last 'option/choice X' was read before the first-line rule the docstring puts first (read A, D)."""
    assert extract_choice(output, "ABCD") == expected


@pytest.mark.parametrize("output, expected", [
    ("D is correct.", "D"),
    ("Among the options, B is the correct answer.", "B"),
    ("Option A is wrong. B is correct.", "B"),
])
def test_choice_a_letter_called_right_is_read(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


def test_choice_a_walk_through_of_the_options_is_no_answer() -> None:
    """The last bare '(X)' was read: a walk-through of (A)..(D) (or one cut off) gave the last option reached."""
    output = ("Let's analyze each option:\n(A) Mitosis - incorrect, it makes two cells.\n(B) Meiosis - correct, it "
              "halves the chromosome number.\n(C) Fission - incorrect.\n(D) Budding - incorrect.\nSo meiosis it is.")
    assert extract_choice(output, "ABCD") is None
    assert extract_choice("Let me think.\n(A) is a cell division\n(B) Epile", "ABCD") is None


@pytest.mark.parametrize("output, expected", [
    ("Option B", "B"),
    ("Thinking it over, (C) fits, and (C) alone.", "C"),  # a single option in bare form is still read
    ("The answer is (C)\n\nOption A is wrong.", "C"),
])
def test_choice_still_reads_an_option_and_a_single_bare_letter(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


@pytest.mark.parametrize("output, expected", [
    ("The answer is 18 because she sells 16 - 3 - 4 = 9 eggs at $2 each.", "18"),
    ("The answer is 18, since 16 - 3 - 4 = 9 eggs are sold for $2 each", "18"),
    ("The answer is 540 meters (3 sprints x 3 times = 9 sprints of 60 m).", "540"),
])
def test_gsm8k_an_equals_in_a_reason_after_the_answer_is_not_read(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("The answer is $2 * 13 = $26.", "26"),
    ("The answer is 18 eggs = $36.", "36"),
    ("The answer is \\(2 \\times 13 = 26\\).", "26"),
    ("The answer is (3 + 5) * 2 = 16.", "16"),
    ("So the final answer is 15 gallons * 8 pints / gallon = 120 pints", "120"),
    ("The answer is 4 packages of flour cost 4*$3=$12.", "12"),
    ("So the answer is that there are 9 + 6 = 15 liters.", "15"),
])
def test_gsm8k_a_stated_calculation_still_gives_its_result(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("The answer is the sum of 5 and 15.\n5 + 15 = 20\n#### 20", "20"),
    ("The answer is the cost of 3 shirts at $12 each.\n3 * 12 = 36\nSo the final result is \\boxed{36}.", "36"),
])
def test_gsm8k_a_cue_stating_no_number_first_yields_to_a_final_marker(output: str, expected: str) -> None:
    """A cue whose answer opens with words ("the sum of 5 and 15") was read (5, 3) over a later '####' / boxed."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("The answer is 20.\n#### 19", "20"),  # a cue leading with a number still beats '####'
    ("The answer is 5 apples per box, so for 4 boxes: 4 * 5 = 20\n#### 20", "20"),  # a reason's '=': '####' decides
    ("The answer is 12.\nSo the answer is 15 because 3 * 5 = 15", "15"),  # the last cue, even with a reason
    ("The answer is the sum of 5 and 15, which is 20.", "5"),  # with no final marker a worded cue is read as before
])
def test_gsm8k_still_ranks_a_numbered_cue_first(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, gold", [
    ("So the answer is 9 because I have 3 + 2 = 5 fruits and 4 instruments.", "9"),
    ("So the answer is 6, since the fruits are 2 + 2 = 4 and there are 2 vegetables.", "6"),
    ("So the answer is (B).\nNote that the answer is not (A), since Jane arrived later.", "(B)"),
    ("So the answer is No.\nThe answer is not Yes because he did not intend it.", "No"),
    ("So the answer is 8.\nThe answer is not 7, because the piano counts too.", "8"),
    ("So the answer is 8.\nThe answer isn't 7.", "8"),
    ("So the answer is valid.\nThe answer is not invalid, since each premise holds.", "valid"),
    ("So the answer is (e).", "(E)"),
    ("So the answer is not valid.", "invalid"),
    ("So the answer is invalid.\nThe answer is not valid, since the second premise fails.", "invalid"),
])
def test_bbh_reasons_denials_and_small_letters(output: str, gold: str) -> None:
    assert score_bbh(output, gold).correct


@pytest.mark.parametrize("output, gold", [
    ("So the answer is 3 + 5 = 8.", "8"),
    ("So the answer is (a) or (b).", None),  # a hedge stays no answer in small letters too
])
def test_bbh_still_reads_a_calculation_and_a_hedge(output: str, gold: str | None) -> None:
    score = score_bbh(output, gold or "(A)")
    assert score.correct is (gold is not None)


@pytest.mark.parametrize("output", ["**Answer:** Paris", "The answer is Paris.", "**Answer: Paris**",
                                    "The final answer is: Paris", "### Answer: Paris"])
def test_qa_an_answer_lead_in_is_not_part_of_the_answer(output: str) -> None:
    assert extract_short_answer(output) == "Paris"
    assert score_qa(output, ["Paris"]).correct


@pytest.mark.parametrize("output", ["**Translation:** " + GERMAN, "German: " + GERMAN, "Deutsch: " + GERMAN,
                                    "Here's the translation: " + GERMAN, "Sure! Here is the German translation: "
                                    + GERMAN])
def test_translation_labels_and_same_line_lead_ins_are_stripped(output: str) -> None:
    assert extract_translation(output) == GERMAN
