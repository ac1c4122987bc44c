"""Multiple choice (review, round i): since 8978cd1 called "X is the answer" right, a letter the output rejects was read
as its answer ("Many students think A is the answer, but it's actually C." scored right for gold A): someone else's
answer, or one the output turns from to another letter, is not stated; the later cues decide."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_choice

# --- someone else's answer, or a hypothetical one ---------------------------------------------------


@pytest.mark.parametrize(("output", "rejected"), [
    ("Many students think A is the answer, but it's actually C.", "A"),
    ("You'd think A is the answer, but the correct one is C.", "A"),
    ("It looks like A is the answer, but actually it's C.", "A"),
    ("A student might think A is the answer, but it is C.", "A"),
    ("It's tempting to say B is the answer, but D is right here.", "B"),
])
def test_an_attributed_answer_is_not_stated(output: str, rejected: str) -> None:
    assert extract_choice(output, "ABCD") != rejected
    assert score_choice(output, rejected, "ABCD").value == 0.0


@pytest.mark.parametrize(("output", "expected"), [
    ("Student 1 says A is the answer. Student 2 says B. The correct response is (C).", "C"),
    ("John claims A is the answer. He is wrong; the correct response is (C).", "C"),
    ("John claims that A is the answer. The correct response is (C).", "C"),
])
def test_the_correction_after_an_attributed_answer_is_read(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected


# --- an answer the output turns from to another letter ----------------------------------------------


@pytest.mark.parametrize(("output", "rejected"), [
    ("A is the answer, but wait \u2014 no, it's C.", "A"),
    ("A is the answer, but wait, let me reconsider. Actually, C.", "A"),
    ("B is the answer but I would pick C.", "B"),
    ("So B is the answer. No, wait, it's D.", "B"),
])
def test_an_answer_turned_from_is_not_stated(output: str, rejected: str) -> None:
    assert extract_choice(output, "ABCD") != rejected
    assert score_choice(output, rejected, "ABCD").value == 0.0


# --- kept: the output's own answer, with a doubt or a remark ---------------------------------------


@pytest.mark.parametrize(("output", "expected"), [
    ("B is the answer, but I am not fully sure.", "B"),
    ("C is the answer, yet some might choose A.", "C"),
    ("A is the answer, but let me double-check: yes.", "A"),
    ("(B) is the answer, but the wording is odd.", "B"),
    ("I think B is the answer.", "B"),
    ("I'd say B is the answer.", "B"),
    ("I would say B is the answer.", "B"),
    ("We believe that B is the answer.", "B"),
    ("Some people say A, but I think B is the answer.", "B"),
    ("Though some may disagree, C is the answer, but D is close.", "C"),
    ("One might think A is the answer, but option C fits the evidence.", "C"),
    ("B is the answer. However, let me explain option A.", "B"),
    ("B is the answer, but it is A good question to ask.", "B"),
    ("Therefore, C is the answer, but D is also plausible.", "C"),
    ("B is the answer, actually.", "B"),
    ("Therefore, the evidence suggests B is the answer.", "B"),
    ("So we can conclude that B is the answer.", "B"),
])
def test_the_outputs_own_answer_is_still_stated(output: str, expected: str) -> None:
    assert extract_choice(output, "ABCD") == expected
