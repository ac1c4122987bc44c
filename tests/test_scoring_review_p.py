"""Review of 4c37bdc (helper 245): readings the commit's rules (1) and (2) broke."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import score_bbh, score_choice

ARC = {"A": "Chemical energy is absorbed through the roots.", "B": "Light energy is converted to chemical energy.",
       "C": "Chlorophyll in the leaf captures light energy.", "D": "Sunlight is converted into chlorophyll."}


@pytest.mark.parametrize("output", [
    "**Answer:**\nOption C: Chlorophyll in the leaf captures light energy.\n\n**Explanation:**\n"
    "- Option A: Chemical energy is absorbed by roots only as water.\n- Option B: Light energy becomes chemical "
    "energy later.\n- Option D: Sunlight does not become chlorophyll.",
    "**Final Answer:**\nOption C: Chlorophyll in the leaf captures light energy.\n\nWhy the others are wrong:\n"
    "Option A: roots absorb water.\nOption D: chlorophyll is made by the plant.",
    "The answer is:\n\nOption C: Chlorophyll in the leaf captures light energy.\n\nOption A: roots take in water, "
    "so it is wrong.",
])
def test_one_item_under_the_cue_then_an_explanation_of_the_others_reads_that_item(output: str) -> None:
    assert score_choice(output, "C", "ABCD", ARC).extracted == "C"


@pytest.mark.parametrize(("output", "right"), [
    ("D is the answer you should choose.", "D"),
    ("So C is the answer most experts pick.", "C"),
    ("Hence, A is the answer that students should choose.", "A"),
    ("C is the answer you would expect from photosynthesis.", "C"),
    ("B is the answer most people expect, and it is also correct.", "B"),
])
def test_an_answer_others_would_also_choose_is_still_the_outputs(output: str, right: str) -> None:
    assert score_choice(output, right, "ABCD").extracted == right
    assert score_bbh(output, f"({right})").extracted == right


@pytest.mark.parametrize("output", [
    "**Final Answer:**\n(A) Mercury\n(B) Venus\n(C) Earth\n(D) Mars",
    "**Final Answer:**\nA. Mercury\nB. Venus\nC. Earth\nD. Mars",
    "Answer:\nA: Mercury\nB: Venus\nC: Earth\nD: Mars",
])
def test_a_cue_over_the_options_copied_in_the_prompts_form_is_no_answer(output: str) -> None:
    planets = {"A": "Mercury", "B": "Venus", "C": "Earth", "D": "Mars"}
    assert score_choice(output, "A", "ABCD", planets).extracted is None
