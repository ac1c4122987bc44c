"""Review of b2696a5 (p, helper 252's cases): four misreadings of the cut-answer and turn rules, each read wrong at
b2696a5. F1: a made-up question on the very next line (its own numbers) was read as working; F2: an intermediate
"So ..." result read as the answer of a cut answer whose working went on; F3: a result sentence's last number is not
its result; F4: a supposed choice ("If I pick (A)") read as a conclusion."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import score_bbh, score_choice, score_number


@pytest.mark.parametrize("output", [
    "16 - 3 - 4 = 9 eggs. 9 * 2 = 18.\nThe answer is 18.\nQ: Tom has 3 apples and buys 4 more. How many apples "
    "does he have?\nA: 3 + 4 = 7. The answer is 7.",
    "16 - 3 - 4 = 9 eggs. 9 * 2 = 18.\nThe answer is 18.\nQuestion: Tom has 3 apples and buys 4 more. How many "
    "apples does he have?\nA: 3 + 4 = 7. The answer is 7.",
])
def test_a_made_up_question_on_the_next_line_is_a_new_turn(output: str) -> None:
    assert score_number(output, "18").extracted == "18"


def test_a_sub_question_without_numbers_is_still_working() -> None:
    output = ("She has 16 - 3 - 4 = 9 eggs left. The answer is 9.\nQ: How much does she make?\n"
              "A: 9 * 2 = 18. The answer is 18.")
    assert score_number(output, "18").extracted == "18"


@pytest.mark.parametrize("output", [
    "Janet has 16 eggs.\nSo she has 13 eggs left.\n\nNext, she bakes muffins with 4 eggs, so 13 - 4 =",
    "So the total cost is $1,200.\n\nNow the discount",
    "So, 48/2 = 24 clips in May.\n\nIn total, she sold 48 + 24 =",
    "Hence x = 5.\n\nNow plug x into",
])
def test_an_intermediate_result_of_a_cut_answer_is_no_answer(output: str) -> None:
    assert score_number(output, "1200", finish="length").extracted is None


def test_a_concluded_result_followed_by_its_check_still_reads() -> None:
    output = "So she makes $18 per day.\n\nLet me double check: 16 - 3 - 4 = 9, 9 * 2 ="
    assert score_number(output, "18", finish="length").extracted == "18"


@pytest.mark.parametrize(("output", "right"), [
    ("So she has 9 eggs left, which is 16 - 7.\n\nLet me check", None),  # was -7 ("- 7" read negative)
    ("So she has 9 eggs left.\n\nLet me check", "9"),
    ("So she works 8 hours a day for 5 days.\n\nLet me check", None),
])
def test_a_result_sentence_reads_its_result_not_its_last_number(output: str, right: str | None) -> None:
    assert score_number(output, "9", finish="length").extracted == right


@pytest.mark.parametrize("output", [
    "If I pick (A), the order is wrong. But if I pick (B), then the order is",
    "Why would I select (C)? Because it",
    "Suppose I choose (A). Then the statement",
])
def test_a_supposed_choice_is_no_conclusion(output: str) -> None:
    assert score_choice(output, "A", "ABCD", finish="length").extracted is None
    assert score_bbh(output, "(A)", finish="length").extracted is None


def test_a_supposed_choice_in_a_whole_answer_is_none_either() -> None:
    output = ("Let's think. If I select (B), the order is size-color, which is fine. If I select (A), the order is "
              "color-size, which is wrong.")
    assert score_choice(output, "B", "AB").extracted is None
