"""Multiple choice (review, round j, of fdae5da): a model that states its own answer and then walks through the
other options had an eliminated letter read as its answer ("C is true of mammals but not of birds" disowned
the stated B, and "Option D" was read: a wrong answer scored right for gold D), and a model's own answer led
by a word such as "passage", "now" or "confidently" was taken for someone else's (no answer)."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_bbh


@pytest.mark.parametrize("output", [
    "B is the answer. However, let's check the other options to be sure. Option A says the opposite, which is "
    "wrong. Option C is the opposite of what the passage says. Option D matches part of the passage but not "
    "the main idea.",
    "B is the answer, but let me explain why the others are wrong. Option A is too broad. Option C is true of "
    "mammals but not of birds. Option D is irrelevant.",
    "B is the answer. Actually, let me verify: A is wrong because it ignores friction. C fits only the special "
    "case of zero mass, so it is out. D is wrong.",
    "B is the answer. But wait, what about C? C is true in general, but the question asks about this specific "
    "case, so B.",
    "B is the answer. But why is D wrong? D is true only when the object is at rest, and here it is moving.",
])
def test_a_walk_through_the_other_options_keeps_the_stated_answer(output: str) -> None:
    assert extract_choice(output, "ABCD") == "B"


def test_bbh_reads_the_stated_answer_past_the_walk_through() -> None:
    output = ("B is the answer, but let me explain why the others are wrong. Option A is too broad. Option C is "
              "true of mammals but not of birds. Option D is irrelevant.")
    assert score_bbh(output, "(B)").value == 1.0
    assert score_bbh(output, "(D)").value == 0.0


@pytest.mark.parametrize("output", [
    "The passage says B is the answer.", "The evidence says B is the answer.", "My analysis says B is the answer.",
    "Newton's first law says B is the answer.", "The definition says B is the answer.",
    "It looks like B is the answer.", "After checking each option, it looks like B is the answer.",
    "It seems like B is the answer.", "I now think B is the answer.", "I therefore think B is the answer.",
    "I would have to say B is the answer.", "I have to say that B is the answer.",
    "I can confidently say that B is the answer.", "Thus we can safely say B is the answer.",
    "So, all things considered, I'm going to say B is the answer.",
])
def test_the_models_own_answer_is_read(output: str) -> None:
    assert extract_choice(output, "ABCD") == "B"


@pytest.mark.parametrize(("output", "rejected"), [  # what fdae5da fixed stays fixed
    ("Many students think A is the answer, but it's actually C.", "A"),
    ("It looks like A is the answer, but actually it's C.", "A"),
    ("John claims A is the answer. He is wrong; the correct response is (C).", "A"),
    ("One might think A is the answer, but option C fits the evidence.", "A"),
])
def test_someone_elses_answer_is_still_not_read(output: str, rejected: str) -> None:
    assert extract_choice(output, "ABCD") != rejected


# --- round k (review of 1b18af1): a turn that is a sentence by itself, and its correction in the next ones ---------

@pytest.mark.parametrize("output", [
    "A is the answer, but let me reconsider. Option C is true for all mammals. So C.",
    "A is the answer. Actually, let me recheck. Option C matches the definition exactly. So the answer should be C.",
    "A is the answer. Wait, let me re-read the question. Option C fits better, since it mentions both factors.",
    "B is the answer. Actually, no. Option C is true.",
])
def test_a_correction_after_a_turn_of_its_own_is_read(output: str) -> None:
    assert extract_choice(output, "ABCD") == "C"  # read the stated letter at 1b18af1, C before it


@pytest.mark.parametrize(("output", "rejected"), [
    ("B is the answer. Actually, no. C matches the description better.", "B"),
    ("B is the answer. But hold on. C is the better choice.", "B"),
    ("B is the answer. Wait. C is the real answer.", "B"),
    ("B is the answer. But wait, the question asks which is NOT a mammal. A whale is a mammal. So C fits.", "B"),
    ("D is the answer. Actually, wait. Looking again, C is true and D is false. So C.", "D"),
    ("A is the answer. But wait, that can't be right since A is a gas. Looking at C, C fits the description of a "
     "liquid.", "A"),
    ("A is the answer. But wait. The evidence points to C.", "A"),
    ("A is the answer, but wait. C is true of all of them, so C.", "A"),
    ("My friend says A is the answer. I say C.", "A"),
    ("Student A thinks B is the answer.", "B"),
])
def test_a_letter_the_output_takes_back_is_not_credited(output: str, rejected: str) -> None:
    assert extract_choice(output, "ABCD") != rejected
