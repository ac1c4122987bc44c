"""Eval harness gaps found by a hunt: MATH-500 answers stated without ``\\boxed{}`` in common forms,
``eval compare`` keeping a FLORES run's stale extraction, and the progress bar counting a member's
timeout as a wrong answer."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
from pathlib import Path
from typing import Any

import pytest

from shared_engine.errors import MemberError
from shared_engine.evaluation import evaluate
from shared_engine.evaluation.math_answers import extract_math, normalize_math, score_math
from shared_engine.evaluation.runner import SAMPLES, SUMMARY
from shared_engine.evaluation.scoring import Score, corpus_translation, score_translation
from tests.test_eval_runner import config, engine, toy_bench


@pytest.mark.parametrize(("output", "gold"), [
    # Minerva's format: the answer's "$...$" is followed by more text on its line
    ("Final Answer: The final answer is $3\\sqrt{2}$. I hope it is correct.", "3\\sqrt{2}"),
    ("Therefore, the answer is \\(\\frac{1}{2}\\).", "\\frac{1}{2}"),
    ("Therefore, the answer is \\[\\frac{1}{2}\\]", "\\frac12"),
    ("**Final Answer:** $\\frac{3}{4}$", "\\frac34"),
    ("Work...\n**Answer:** $12$", "12"),
    ("The answer is $\\$18.90$, the total.", "\\$18.90"),  # an escaped dollar does not close the span
    ("So the answer is 5. Let me double-check: 2 + 3 = 5.", "5"),
])
def test_math_answers_stated_in_common_forms_are_read(output: str, gold: str) -> None:
    score = score_math(output, gold)
    assert score.correct, (output, score.extracted)


def test_math_reading_keeps_boxed_first_and_the_forms_read_before() -> None:
    assert extract_math("The answer is $5$. Final Answer: \\boxed{7}") == "7"
    assert extract_math("So the answer is $\\frac{3}{4}$.") == "\\frac{3}{4}"
    assert extract_math("The answer is: 42\nThat is all.") == "42"
    assert extract_math("The answer isn't obvious.") is None
    assert extract_math("The answer is $3$ or $4$; the answer is $4$.") == "4"  # the last cue
    assert normalize_math("\\(\\frac{1}{2}\\)") == "\\frac{1}{2}" and normalize_math("\\[x^2\\]") == "x^2"


def _flores_run(folder: Path, extracted: str, output: str, reference: str) -> Path:
    """A finished FLORES run of one sentence, stored with ``extracted`` as the translation of that time."""
    import sacrebleu

    folder.mkdir(parents=True)
    chrf = sacrebleu.sentence_chrf(extracted, [reference]).score / 100
    row = {"id": "0", "prompt": [{"role": "user", "content": "x"}], "output": output, "gold": [reference],
           "extracted": extracted, "correct": False, "value": chrf,
           "finish_reason": "eos", "stats": {"tokens": 5, "elapsed_s": 1.0, "ensembled_tokens": 0}, "error": None}
    (folder / SAMPLES).write_text(json.dumps(row) + "\n")
    corpus = corpus_translation([extracted], [reference])
    (folder / SUMMARY).write_text(json.dumps({
        "bench": "flores-en-de", "models": ["m"], "method": "single", "engine_options": {}, "metric": "chrf",
        "n": 1, "score": corpus["chrf"], **corpus, "ci95": None, "ensemble_rate": 0.0, "tokens_per_s": 1.0,
        "forward_passes_per_token": {}, "mean_output_tokens": 5, "truncated": 0, "failures": 0,
        "max_new_tokens": 10}))
    return folder


def test_compare_reads_a_flores_runs_translations_again(tmp_path: Path) -> None:
    """A run stored before code fences stopped being read as the translation (3df941b) is compared on
    the translation read now: its sentence chrF, the pairing and its corpus chrF in the table."""
    from shared_engine.evaluation.compare import compare_runs, paired

    reference = "Am Montag gaben Wissenschaftler bekannt, dass sie ein neues Diagnosewerkzeug erfunden haben."
    output = "```\n" + reference + "\n```"
    now = score_translation(output, reference).extracted
    assert now == reference
    old = _flores_run(tmp_path / "old", output, output, reference)  # the fence kept, as stored then
    new = _flores_run(tmp_path / "new", now, output, reference)
    result = paired(old, new)
    assert (result["wins"], result["losses"], result["chrf_delta"]) == (0, 0, 0.0)
    text = compare_runs([old, new], tmp_path / "plots", baseline=old)
    rows = [line for line in text.splitlines() if line.startswith("| flores-en-de |")]
    assert len(rows) == 2 and all("| 100.0 chrF |" in line for line in rows), text
    assert "1 translation(s) read differently" in text.split("re-scored with the current scorer")[1]


async def test_progress_accuracy_leaves_out_a_members_timeout(tmp_path: Path) -> None:
    """Every answer right and one member timeout: the bar showed acc 0.750 beside the summary's 1.0 on 3."""
    bench = dataclasses.replace(toy_bench(tmp_path, questions=4),
                                score=lambda out, r, finish=None: Score(extracted="x", correct=True, value=1.0))
    eng = engine()
    real, calls = eng.agenerate, {"n": 0}

    async def flaky(messages: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise MemberError("b", "http://x", "timed out")
        return await real(messages, **kwargs)

    eng.agenerate = flaky  # type: ignore[method-assign]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        summary = await evaluate(eng, bench, config(max_new_tokens=3), tmp_path / "run", progress=True)
    assert summary["accuracy"] == 1.0 and summary["n"] == 3 and summary["transient_failures"] == 1
    shown = [part.split("acc=")[1][:5] for part in err.getvalue().split("\r") if "acc=" in part]
    assert shown and all(acc == "1.000" for acc in shown), shown
