"""The finish reason reaches the scorer (p): a GSM8K answer cut at the token cap mid-working got credit from
the last-number fallback in a run and in ``eval compare`` (4c37bdc gave the scorer ``finish``; nothing passed it)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

from shared_engine import EnsembleEngine
from shared_engine.evaluation import RunConfig, evaluate, get_benchmark
from shared_engine.evaluation.benchmarks import stored_scorer
from shared_engine.evaluation.datasets import Dataset, Record
from shared_engine.evaluation.scoring import Score
from tests.eval_files import gsm8k_file
from tests.toy import toy_member

CUT = "She has 16 eggs and eats 3, so 16 - 3 = 13, then 13 - 4 = 9"  # the working, cut before the answer


def test_a_benchmark_scores_with_the_finish_reason(tmp_path: Path) -> None:
    bench = get_benchmark("gsm8k", data=str(gsm8k_file(tmp_path, [("1 + 1?", "9")])))
    record = Record(id="0", question="q", answers=["9"])
    assert bench.score(CUT, record, "length").extracted is None
    assert bench.score(CUT, record, "eos").extracted == "9"
    assert bench.score(CUT, record).extracted == "9"  # a caller that does not know it: as before


def test_eval_compare_rescores_a_stored_cut_answer_with_its_finish_reason() -> None:
    score = stored_scorer("gsm8k")
    assert score is not None
    sample = {"output": CUT, "gold": ["9"], "finish_reason": "length"}
    assert score(CUT, sample) is not None and score(CUT, sample).extracted is None  # type: ignore[union-attr]
    assert score(CUT, {**sample, "finish_reason": "eos"}).correct  # type: ignore[union-attr]


def test_a_run_passes_each_answers_finish_reason_to_its_scorer(tmp_path: Path) -> None:
    seen: list[str | None] = []

    def score(output: str, record: Record, finish: str | None = None) -> Score:
        seen.append(finish)
        return Score(extracted=None, correct=False, value=0.0)

    data = Dataset(name="toy", source="memory", records=[Record(id="0", question="What is 1 + 1?", answers=["2"])])
    bench = dataclasses.replace(get_benchmark("gsm8k", data=str(gsm8k_file(tmp_path, [("1 + 1?", "2")]))),
                                name="toy", load=lambda _path: data,
                                messages=lambda r: [{"role": "user", "content": r.question}], score=score)
    config = RunConfig(bench="toy", models=["a", "b"], method="safe", max_new_tokens=2)
    with EnsembleEngine([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)],
                        method="safe") as engine:
        asyncio.run(evaluate(engine, bench, config, tmp_path / "run"))
    assert seen == ["length"]  # two tokens of a toy's answer: cut at the cap
