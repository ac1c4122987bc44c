"""Scoring fixes from the second evaluation hunt (hunt-eval REPORT2: r1, r2, r5, r6, r7)."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.math_answers import math_equal, score_math
from shared_engine.evaluation.scoring import (
    extract_choice,
    extract_number,
    extract_translation,
    score_bbh,
    score_choice,
    score_qa,
)

# --- r1: a calculation's result given in words (GSM8K, BBH) --------------------------------------


@pytest.mark.parametrize("output", [
    "The answer is 36 / 2, which is 18.",
    "The answer is 3 * 6, which equals 18.",
    "The answer is 12+6 equals 18.",
    "The answer is 3 times 6, which is 18.",
    "The answer is 1/2 of 36, which is 18.",
    "The answer is half of 36, which is 18.",
    "The answer is 3 * 6 apples, which is 18 apples.",
    "The answer is $36 / 2, which is $18.",
])
def test_gsm8k_result_in_words_is_the_answer(output: str) -> None:
    assert extract_number(output) == "18"


@pytest.mark.parametrize(("output", "expected"), [
    ("The answer is 15, which is 3 more than 12.", "15"),       # no calculation before "which is"
    ("The answer is 3 + 5 = 8, which is 2 more than 6.", "8"),  # the '=' gave the result already
    ("The answer is 18 because 3 + 6 is 9 eggs.", "18"),         # a reason after the answer
    ("The answer is that there are 15 liters, which is more than 10.", "15"),
    ("The answer is 12 + 6 = 18.", "18"),
])
def test_gsm8k_words_after_no_calculation_keep_the_answer(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize(("output", "gold"), [
    ("So the answer is 3 * 6, which is 18.", "18"),
    ("So the answer is -3 * 6, which equals -18.", "-18"),
])
def test_bbh_result_in_words(output: str, gold: str) -> None:
    assert score_bbh(output, gold).correct


# --- r2: MATH-500 a \pm gold, several boxes, {,} ----------------------------------------------


@pytest.mark.parametrize(("prediction", "gold"), [
    ("1, -2", "-2,1"),  # "Enter all the integer roots, separated by commas": any order
    ("-2, 1", "1,-2"),
    ("3 + 2\\sqrt{2}, 3 - 2\\sqrt{2}", "3 \\pm 2 \\sqrt{2}"),
    ("3 - 2\\sqrt{2}, 3 + 2\\sqrt{2}", "3 \\pm 2 \\sqrt{2}"),
    ("10{,}080", "10,\\!080"),
    ("11{,}111{,}111{,}100", "11,\\! 111,\\! 111,\\! 100"),
    ("\\$32{,}348", "\\$32,\\!348"),
])
def test_math_lists_and_thousands(prediction: str, gold: str) -> None:
    assert math_equal(prediction, gold)


@pytest.mark.parametrize(("prediction", "gold"), [
    ("(1,-2)", "(-2,1)"),        # an ordered pair keeps its order
    ("[1,2)", "(1,2]"),          # an interval its brackets
    ("1,1", "1,-1"),             # each item matched once
    ("5,5", "5"),                # a list is not a single number
    ("1", "1,2"),
    ("3 + 2\\sqrt{2}", "3 \\pm 2 \\sqrt{2}"),  # one root of two
])
def test_math_lists_still_differ(prediction: str, gold: str) -> None:
    assert not math_equal(prediction, gold)


def test_math_each_item_boxed_on_its_own() -> None:
    assert score_math("The integer roots are $\\boxed{-2}$ and $\\boxed{1}$.", "-2,1").correct
    output = "So $x = \\boxed{3 + 2\\sqrt{2}}$ or $x = \\boxed{3 - 2\\sqrt{2}}$."
    assert score_math(output, "3 \\pm 2 \\sqrt{2}").correct
    # a gold of one item reads the last box alone; boxes on earlier lines are steps, not the list
    assert not score_math("The roots are $\\boxed{-2}$ and $\\boxed{1}$.", "-2").correct
    assert not score_math("First $\\boxed{4}$.\nSo the answer is $\\boxed{5}$.", "4,5").correct


# --- r5: typographic quotes in open QA --------------------------------------------------------------


@pytest.mark.parametrize(("output", "gold"), [
    ("Eugene O\u2019Neill", "Eugene O'Neill"),
    ("\u201cHey Jude\u201d", "Hey Jude"),
    ("Mother\u2019s Day", "Mother's Day"),
    ("Mother's Day", "Mother\u2019s Day"),
])
def test_qa_typographic_quotes(output: str, gold: str) -> None:
    score = score_qa(output, [gold])
    assert score.correct and score.f1 == 1.0


# --- r6: a letter in quotes, brackets or backticks; "B is the answer" ---------------------------------


@pytest.mark.parametrize("output", ['The answer is "B".', "The answer is 'B'.", "The answer is [B].",
                                    "The answer is `B`.", "The answer is \u201cB\u201d.", "B is the answer."])
def test_choice_letter_forms(output: str) -> None:
    assert score_choice(output, "B", "ABCD").correct


@pytest.mark.parametrize("output", ["The answer is 'A' or 'B'.", "The answer is [A] or [B].",
                                    'The answer is either "A" or "C".'])
def test_choice_quoted_hedge_is_no_answer(output: str) -> None:
    assert extract_choice(output, "ABCD") is None


def test_bbh_quoted_option_letter() -> None:
    assert score_bbh("Let's think step by step. ... So the answer is \"B\".", "(B)").extracted == "B"


# --- r7: a FLORES lead-in line with no colon ----------------------------------------------------------


@pytest.mark.parametrize("output", [
    "Sure! Here is the translation.\n\nDer Hund läuft schnell über die Straße.",
    "Here is the translation into German\n\nDer Hund läuft schnell über die Straße.",
    "Here's the German translation:\n\nDer Hund läuft schnell über die Straße.",
])
def test_flores_lead_in_without_colon(output: str) -> None:
    assert extract_translation(output) == "Der Hund läuft schnell über die Straße."


def test_flores_lead_in_alone_is_kept() -> None:
    # nothing follows it: it is all the output has
    assert extract_translation("Here is the translation.") == "Here is the translation."
