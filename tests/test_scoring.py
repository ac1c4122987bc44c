"""Scoring fixes, each on the outputs that were scored wrong (no data folder needed: the real rows
these come from are checked in tests/test_eval_data.py, which skips without it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.evaluation.compare import compare_runs, paired
from shared_engine.evaluation.datasets import load_bbh, load_mmlu_redux, load_qa
from shared_engine.evaluation.math_answers import math_equal, score_math
from shared_engine.evaluation.scoring import extract_choice, extract_number, score_bbh, score_number, score_qa


@pytest.mark.parametrize("output, gold", [
    ("She sells the remainder for $2 per egg.\nThe answer is $2 * 13 = $26.", "26"),  # a real Qwen answer
    ("The answer is 5 + 3 = 8.", "8"),
    ("So she makes 9 * 2 = 18 dollars.\nThe answer is \\(18\\). She sells 16 - 3 - 4 = 9 eggs.", "18"),
    ("The answer is \\$18. That is 9 eggs at $2 each.", "18"),
    ("The answer is \u22123.", "-3"),                                   # a Unicode minus sign
    ("The answer is 1,234.50.", "1234.5"),
    ("The answer is:\n\n**18**", "18"),
])
def test_gsm8k_reads_the_stated_result_not_the_calculation(output: str, gold: str) -> None:
    assert score_number(output, gold).correct, extract_number(output)


@pytest.mark.parametrize("output, value", [
    ("The answer is 1/2.", "0.5"), ("The answer is 3/4 of a cup.", "0.75"), ("The answer is 2 1/2.", "2.5"),
    ("The answer is 2 and 1/2 hours.", "2.5"), ("The answer is \u22122 1/2.", "-2.5"), ("#### 1/2", "0.5"),
    ("\\boxed{\\frac{3}{4}}", "0.75"), ("The answer is 2\\frac{1}{2} cups.", "2.5"), ("The answer is 2\u00bd.", "2.5"),
    ("She has 2 1/2 cups left.", "2.5"),
])
def test_gsm8k_a_fraction_is_read_whole(output: str, value: str) -> None:
    """'2 1/2' was read as 2 and '3/4' as 3 (the first integer), so '24/7' scored right against 24."""
    assert score_number(output, value).correct, extract_number(output)


@pytest.mark.parametrize("output, gold", [
    ("The answer is 24/7.", "24"), ("The answer is 2 1/2.", "2"), ("The answer is 3/4 of a cup.", "3"),
])
def test_gsm8k_a_fraction_is_not_its_numerator(output: str, gold: str) -> None:
    assert not score_number(output, gold).correct


def test_gsm8k_a_date_or_a_calculation_is_no_fraction() -> None:
    assert extract_number("On 3/4/2020 she had 5 apples. The answer is 5.") == "5"
    assert extract_number("The answer is 3/4/2020.") == "3" and extract_number("It was 3/4/2020") == "2020"
    assert extract_number("So 12 * 3/4 = 9 cups.\nThe answer is 12 * 3/4 = 9.") == "9"
    assert extract_number("In 2 1/2 hours she walks 10 miles.") == "10"


def test_gsm8k_an_answer_sentence_without_a_number_falls_back() -> None:
    assert extract_number("The answer is below.\n#### 42") == "42"
    assert extract_number("The answer is 7. Earlier the answer is unclear.") == "7"


@pytest.mark.parametrize("prediction, gold", [
    ("11111111110", "11,\\! 111,\\! 111,\\! 100"), ("0.000067", ".0000672"), ("0.0000675", ".0000672"),
    ("2^{20}+1", "1048576"), ("\\frac{1}{3}", "0.3333333"),
])
def test_math_numbers_compare_exactly(prediction: str, gold: str) -> None:
    assert not math_equal(prediction, gold)


@pytest.mark.parametrize("prediction, gold", [
    ("52_{8}", "52_8"), ("2516_{8}", "2516_8"), ("1\\pm\\sqrt{5}, -2", "\\{1\\pm\\sqrt{5},-2\\}"),
    ("11111111100", "11,\\! 111,\\! 111,\\! 100"), ("6.72\\times10^{-5}", ".0000672"), ("0.1", "\\frac{1}{10}"),
    ("\\sqrt{2}+\\sqrt{3}", "\\sqrt{5+2\\sqrt{6}}"),
])
def test_math_equal_forms(prediction: str, gold: str) -> None:
    assert math_equal(prediction, gold)
    assert score_math(f"So it is $\\boxed{{{prediction}}}$.", gold).correct


@pytest.mark.parametrize("output, gold", [
    ("B. 4\n\nExplanation: 2 + 2 = 4; (A) 3 is wrong, (C) 5 is wrong.", "B"),
    ("The answer is A. However, statement 2 is false. Final Answer: B", "B"),
    ("**Final answer:** \\boxed{B}", "B"), ("So the correct choice is B.", "B"), ("The answer is (b).", "B"),
    ("The answer is option B.", "B"), ("I pick option C.", "C"),
    ("The answer is (C) the cell wall.", "C"),                   # the form Qwen answers in, unchanged
    ("I think (B) is wrong. The answer is (C).", "C"), ("Option (A) is wrong. The answer is **B**.", "B"),
])
def test_choice_takes_the_last_stated_answer(output: str, gold: str) -> None:
    assert extract_choice(output, "ABCD") == gold


@pytest.mark.parametrize("output", ["Answer: a plant makes sugar.", "A crab is an animal.", "The answer is (E).",
                                    "A man walks in."])
def test_choice_articles_are_not_answers(output: str) -> None:
    assert extract_choice(output, "ABCD") is None


@pytest.mark.parametrize("output, gold", [
    ("So the answer is (A). Option (B) is less likely.", "(A)"),
    ("So the answer is Yes. This is because he intended it.", "Yes"),
    ("So the answer is 8. That's all.", "8"), ("So the answer is 3.5.", "3.5"),
    ("So the answer is ] ] ).", "] ] )"), ("So the answer is **(C)**.", "(C)"), ("So the answer is B.", "(B)"),
])
def test_bbh_answer_ends_at_its_sentence(output: str, gold: str) -> None:
    assert score_bbh(output, gold).correct


@pytest.mark.parametrize("output, gold", [
    ("Answer: No", "No"), ("No!", "No"), ("**Yes**", "Yes"), ("So the answer is 'valid'.", "valid"),
    ('So the answer is "invalid".', "invalid"), ("So the answer is No!", "No"), ("So the answer is `True`.", "True"),
    ("Final answer: True", "True"), ("**Answer:** valid", "valid"), ("So the answer is \\boxed{No}.", "No"),
    ("So the answer is No, the man did not.", "No"), ("the answer is (No).", "No"),
    ("So the answer is yes, since", "Yes"), ("No. The man did not intend it.", "No"),
    ("Let me think.\n\n**No.**", "No"), ("So the answer is no.", "No"),
    ("So the answer is Yes.\n\n**Final Answer:** No", "No"),
    ("So the answer is Yes.\nI checked the answer: it holds.", "Yes"),
])
def test_bbh_a_word_answer_is_read_through_its_wrapping(output: str, gold: str) -> None:
    """Yes/No, True/False, valid/invalid (causal_judgement, navigate, web_of_lies, boolean_expressions,
    formal_fallacies...): 'Answer: No', 'No!' and a quoted 'valid' were read as no answer or as "'valid'"."""
    assert score_bbh(output, gold).correct


@pytest.mark.parametrize("output, gold", [
    ("So the answer is not valid.", "valid"), ("No one would say so.", "No"), ("So the answer is invalid.", "valid"),
    ("So the answer is False, not True.", "True"), ("Yes, so the answer is No", "Yes"), ("Answer: valid", "invalid"),
    ("Yes it is. Hmm.", "Yes"),  # a first line is an answer only as the word before punctuation
])
def test_bbh_a_word_answer_is_the_word_that_starts_it(output: str, gold: str) -> None:
    assert not score_bbh(output, gold).correct


@pytest.mark.parametrize("output, gold", [
    ("So the answer is 8 apples.", "8"), ("So the answer is eight.", "8"), ("So the answer is $\\boxed{-42}$.", "-42"),
    ("So the answer is 1 + 2 = 3.", "3"), ("Answer: 11", "11"),
    ("So the answer is apple, banana, cherry.", "apple banana cherry"), ("So the answer is ])).", "] ) )"),
    ("So the answer is `] ) )`.", "] ) )"), ("So the answer is 'o'connell phony'.", "o'connell phony"),
])
def test_bbh_numbers_lists_and_closings_are_read_through_their_wrapping(output: str, gold: str) -> None:
    """object_counting's '8 apples' / 'eight', a word list with commas and a dyck closing without spaces
    were compared as the raw string, never equal to the target."""
    assert score_bbh(output, gold).correct


@pytest.mark.parametrize("output, gold", [
    ("So the answer is twenty-one.", "20"), ("So the answer is 8 - 3 = 5.", "8"),
    ("So the answer is ] ) ) >.", "] ) )"),
    ("So the answer is banana apple cherry.", "apple banana cherry"), ("So the answer is -3.", "3"),
])
def test_bbh_numbers_lists_and_closings_still_compare_exactly(output: str, gold: str) -> None:
    assert not score_bbh(output, gold).correct


def test_qa_an_alias_that_normalises_to_nothing_matches_nothing(tmp_path: Path) -> None:
    assert not score_qa("", ["---"]).correct and not score_qa("The.", [")"]).correct
    assert not score_qa("A-", ["A+", "AB+"]).correct and score_qa("AB+", ["A+", "AB+"]).correct
    assert score_qa("A+.", ["A+", "AB+"]).correct and score_qa("**@**", ["At sign", "@"]).correct  # as written
    file = tmp_path / "test.jsonl"
    file.write_text("".join(json.dumps(row) + "\n" for row in [
        {"question": "q0", "answer": ["---"]}, {"question": "q1", "answer": ["Paris", ")"]}]))
    data = load_qa(file, "nq")
    assert [r.id for r in data.records] == ["1"] and data.skipped == {"no alias left once normalised": 1}


def test_mmlu_no_correct_answer_is_skipped(tmp_path: Path) -> None:
    (tmp_path / "mmlu_x.csv").write_text(
        "question,choices,answer,error_type\n"
        "q0,\"['a', 'b']\",0,ok\nq1,\"['a', 'b']\",1,No Correct Answer\nq2,\"['a', 'b']\",1,wrong_groundtruth\n")
    data = load_mmlu_redux(tmp_path)
    assert [r.id for r in data.records] == ["x/0"]
    assert data.skipped == {"no correct answer": 1, "wrong groundtruth": 1}


def test_bbh_gold_that_is_option_text_is_skipped(tmp_path: Path) -> None:
    examples = [{"input": "Find a movie.\nOptions:\n(A) Monsters\n(B) Inc", "target": "Monsters, Inc"},
                {"input": "Find a movie.\nOptions:\n(A) Up\n(B) Cars", "target": "(B)"},
                {"input": "Is it valid?", "target": "valid"}]
    (tmp_path / "movie.json").write_text(json.dumps({"examples": examples}))
    data = load_bbh(tmp_path)
    assert [r.id for r in data.records] == ["movie/1", "movie/2"]
    assert data.skipped == {"gold is an option's text, not its letter": 1}


def _run(folder: Path, bench: str, rows: list[tuple[str, str, list[str], bool]], question: str = "q") -> Path:
    """A run folder as the runner writes it, with stored verdicts (id, output, gold, correct)."""
    folder.mkdir()
    samples = [{"id": i, "group": None, "prompt": [{"role": "user", "content": question}], "output": out, "gold": gold,
                "extracted": None, "correct": correct, "value": float(correct), "finish_reason": "eos"}
               for i, out, gold, correct in rows]
    (folder / "samples.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    n, right = len(rows), sum(r[3] for r in rows)
    (folder / "summary.json").write_text(json.dumps({
        "bench": bench, "models": [folder.name], "method": "single", "metric": "accuracy", "n": n,
        "correct": right, "accuracy": right / n, "score": right / n, "ci95": [0, 1], "ensemble_rate": 0.0,
        "tokens_per_s": 1.0, "mean_output_tokens": 1, "truncated": 0, "failures": 0, "max_new_tokens": 8}))
    return folder


def test_compare_rescores_stored_samples(tmp_path: Path) -> None:
    """A run scored before a fix (its stored verdict wrong) and one after compare by the same rules."""
    old = _run(tmp_path / "old", "gsm8k", [("0", "The answer is 5 + 3 = 8.", ["8"], False),
                                           ("1", "The answer is 2.", ["3"], False)])
    new = _run(tmp_path / "new", "gsm8k", [("0", "The answer is 8.", ["8"], True),
                                           ("1", "The answer is 3.", ["3"], True)])
    result = paired(old, new)
    assert (result["both_right"], result["wins"], result["losses"]) == (1, 1, 0)
    text = compare_runs([old, new], tmp_path / "plots")
    assert "| gsm8k | single (old) | 2 | 50.0% |" in text
    assert "single (old): 1 verdict(s) changed" in text and "single (new)" not in text.split("note:")[-1]


def test_compare_drops_questions_no_longer_scored(tmp_path: Path) -> None:
    question = "Find a movie.\nOptions:\n(A) Monsters\n(B) Inc"
    old = _run(tmp_path / "old", "bbh", [("movie/1", "So the answer is (A).", ["Monsters, Inc"], False)], question)
    text = compare_runs([old], tmp_path / "plots")
    assert "single (old): 0 verdict(s) changed, 1 question(s) no longer scored" in text


def test_compare_rescores_bbh_word_answers(tmp_path: Path) -> None:
    """A BBH run stored before the word-answer fix ('Answer: No' scored wrong) is compared by today's rules."""
    old = _run(tmp_path / "old", "bbh", [("navigate/0", "Answer: No", ["No"], False),
                                         ("navigate/1", "So the answer is Yes.", ["No"], False)])
    text = compare_runs([old], tmp_path / "plots")
    assert "| bbh | single (old) | 2 | 50.0% |" in text and "single (old): 1 verdict(s) changed" in text


def test_gsm8k_takes_the_last_marked_or_boxed_answer() -> None:
    """Catches the first '####' or \\boxed{} answer being read where several are written."""
    assert extract_number("#### 12\n#### 13") == "13"
    assert extract_number("\\boxed{12} no, \\boxed{13}") == "13"


def test_gsm8k_a_stated_calculation_is_read_after_its_last_equals_sign() -> None:
    """Catches the number after the first '=' of a stated chain of calculations being read."""
    assert extract_number("The answer is 1 + 2 = 3 + 4 = 7.") == "7"
