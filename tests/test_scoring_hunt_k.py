"""Multiple choice (hunt k, hand-graded zoo outputs): an output cut off while analysing "Option (A): ..." / "The
adjective order that Option (A) has is ..." was read as A by the last-'option X' fallback (F1); "The answer is (D)
<option C's text word for word>" was read as D (F2); "The answer is (B" cut at the token cap read nothing (F4).
Counter-cases keep their reading."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_bbh, score_choice

BBH = "ABCDEFGHIJKLMNOPQR"
OPTIONS = {"A": "They have each lost kinetic energy.",
           "B": "They have each gained the same amount of potential energy.",
           "C": "They have each lost the same amount of potential energy.",
           "D": "They have each gained one-half of their maximum kinetic energy."}


# --- F1: an option label of an item being analysed is no choice ---------------------------------------------------

@pytest.mark.parametrize("output", [
    'Let\'s think step by step.\nOption (A): "midsize old grey Brazilian sweater". (1) "midsize" falls into the size '
    'category. The adjective order that Option (A) has is [5. color',
    "Let's analyse each option.\n**Option B**: this says the opposite of the passage",
    "Analysing the options:\n- Option C - the rate would double, which",
    "1. Option (A) has the order [2. size] [3. age], and",
    "Because 1 < 2 is not correct, (A) does not have the correct ordering.\nOption (B): \"big old sweater\". "
    "Option (B) has the following adjective order: [2. size] [",
])
def test_an_output_cut_off_while_analysing_a_labelled_option_states_no_answer(output: str) -> None:
    assert extract_choice(output, "ABCD") is None
    assert score_bbh(output, "(A)").extracted is None


@pytest.mark.parametrize(("output", "letter"), [
    ("Option (A): big old sweater. (1) big is size, (2) old is age. 2 < 3 is correct, so Option (A) is correct.",
     "A"),
    ("Option (B): it fits the data.\nTherefore the answer is (B).", "B"),
    ("(A) is wrong. (B) is wrong. (D) is wrong.\nThe answer is (C).", "C"),
    ("**Option A**: wrong.\n**Option D**: peptide linkages. This is the most likely attribution of stabilization.\n\n"
     "3. **Conclusion**: Based on the analysis, the option that best explains", "D"),
    ("Therefore, Option C: the rate doubles.", "C"),
    ("I think the best choice is option C because it matches.", "C"),
    ("So I pick option D", "D"),
])
def test_a_concluded_option_keeps_its_reading(output: str, letter: str) -> None:
    assert extract_choice(output, "ABCD") == letter


# --- F2: a cue's letter with another option's text word for word -------------------------------------------------

@pytest.mark.parametrize("output", [
    "The answer is (D) They have each lost the same amount of potential energy.",
    "The answer is (D): they have each lost the same amount of potential energy",
    "The answer is **D** They have each lost the same amount of potential energy.\n",
    "Answer: (A) They have each gained the same amount of potential energy.",
])
def test_a_letter_with_another_options_text_is_no_answer(output: str) -> None:
    assert score_choice(output, "D", "ABCD", OPTIONS).extracted is None
    assert extract_choice(output, "ABCD") is not None  # without the options' texts it reads the letter, as before


@pytest.mark.parametrize(("output", "letter"), [
    ("The answer is (C) They have each lost the same amount of potential energy.", "C"),
    ("The answer is (D) They have each gained one-half of their maximum kinetic energy.", "D"),
    ("The answer is (D) They have each lost potential energy, the same amount.", "D"),
    ("The answer is (D) because they have each lost the same amount of potential energy and more.", "D"),
    ("The answer is (D).\nThey have each lost the same amount of potential energy.", "D"),
])
def test_a_letter_with_its_own_text_or_a_paraphrase_keeps_it(output: str, letter: str) -> None:
    assert score_choice(output, letter, "ABCD", OPTIONS).extracted == letter


# --- F4: a cue's letter cut before its ')' at the output's end ---------------------------------------------------

@pytest.mark.parametrize("output", [
    "After analysing all the options, the correct answer is:\n\nThe answer is (B",
    "The answer is (B ",
    "So the answer is (b",
])
def test_a_cue_letter_cut_off_before_its_bracket_is_read(output: str) -> None:
    assert extract_choice(output, "ABCD") == "B"


def test_an_unclosed_letter_not_at_the_end_is_not_read() -> None:
    assert extract_choice("The answer is (B and more text follows", "ABCD") is None


def test_bbh_reads_a_cue_letter_cut_off_before_its_bracket() -> None:
    assert score_bbh("Let's think step by step. So the answer is (B", "(B)").correct


# --- F2 through the harness: a run's scorer and eval compare's re-scoring pass the options ----------------------

def test_the_harness_scores_a_letter_stated_with_another_options_text_as_no_answer() -> None:
    from shared_engine.evaluation.benchmarks import _choice_score, stored_scorer
    from shared_engine.evaluation.datasets import Choice, Record

    output = "The answer is (D) They have each lost the same amount of potential energy."
    record = Record(id="0", question="Which is true?", answers=["D"],
                    choices=[Choice(label=k, text=v) for k, v in OPTIONS.items()])
    assert _choice_score(output, record).extracted is None
    asked = "Which is true?\n" + "\n".join(f"({k}) {v}" for k, v in OPTIONS.items())
    sample = {"gold": ["D"], "prompt": [{"role": "user", "content": asked}]}
    rescore = stored_scorer("arc-challenge")
    assert rescore is not None
    stored = rescore(output, sample)
    assert stored is not None and stored.extracted is None
    right = "The answer is (D) They have each gained one-half of their maximum kinetic energy."
    assert _choice_score(right, record).correct
    stored_right = rescore(right, sample)
    assert stored_right is not None and stored_right.correct
