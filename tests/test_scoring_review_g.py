"""False verdicts that the scoring fixes of 8978cd1 and d5ed095 brought in (review of their cases, round g): a later
remark's "is N" read as the answer, "N of M" read as a calculation, the farthest 'is' taken as a result, an attributed
"X is the answer" read as the answer, every box of the last line joined, and a lead-in swallowing its translation."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.math_answers import score_math
from shared_engine.evaluation.scoring import extract_choice, extract_number, extract_translation, score_bbh

# --- GSM8K / BBH: a result in words only straight after a calculation that leads the answer -------


@pytest.mark.parametrize(("output", "expected"), [
    ("The answer is 24 cookies and 24 / 2 is 12 per friend.", "24"),
    ("The answer is 3 hours and 3 x 60 is 180 minutes.", "3"),
    ("Answer: 12 boxes and 12 * 3 is 36 cans", "12"),
    ("The answer is 48 clips, 48 / 2 is 24 in May.", "48"),
    ("The answer is 24 cookies and half of 24 is 12 for each friend.", "24"),
    ("The answer is 18 dollars per day and 18 * 7 is 126 per week.", "18"),
    ("The answer is 8 cups and 8 / 2 makes 4 servings.", "8"),
])
def test_a_later_remarks_result_is_not_the_answer(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize(("output", "gold"), [
    ("So the answer is 5 and 5 - 2 is 3.", "5"),
    ("So the answer is 3 fruits and 2 + 2 is 4 vegetables.", "3"),
])
def test_bbh_later_remark_is_not_the_answer(output: str, gold: str) -> None:
    assert score_bbh(output, gold).correct


@pytest.mark.parametrize(("output", "expected"), [
    ("The answer is 2 of 4 days, which is 50%.", "2"),
    ("The answer is 3 of 10 tickets, which is 30 percent of them.", "3"),
    ("The answer is 20% of 50, which is 10.", "10"),
    ("The answer is 1/2 of 36, which is 18.", "18"),
    ("The answer is half of 36, which is 18.", "18"),
])
def test_n_of_m_is_no_calculation_but_a_fraction_of_one_is(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize(("output", "expected"), [
    ("The answer is 3 + 5 is 8, which is 2 more than 6.", "8"),
    ("The answer is 3 + 15 is 18, which is 2 more than 16.", "18"),
    ("The answer is 36 / 2, which is 18.", "18"),
])
def test_the_nearest_is_gives_the_result(output: str, expected: str) -> None:
    assert extract_number(output) == expected


# --- multiple choice: "X is the answer, but ..." is someone else's answer -------------------------


@pytest.mark.parametrize(("output", "expected"), [
    ("One might think A is the answer, but option C fits the evidence.", "C"),
    ("Someone might argue A is the answer, yet the evidence points to option C.", "C"),
    ("A is the answer most people pick, however C is correct.", "C"),
    ("B is the answer.", "B"),
    ("B is the answer. However, let me explain option A.", "B"),
    ("A is correct, but it took a while to see. Option C is a distractor.", "A"),  # only the "answer" wording turns
])
def test_an_answer_the_sentence_turns_from_is_not_stated(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


# --- MATH: only boxes joined to the last one by a comma, 'and', 'or' ------------------------------


@pytest.mark.parametrize(("output", "gold", "correct"), [
    ("So $x=\\boxed{1}$ or $x=\\boxed{-2}$, i.e. $\\boxed{1,-2}$.", "1,-2", True),
    ("The roots are $\\boxed{1}$ and $\\boxed{-2}$, so the answer is $\\boxed{1, -2}$.", "1,-2", True),
    ("$\\boxed{1}$, $\\boxed{1, -2}$", "1,-2", True),  # a last box that lists the items is taken alone
    ("Checking: $\\boxed{-2}$ is extraneous, so the answer is $\\boxed{1}$.", "1,-2", False),
    ("We find $n=\\boxed{-2}$ fails the equation, so only $\\boxed{1}$ works.", "1,-2", False),
    ("$\\boxed{3}, \\boxed{5}$ and also $\\boxed{7}$ is wrong", "3, 5, 7", False),
    ("$\\boxed{-2}$ and $\\boxed{1}$.", "-2,1", True),
    ("So $x=\\boxed{1}$ or $x=\\boxed{-2}$.", "1,-2", True),
    ("$\\boxed{3}$, $\\boxed{5}$, $\\boxed{7}$", "3, 5, 7", True),
    ("$x = \\boxed{3 + 2\\sqrt{2}}$ or $x = \\boxed{3 - 2\\sqrt{2}}$", "3 \\pm 2 \\sqrt{2}", True),
    ("$\\boxed{1}$ \\quad $\\boxed{-2}$", "1,-2", True),
])
def test_math_joins_only_the_boxes_listed_together(output: str, gold: str, correct: bool) -> None:
    assert score_math(output, gold).correct is correct


# --- FLORES: a lead-in line is only a short one -----------------------------------------------------


@pytest.mark.parametrize(("output", "expected"), [
    ("Here is the translation — Der Hund bellt.\n\nNote: literal.", "Here is the translation — Der Hund bellt."),
    ("Here's my translation, Der Hund bellt.\nI kept the tense.",
     "Here's my translation, Der Hund bellt.\nI kept the tense."),
    ("Here is the translation the U.N. commissioned in 1990.\nIt was never published.",
     "Here is the translation the U.N. commissioned in 1990.\nIt was never published."),
    ("Here is the translation process that engineers follow.\nIt has three steps.",
     "Here is the translation process that engineers follow.\nIt has three steps."),
])
def test_flores_a_line_that_goes_on_is_no_lead_in(output: str, expected: str) -> None:
    assert extract_translation(output) == expected


@pytest.mark.parametrize("output", [
    "Sure! Here is the translation.\nDer Hund bellt.",
    "Here is the translation into German\nDer Hund bellt.",
    "Here is the translation of the text:\nDer Hund bellt.",
    "Here's the Romanian translation (traducere)\nDer Hund bellt.",
    "Here is a translation of the text, but I am unsure.\n\nDer Hund bellt.",
    "**Here is the translation in German.**\nDer Hund bellt.",
])
def test_flores_short_lead_ins_still_dropped(output: str) -> None:
    assert extract_translation(output) == "Der Hund bellt."
