"""Scoring edges found on GSM8K's own worked solutions and on hedged option answers: each test fails on the
scorer before its fix."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, extract_number, parse_number, score_bbh, score_number


@pytest.mark.parametrize("output, gold", [
    ("The answer is 1 000 dollars.", "1000"), ("#### 1 000", "1000"), ("The answer is 1\u2009000.", "1000"),
    ("The answer is 3 000 000.", "3000000"), ("The answer is 1\u00a0000.", "1000"),
    ("The answer is 1 000 1/2.", "1000.5"),
    # GSM8K's own worked solution (train), its last line: read as 000 before
    ("So the selling price is $80 000+ $16 000 + $4 000 = $100 000.\n", "100,000"),
])
def test_gsm8k_thousands_grouped_by_spaces_are_one_number(output: str, gold: str) -> None:
    """'1 000' was read as 1 (the answer sentence's first number) or 000 (the last number)."""
    assert score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output, expected", [
    ("1 2", "2"), ("The answer is 1 2.", "1"), ("1, 2, 3", "3"), ("The answer is 1,2,3.", "1"),
    ("The answer is 12,34.", "12"), ("The answer is 1 0000.", "1"), ("The answer is 1,234,567.", "1,234,567"),
    ("The answer is 18, since", "18"), ("The answer is 2 1/2.", "2 1/2"),
])
def test_gsm8k_digits_group_only_in_threes(output: str, expected: str) -> None:
    """A separator joins digits only before exactly three (as ',' does): "1,2,3" was read as 123, "12,34" as 1234."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, gold", [
    ("The answer is 10:30.", "10"), ("The answer is 10:30.", "30"), ("#### 10:30", "10"),
    ("She arrives at 10:30", "30"), ("The answer is 12:45 pm.", "12"),
])
def test_gsm8k_a_time_is_not_its_hours_or_minutes(output: str, gold: str) -> None:
    """'10:30' was read as 10 after a cue and as 30 as the last number: scored right against either."""
    assert not score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output, gold", [
    ("The answer is 7:00 pm.", "7"), ("#### 2:00", "2"),
    # GSM8K's own worked solution (train, gold 10): read as 00 before
    ("so the latest she can start is 18- 8 = 10:00 am\n", "10"),
])
def test_gsm8k_a_time_on_the_hour_is_its_hour(output: str, gold: str) -> None:
    """GSM8K's golds write a time on the hour as the hour ('2:00 pm' is 2)."""
    assert score_number(output, gold).correct, extract_number(output)
    assert parse_number("10:30") is None and parse_number("7:00") == 7


@pytest.mark.parametrize("output", [
    "The answer is A or B.", "The answer is A and C.", "The answer is either (A) or (D).", "The answer is (A) or (B).",
    "Answer: A or B", "**Answer:** A, C", "The answer is A/B.", "The answer is **A** or **B**.", "(A) or (B)",
    "I pick option A or option B.", "The answer is A or maybe C.", "The answer is A and C are both true.",
])
def test_choice_a_hedge_is_no_answer(output: str) -> None:
    """A hedge was read as one of its letters (mostly the first), so it scored right whenever that was the key."""
    assert extract_choice(output, "ABCD") is None


@pytest.mark.parametrize("output, gold", [
    ("The answer is (B).", "B"), ("B) 42", "B"), ("**Answer: C**", "C"), ("The answer is B, not A.", "B"),
    ("The answer is B, A is wrong.", "B"), ("The answer is B and I am sure.", "B"), ("Answer: D) because", "D"),
    ("The answer is A or B. After checking, the answer is B.", "B"),
    ("The answer is C. Options A and B are wrong.", "C"),
])
def test_choice_a_single_answer_beside_other_letters_is_read(output: str, gold: str) -> None:
    assert extract_choice(output, "ABCDEFGHIJ") == gold


def test_bbh_a_hedged_option_is_no_answer() -> None:
    assert score_bbh("So the answer is (A) or (B).", "(A)").extracted is None
    assert score_bbh("So the answer is (B), not (A).", "(B)").correct


