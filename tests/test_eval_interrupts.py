"""An eval run stopped part-way (Ctrl-C): what it leaves for ``--resume`` and ``eval compare``, on toy members."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared_engine.cli import build_parser
from shared_engine.evaluation import runner
from shared_engine.evaluation.compare import compare_runs
from shared_engine.evaluation.runner import SAMPLES, SUMMARY
from tests.eval_files import gsm8k_file
from tests.toy import registered_members, toy_member


@pytest.fixture(autouse=True)
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C as an interactive run has it: a suite started in the background (``make test &``) inherits
    SIGINT ignored, and these tests' SIGINT did nothing there."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_a_run_that_ignores_ctrl_c_keeps_ignoring_it_while_its_members_load(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Started in the background (SIGINT ignored), the load did not make the run interruptible."""
    seen = []
    monkeypatch.setattr(runner, "load_with_notice", lambda engine, notice=True: seen.append(
        signal.getsignal(signal.SIGINT)))
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    with registered_members(members):
        _eval(tmp_path, tmp_path / "run", 1)
    assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN


def _data(tmp_path: Path, questions: int) -> Path:
    return gsm8k_file(tmp_path, [(f"What is {i} + {i}?", str(2 * i)) for i in range(questions)], "questions.jsonl")


def _eval(tmp_path: Path, out: Path, limit: int, *extra: str) -> None:
    from shared_engine.evaluation import cli

    args = build_parser().parse_args(["eval", "--bench", "gsm8k", "--models", "a,b", "--method", "safe",
                                      "--max-new-tokens", "3", "--data", str(_data(tmp_path, 6)),
                                      "--limit", str(limit), "--out", str(out), "--no-progress", *extra])
    cli.run(args)


def _ctrl_c_at(monkeypatch: pytest.MonkeyPatch, question: str) -> None:
    """Ctrl-C (a real SIGINT, which asyncio.run turns into a cancellation) while ``question`` is answered."""
    answer = runner._answer

    async def answer_or_interrupt(engine: Any, bench: Any, config: Any, record: Any) -> Any:
        if record.id == question:
            os.kill(os.getpid(), signal.SIGINT)
            await asyncio.sleep(30)
        return await answer(engine, bench, config, record)

    monkeypatch.setattr(runner, "_answer", answer_or_interrupt)


def test_an_interrupted_run_writes_the_summary_of_its_answers_so_far(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C left no summary.json (a first run: ``eval compare runs/*`` failed on it, right after the CLI
    said the answers were saved) or the one from before (a --resume: compare showed N=2 and the old score
    while pairing every stored answer, without a word)."""
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    with registered_members(members):
        _eval(tmp_path, tmp_path / "single", 5)
        _eval(tmp_path, tmp_path / "fresh", 1)
        answer = runner._answer
        with monkeypatch.context() as patch:
            _ctrl_c_at(patch, "2")
            with pytest.raises(KeyboardInterrupt):
                _eval(tmp_path, tmp_path / "first", 5)   # a first run, stopped at its third question
            with pytest.raises(KeyboardInterrupt):
                _eval(tmp_path, tmp_path / "fresh", 5, "--resume")   # 1 answer before, 2 now
        assert runner._answer is answer
        for name in ("first", "fresh"):
            summary = json.loads((tmp_path / name / SUMMARY).read_text())
            assert (summary["n"], summary["interrupted"], summary["asked"]) == (2, True, 5), summary
        assert "summary.json scores them, marked interrupted" in capsys.readouterr().err
        text = compare_runs([tmp_path / "first", tmp_path / "fresh", tmp_path / "single"], tmp_path / "plots",
                            baseline=tmp_path / "single")
        table, pairs = text.split("Paired with")
        assert "[first] | 2 (interrupted) |" in table and "[fresh] | 2 (interrupted) |" in table, text
        assert "[fresh] | 2 |" in pairs and "[first] | 2 |" in pairs, text
        assert "interrupted runs, scored on the questions answered so far" in text and "[fresh]: 2 of 5" in text
        assert "summary out of date" not in text
        _eval(tmp_path, tmp_path / "fresh", 5, "--resume")   # finished: a summary like any other
    finished = json.loads((tmp_path / "fresh" / SUMMARY).read_text())
    assert finished["n"] == 5 and "interrupted" not in finished and "asked" not in finished
    assert not list(tmp_path.glob("*/*.part"))


def test_compare_says_which_summary_its_answers_have_outgrown(tmp_path: Path) -> None:
    """A run killed before it could write its summary (or one still going) has more answers than its
    summary counts: compare paired them all under the old N without a note."""
    from tests.test_eval_runner import _run_folder

    rows = [{"id": str(i), "correct": i < 2, "value": float(i < 2)} for i in range(4)]
    base = _run_folder(tmp_path / "base", "gsm8k", rows, method="single")
    run = _run_folder(tmp_path / "run", "gsm8k", rows[:2])
    with open(run / SAMPLES, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows[2:])
    text = compare_runs([base, run], tmp_path / "plots", baseline=base)
    assert "note: summary out of date" in text and "safe (m): 4 answers, the summary counts 2" in text, text
    (run / SUMMARY).unlink()
    (run / "config.json").write_text("{}")
    with pytest.raises(Exception, match="stopped before writing one: the same eval command with --resume"):
        compare_runs([run], tmp_path / "plots")  # alone; beside others it is skipped with a note
    assert "stopped before writing one" in compare_runs([base, run], tmp_path / "plots")


async def test_a_crash_part_way_leaves_a_summary_marked_interrupted(tmp_path: Path) -> None:
    from tests.test_eval_runner import config, engine, toy_bench

    def crash_after_two(sample: Any) -> None:
        if sample.id == "1":
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        await runner.evaluate(engine(), toy_bench(tmp_path), config(), tmp_path / "run", progress=False,
                              on_sample=crash_after_two)
    summary = json.loads((tmp_path / "run" / SUMMARY).read_text())
    assert (summary["n"], summary["interrupted"], summary["asked"]) == (2, True, 3)


def test_ctrl_c_while_the_members_load_stops_the_run_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The members loaded in a worker thread: Ctrl-C cancelled the run, then asyncio.run waited for the
    load to end (the zoo's models, llama.cpp servers: up to minutes) before the CLI exited."""
    import time

    def slow_load(engine: Any, notice: bool = True) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(20)

    monkeypatch.setattr(runner, "load_with_notice", slow_load)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        _eval(tmp_path, tmp_path / "run", 2)
    assert time.monotonic() - started < 10
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    assert not (tmp_path / "run" / SUMMARY).exists()  # nothing answered
