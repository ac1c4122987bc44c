"""Answer cues and number / letter edges of the GSM8K and multiple-choice scorers: each case here failed on the
scorer before its fix (the "still" tests pin the neighbouring behaviour the fixes keep)."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, extract_number, score_number


@pytest.mark.parametrize("output, expected", [
    ("The answer is 12, no wait, the answer is 15.", "15"),
    ("The answer is 12. Wait, the answer is 15.", "15"),
    ("So the answer is 3 + 4 = 7, hmm, the answer is 8.", "8"),
])
def test_gsm8k_the_last_cue_on_a_line_is_read(output: str, expected: str) -> None:
    """The first 'answer is' ate its whole line, so a correction later on the same line was never seen (read 12)."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("The answer is 12, because the answer is the sum of the parts.", "12"),  # the later cue states no number
    ("The answer is 12. The answer is not 12, it is 15.", "15"),  # a denial on the same line still takes it back
    ("The answer is 24. (The answer is not 12, which counts one day.)", "24"),
])
def test_gsm8k_same_line_cues_follow_the_later_line_rules(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("Answer: 42", "42"), ("Final answer: 42", "42"), ("**Answer:** 42", "42"), ("### Final Answer: $42", "42"),
    ("3 + 4 = 7 boxes, 6 each.\nAnswer: 42\nCheck: 42 - 35 = 7", "42"),
    ("Answer: 42 apples. She had 7 left over.", "42"),
    ("Answer: 6 * 7 = 42 apples.\nThat uses 3 bags.", "42"),
])
def test_gsm8k_an_answer_label_states_the_answer(output: str, expected: str) -> None:
    """'Answer: 42' was no cue: the last number (a check's 7, a remark's 3) was read instead."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("Answer: She sold 48/2 = 24 clips in May.\nShe sold 48 + 24 = 72 clips in all.", "72"),  # a labelled reasoning
    ("The answer: 5 boxes of 12.\nSo 60.", "60"),  # not at a line's start: no cue
])
def test_gsm8k_an_answer_label_over_reasoning_is_still_no_cue(output: str, expected: str) -> None:
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, expected", [
    ("Out of 100 250", "250"), ("Out of 100 250 passed.", "250"), ("The answer is out of 100 250.", "100"),
])
def test_gsm8k_a_space_after_out_of_joins_no_ambiguous_groups(output: str, expected: str) -> None:
    """'Out of 100 250' was read as 100250: a total, then another number."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, gold", [
    ("He scored 250 out of 1 000", "1000"), ("Step 1 000 is 2 050.", "2050"),
    ("The answer is 5 000-dollar bills.", "5000"),
    ("So the selling price is $409 500.", "409500"), ("so 1 200 m in total", "1200"),
])
def test_gsm8k_groups_joined_where_unambiguous(output: str, gold: str) -> None:
    """A group led by 0 cannot be a number of its own: '1 000' joins whatever comes before (a label, 'out of') or
    after it (a hyphenated word), and GSM8K's own '$409 500' / '1 200 m' still join."""
    assert score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output, gold", [
    ("Answer: 12 cookies, done at 3:45 pm.", "12"), ("The answer is 12 cookies by 3:45 pm.", "12"),
    ("At 3:45 pm, the answer is 12.", "12"), ("The answer is 12.\nShe leaves at 3:45 pm.", "12"),
])
def test_gsm8k_a_time_does_not_hide_a_stated_number(output: str, gold: str) -> None:
    """'Answer: 12 ... 3:45 pm' read the time (no number): the label was no cue and the time was the last token."""
    assert score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output, gold", [
    ("3:45 pm", "3"), ("3:45 pm", "45"), ("3:45 pm", "345"), ("Answer: 3:45 pm", "3"), ("Answer: 3:45 pm", "45"),
])
def test_gsm8k_a_time_stated_as_the_answer_is_still_no_number(output: str, gold: str) -> None:
    """Every GSM8K gold is an integer: a time off the hour given as the answer matches none (not its hour, its
    minutes or its digits)."""
    assert not score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output, gold", [
    ("The answer is B, A and C, which are wrong.", "B"), ("The answer is (B), (A) and (C), which are incorrect.", "B"),
    ("The answer is **B**, **A** and **C**, which are wrong.", "B"), ("The answer is B, A, C (all wrong).", "B"),
    ("Answer: D, A and B -- both incorrect.", "D"), ("The answer is C, A and B, which are ruled out.", "C"),
])
def test_choice_a_letter_then_the_others_called_wrong_is_read(output: str, gold: str) -> None:
    """The comma after the chain ('C, which') made it an offer of all its letters: no answer."""
    assert extract_choice(output, "ABCD") == gold


@pytest.mark.parametrize("output", [
    "The answer is A or B, which are both wrong.", "The answer is A and B, which are wrong.",
    "The answer is B, A and C, which are plausible.", "The answer is either B, A or C, which are wrong.",
    "The answer is A, B, and C.",
])
def test_choice_a_rejection_without_a_chosen_head_is_still_a_hedge(output: str) -> None:
    assert extract_choice(output, "ABCD") is None
