"""Multiple choice (review k2 of c2df02e): a ':' lead-in over a list of several options concluded its first
item; a verdict in a label's first sentence about another option ("Option A: Mercury is wrong; Venus is the
correct answer.") or qualified by "but" called the label right; 'Option C is false.' (the answer to a "which is
false?" question) was kept out as an option called wrong; an en dash or hyphen written for a minus made the
model's own option ("(A) –2") read as another's text."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice

NUMBERS = {"A": "-2", "B": "2", "C": "3", "D": "4"}


@pytest.mark.parametrize("output", [
    "The answer is:\n- Option A: Mercury - too close\n- Option B: Venus - hottest\n- Option C: Earth",
    "Final Answer:\n1. Option A: Mercury. Too cold at night.\n2. Option B: Venus. Too hot.",
    "Therefore:\n- Option A: Mercury\n- Option B: Venus",
])
def test_a_lead_in_over_a_list_of_options_concludes_none_of_them(output: str) -> None:
    assert extract_choice(output, "ABCD") is None


def test_a_lead_in_over_one_option_still_concludes_it() -> None:
    assert extract_choice("The correct answer is:\n\n- **Option B**: Venus", "ABCD") == "B"


@pytest.mark.parametrize("output", [
    "Option A: Mercury is wrong; Venus is the correct answer.\nOption B: Venus",
    "Option A: correct, but incomplete.\nOption B: Venus is correct and complete.",
    "Option A: Mercury is not correct, Venus is correct.\nOption B: Venus",
    "Option A: The statement is correct, but irrelevant.\nOption B: Venus",
])
def test_a_verdict_about_another_option_or_qualified_does_not_call_the_label_right(output: str) -> None:
    assert extract_choice(output, "ABCD") != "A"


@pytest.mark.parametrize("output", [
    "Option C is false.",
    "Option C is incorrect. The Moon is not a planet.",
    "Option C is wrong: the Moon is a satellite, not a planet.",
])
def test_the_one_option_called_false_is_the_answer_to_a_which_is_false_question(output: str) -> None:
    assert extract_choice(output, "ABCD") == "C"


def test_an_option_called_wrong_among_others_is_still_no_fallback() -> None:
    assert extract_choice("Option A is incorrect.\n\nOption C: Earth is the correct answer.", "ABCD") == "C"


@pytest.mark.parametrize("dash", ["\u2013", "\u2010", "\u2212"])
def test_a_dash_written_for_a_minus_keeps_the_models_own_option(dash: str) -> None:
    assert extract_choice(f"The answer is (A) {dash}2", "ABCD", NUMBERS) == "A"
    assert extract_choice(f"The answer is (B) {dash}2", "ABCD", NUMBERS) is None  # A's text after B
