"""The command line, as a user runs it (subprocesses, real zoo models)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.zoo
SMOL, QWEN = "smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct"


def cli(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shared_engine.cli", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_run_streams_an_answer_and_prints_stats() -> None:
    result = cli("run", "--models", QWEN, "--max-new-tokens", "24", "What is 17 + 25?")
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout and result.stdout.endswith("\n")  # `run ... > answer.txt` ends its line
    assert "finish=" in result.stderr and "tok/s" in result.stderr
    # the seconds the members take to load are announced, not silent
    assert f"loading 1 member ({QWEN}) ..." in result.stderr and "loaded in " in result.stderr


def test_run_events_are_json_lines_ending_with_finish() -> None:
    result = cli("run", "--models", f"{QWEN},{SMOL}", "--method", "safe", "--events",
                 "--max-new-tokens", "16", "Name a color.")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    assert events[-1]["type"] == "finish"
    assert {e["type"] for e in events} >= {"token", "verify", "finish"}
    assert "".join(e["text"] for e in events if e["type"] == "token") == events[-1]["text"]


def test_run_raw_continues_the_text() -> None:
    result = cli("run", "--models", QWEN, "--raw", "--events", "--max-new-tokens", "4", "The capital of France is")
    assert result.returncode == 0, result.stderr
    finish = json.loads(result.stdout.splitlines()[-1])
    assert finish["text"].startswith(" Paris") and finish["stats"]["prompt_tokens"] == 5  # no chat template


def test_unknown_model_is_a_readable_error() -> None:
    result = cli("run", "--models", "gpt-17", "hi")
    assert result.returncode == 2
    assert "gpt-17" in result.stderr and SMOL in result.stderr
    assert "Traceback" not in result.stderr


def test_bench_writes_the_documented_keys(tmp_path) -> None:  # noqa: ANN001
    out = tmp_path / "bench.json"
    result = cli("bench", "--models", f"{SMOL},{SMOL}", "--prompts", "1", "--max-new-tokens", "8",
                 "--json", str(out))
    assert result.returncode == 0, result.stderr
    data = json.loads(out.read_text())
    for key in ("single_tokens_per_s", "safe_tokens_per_s", "every_token_tokens_per_s",
                "safe_ensemble_rate", "forward_passes_per_token", "safe_vs_single", "safe_vs_every_token",
                "adafuse_tokens_per_s", "adafuse_fused_span_rate", "adafuse_vs_single"):
        assert key in data, key
    assert data["safe_ensemble_rate"] == 0.0  # identical members never disagree
    assert 0.0 <= data["adafuse_fused_span_rate"] <= 1.0
    assert data["methods"]["adafuse"]["forward_passes_per_token"]
    safe = data["methods"]["safe"]  # where SAFE's time went, adding up to its elapsed time
    assert safe["time_split_s"]["draft"] > 0 and safe["time_split_s"]["rest"] >= 0
    assert sum(safe["time_split_s"].values()) == pytest.approx(safe["elapsed_s"], abs=0.01)
    for row in data["methods"].values():  # a wait before the first token (drafter='auto' scoring) shows here
        assert 0 < row["mean_time_to_first_token_s"] <= row["elapsed_s"]
    assert not any("mean_drafter_choice_s" in row for row in data["methods"].values())  # zero-shot: no choice


def test_bench_reports_the_wait_for_the_drafter_choice() -> None:
    from shared_engine.bench import _Totals
    from shared_engine.events import Stats
    from shared_engine.options import EngineOptions

    totals = _Totals()
    for choice_s, first_token_s in ((3.0, 3.5), (0.0, 0.4)):  # a new few-shot block, then the cached one
        totals.add(Stats(tokens=4, elapsed_s=4.0, drafter_choice_s=choice_s, time_to_first_token_s=first_token_s))
    row = totals.row(EngineOptions(method="safe"))
    assert row["mean_drafter_choice_s"] == 1.5 and row["mean_time_to_first_token_s"] == 1.95


def test_bench_answer_agreement_between_backends() -> None:
    from shared_engine.bench import answer_agreement

    got = answer_agreement(["The answer is 42.", "abc", ""], ["The answer is 41.", "abc", ""])
    assert got == {"identical": 2, "answers": 3, "mean_shared_prefix": round((15 / 17 + 1 + 1) / 3, 3)}
    with pytest.raises(ValueError):
        answer_agreement(["a"], ["a", "b"])  # not the same prompts


@pytest.mark.parametrize("command", ["run", "eval"])
def test_weights_reach_the_engine_and_label_the_run(command: str) -> None:
    from shared_engine.cli import build_parser
    from shared_engine.engine_args import engine_from_args
    from shared_engine.evaluation.compare import run_label

    extra = ["--bench", "gsm8k", "--max-new-tokens", "64"] if command == "eval" else ["hi"]
    args = build_parser().parse_args([command, "--models", f"{QWEN},{SMOL}", "--weights", "2,1", *extra])
    engine = engine_from_args(args, "safe")  # members load on first request
    assert engine.options.weights == [2.0, 1.0]
    summary = {"method": "safe", "models": [QWEN, SMOL], "engine_options": engine.options.model_dump()}
    assert run_label(summary) == "safe (qwen+smol) drafter=auto dc=0.5 w=2,1"  # SAFE's defaults are part of the run
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--models", QWEN, "--weights", "two,1", *extra])
    for flag, confidence in (("none", None), ("0.7", 0.7)):  # none: the paper's consensus rule alone
        args = build_parser().parse_args([command, "--models", f"{QWEN},{SMOL}", "--drafter-confidence", flag, *extra])
        assert engine_from_args(args, "safe").options.drafter_confidence == confidence
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--models", QWEN, "--drafter-confidence", "sure", *extra])
    for flag, guard in (("none", None), ("64", 64)):  # the loop guard: off by default, a byte limit
        args = build_parser().parse_args([command, "--models", f"{QWEN},{SMOL}", "--loop-guard", flag, *extra])
        assert engine_from_args(args, "safe").options.loop_guard == guard
    summary["engine_options"] = engine_from_args(args, "safe").options.model_dump()
    assert run_label(summary).endswith(" guard=64")  # a guarded run is told apart from an unguarded one
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--models", QWEN, "--loop-guard", "long", *extra])
    args = build_parser().parse_args([command, "--models", f"{QWEN},{SMOL}", "--plausibility", "0.1", *extra])
    summary["engine_options"] = engine_from_args(args, "safe").options.model_dump()
    assert run_label(summary).endswith(" plaus=0.1")  # the plausibility constraint is told apart too
