"""Review of 4c37bdc/df71a7a (helper 249): readings its turn rule (3) and cut rule (4) lost.

R3. GSM8K's cut at a restated question took a least-to-most sub-question ("The answer is 9.\\nQ: How much does she
    make?\\nA: 9 * 2 = 18. The answer is 18.") for a made-up next turn and read 9. A made-up question follows a blank
    line (or a '####' / \\boxed{} answer); one on the next line after 'answer is' is the working's.
R4. With finish "length", a bare "(C)" chosen in the first person ("I pick (C) because ...") or by "... makes (C) the
    best fit" read none (no conclusion led it), and GSM8K's "So she makes $18 per day.\\n\\nLet me double check: ...
    So 18" read none (no last-number fallback): a paragraph closed by a result ("So ... N.") is read, never the
    cut-off sentence.
"""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import score_bbh, score_choice, score_number


@pytest.mark.parametrize("output", [
    "She has 16 - 3 - 4 = 9 eggs left. The answer is 9.\nQ: How much does she make?\nA: 9 * 2 = 18. The answer is 18.",
    "First, 16 - 3 = 13. The answer is 13 so far.\nQuestion: how many after baking? 13 - 4 = 9\n9 * 2 = 18. "
    "The answer is 18.",
])
@pytest.mark.parametrize("finish", [None, "stop", "length"])
def test_a_sub_question_of_the_working_is_no_new_turn(output: str, finish: str | None) -> None:
    assert score_number(output, "18", finish=finish).extracted == "18"


@pytest.mark.parametrize("output", [
    "She has 9 eggs. The answer is 18.\n\nQ: Tom has 3 apples and buys 4. How many?\nA: 3 + 4 = 7. The answer is 7.",
    "The answer is 9.\nQ: How much does she make?\nA: 9 * 2 = 18. The answer is 18.\n\nQuestion: Tom has 3 apples "
    "and buys 4. How many?\nThe answer is 7.",
    "The answer is 18.\nUser: And for 3 apples plus 4?\nAssistant: The answer is 7.",
])
def test_a_made_up_question_after_a_blank_line_or_a_chat_turn_is_still_cut(output: str) -> None:
    assert score_number(output, "18").extracted == "18"


@pytest.mark.parametrize("output", [
    "I pick (C) because chlorophyll captures light energy. Let me explain each step of photosynthesis in detail. "
    "First, light hits the leaf and",
    "Chlorophyll captures light, which makes (C) the best fit. To explain further, the light reactions",
    "I'd go with (C), as the leaf captures light. Let me also explain why the roots",
])
def test_a_cut_answer_choosing_a_letter_in_the_first_person_reads_it(output: str) -> None:
    assert score_choice(output, "C", "ABCD", finish="length").extracted == "C"
    assert score_bbh(output, "(C)", finish="length").extracted == "C"


def test_a_cut_walkthrough_naming_letters_without_choosing_still_reads_none() -> None:
    output = "First, (A) Mercury is the closest. It makes (B) the hottest planet though. Next"
    assert score_choice(output, "B", "ABCD", finish="length").extracted is None


@pytest.mark.parametrize(("output", "read"), [
    ("She has 16 - 3 - 4 = 9 eggs left, and sells them for 9 * 2 = $18.\nSo she makes $18 per day.\n\n"
     "Let me double check: 16 - 3 = 13, 13 - 4 = 9, 9 * 2 = 18. So 18", "18"),
    ("She has 9 eggs left.\nTherefore, she makes 9 * 2 = 18 dollars.\n\nTo verify, 9 * 2 is", "18"),
    ("She has 9 eggs left.\n\nIn total, she makes $18 a day.", "18"),  # cut right after the sentence's end
    # the cut-off sentence is never read, nor a list item's step, nor a conclusion its paragraph goes on from
    ("She has 9 eggs left.\nSo she makes 9 * 2 = 1", None),
    ("1. Eggs:\n   - Therefore, she has 16 - 3 - 4 = 9 eggs.\n\n2. Sum up", None),
    ("So she has 9 eggs. Then she sells them.\n\nNext,", None),
    ("So, let's compute 9 * 2 = 18.\n\nNext,", None),
])
def test_a_cut_gsm8k_answer_reads_a_stated_result_before_the_cut(output: str, read: str | None) -> None:
    assert score_number(output, "18", finish="length").extracted == read
