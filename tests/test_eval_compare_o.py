"""``eval compare`` and ``eval`` edges a hunt found (h232): a baseline nothing pairs with, a baseline left
out of the table, ``--pair`` off FLORES, ``--out`` under a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine import InvalidRequestError
from shared_engine.cli import build_parser
from shared_engine.evaluation.compare import compare_runs
from shared_engine.evaluation.runner import CONFIG, SAMPLES
from tests.eval_files import gsm8k_file
from tests.test_eval_runner import _run_folder
from tests.toy import registered_members, toy_member

RIGHT = [{"id": str(i), "correct": True, "value": 1.0, "group": "g"} for i in range(4)]
WRONG = [{"id": str(i), "correct": i == 3, "value": float(i == 3), "group": "g"} for i in range(4)]


def _first_pass(folder: Path) -> Path:
    """A run killed (or still going) before its first summary: its config and answers, no summary.json."""
    folder.mkdir(parents=True)
    (folder / CONFIG).write_text("{}")
    (folder / SAMPLES).write_text("".join(json.dumps(r) + "\n" for r in RIGHT[:2]))
    return folder


def test_a_run_without_its_first_summary_is_skipped_with_a_note_among_others(tmp_path: Path) -> None:
    """``compare runs/*`` printed nothing but 'no summary.json in X' when any one run had none yet."""
    base = _run_folder(tmp_path / "base", "gsm8k", WRONG, method="single")
    run = _run_folder(tmp_path / "run", "gsm8k", RIGHT)
    going = _first_pass(tmp_path / "going")
    text = compare_runs([base, run, going], tmp_path / "plots", baseline=base)
    assert "| gsm8k | safe (m) | 4 |" in text and "| safe (m) | 4 | 1 | 3 | 0 |" in text, text
    assert (f"note: skipped {going} (no summary.json yet: its run stopped before writing one: the same eval "
            "command with --resume writes it)") in text, text
    # alone, or as the baseline, it is still the error
    with pytest.raises(InvalidRequestError, match=r"no summary.json in .*going \(its run stopped before"):
        compare_runs([going], tmp_path / "plots")
    with pytest.raises(InvalidRequestError, match=r"no summary.json in .*going \(its run stopped before"):
        compare_runs([base, run, going], tmp_path / "plots", baseline=going)


def test_a_baseline_nothing_pairs_with_gets_a_sentence_not_an_empty_table(tmp_path: Path) -> None:
    """An empty 'Paired with' table header (and --by-group's blank lines) where no run shares the baseline's
    benchmark."""
    base = _run_folder(tmp_path / "base", "bbh", WRONG, method="single")
    other = _run_folder(tmp_path / "mm", "mmlu-redux", RIGHT)
    text = compare_runs([base, other], tmp_path / "plots", baseline=base, by_group=True)
    assert "Paired with" not in text and "| run | N | both right" not in text and "By group" not in text, text
    assert f"no run pairs with {base} (the same questions): see why below" in text, text
    assert "not paired (another benchmark than the baseline's): safe (m)" in text
    assert "\n\n\n" not in text, text
    alone = compare_runs([base], tmp_path / "plots", baseline=base)
    assert f"no run pairs with {base} (the same questions): no other run was given" in alone, alone


def test_a_baseline_not_among_the_runs_has_its_row_in_the_table(tmp_path: Path) -> None:
    """``compare run --baseline base`` paired the run with base but left base's own row out of the table."""
    base = _run_folder(tmp_path / "base", "gsm8k", WRONG, method="single")
    run = _run_folder(tmp_path / "run", "gsm8k", RIGHT)
    table, pairs = compare_runs([run], tmp_path / "plots", baseline=base).split("Paired with")
    assert "| gsm8k | single (m) | 4 |" in table and "| gsm8k | safe (m) | 4 |" in table, table
    assert "| safe (m) | 4 | 1 | 3 | 0 |" in pairs and "single (m)" not in pairs.split("plots:")[0], pairs
    # given among the runs too, it is one row
    twice = compare_runs([base, run], tmp_path / "plots", baseline=base).split("Paired with")[0]
    assert twice.count("| gsm8k | single (m) |") == 1, twice


def _eval(tmp_path: Path, *extra: str) -> None:
    from shared_engine.evaluation import cli

    data = gsm8k_file(tmp_path, [("What is 1 + 1?", "2")], "questions.jsonl")
    args = build_parser().parse_args(["eval", "--models", "a,b", "--method", "safe", "--max-new-tokens", "3",
                                      "--data", str(data), "--limit", "1", "--no-progress", *extra])
    cli.run(args)


def test_pair_is_refused_off_flores_and_out_under_a_file_names_out(tmp_path: Path) -> None:
    """``--pair`` with another benchmark was silently ignored; ``--out run.log/sub`` failed naming fit_cache,
    an option the user never gave (the engine's fit cache made the folder first)."""
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    with registered_members(members):
        with pytest.raises(InvalidRequestError, match="--pair de-en is a FLORES language pair: --bench gsm8k"):
            _eval(tmp_path, "--bench", "gsm8k", "--pair", "de-en", "--out", str(tmp_path / "run"))
        assert not (tmp_path / "run").exists()
        log = tmp_path / "run.log"
        log.write_text("a log\n")
        with pytest.raises(InvalidRequestError, match=r"--out .*run.log/sub: cannot make the run's folder "
                                                      r"\(.*run.log is a file\)"):
            _eval(tmp_path, "--bench", "gsm8k", "--drafter", "auto", "--out", str(log / "sub"))
