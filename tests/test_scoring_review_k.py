"""Review of hunt k's multiple-choice rules (f69582c): an 'Option X' label whose item calls it right, or that a
conclusion above it leads in ("The correct answer is:\\n\\n- **Option B**: ..."), read none, and with every label
dropped the last-'option X' fallback went back to a rejected mention ("Option A is incorrect.\\n\\nOption C: Earth is
the correct answer." read A); a line ending in "answer." made the label under it a choice ('$' before a newline);
BBH hyperbaton cut before "So the answer is" read none; number options differing by sign, decimal point, slash or
exponent read alike, so a letter with another's text was read as the letter."""

from __future__ import annotations

import pytest

from shared_engine.evaluation.scoring import extract_choice, score_bbh

PLANETS = {"A": "Mercury", "B": "Venus", "C": "Earth", "D": "Mars"}


@pytest.mark.parametrize(("output", "letter"), [
    ("Option (B): correct. This matches the passage.", "B"),
    ("**Option C**: the best choice", "C"),
    ("Option B: Venus is the correct answer.", "B"),
    ("Option B: Venus - correct", "B"),
    ("Looking at the choices, option B would be the best answer.", "B"),
    ("- **Option A**: Mercury - incorrect\n- **Option B**: Venus - correct\n- **Option C**: Earth - incorrect", "B"),
    ("The correct answer is:\n\n- **Option B**: Venus", "B"),
    ("The correct answer is:\n\n### Option B: Venus", "B"),
    ("**Final Answer:**\n- Option B: Venus", "B"),
    ("Therefore, the answer must be Option (B): Venus.", "B"),
    ("In conclusion, option B: Venus.", "B"),
    ("### Option A: Mercury\n\nMercury is closest to the Sun. This is incorrect.\n\n### Option B: Venus\n\n"
     "Venus is the hottest planet. This is the correct answer.", "B"),
    ("Option A is incorrect.\n\nOption C: Earth is the correct answer.", "C"),
    ("Mercury (Option A) is too hot.\nThe correct answer is:\n- **Option C**: Earth", "C"),
    ("Option A is wrong because Mercury is too close. Option B is wrong too.\n**Option C**: the best choice.", "C"),
])
def test_a_label_called_right_or_led_in_by_a_conclusion_is_the_choice(output: str, letter: str) -> None:
    assert extract_choice(output, "ABCD", PLANETS) == letter


@pytest.mark.parametrize("output", [
    "Let us check each option to find the answer.\nOption A: Mercury, too cold.\nOption B: Venus, too hot.\n"
    "Option C: Earth, just",
    "Option A: Mercury, which is correct for the closest planet, but the question asks for the hottest.\nOption B: V",
    "Option A: Mercury. It is the right size but too cold.\nOption B: Venus. This is wrong.",
    "Option A is incorrect. Option C: Earth",
    "Answer:\n- Option A: Mercury, too cold\n- Option B: Venus, too",
])
def test_a_walk_through_cut_off_states_no_answer(output: str) -> None:
    assert extract_choice(output, "ABCD", PLANETS) is None


HYPERBATON = ('Option (A): "terrible rubber ship". Option (A) has the following adjective order: [1. opinion] [7. '
              'material] (or, in numeric terms, 1 7). Because 1 < 7 is correct, (A) has the correct ordering.\nOption '
              '(B): "rubber terrible ship". Option (B) has the following adjective order: [7. material] [1. opinion] '
              '(or, in numeric terms, 7 1). Because 7 < 1 is not correct, (B) does not have the correct ordering.')


def test_bbh_hyperbaton_cut_before_its_answer_line_reads_the_ordering_called_correct() -> None:
    assert score_bbh(HYPERBATON, "(A)").extracted == "A"
    second = HYPERBATON.replace("1 < 7 is correct, (A) has", "7 < 1 is not correct, (A) does not have").replace(
        "7 < 1 is not correct, (B) does not have", "1 < 7 is correct, (B) has")
    assert score_bbh(second, "(B)").extracted == "B"


@pytest.mark.parametrize(("output", "options", "letter"), [
    ("The answer is (A) 2", {"A": "-2", "B": "2", "C": "-1/2", "D": "1/2"}, None),
    ("The answer is (A) -2", {"A": "-2", "B": "2", "C": "-1/2", "D": "1/2"}, "A"),
    ("The answer is (A) 1/2", {"A": "12", "B": "1/2", "C": "2", "D": "21"}, None),
    ("The answer is (B) 10^{-3}", {"A": "10^{-3}", "B": "10^{3}", "C": "10^{-2}", "D": "10^{2}"}, None),
    ("The answer is (B) 1.2", {"A": "1 2", "B": "12", "C": "1.2", "D": "12 m"}, None),
    ("The answer is (B) - 2 m/s", {"A": "-2 m/s", "B": "2 m/s", "C": "-4 m/s", "D": "4 m/s"}, "B"),
])
def test_number_options_keep_their_sign_point_slash_and_exponent(output: str, options: dict[str, str],
                                                                 letter: str | None) -> None:
    assert extract_choice(output, "ABCD", options) == letter
