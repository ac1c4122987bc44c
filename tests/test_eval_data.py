"""Loaders, prompts and scorers on the real benchmark files (../shared/data or $SAFE_ENSEMBLE_DATA).

Skipped, with the reason, where the data folder is absent. Fast: no model runs here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation import BENCHMARKS, get_benchmark
from shared_engine.evaluation.datasets import load_arc, load_gsm8k, load_mmlu_redux, load_qa, normalize_error_type
from shared_engine.evaluation.math_answers import extract_math, math_equal, score_math
from shared_engine.evaluation.prompts import bbh_prompt
from shared_engine.evaluation.scoring import (
    corpus_translation,
    extract_choice,
    extract_translation,
    score_bbh,
    score_choice,
    score_number,
    score_qa,
    score_translation,
)
from tests.benchdata import DATA, needs_data

# Records per benchmark in the 70% share stored in ../shared/data (see its README), after skipping.
EXPECTED = {"gsm8k": 923, "math500": 350, "arc-challenge": 820, "mmlu-redux": 3887, "bbh": 4612, "nq": 2525,
            "triviaqa": 4195, "squad": 1747, "flores": 708}


@needs_data
@pytest.mark.parametrize("name", BENCHMARKS)
def test_every_benchmark_loads_prompts_and_scores_its_own_gold_answers(name: str) -> None:
    bench = get_benchmark(name)
    dataset = bench.dataset()
    assert len(dataset.records) == EXPECTED[name]
    assert len({r.id for r in dataset.records}) == len(dataset.records), "ids must be unique (resume uses them)"
    for record in dataset.records[:50] + dataset.records[-50:]:
        messages = bench.messages(record)
        assert messages[-1]["role"] == "user" and record.question.strip()[:40] in messages[-1]["content"]
        gold = _gold_output(name, record)
        score = bench.score(gold, record)
        if name == "flores":
            assert score.value == pytest.approx(1.0)
        else:
            assert score.correct, (record.id, gold, score)


def _gold_output(name: str, record) -> str:  # noqa: ANN001 - a Record
    if name in ("arc-challenge", "mmlu-redux"):
        return f"Let's see. Option (A) is tempting, but no.\nThe answer is ({record.answers[0]})."
    if name == "bbh":
        return f"Let's think step by step.\nSo the answer is {record.answers[0]}."
    if name == "gsm8k":
        return f"{record.solution.rsplit('####', 1)[0]}The answer is {record.answers[0]}."
    if name == "math500":
        return record.solution  # the published worked solution ends in \boxed{...}
    if name in ("nq", "triviaqa", "squad"):
        return f"{record.answers[-1]}.\n"
    return record.answers[0]


@needs_data
def test_gsm8k_answers_are_numbers_and_the_train_split_gives_four_cot_exemplars() -> None:
    data = load_gsm8k(DATA / "gsm8k" / "test.jsonl")
    assert data.records[0].answers == ["18"]
    assert all(r.answers[0].lstrip("-").replace(".", "").isdigit() for r in data.records)
    messages = get_benchmark("gsm8k").messages(data.records[0])
    shots = [m for m in messages if m["role"] == "assistant"]
    assert len(shots) == 4 and all(s["content"].splitlines()[-1].startswith("The answer is ") for s in shots)
    assert not any("<<" in s["content"] for s in shots)
    assert "Natalia" in messages[1]["content"]  # the first train question


@needs_data
def test_mmlu_redux_quirks() -> None:
    folder = DATA / "mmlu_redux"
    anatomy = load_mmlu_redux(folder / "mmlu_anatomy.csv")            # ';'-delimited, CRLF
    assert len(anatomy.records) + sum(anatomy.skipped.values()) == 100
    assert anatomy.records[0].choices[0].text == "Dyslexia"
    moral = load_mmlu_redux(folder / "mmlu_moral_scenarios.csv")      # Mac Roman
    assert any("sister\u2019s" in r.question for r in moral.records)
    ml = load_mmlu_redux(folder / "mmlu_machine_learning.csv")        # columns in another order
    assert ml.skipped == {"wrong groundtruth": 2} and all(r.answers[0] in "ABCD" for r in ml.records)
    econ = load_mmlu_redux(folder / "mmlu_econometrics.csv")          # an extra empty column
    assert len(econ.records) == 100 and len(econ.records[0].choices) == 4
    virology = load_mmlu_redux(folder / "mmlu_virology.csv")          # JSON-style quoted choices
    assert virology.skipped == {"wrong groundtruth": 33, "no correct answer": 4} and len(virology.records) == 63
    everything = load_mmlu_redux(folder)
    assert everything.skipped == {"wrong groundtruth": 91, "no correct answer": 22}
    assert [r.group for r in everything.records[:3]] == ["abstract_algebra", "anatomy", "astronomy"]  # interleaved


def test_error_type_labels_normalise() -> None:
    for label in ("Wrong Groundtruth", "wrong_groundtruth", " wrong  groundtruth "):
        assert normalize_error_type(label) == "wrong groundtruth"
    assert {normalize_error_type(x) for x in ("ok", "OK", "Ok")} == {"ok"}
    assert normalize_error_type(None) == ""


@needs_data
def test_arc_reads_both_schemas_and_its_dev_split_gives_exemplars() -> None:
    test = load_arc(DATA / "arc_challenge" / "test.jsonl")
    dev = load_arc(DATA / "arc_challenge" / "dev.jsonl")
    assert len(dev.records) == 294 and dev.records[0].answers == ["D"]
    sizes = {len(r.choices) for r in test.records}
    assert 4 in sizes and sizes <= {3, 4, 5}
    assert all(r.answers[0] in {c.label for c in r.choices} for r in test.records)
    messages = get_benchmark("arc-challenge").messages(test.records[0])
    assert [m["content"][15] for m in messages if m["role"] == "assistant"] == ["D", "C", "A", "B"]
    assert "(C) Chlorophyll in the leaf captures light energy." in messages[-1]["content"]


@needs_data
def test_bbh_cot_prompts_parse_into_three_exemplars_per_task() -> None:
    for file in sorted((DATA / "bbh" / "cot-prompts").glob("*.txt")):
        description, shots = bbh_prompt(file)
        assert len(shots) == 3, file.name
        assert "canary" not in description and all("answer is" in a for _, a in shots)


@needs_data
def test_open_qa_alias_lists_split_records_and_prompt_exemplars() -> None:
    trivia = load_qa(DATA / "triviaqa" / "test.jsonl", "triviaqa")
    assert trivia.skipped == {"malformed line": 1}     # the tail of a record whose head is not in the 70% share
    joined = next(r for r in trivia.records if "Sutherland Brothers" in r.question)
    assert "QUIVER" in joined.answers                     # a record spanning two lines is read whole
    squad = get_benchmark("squad").dataset()
    assert squad.skipped == {"exemplar in the few-shot prompt": 3}
    assert not any(r.question.endswith("In what country is Normandy located?") for r in squad.records)
    assert squad.records[0].question.endswith("Who was the Norse leader?")   # same context, another question
    nq = get_benchmark("nq")
    messages = nq.messages(nq.dataset().records[0])
    assert messages[0]["content"].startswith("Instructions:") and messages[2]["content"] == "Prince"


@needs_data
def test_math500_published_solutions_box_their_answer() -> None:
    """The worked solution's last \\boxed{} equals the answer field for every record (extraction and
    equivalence on 350 real LaTeX answers), and a wrong answer is not accepted."""
    records = get_benchmark("math500").dataset().records
    assert all(score_math(r.solution, r.answers[0]).correct for r in records)
    assert not any(score_math("\\boxed{" + r.answers[0] + "+1}", r.answers[0]).correct for r in records[:40])


@pytest.mark.parametrize("prediction, gold", [
    ("\\dfrac{17}{50}", "0.34"), ("\\frac43", "\\frac{4}{3}"), ("90", "90^\\circ"), ("5.4", "5.4 \\text{ cents}"),
    ("10080", "10,\\!080"), ("C", "\\text{(C)}"), ("(C)", "\\text{(C)}"),
    ("(3,\\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)"), ("\\sqrt{20}", "2\\sqrt{5}"),
    ("[-2,7]", "x \\in [-2,7]"), ("32348", "\\$32,\\!348"), ("864", "864 \\mbox{ inches}^2"),
    ("\\frac{270}{7}", "\\frac{270}7\\text{ degrees}"), ("6.72\\times10^{-5}", ".0000672"), ("1+2x", "2x+1"),
    ("\\frac{1}{2}", "0.5"), ("evelyn", "\\text{Evelyn}"), ("x=5", "5"),
    ("\\begin{pmatrix}-1/3\\\\2/3\\\\5/3\\end{pmatrix}", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}"),
])
def test_math_equivalent_answers(prediction: str, gold: str) -> None:
    assert math_equal(prediction, gold)


@pytest.mark.parametrize("prediction, gold", [
    ("(3,4)", "(3,4]"), ("3", "4"), ("\\frac{1}{3}", "0.33"), ("\\sqrt{3}", "3"), ("(2,1)", "(1,2)"),
    ("\\begin{pmatrix}1\\\\2\\end{pmatrix}", "\\begin{pmatrix}1\\\\3\\end{pmatrix}"), ("__import__('os')", "0"),
])
def test_math_different_answers(prediction: str, gold: str) -> None:
    assert not math_equal(prediction, gold)


def test_math_extraction_takes_the_last_balanced_box() -> None:
    assert extract_math("First \\boxed{1}, then \\boxed{\\frac{a}{b_{1}}} done.") == "\\frac{a}{b_{1}}"
    assert extract_math("cut off \\boxed{\\frac{1}{2") is None
    assert extract_math("So the answer is $\\frac{3}{4}$.") == "\\frac{3}{4}"


def test_number_scoring() -> None:
    assert score_number("She makes 9 * 2 = $18.\nThe answer is $18.", "18").correct
    assert score_number("Total: 1,234 apples. #### 1234", "1234").correct
    assert score_number("so x = 7.50", "7.5").correct
    assert not score_number("The answer is 17. (Later: 18)", "18").correct   # the stated answer wins
    assert score_number("no number here", "3").extracted is None
    assert score_number("The answer is **18**.\nThat took 2 steps.", "18").correct  # Markdown bold read through


def test_choice_scoring() -> None:
    assert extract_choice("I think (B) is wrong. The answer is (C).", "ABCD") == "C"
    assert extract_choice("Answer: D) because", "ABCD") == "D"
    assert extract_choice("Answer: a plant makes sugar.", "ABCD") is None       # an article, not option A
    assert extract_choice("A crab is an animal.", "ABCD") is None
    assert extract_choice("B", "ABCD") == "B"
    assert extract_choice("The answer is (E).", "ABCD") is None
    assert not score_choice("A crab is an animal", "C", "ABCD").correct
    assert extract_choice("Option (A) is wrong. The answer is **B**.", "ABCD") == "B"  # Markdown bold
    assert extract_choice("**Answer:** C", "ABCD") == "C" and extract_choice("Answer: **D**", "ABCD") == "D"


def test_a_power_tower_is_not_evaluated() -> None:
    # sympy would compute 2^(2^40) (minutes, the whole evaluation stalled); such an answer is not shown equal
    from shared_engine.evaluation.math_answers import _to_sympy_text, _too_big_to_evaluate

    for answer in ("9^{9^{9}}", "2^{2^{40}}", "9^9^9", "2^{1001}"):
        assert _too_big_to_evaluate(_to_sympy_text(answer) or "")
        assert not score_math(f"The answer is \\boxed{{{answer}}}", "5").correct
    for answer in ("2^{10}", "x^5 - x^4 + x^3 - x^2 + x - 1", "3^{2}+4^2"):
        assert not _too_big_to_evaluate(_to_sympy_text(answer) or "")
    assert score_math("\\boxed{2^{10}}", "1024").correct


def test_bbh_and_qa_scoring() -> None:
    assert score_bbh("So the answer is (B).", "(B)").correct
    assert score_bbh("... So the answer is ] ] ).", "] ] )").correct
    assert not score_bbh("So the answer is ] ].", "] ] )").correct
    assert score_bbh("So the answer is valid.", "valid").correct and not score_bbh("valid", "invalid").correct
    result = score_qa("Answer: The Sunset Boulevard.\nIt premiered in 1993.", ["Sunset Blvd", "Sunset Boulevard"])
    assert result.correct and result.f1 == 1.0
    partial = score_qa("Henry Campbell", ["Sir Henry Campbell-Bannerman"])
    assert not partial.correct and 0 < partial.f1 < 1


def test_a_translation_is_read_without_its_wrapper() -> None:
    """Seen in FLORES de-en answers: a code fence or a lead-in before the translation, whose first
    paragraph the first-paragraph rule took for the answer."""
    assert extract_translation("```plaintext\n\nThe cat sat.\n```") == "The cat sat."
    assert extract_translation("The sentence was translated into English as follows:\n\nThe cat sat.\n\nNote: x") \
        == "The cat sat."
    assert extract_translation("Here it is:\nTranslation: The cat sat.") == "The cat sat."
    assert extract_translation("Translation: The cat sat.\n\nNote: literal.") == "The cat sat."
    assert extract_translation("The cat sat:") == "The cat sat:"            # a colon with nothing after it stays
    assert extract_translation("The cat sat.\nThe dog too.\n\nNotes") == "The cat sat.\nThe dog too."
    assert extract_translation("```plaintext") == ""


@needs_data
def test_flores_bleu_and_chrf_with_sacrebleu() -> None:
    records = get_benchmark("flores", pair="en-ro").dataset().records[:20]
    references = [r.answers[0] for r in records]
    assert corpus_translation(references, references) == {"bleu": 100.0, "chrf": 100.0}
    shuffled = corpus_translation(references[1:] + references[:1], references)
    assert shuffled["bleu"] < 10 and shuffled["chrf"] < 40
    assert score_translation("Translation: " + references[0] + "\n\nNote: literal.", references[0]).value == 1.0
    for pair in ("en-de", "de-en"):
        first = get_benchmark("flores", pair=pair).dataset().records[0]
        assert first.id == "0" and first.answers[0] != first.question


def test_data_flag_accepts_a_file_of_the_same_format(tmp_path: Path) -> None:
    file = tmp_path / "mine.jsonl"
    file.write_text(json.dumps({"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"}) + "\n")
    bench = get_benchmark("gsm8k", data=str(file))
    assert [r.answers for r in bench.dataset().records] == [["4"]]
    (tmp_path / "bad.jsonl").write_text("question,answer\n1,2\n")
    with pytest.raises(InvalidRequestError, match="no JSON lines"):
        get_benchmark("gsm8k", data=str(tmp_path / "bad.jsonl")).dataset()
    with pytest.raises(InvalidRequestError, match="unknown benchmark"):
        get_benchmark("hellaswag")


@needs_data
def test_rows_whose_gold_no_answer_can_match_are_skipped() -> None:
    """Real rows: NQ's aliases ``---`` (row 208) and ``)`` (268) matched an empty answer; BBH's three
    targets that are an option's text could not be matched by any letter."""
    nq = get_benchmark("nq").dataset()
    assert nq.skipped == {"no alias left once normalised": 2} and not {"208", "268"} & {r.id for r in nq.records}
    assert not any(score_qa("", r.answers).correct for r in nq.records)
    bbh = get_benchmark("bbh").dataset()
    assert bbh.skipped == {"gold is an option's text, not its letter": 3}
    assert not {"movie_recommendation/163", "ruin_names/99", "ruin_names/144"} & {r.id for r in bbh.records}


