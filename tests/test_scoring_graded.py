"""The scorer against real zoo outputs graded by hand (tests/graded_outputs/, see its README): for every row the scorer
reads what the human grader read, but for the rows listed in KNOWN below, whose current reading is pinned instead (a
change to any of them is seen and must be judged). Rows 'F1', 'F2' and 'F4' were misread before the fix that added this
corpus: an output cut off while analysing "Option (A): ..." read as A, "The answer is (D) <option C's text>" read as D,
and "The answer is (B" cut at the token cap read nothing."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared_engine.evaluation.math_answers import score_math
from shared_engine.evaluation.scoring import Score, score_bbh, score_choice, score_number

ROWS = [json.loads(line) for line in
        (Path(__file__).parent / "graded_outputs" / "graded.jsonl").read_text(encoding="utf-8").splitlines()]

# (benchmark, id, how the output ends) -> (the scorer's current reading, why it differs from the human's)
F5 = "GSM8K last-number fallback on an output cut off before any answer (the human reads none); left as it is"
KNOWN: dict[tuple[str, str, str], tuple[str | None, str]] = {
    ("gsm8k", "4", "\n\n4. Sum up"): ("4", F5 + ": '4. Sum up' is a list item"),
    ("gsm8k", "6", "4 miles per hour, so we can"): ("4", F5 + ": '4 miles per hour' restated"),
    ("gsm8k", "7", "water_pineapple_liters = pineapple_dr"): ("5", F5 + ": '3 / 5' in Python code"),
    ("gsm8k", "0", "Janet has 16 x 3 = 42 ducks, and"): ("42", F5),
    ("gsm8k", "1", "He runs 3 sprints"): ("3", F5),
    ("gsm8k", "2", "Toulouse has twice as many"): ("20", F5),
    ("gsm8k", "0", "every morning and bakes muff"): ("16", F5),
    ("gsm8k", "1", "So he runs 60 * 3 ="): ("3", F5),
    ("mmlu-redux", "econometrics/0", "is a unit root.\n\nTherefore, the"): (
        None, "F3: the answer is given only in words (option B's text), the letter was cut off; left as it is"),
    ("mmlu-redux", "clinical_knowledge/0", "(D) assess for 30 seconds.\n-"): (
        None, "a walk-through cut off at (D) that had called '(B) ... This option is correct' (bare '(B)' items, no "
              "answer stated): the human reads B from the unfinished walk-through, the scorer reads none"),
}


def _known(row: dict[str, Any]) -> tuple[str | None, str] | None:
    hits = [value for (bench, id_, start), value in KNOWN.items()
            if bench == row["benchmark"] and id_ == row["id"] and row["output"].endswith(start)]
    assert len(hits) <= 1, f"KNOWN matches {row['id']} more than once"
    return hits[0] if hits else None


def _score(row: dict[str, Any]) -> Score:
    output, gold = row["output"], row["gold"][0]
    if row["benchmark"] in ("arc-challenge", "mmlu-redux"):
        options = row["options"]
        return score_choice(output, gold, "".join(options), options)
    if row["benchmark"] == "bbh":
        return score_bbh(output, gold)
    if row["benchmark"] == "gsm8k":
        return score_number(output, gold)
    return score_math(output, gold)


def _name(row: dict[str, Any]) -> str:
    return f"{row['benchmark']}-{row['id']}-{'+'.join(m.split('-')[0] for m in row['models'])}-{row['max_new_tokens']}"


def test_the_corpus_is_small_and_covers_every_benchmark() -> None:
    assert 40 <= len(ROWS) <= 60
    assert {row["benchmark"] for row in ROWS} == {"arc-challenge", "mmlu-redux", "bbh", "gsm8k", "math500"}
    assert all(row["options"] for row in ROWS if row["benchmark"] in ("arc-challenge", "mmlu-redux"))


def test_every_known_difference_names_one_row() -> None:
    for key in KNOWN:
        named = [row for row in ROWS if (row["benchmark"], row["id"]) == key[:2] and row["output"].endswith(key[2])]
        assert len(named) == 1, key


@pytest.mark.parametrize("row", ROWS, ids=[_name(row) for row in ROWS])
def test_the_scorer_reads_a_real_output_as_its_human_grader(row: dict[str, Any]) -> None:
    known = _known(row)
    extracted = _score(row).extracted
    if known is not None:
        assert extracted == known[0], f"a known difference changed ({known[1]}): now {extracted!r}"
        assert extracted != row["human_reading"]
    else:
        assert extracted == row["human_reading"], row["note"]
