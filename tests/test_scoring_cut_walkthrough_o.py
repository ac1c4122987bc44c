# ruff: noqa: E501  (a table of model outputs, each on one line)
"""A walk-through cut at the token cap right after its first option's label (hunt o, a real Qwen MMLU-Redux
answer: "...let's analyze each option step by step:\n\n(A) It is formed of autonomic nerve", finish length)
read A, its one bare "(X)": scored right wherever the gold is A, so truncation gave free credit. A bare "(X)"
that starts its line after a walk-through's lead-in, or a bold label followed by a colon, labels an item. Near
misses keep their reading: a bare answer on its own, one after a conclusion, one with no lead-in."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_bbh

CUT = [
    "To determine which statement concerning the atrioventricular bundle is correct, let's analyze each option step by step:\n\n(A) It is formed of autonomic nerve",
    "Let's evaluate the options one by one.\n\n**(A) Dyslexia**: a reading",
    "Let's look at each option:\n- (A) The mitochondria is",
]

KEPT = [
    ("(A)", "A"),
    ("(C) Paris", "C"),
    ("The capital of France is Paris.\n(C) Paris", "C"),
    ("Let's analyze each option step by step.\n(A) is wrong because of X. (B) is wrong. Therefore (C).", "C"),
    ("Let's think step by step. Paris is the capital.\n\nThe answer is:\n(C) Paris", "C"),
]


@pytest.mark.parametrize("output", CUT)
def test_a_walkthrough_cut_after_its_first_label_is_no_answer(output: str) -> None:
    assert extract_choice(output, "ABCD") is None
    assert score_bbh(output, "(A)").extracted is None


@pytest.mark.parametrize(("output", "letter"), KEPT)
def test_a_bare_answer_keeps_its_reading(output: str, letter: str) -> None:
    assert extract_choice(output, "ABCD") == letter
