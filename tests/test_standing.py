"""docs/results/standing.csv, the README's standing at a glance, and scripts/standing_plot.py that draws
it. The CSV is transcribed from the runs' ``eval compare`` output, so each row must agree with itself: on
an accuracy row a transcription error (a swapped count, a wrong N, a score from another run) breaks the
arithmetic; a chrF row's difference must sit in its interval and match its two scores (a sentence count
has no such check: more sentences higher can go with a lower corpus chrF). The README's table must show
the CSV's counts."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STANDING = ROOT / "docs" / "results" / "standing.csv"


def _script():  # noqa: ANN202 - the module
    spec = importlib.util.spec_from_file_location("standing_plot", ROOT / "scripts" / "standing_plot.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_standing_row_agrees_with_its_own_counts() -> None:
    script = _script()
    rows = script.load(STANDING)
    assert len(rows) >= 20
    for row in rows:
        wins, losses, n = int(row["wins"]), int(row["losses"]), int(row["n"])
        change = float(row["score"]) - float(row["baseline_score"])
        assert 0 <= wins + losses <= n, row
        if row["unit"] == "pts":
            # the two scores differ by exactly the discordant questions (scores are rounded to 0.1), and
            # the baseline's score is a whole number of questions, at least the ones the ensemble lost
            assert change == pytest.approx(100 * (wins - losses) / n, abs=0.1), row
            right = script.baseline_right(row)
            assert round(100 * right / n, 1) == pytest.approx(float(row["baseline_score"]), abs=0.05), row
            assert losses <= right and right - losses + wins <= n, row
            assert not row["delta"], row  # computed from the counts, never typed in
        else:
            delta, low, high = float(row["delta"]), float(row["ci_low"]), float(row["ci_high"])
            assert low <= delta <= high and change == pytest.approx(delta, abs=0.1), row
    # every benchmark the issue names is there, each ensemble against its best member
    assert {r["benchmark"].split(" (")[0] for r in rows} >= {
        "SQuAD", "ARC-Challenge", "GSM8K", "MATH-500", "BBH", "TriviaQA", "NQ-open", "MMLU-Redux",
        "FLORES en-de", "FLORES de-en", "FLORES en-ro"}


def test_the_readme_at_a_glance_table_shows_the_csvs_counts() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("### At a glance"):]
    section = section[:section.index("\n### ", 1)]
    lines = [x for x in section.splitlines() if x.startswith("| ")]
    columns = {"Qwen + Gemma": 2, "Qwen + SmolLM2 + Gemma": 3}  # the table's cells for the two member sets
    shown = 0
    for row in _script().load(STANDING):
        if row["series"] not in columns:
            continue  # every-token and the comparable pair: drawn, and tabled in their own sections
        line = next(x for x in lines if x.startswith(f"| {row['benchmark']}"))
        cell = line.split(" | ")[columns[row["series"]]]
        assert f"{row['wins']} / {row['losses']}" in cell, (row, cell)
        if row["unit"] == "chrF":
            assert f"{float(row['delta']):+.2f}".replace("-", "−") in cell, (row, cell)
        shown += 1
    assert shown == 28


def test_the_standing_script_prints_the_table_and_draws_the_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    module = _script()
    out = tmp_path / "standing.png"
    monkeypatch.setattr("sys.argv", ["standing_plot.py", "--out", str(out)])
    assert module.main() == 0
    assert out.read_bytes()[:4] == b"\x89PNG"
    text = capsys.readouterr().out
    # the README's TriviaQA gain for three members: 31 / 16 on 1000, two-sided sign test p = 0.040
    line = next(x for x in text.splitlines() if x.startswith("| TriviaQA (EM) | Qwen + SmolLM2 + Gemma |"))
    assert "| 31 / 16 |" in line and "| 0.040 |" in line
    low, high = map(float, re.search(r"\+1\.50 pts \(([-+.\d]+) to ([-+.\d]+)\)", line).groups())  # type: ignore[union-attr]
    assert 0 < low < 1.5 < high