@needs_data
def test_math500_base_subscripts_in_braces_are_the_same_number() -> None:
    records = get_benchmark("math500").dataset().records
    based = [r for r in records if re.fullmatch(r"\d+_\d+", r.answers[0])]
    assert len(based) == 5
    for r in based:
        number, base = r.answers[0].split("_")
        assert score_math(f"\\boxed{{{number}_{{{base}}}}}", r.answers[0]).correct


def test_another_benchmarks_file_is_a_one_line_error(tmp_path: Path) -> None:
    """--data pointing at another benchmark's file was a traceback: BBH given JSON lines
    (JSONDecodeError), FLORES given an open-QA file (a pydantic ValidationError)."""
    qa = tmp_path / "nq.jsonl"
    qa.write_text("".join(json.dumps({"question": f"who {i}?", "answer": ["a", "b"]}) + "\n" for i in range(2)))
    with pytest.raises(InvalidRequestError, match="not a BBH task file"):
        get_benchmark("bbh", data=str(qa)).dataset()
    with pytest.raises(InvalidRequestError, match="not a FLORES file"):
        get_benchmark("flores", data=str(qa), pair="de-en").dataset()
    task = tmp_path / "task.json"
    task.write_text(json.dumps({"examples": [{"question": "x"}]}))
    with pytest.raises(InvalidRequestError, match="not a BBH example"):
        get_benchmark("bbh", data=str(task)).dataset()


def test_math_a_bold_option_or_one_with_a_full_stop_is_the_option() -> None:
    """Catches \\textbf{} not being unwrapped and a final full stop being kept."""
    assert math_equal("\\textbf{(B)}", "B") and math_equal("\\textbf{12}", "12")
    assert math_equal("(C).", "C")
