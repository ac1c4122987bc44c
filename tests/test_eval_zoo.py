"""``safe-ensemble eval`` end to end on a real model: 3 GSM8K questions, interrupted after the first
(by ``--limit``) and resumed, give the same samples and summary as one uninterrupted run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.cli import main
from tests.benchdata import needs_data

pytestmark = pytest.mark.zoo
SMOL = "smollm2-135m-instruct"
TIMING = {"tokens_per_s", "elapsed_s", "seconds_per_question", "mean_time_to_first_token_s",
          "mean_drafter_choice_s"}
STATS_TIMING = {"elapsed_s", "tokens_per_s", "time_to_first_token_s", "draft_s", "verify_s", "drafter_choice_s"}


def eval_cli(out: Path, *extra: str) -> int:
    return main(["eval", "--bench", "gsm8k", "--models", SMOL, "--method", "single", "--max-new-tokens", "24",
                 "--out", str(out), "--no-progress", *extra])


@needs_data
def test_gsm8k_eval_resumed_after_an_interruption_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    assert eval_cli(tmp_path / "full", "--limit", "3") == 0
    assert eval_cli(tmp_path / "resumed", "--limit", "1") == 0            # stopped after one question
    assert eval_cli(tmp_path / "resumed", "--limit", "3") == 2            # refuses without --resume
    assert eval_cli(tmp_path / "resumed", "--limit", "3", "--resume") == 0

    full, resumed = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("full", "resumed"))
    assert {k: v for k, v in resumed.items() if k not in TIMING} == {k: v for k, v in full.items() if k not in TIMING}
    assert full["n"] == 3 and full["method"] == "single" and full["models"] == [SMOL]
    assert 0 < full["mean_output_tokens"] <= 24 and full["tokens_per_s"] > 0 and full["failures"] == 0

    def samples(folder: str) -> list[dict]:
        rows = [json.loads(line) for line in (tmp_path / folder / "samples.jsonl").read_text().splitlines()]
        for row in rows:
            row["stats"] = {k: v for k, v in row["stats"].items() if k not in STATS_TIMING}
        return rows

    rows = samples("full")
    assert rows == samples("resumed")
    assert [r["id"] for r in rows] == ["0", "1", "2"] and rows[0]["gold"] == ["18"]
    assert rows[0]["prompt"][-1]["content"].startswith("Janet")
    assert all(r["output"] and r["stats"]["tokens"] > 0 for r in rows)
    assert sum(r["correct"] for r in rows) == full["correct"]
