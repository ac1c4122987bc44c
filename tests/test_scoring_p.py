"""Scorer fixes of helper 238 (p): four misreadings, each read wrong before.

1. A cue heading a list of the options ("**Final Answer:**\\nOption A: ...\\nOption B: ...") read its first item, A:
   it is no answer, unless the lines after the list name one item by words only it has.
2. "B. However, D is the answer many students choose." read D: an answer others choose is not the output's.
3. A cue before a line opening another turn ("The answer is 18.\\n\\nQuestion: <a made-up question> ... The answer is
   7.") read the made-up turn's answer for GSM8K and multiple choice; only BBH cut there.
4. An answer cut at the token cap (finish "length") got credit from fallbacks reading its half-written working:
   GSM8K's last number, a walk-through's one bare "(A)" or its last "option X". ``finish`` is optional: without it
   the scorer reads as before.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.evaluation.scoring import score_bbh, score_choice, score_number

PLANETS = {"A": "Mercury", "B": "Venus", "C": "Earth", "D": "Mars"}
LISTED = "Option A: Mercury\nOption B: Venus\nOption C: Earth\nOption D: Mars"
PRONOUN = ("**Answer:**\n\nOption A: The patient had a skin condition\nOption B: The specialist had a skin condition\n"
           "Option C: Ambiguous\n\n")


@pytest.mark.parametrize(("output", "right"), [
    ("**Final Answer:**\n" + LISTED, None),
    ("Final Answer:\n" + LISTED, None),
    ("**Final Answer:**\n\n" + LISTED + "\n", None),
    # the item marked as the answer, or the lines after the list naming one item
    ("**Final Answer:**\nOption A: Mercury\nOption B: Venus - this is the correct answer.\nOption C: Earth", "B"),
    (PRONOUN + "The pronoun 'he' refers to the specialist.", "B"),
    (PRONOUN + "Both the patient and the specialist could be meant.", None),
    (PRONOUN + "It does not refer to the patient.", None),
])
def test_a_cue_over_a_list_of_the_options_is_no_answer(output: str, right: str | None) -> None:
    letters = "".join(PLANETS) if "Mercury" in output else "ABC"
    assert score_choice(output, "B", letters, PLANETS if "Mercury" in output else None).extracted == right
    assert score_bbh(output, "(B)").extracted == right


@pytest.mark.parametrize("output", [
    "**Final Answer:**\nOption B: Venus",  # one item under the cue is the answer
    "The answer is C.\n\n**Final Answer:**\nOption A: Mercury\nOption B: Venus\nOption C: Earth",
])
def test_a_cue_naming_one_option_still_reads(output: str) -> None:
    right = "C" if output.startswith("The answer is C") else "B"
    assert score_choice(output, right, "ABCD", PLANETS).extracted == right


@pytest.mark.parametrize(("output", "right"), [
    ("B. However, D is the answer many students choose.", "B"),
    ("D is the answer many students choose, but B is correct.", "B"),
    ("D is the answer that most people would pick. B is right though.", "B"),
    ("B is the answer I would give.", "B"),
    ("D is the answer.", "D"),
])
def test_an_answer_others_choose_is_not_the_outputs(output: str, right: str) -> None:
    assert score_choice(output, right, "ABCD").extracted == right
    assert score_bbh(output, f"({right})").extracted == right


def test_a_made_up_next_question_does_not_answer_for_gsm8k_or_multiple_choice() -> None:
    number = "The answer is 18.\n\nQuestion: Tom has 5 apples and buys 2. How many?\nThe answer is 7."
    assert score_number(number, "18").extracted == "18"
    assert score_number("#### 18\nQuestion: What is 3 + 4?\n#### 7", "18").extracted == "18"
    choice = "The answer is (B).\n\nQuestion: Which planet is red?\n(A) Mars\n(B) Venus\nThe answer is (A)."
    assert score_choice(choice, "B", "ABCD", PLANETS).extracted == "B"
    # the question restated before the working is part of it: its answer is after it
    restated = "Let me restate.\nQuestion: Tom has 5 apples and buys 2. How many?\n5 + 2 = 7. The answer is 7."
    assert score_number(restated, "7").extracted == "7"
    assert score_choice("Let me check (B).\nQuestion: which?\nSo the answer is (A).", "A", "ABCD").extracted == "A"


@pytest.mark.parametrize(("output", "cut_reading", "whole_reading"), [
    ("Janet has 16 eggs. She eats 3 and bakes with 4, so 16 - 3 - 4 =", None, "-4"),
    ("James runs 60 meters each sprint.\nHe runs 3 sprints", None, "3"),
    ("She has 16 - 3 - 4 = 9 eggs.\nThe answer is 18.", "18", "18"),  # a stated answer stands
    ("Step one: 16 - 3 - 4 = 9.\n#### 18", "18", "18"),
])
def test_a_cut_answer_gets_no_last_number(output: str, cut_reading: str | None, whole_reading: str) -> None:
    assert score_number(output, "18", finish="length").extracted == cut_reading
    assert score_number(output, "18", finish="eos").extracted == whole_reading
    assert score_number(output, "18").extracted == whole_reading  # a caller that does not know: as before


@pytest.mark.parametrize(("output", "cut_reading", "whole_reading"), [
    ("First, (A) Mercury is the closest to the sun, so it is hot. Next", None, "A"),
    ("Let's think. First, let's look at option C, which says", None, "C"),
    ("Let's look at each.\n- **Option D**: Mars. This is the most likely answer.\n\nSo the", "D", "D"),
    ("We eliminate (A) and (D). Therefore (C). Let me also", "C", "C"),
    ("Therefore, option C. Let me also check", "C", "C"),
])
def test_a_cut_walkthrough_gets_no_fallback_letter(output: str, cut_reading: str | None, whole_reading: str) -> None:
    assert score_choice(output, "C", "ABCD", finish="length").extracted == cut_reading
    assert score_choice(output, "C", "ABCD").extracted == whole_reading
    assert score_bbh(output, "(C)", finish="length").extracted == cut_reading  # BBH's option targets too
    assert score_bbh(output, "(C)").extracted == whole_reading


GRADED = [json.loads(line) for line in
          (Path(__file__).parent / "graded_outputs" / "graded.jsonl").read_text(encoding="utf-8").splitlines()]
# read otherwise than the grader with the finish reason too, as without it (test_scoring_graded's KNOWN F3 and the
# unfinished walk-through): no fallback gives a letter the output never wrote
STILL_KNOWN = {("econometrics/0", "the process is a unit root.\n\nTherefore, the"),
               ("clinical_knowledge/0", "(D) assess for 30 seconds.\n-")}


@pytest.mark.parametrize("row", [r for r in GRADED if r["benchmark"] in ("gsm8k", "arc-challenge", "mmlu-redux")],
                         ids=lambda r: f"{r['benchmark']}-{r['id']}-{r['finish']}-{r['max_new_tokens']}")
def test_the_graded_corpus_with_its_finish_reasons(row: dict) -> None:
    """With each row's finish reason, the GSM8K outputs cut before any answer (KNOWN F5, read as a number of the
    working without it) read none, as the grader read them, and no other row changes."""
    gold = row["gold"][0]
    if row["benchmark"] == "gsm8k":
        read = score_number(row["output"], gold, finish=row["finish"]).extracted
    else:
        options = row["options"]
        read = score_choice(row["output"], gold, "".join(options), options, finish=row["finish"]).extracted
    if any(row["id"] == id_ and row["output"].endswith(end) for id_, end in STILL_KNOWN):
        assert read is None
    else:
        assert read == row["human_reading"]
