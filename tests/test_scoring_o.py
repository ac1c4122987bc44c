"""Multiple choice and BBH (fixer o, misreadings left by the last review): a verdict list calling two options right
("- Option A: ... - correct\n- Option B: ... - correct\n- Option C: ... - incorrect", a "which is false?" walk-through)
read its last right one; a headed item whose next line calls it right ("### Option B: Venus\nVenus is the right
answer.") read none; BBH's "Final Answer:\nOption A: <text>" read none; a first line taken back ("(A). Wait, no. (C) is
correct.") read A; "B is plausible, but C is correct too" read C; a BBH answer followed by a turn the model wrote on
its own ("(A)\n\nUser: ... So the answer is (B).") read that turn's B; "Logic says B" read none. Each rule has near
misses that keep their old reading."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_bbh


def _mc(output: str) -> str | None:
    return extract_choice(output, "ABCD")


def _bbh(output: str, gold: str = "(A)") -> str | None:
    return score_bbh(output, gold).extracted


# a. the scorer does not see the question ("which is false?"), so neither the last option called right (B) nor the one
# called wrong (C) can be told to be the answer: none, not a wrong letter
@pytest.mark.parametrize("output", [
    "- Option A: Mercury - correct\n- Option B: Venus - correct\n- Option C: The Sun - incorrect",
    "### Option A: Mercury\nThis is correct.\n### Option B: Venus\nThis is the correct answer.",
])
def test_a_verdict_list_calling_several_options_right_concludes_none(output: str) -> None:
    assert _mc(output) is None


@pytest.mark.parametrize(("output", "letter"), [
    ("- Option A: Mercury - incorrect\n- Option B: Venus - correct\n- Option C: The Sun - incorrect", "B"),
    ("- Option A: Mercury - correct\n- Option B: Venus - correct\n\nThe answer is C.", "C"),
    ("- Option A: Mercury - correct, but incomplete\n- Option B: Venus - correct", "B"),
    ("Option B: Venus is the correct answer.\n\nOption B: the best choice.", "B"),
    ("The correct answer is:\n\n- **Option B**: Venus", "B"),
])
def test_one_option_called_right_in_a_verdict_list_is_still_the_choice(output: str, letter: str) -> None:
    assert _mc(output) == letter


# b. a heading's line holds only the option's text; its next line states the verdict
@pytest.mark.parametrize("output", [
    "### Option B: Venus\nVenus is the right answer.",
    "### Option B: Venus\n\nVenus is the right answer.",
])
def test_a_headed_item_whose_first_line_calls_it_right_is_the_choice(output: str) -> None:
    assert _mc(output) == "B"


@pytest.mark.parametrize("output", [
    "### Option A: Mercury\nMercury is not the right answer.",
    "### Option B: Venus\nVenus is the right size for life.",
    "### Option A: Mercury\nMercury is too close.\n### Option B: Venus\nVenus is hot.",
    "### Option A: Mercury\nIt is wrong, Venus is the right answer.",
    "### Option A: Mercury\nSome say it is the right answer, but it is too close.",
])
def test_a_headed_item_not_called_right_in_its_first_line_is_no_choice(output: str) -> None:
    assert _mc(output) is None


# c. BBH's 'Answer:' cue read across its line break names the labelled option
@pytest.mark.parametrize(("output", "letter"), [
    ("Final Answer:\nOption A: Mercury", "A"),
    ("**Final Answer:**\nOption A: Mercury", "A"),
    ("Final Answer:\nOption (B): Venus", "B"),
])
def test_bbh_final_answer_over_a_labelled_option_is_that_option(output: str, letter: str) -> None:
    assert _bbh(output) == letter


@pytest.mark.parametrize("output", [
    "Final Answer:\nOption A: Mercury is wrong",
    "Final Answer:\nOption A or Option B",
    "Final Answer:\n1. Option A: Mercury\n2. Option B: Venus",
])
def test_bbh_final_answer_over_a_rejected_offered_or_listed_option_is_none(output: str) -> None:
    assert _bbh(output) is None


# d. a first line's letter taken back for another
@pytest.mark.parametrize(("output", "letter"), [
    ("(A). Wait, no. (C) is correct.", "C"),
    ("B. Actually, C is correct.", "C"),
])
def test_a_first_line_that_turns_to_another_letter_states_that_letter(output: str, letter: str) -> None:
    assert _mc(output) == letter


@pytest.mark.parametrize(("output", "letter"), [
    ("(A). Wait, let me check: yes, (A) is correct.", "A"),
    ("(A). However, (C) is also plausible.", "A"),
    ("(A). No, (C) is wrong.", "A"),
    ("B. Venus\nWait, I should explain why option C is wrong.", "B"),
])
def test_a_first_line_that_keeps_its_letter_states_it(output: str, letter: str) -> None:
    assert _mc(output) == letter


# "too" adds C to B, which the same sentence called plausible: both are held, as in a hedge "B or C" (read as C, it
# scored right whenever C was the key), so none
def test_a_letter_called_right_too_beside_one_called_plausible_is_a_hedge() -> None:
    assert _mc("B is plausible, but C is correct too.") is None


@pytest.mark.parametrize("output", [
    "B is plausible, but C is correct.",
    "B is wrong, but C is correct too.",
    "C is correct too.",
])
def test_a_letter_called_right_without_another_held_beside_it_is_the_choice(output: str) -> None:
    assert _mc(output) == "C"


# BBH: the model's answer, then a turn it wrote on its own (the stop sequence "\nQ:" catches only one form)
@pytest.mark.parametrize(("output", "letter"), [
    ("(A)\n\nUser: what about this one?\nSo the answer is (B).", "A"),
    ("(A)\n\nQ: Which is next?\nA: Let's think. So the answer is (B).", "A"),
    ("So the answer is (C).\n\nQ: next?\nA: So the answer is (B).", "C"),
])
def test_bbh_reads_the_answer_before_a_later_turn(output: str, letter: str) -> None:
    assert _bbh(output) == letter


@pytest.mark.parametrize("output", [
    "Let's think.\nQuestion: restated\nSo the answer is (B).",
    "Q: restated\nA: So the answer is (B).",
    "(A)\nSo the answer is (B).",
])
def test_bbh_reads_a_later_answer_where_nothing_before_a_turn_answers(output: str) -> None:
    assert _bbh(output) == "B"


def test_bbh_yes_no_answer_before_a_later_turn() -> None:
    assert _bbh("Yes\n\nUser: next?\nSo the answer is No.", "Yes") == "Yes"


# a conclusion naming the reasoning, not a person, as what says it
@pytest.mark.parametrize("output", ["Logic says B.", "Logic says B", "The evidence suggests option B."])
def test_reasoning_that_says_a_letter_states_it(output: str) -> None:
    assert _mc(output) == "B"


@pytest.mark.parametrize("output", [
    "Student 1 says B.", "John says B.", "Logic says B is wrong.", "Logic says B or C.",
])
def test_a_person_saying_a_letter_or_reasoning_rejecting_or_offering_letters_states_none(output: str) -> None:
    assert _mc(output) is None


def test_reasoning_pointing_to_an_option_still_states_it() -> None:
    assert _mc("The analysis points to option C.") == "C"
