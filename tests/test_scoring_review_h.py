"""False verdicts that the scoring fixes of f27146b brought in (second review, round h): a calculation whose second
number opens brackets read as its first number, "X is the answer, but ..." disowned by any turn, and a FLORES lead-in
that names what it translates kept as the translation."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, extract_number, extract_translation, score_bbh

# --- GSM8K / BBH: a calculation with brackets, then its result in words ---------------------------


@pytest.mark.parametrize(("output", "expected"), [
    ("The answer is 2 * (3 + 4), which is 14.", "14"),
    ("The answer is 3 × (4 + 2), which is 18.", "18"),
    ("The answer is 6 * (12 / 3) which is 24 cookies.", "24"),
    ("The answer is 2(3 + 4), which is 14.", "14"),
    ("The answer is 5 * $(2 + 1), which is $15.", "15"),
    ("The answer is 3 * (2 + 5) which equals 21.", "21"),
])
def test_a_bracketed_calculation_gives_its_result_in_words(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize(("output", "expected"), [
    ("The answer is 18 (2 hours), which is the total.", "18"),
    ("The answer is 18 (2 hours), which is 36 minutes.", "18"),  # a remark in brackets, no multiplication
    ("The answer is 24 cookies and 24 / 2 is 12 per friend.", "24"),
    ("The answer is 2 of 4 days, which is 50%.", "2"),
])
def test_a_number_with_a_bracketed_remark_is_still_the_answer(output: str, expected: str) -> None:
    assert extract_number(output) == expected


def test_bbh_bracketed_calculation_gives_its_result() -> None:
    assert score_bbh("So the answer is 2 * (3 + 4), which is 14.", "14").correct


# --- multiple choice: "X is the answer, but ..." is disowned only by a supposition or another right letter ----


@pytest.mark.parametrize(("output", "expected"), [
    ("B is the answer, but I am not fully sure.", "B"),
    ("C is the answer, yet some might choose A.", "C"),
    ("A is the answer, but let me double-check: yes.", "A"),
    ("So B is the answer, yet I'm not certain.", "B"),
    ("Therefore, C is the answer, but D is also plausible.", "C"),
    ("(B) is the answer, but the wording is odd.", "B"),
    ("Though some may disagree, C is the answer, but D is close.", "C"),
    ("One could argue that A is the answer, but option B fits better.", "B"),
])
def test_a_stated_answer_with_a_doubt_is_still_stated(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


@pytest.mark.parametrize(("output", "expected"), [
    ("One might think A is the answer, but option C fits the evidence.", "C"),
    ("Someone might argue A is the answer, yet the evidence points to option C.", "C"),
    ("A is the answer most people pick, however C is correct.", "C"),
    ("At first glance B is the answer, but D is correct.", "D"),
    ("It may seem that B is the answer, but the data say otherwise. D is correct.", "D"),
])
def test_a_supposed_or_overruled_answer_is_still_disowned(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


# --- FLORES: a lead-in that names what it translates ----------------------------------------------


@pytest.mark.parametrize("output", [
    "Sure! Here is the translation of the sentence into Spanish.\nEl perro ladra.",
    "Here is the translation of the given text into Spanish.\nEl perro ladra.",
    "Sure, here is the translation of your sentence in Spanish.\nEl perro ladra.",
    "Here is the translation to Spanish of the sentence above.\nEl perro ladra.",
    "Here is the translation of the text.\n\nEl perro ladra.",
])
def test_flores_lead_in_with_its_object_is_dropped(output: str) -> None:
    assert extract_translation(output) == "El perro ladra."


@pytest.mark.parametrize(("output", "expected"), [
    ("Here is the translation — Der Hund bellt.\n\nNote: literal.", "Here is the translation — Der Hund bellt."),
    ("Here is the translation of the dog barks loudly.\nNext.",
     "Here is the translation of the dog barks loudly.\nNext."),
])
def test_flores_a_line_that_goes_on_is_still_no_lead_in(output: str, expected: str) -> None:
    assert extract_translation(output) == expected
