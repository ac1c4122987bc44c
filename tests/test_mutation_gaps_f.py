"""Behaviour the suite left unpinned (mutation testing of evaluation/compare.py's statistics,
evaluation/scoring.py, evaluation/math_answers.py, weighting.py and policies.py): each test fails on
a changed comparison, bound or constant that the rest of the suite let through. Pure functions and
hand-made run folders only, so the file stays fast."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.compare import (
    _rescore_summary,
    accuracy_difference,
    chrf_difference,
    rescored,
)
from shared_engine.evaluation.math_answers import _too_big_to_evaluate, math_equal, normalize_math
from shared_engine.evaluation.runner import SAMPLES, SUMMARY
from shared_engine.evaluation.scoring import extract_translation, score_number, score_qa, token_f1, usable_aliases
from shared_engine.policies import DraftSchedule, Policy, make_policy
from shared_engine.weighting import (
    TextFit,
    best_threshold,
    segment_logprobs,
    tokens_inside,
)

# --- compare: the paired statistics ---------------------------------------------------------------




def test_accuracy_difference_refuses_counts_one_over_n() -> None:
    """wins + losses + both right may reach n (no question wrong in both), never pass it."""
    assert accuracy_difference(50, 30, 20, 100)[0] == 0.2
    with pytest.raises(InvalidRequestError, match="do not fit"):
        accuracy_difference(50, 30, 21, 100)








def _folder(folder: Path, rows: list[dict], bench: str = "gsm8k", **summary: object) -> Path:
    folder.mkdir(parents=True)
    (folder / SUMMARY).write_text(json.dumps({"bench": bench, "metric": "accuracy", **summary}))
    (folder / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder




def test_rescoring_leaves_a_row_without_gold_as_stored(tmp_path: Path) -> None:
    """A stored answer with no gold cannot be scored again: its verdict stands, it is not dropped."""
    rows = [{"id": "0", "output": "The answer is 4.", "gold": "4", "correct": True},
            {"id": "1", "output": "The answer is 5.", "gold": None, "correct": True}]
    result = rescored(_folder(tmp_path / "run", rows))
    assert set(result.rows) == {"0", "1"} and result.rows["1"]["correct"] is True
    assert (result.changed, result.dropped) == (0, 0)


def test_rescored_exact_match_summary_recomputes_f1(tmp_path: Path) -> None:
    """Where re-scoring changes a verdict, the summary's F1 is the mean of the re-scored rows' F1."""
    rows = [{"id": "0", "output": "Paris", "gold": ["Paris"], "correct": False, "f1": 0.0},
            {"id": "1", "output": "Rome", "gold": ["Madrid"], "correct": False, "f1": 0.0}]
    folder = _folder(tmp_path / "run", rows, bench="triviaqa")
    summary = {"dir": str(folder), "metric": "exact_match", "f1": 0.0, "score": 0.0}
    assert _rescore_summary(summary) == (1, 0)
    assert (summary["n"], summary["correct"], summary["f1"]) == (2, 1, 0.5)




def test_chrf_difference_interval_is_the_bootstraps_2_5_and_97_5_percentiles() -> None:
    """The interval against resamples scored with sacrebleu's own corpus chrF: the same sentences drawn
    (every one of them can be) for both runs, its ends the 2.5th and 97.5th percentiles."""
    import numpy as np
    import sacrebleu

    refs = ["Der Hund schläft im Garten.", "Ich trinke gern Kaffee.", "Das Haus ist alt.", "Wir fahren nach Berlin.",
            "Sie liest ein Buch.", "Es regnet heute."]
    base = ["Der Hund schläft.", "Ich trinke Kaffee.", "Das Haus ist alt.", "Wir fahren.", "Sie liest.", "Regen."]
    new = ["Der Hund schläft im Garten.", "Kaffee.", "Haus alt.", "Wir fahren nach Berlin.", "Sie liest ein Buch.",
           "Es regnet heute."]
    rows = [[{"gold": [r], "extracted": o} for o, r in zip(outputs, refs)] for outputs in (base, new)]
    resamples = 200
    delta, (low, high) = chrf_difference(rows[0], rows[1], resamples=resamples, seed=3)
    rng = np.random.default_rng(3)
    deltas = []
    for _ in range(resamples):
        picks = rng.integers(0, len(refs), len(refs))
        deltas.append(sacrebleu.corpus_chrf([new[i] for i in picks], [[refs[i] for i in picks]]).score
                      - sacrebleu.corpus_chrf([base[i] for i in picks], [[refs[i] for i in picks]]).score)
    deltas.sort()
    assert delta == pytest.approx(sacrebleu.corpus_chrf(new, [refs]).score - sacrebleu.corpus_chrf(base, [refs]).score,
                                  abs=0.01)
    assert (low, high) == (pytest.approx(deltas[5], abs=0.01), pytest.approx(deltas[194], abs=0.01))


# --- scoring and math answers ---------------------------------------------------------------------


def test_token_f1_is_the_harmonic_mean_and_empty_matches_empty() -> None:
    assert token_f1("the Eiffel tower Paris", "Eiffel Tower") == pytest.approx(2 * (2 / 3) * 1 / (2 / 3 + 1))
    assert token_f1("the", "a") == 1.0  # both normalise to nothing
    assert token_f1("an apple", "apple") == 1.0  # "an" is an article too


def test_a_translation_is_its_first_paragraph_not_the_notes_after_it() -> None:
    assert extract_translation("Der Hund schläft.\n\nNote: I used the formal register.") == "Der Hund schläft."


def test_no_number_against_a_gold_that_is_no_number_is_not_right() -> None:
    assert not score_number("I cannot tell.", "n/a").correct


def test_qa_f1_is_the_best_alias_not_the_first() -> None:
    score = score_qa("New York City", ["Big Apple", "New York City"])
    assert score.correct and score.f1 == 1.0


def test_an_alias_of_symbols_matches_only_itself_and_empty_aliases_are_unusable() -> None:
    assert usable_aliases(["---", "Paris", "the"]) == ["Paris"]
    assert not score_qa("", [""]).correct  # an alias empty as written matches nothing


def test_math_intervals_need_the_same_closing_bracket_and_tuples_the_same_length() -> None:
    assert not math_equal("[1,2)", "[1,2]")
    assert math_equal("(1,2)", "(1,2)")
    assert not math_equal("(1,2,3)", "(1,2)")
    assert not math_equal("1,2", "1")
    assert not math_equal("\\begin{pmatrix}1\\\\2\\\\3\\end{pmatrix}", "\\begin{pmatrix}1\\\\2\\end{pmatrix}")


def test_math_normalisation_keeps_a_negative_decimals_sign_and_reads_thousands() -> None:
    assert normalize_math("-.5") == "-0.5" and math_equal("-.5", "-\\frac{1}{2}")
    assert normalize_math("1,234,567") == "1234567"
    assert normalize_math("12.") == "12"


def test_math_letters_compare_case_aside_only_when_alphabetic() -> None:
    assert math_equal("B", "b")
    assert not math_equal("\\Pi", "\\pi")


def test_math_exponents_over_a_thousand_are_not_evaluated() -> None:
    """sympy would compute the number (2^(2^40) stalled a whole evaluation): 1000 is the bar."""
    assert _too_big_to_evaluate("2^(1001)") and _too_big_to_evaluate("2**1500")
    assert not _too_big_to_evaluate("2^(1000)") and not _too_big_to_evaluate("10^3")




# --- weighting ------------------------------------------------------------------------------------


def test_a_text_of_no_bytes_has_no_loss_per_byte() -> None:
    assert math.isnan(TextFit(0.0, 0, 0).nll_per_byte)


def test_the_first_token_is_never_scored_and_a_token_ending_on_the_span_end_is() -> None:
    pieces = [b"Hello", b" there"]
    assert tokens_inside(pieces, [(0, 11)]) == [1]
    assert tokens_inside([b"x", b"ab", b"c"], [(1, 3)]) == [1]




def test_segment_logprobs_a_token_ending_on_a_boundary_belongs_to_the_span_before() -> None:
    spans = segment_logprobs([[2, 4]], [[-1.0, -2.0]], [0, 2, 4])
    assert spans.flatten().tolist() == [-1.0, -2.0]
    # a token of no bytes at the start (a BOS) ends at offset 0: it spells no span's text, so no span takes it
    spans = segment_logprobs([[0, 2, 4]], [[-5.0, -1.0, -2.0]], [0, 2, 4])
    assert spans.flatten().tolist() == [-1.0, -2.0]




def test_best_threshold_keeps_the_drafter_at_exactly_its_threshold_and_ties_go_to_fusing() -> None:
    best, accuracy = best_threshold([0.7, 0.3], [True, False], [False, True], grid=[0.7])
    assert best == 0.7 and accuracy["0.7"] == 1.0
    # two thresholds as good: the higher one (fuse more) wins
    best, _ = best_threshold([0.9, 0.3], [True, False], [False, True], grid=[0.5, 0.8])
    assert best == 0.8
    # as good as always fusing: None
    assert best_threshold([0.9], [True], [True], grid=[0.5])[0] is None


# --- policies -------------------------------------------------------------------------------------






def test_the_drafter_decides_alone_at_exactly_its_confidence_and_only_for_safe() -> None:
    safe = make_policy("safe", DraftSchedule.fixed(2), None, drafter_confidence=0.5)
    assert safe.drafter_decides_alone([0.5, 0.9]) and not safe.drafter_decides_alone([0.49, 0.9])
    other = Policy("x", DraftSchedule.fixed(1), verify_draft=False, require_boundary=False, skip_consensus=False,
                   drafter_confidence=0.5)
    assert other.confidence_gate is None and not other.drafter_decides_alone([1.0])




def test_overlap_auto_drafts_ahead_where_any_member_computes_apart() -> None:
    """A server member beside a local one: the drafter drafts on while the server scores."""
    policy = make_policy("safe", DraftSchedule.fixed(2), None, overlap="auto")
    server, local = (SimpleNamespace(capabilities=SimpleNamespace(computes_apart=apart)) for apart in (True, False))
    assert policy.overlaps([local, server]) and not policy.overlaps([local, local])
    assert make_policy("safe", DraftSchedule.fixed(2), None, overlap="on").overlaps([local])