@pytest.mark.parametrize("output, expected", [
    ("The answer isn't 12. It is 15.", "15"), ("The answer is not 12, it is 15.", "15"),
    ("The answer is 15. It is not 12.", "15"), ("The answer is **not** 12.\n#### 15", "15"),
])
def test_gsm8k_a_denied_answer_is_not_the_answer(output: str, expected: str) -> None:
    """'The answer isn't 12' and 'is not 12' were read as the stated answer 12."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, gold", [
    ("The answer is B, A and C are incorrect.", "B"), ("Answer: B, A and D are wrong", "B"),
    ("The answer is A, B and C are wrong.", "A"), ("The answer is C, A or B would double count.", "C"),
    ("The answer is B, C and D being distractors.", "B"), ("The answer is **B**, **A** and **C** are wrong.", "B"),
    ("The answer is (B), (A) is incorrect.", "B"), ("The answer is B, A, and C are not correct.", "B"),
])
def test_choice_an_answer_explained_by_the_other_options_is_read(output: str, gold: str) -> None:
    """A letter chain followed by why the others are wrong was read as a hedge (no answer): the bare letter after
    'B, ' counted as another option before 'and', and '(A)' after ',' whatever followed it."""
    assert extract_choice(output, "ABCD") == gold


@pytest.mark.parametrize("output", [
    "The answer is A or B\nBecause both fit.", "The answer is A, B, and C.", "The answer is A or B could be correct.",
    "The answer is either A or B depending on the reading.", "The answer is (A) or (B), hard to say.",
    "The answer is A & B",
])
def test_choice_a_chain_offering_its_letters_is_still_a_hedge(output: str) -> None:
    assert extract_choice(output, "ABCD") is None


@pytest.mark.parametrize("output, gold", [
    ("So the answer is (A), (B) being wrong.", "(A)"), ("So the answer is (C), D and E are wrong.", "(C)"),
])
def test_bbh_an_option_explained_by_the_others_is_read(output: str, gold: str) -> None:
    assert score_bbh(output, gold).correct


@pytest.mark.parametrize("output, expected", [
    ("Step 1 200 apples", "200"), ("Day 1 100 km, Day 2 150 km", "150"), ("#1 200", "200"),
    ("The answer is 5 100-dollar bills.", "5"), ("The answer is 1,00,000.", "1,00,000"),
    ("He earns ₹1,00,000 a year.", "1,00,000"), ("The answer is 12,34,567.", "12,34,567"),
])
def test_gsm8k_a_count_or_label_before_a_number_is_not_a_thousands_group(output: str, expected: str) -> None:
    """'Step 1 200' was read as 1200 and '5 100-dollar' as 5100 (a space joined a count to the next number); Indian
    grouping '1,00,000' as 1 after a cue and 00,000 as the last number."""
    assert extract_number(output) == expected


@pytest.mark.parametrize("output, gold", [
    ("#### 1 000", "1000"), ("so 1 200 m in total", "1200"), ("= $100 000", "100000"), ("₹1,00,000", "100000"),
])
def test_gsm8k_thousands_groups_beside_the_label_rule(output: str, gold: str) -> None:
    assert score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output", [
    "So the answer is 12. Wait, that's wrong: the answer is not 12, it is 15.",
    "The answer is 12. Hmm, no: the answer isn't 12. It is 15.", "The answer is 12. No, the answer isn\u2019t 12: 15.",
])
def test_gsm8k_a_denial_takes_back_the_cues_before_it(output: str) -> None:
    """The denied cue was skipped and the earlier cue it corrects (12) read as the answer."""
    assert extract_number(output) == "15"
    assert extract_number("The answer isn't 12. The answer is 15.") == "15"


@pytest.mark.parametrize("output, gold", [
    ("Therefore, the answer is 24. (The answer is not 12, which counts only one day.)", "24"),
    ("So the answer is 15. The answer is not 16.", "15"),
    ("The answer is 15. The answer is not 16, as some might think.", "15"),
    ("The answer is **15**. The answer isn't 16.", "15"),
])
def test_gsm8k_a_denial_of_another_number_keeps_the_stated_answer(output: str, gold: str) -> None:
    """A denial dropped every cue before it, whatever number it denied, so the last number (the denied one) was
    read: 'the answer is 24. (The answer is not 12 ...)' scored 12. It takes back only a cue stating its number."""
    assert score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output", [
    "So the answer is 12. Wait... the answer is not 12, it is 15.", "The answer isn't 12. It is 15.",
    "The answer is not 12, it is 15.", "The answer is **12**.\nNo: the answer is **not** $12.00. It is 15.",
    "The answer is 12.\nThe answer is 12 again? No, the answer isn't 12. #### 15",
])
def test_gsm8k_a_denial_of_the_stated_number_still_takes_it_back(output: str) -> None:
    assert extract_number(output) == "15"
