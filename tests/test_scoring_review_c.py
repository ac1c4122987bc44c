"""Scoring regressions a review found in the session's cue rules (310625d, 54f41d6), from realistic answer variants:
each case here failed on the scorer before its fix; the "still" tests pin the neighbouring behaviour kept."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.math_answers import score_math
from shared_engine.evaluation.scoring import extract_choice, extract_number, score_bbh


@pytest.mark.parametrize("output, expected", [
    ("#### 1. Eggs left\n16 - 3 - 4 = 9\n#### 2. Money\n9 * 2 = 18\n\nThe answer is 18, since 9 * 2 = 18.", "18"),
    ("She sells \\boxed{9} eggs.\nThe answer is 18, since 9 * 2 = 18.", "18"),
])
def test_gsm8k_a_loose_cue_gives_way_only_to_a_later_final_marker(output: str, expected: str) -> None:
    """A cue giving a reason with an '=' gave way to any '####' / \\boxed{}, even an earlier heading or remark: 2, 9."""
    assert extract_number(output) == expected


def test_gsm8k_a_loose_cue_still_gives_way_to_a_later_final_marker() -> None:
    assert extract_number("The answer is 5 apples per box, so for 4 boxes: 4 * 5 = 20\n#### 20") == "20"


@pytest.mark.parametrize("output, expected", [
    ("The answer is 22 \u2013 7 = 15 games.", "15"),  # an en dash as a minus
    ("The answer is 22\u20147 = 15.", "15"),  # an em dash
    ("The answer is 20 - 5 (gave away) = 15.", "15"),  # a bracket closed before the '='
    ("The answer is 2 packs for $3 each = $6.", "6"),  # prepositions in a unit phrase
    ("The answer is 5 boxes with 4 apples each = 20 apples.", "20"),
    ("The answer is 2 trips from 5 = 10 miles.", "10"),
])
def test_gsm8k_a_calculation_with_dashes_remarks_or_unit_phrases_gives_its_result(output: str, expected: str) -> None:
    """A dash, a closed bracket or 'for'/'with'/'from' counted as a reason before the '=' (read 22, 20, 2, 5, 2)."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("The answer is 18 because she sells 16 - 3 - 4 = 9 eggs.", "18"),
    ("The answer is 18 \u2013 she sells 16 - 3 - 4 = 9 eggs.", "18"),  # a dash before words is still a reason
    ("The answer is 540 meters (3 sprints x 3 times = 9 sprints).", "540"),  # a bracket open at the '='
    ("The answer is 18, since 16 - 3 - 4 = 9 eggs are sold.", "18"),
])
def test_gsm8k_still_a_reason_after_the_answer_is_not_read(output: str, expected: str) -> None:
    assert extract_number(output) == expected


def test_bbh_a_count_with_a_unit_phrase_gives_its_result() -> None:
    assert score_bbh("So the answer is 2 packs with 3 = 6.", "6").extracted == "6"


@pytest.mark.parametrize("output, expected", [
    ("A. Mitosis: incorrect.\nB. Meiosis: incorrect.\nC. Photosynthesis: correct.\nD. Budding: incorrect.\n"
     "So option C.", "C"),
    ("A is correct? No, A is wrong. Option C.", "C"),
    ("At first I thought A is correct, but option C fits better.", "C"),
    ("If B is correct then the cell would divide; but that contradicts. Option D.", "D"),
    ("None of A, B or C is correct. Option D is the only one left.", "D"),
    ("A is correct if we ignore air resistance, but with it, D is correct.", "D"),  # "but" ends the supposition
    ("We eliminate (A) and (D). Between (B) and (C), (C) fits. Therefore (C).", "C"),
])
def test_choice_without_a_cue_reads_the_verdict_not_a_list_a_supposition_or_a_walk(output: str, expected: str) -> None:
    """The first-line rule read a list of verdicts' first item (A); a supposed, asked or denied "X is correct" was
    read (A, A, B, C); a concluding bare "(X)" after an elimination was no answer."""
    assert extract_choice(output, "ABCD") == expected


@pytest.mark.parametrize("output, expected", [
    ("B. Photosynthesis\n\nExplanation: Option A is wrong because plants do not eat.", "B"),
    ("D is correct.", "D"),
    ("Option A is wrong. B is correct.", "B"),
])
def test_choice_still_reads_a_first_line_and_a_letter_called_right(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


def test_choice_a_walk_through_cut_off_is_still_no_answer() -> None:
    assert extract_choice("Let me think.\n(A) is a cell division\n(B) Epile", "ABCD") is None
    assert extract_choice("Checking each:\n(A) is wrong. (B) is wrong. (C) is wrong. (D)", "ABCD") is None


@pytest.mark.parametrize("output", ["So the answer is not (A) but (B).", "So the answer is not (A), it is (B)."])
def test_bbh_a_denial_that_goes_on_to_the_answer_states_it(output: str) -> None:
    assert score_bbh(output, "(B)").extracted == "B"


def test_math_an_answer_checked_after_it_is_stated_is_the_answer() -> None:
    output = "The answer is $5$.\nWe can verify the answer is correct by plugging in $x = 5$."
    assert score_math(output, "5").correct


def test_math_an_answer_on_the_line_after_its_cue_is_read() -> None:
    assert score_math("The answer is:\n$\\frac{1}{2}$", "\\frac{1}{2}").correct
