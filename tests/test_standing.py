"""docs/results/standing.csv, the README's standing at a glance, and scripts/standing_plot.py that draws
it. The CSV is transcribed from the runs' ``eval compare`` output, so each row must agree with itself: a
transcription error (a swapped count, a wrong N, a score from another run) breaks the arithmetic."""

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
    rows = _script().load(STANDING)
    assert len(rows) >= 20
    for row in rows:
        wins, losses, n = int(row["wins"]), int(row["losses"]), int(row["n"])
        change = float(row["score"]) - float(row["baseline_score"])
        assert 0 <= wins + losses <= n, row
        if row["unit"] == "pts":
            # the two scores differ by exactly the discordant questions (scores are rounded to 0.1)
            assert change == pytest.approx(100 * (wins - losses) / n, abs=0.1), row
            assert not row["delta"], row  # computed from the counts, never typed in
        else:
            delta, low, high = float(row["delta"]), float(row["ci_low"]), float(row["ci_high"])
            assert low <= delta <= high and change == pytest.approx(delta, abs=0.1), row
    # every benchmark the issue names is there, each ensemble against its best member
    assert {r["benchmark"].split(" (")[0] for r in rows} >= {
        "SQuAD", "ARC-Challenge", "GSM8K", "MATH-500", "BBH", "TriviaQA", "NQ-open", "MMLU-Redux",
        "FLORES en-de", "FLORES de-en", "FLORES en-ro"}


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
