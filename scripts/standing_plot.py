"""The README's standing (#16) at a glance: each ensemble's score minus its best member's on every
benchmark, paired on the same questions, with the 95% interval, drawn from ``docs/results/standing.csv``.

    python scripts/standing_plot.py                 # -> docs/results/standing.png, and the table on stdout

The CSV records what each run's ``eval compare --baseline`` printed (the runs themselves live outside
the repo; ``docs/results/reproduce.sh`` makes them again): N, the scores, the paired wins and losses,
and for chrF the corpus difference with its paired-bootstrap interval. For accuracy the interval is
computed here as ``eval compare`` computes it (``compare.accuracy_difference``, Newcombe's interval for
paired proportions), from the counts and the baseline's score (its right answers, of which the questions
both got right are those the ensemble did not lose), so a row added to the CSV is drawn the way its own
compare printed it.
"""

from __future__ import annotations

import argparse
import csv
from pathlib import Path

from shared_engine.evaluation.compare import (
    PairedDifference,
    accuracy_difference,
    paired_difference_plot,
    sign_test,
)

ROOT = Path(__file__).resolve().parent.parent
STANDING = ROOT / "docs" / "results" / "standing.csv"


def load(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def baseline_right(row: dict[str, str]) -> int:
    """The questions the baseline answered right: its score (a percentage, rounded to 0.1) of N."""
    return round(float(row["baseline_score"]) * int(row["n"]) / 100)


def points(rows: list[dict[str, str]]) -> list[PairedDifference]:
    """One point per row: accuracy in points (interval from the counts), chrF as recorded."""
    out = []
    for row in rows:
        wins, losses, n = int(row["wins"]), int(row["losses"]), int(row["n"])
        if row["unit"] == "pts":
            delta, ci = accuracy_difference(wins, losses, baseline_right(row) - losses, n)
            assert ci is not None  # n > 0
            delta, low, high = 100 * delta, 100 * ci[0], 100 * ci[1]
        else:
            delta, low, high = float(row["delta"]), float(row["ci_low"]), float(row["ci_high"])
        out.append(PairedDifference(row["benchmark"], row["series"], row["unit"], delta, low, high,
                                    f"{wins} / {losses} vs {row['baseline']}, N={n}"))
    return out


def table(rows: list[dict[str, str]], drawn: list[PairedDifference]) -> str:
    """The same rows as a markdown table, with the sign test's p-values."""
    lines = ["| benchmark | ensemble | N | best member | ensemble | won / lost | p (worse) | two-sided p "
             "| Δ (95% CI) |", "|---|---|---|---|---|---|---|---|---|"]
    for row, point in zip(rows, drawn):
        p, p_worse = sign_test(int(row["wins"]), int(row["losses"]))
        lines.append(f"| {row['benchmark']} | {row['series']} | {row['n']} | {row['baseline']} "
                     f"{row['baseline_score']} | {row['score']} | {row['wins']} / {row['losses']} | {p_worse:.3f} "
                     f"| {p:.3f} | {point.delta:+.2f} {row['unit']} ({point.low:+.2f} to {point.high:+.2f}) |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(STANDING), help="the standing CSV (default: %(default)s)")
    parser.add_argument("--out", default=str(STANDING.with_suffix(".png")), help="the plot (default: %(default)s)")
    args = parser.parse_args()
    rows = load(Path(args.data))
    drawn = points(rows)
    title = ("Each ensemble minus its best member, paired on the same questions (llama.cpp members, greedy)\n"
             "95% interval: Newcombe's for paired proportions (accuracy), paired bootstrap (chrF);\n"
             "beside each point: won / lost, FLORES: sentences higher / lower")
    print(table(rows, drawn))
    print(f"\nplot: {paired_difference_plot(drawn, Path(args.out), title)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
