"""Eval harness edges (hunt): the FLORES pair of a --data file, two writers on one run folder, resuming
a non-safe run written before an engine option existed, a summary that a killed resume left stale, and
a samples rewrite cut off by a kill."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from shared_engine import EnsembleEngine, InvalidRequestError
from shared_engine.cli import build_parser
from shared_engine.evaluation import evaluate, get_benchmark
from shared_engine.evaluation.compare import compare_runs
from shared_engine.evaluation.runner import CONFIG, SAMPLES, read_samples
from tests.test_eval_runner import config, engine, toy_bench
from tests.toy import toy_member


def _flores_file(folder: Path, name: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    file = folder / name
    file.write_text(json.dumps({"id": 0, "question": "Guten Morgen.", "answer": "Good morning."}) + "\n")
    return file


def test_a_flores_file_without_pair_runs_the_pair_its_name_says(tmp_path: Path) -> None:
    """`--data .../de-en.jsonl` without --pair ran en-de: German asked with the English->German prompt,
    scored against the English side, recorded as flores-en-de."""
    de_en = _flores_file(tmp_path, "de-en.jsonl")
    args = build_parser().parse_args(["eval", "--bench", "flores", "--data", str(de_en), "--models", "a,b"])
    bench = get_benchmark(args.bench, args.data, args.pair)
    assert bench.name == "flores-de-en" and bench.dataset().name == "flores-de-en"
    assert get_benchmark("flores", str(de_en), "de-en").name == "flores-de-en"
    with pytest.raises(InvalidRequestError, match="--pair en-de disagrees with --data .*de-en"):
        get_benchmark("flores", str(de_en), "en-de")
    other = _flores_file(tmp_path, "mine.jsonl")  # a name that says no pair: en-de, or the pair given
    assert get_benchmark("flores", str(other)).name == "flores-en-de"
    assert get_benchmark("flores", str(other), "en-ro").name == "flores-en-ro"


async def test_a_second_writer_is_refused_and_compare_says_the_run_is_still_going(tmp_path: Path) -> None:
    """Two evals appended to one folder (answers twice), and compare advised --resume on a running run."""
    pytest.importorskip("fcntl")
    from shared_engine.evaluation.runner import writer_lock  # (made with the lock)

    bench = toy_bench(tmp_path, questions=2)
    out = tmp_path / "run"
    await evaluate(engine(), bench, config(), out, limit=1, progress=False)
    with writer_lock(out):  # another eval writing it
        with pytest.raises(InvalidRequestError, match=r"run is being written by another eval \(pid \d+\)"):
            await evaluate(engine(), bench, config(), out, resume=True, progress=False)
        with open(out / SAMPLES, "a") as f:  # its next answer, summary not yet written
            f.write((out / SAMPLES).read_text().replace('"id":"0"', '"id":"1"'))
        text = compare_runs([out], tmp_path / "plots")
        assert "runs still going" in text and "--resume rewrites" not in text, text
    assert len((out / SAMPLES).read_text().splitlines()) == 2
    text = compare_runs([out], tmp_path / "plots")  # it ended without its summary: now --resume is the advice
    assert "--resume rewrites" in text and "runs still going" not in text, text


async def test_a_lock_left_by_a_killed_eval_does_not_block(tmp_path: Path) -> None:
    pytest.importorskip("fcntl")
    from shared_engine.evaluation.runner import LOCK  # (made with the lock)

    out = tmp_path / "run"
    out.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"f = open({str(out / LOCK)!r}, 'a+'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write(str(os.getpid())); f.flush(); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(InvalidRequestError, match=f"pid {holder.pid}"):
            await evaluate(engine(), toy_bench(tmp_path, questions=1), config(), out, progress=False)
    finally:
        holder.kill()
        holder.wait()
    summary = await evaluate(engine(), toy_bench(tmp_path, questions=1), config(), out, progress=False)
    assert summary["n"] == 1


@pytest.mark.parametrize("method", ["every-token", "adafuse", "gac-threshold"])
async def test_a_non_safe_run_written_before_an_option_existed_resumes(tmp_path: Path, method: str) -> None:
    """Options missing from an old config.json were filled with the safe method's defaults, so an
    every-token run lacking drafter_weight was refused with drafter_weight (None, 1.0)."""
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    options = EnsembleEngine(members, method=method).options.model_dump()
    ran = config(method=method, max_new_tokens=2).model_copy(update={"engine_options": options})
    bench = toy_bench(tmp_path, questions=2)
    out = tmp_path / "run"
    await evaluate(EnsembleEngine(members, method=method), bench, ran, out, limit=1, progress=False)
    stored = json.loads((out / CONFIG).read_text())
    for key in ("drafter_weight", "sharpen", "fusion"):  # each differs from safe's default for some method
        del stored["engine_options"][key]
    (out / CONFIG).write_text(json.dumps(stored))
    summary = await evaluate(EnsembleEngine(members, method=method), bench, ran, out, resume=True, progress=False)
    assert summary["n"] == 2


async def test_a_resume_killed_after_a_smaller_limit_leaves_its_summary_marked_out_of_date(tmp_path: Path) -> None:
    """The summary's ``ids`` (a smaller --limit) hid the answers a later, killed resume added: compare
    showed the old numbers with no note."""
    bench = toy_bench(tmp_path, questions=4)
    out = tmp_path / "run"
    await evaluate(engine(), bench, config(), out, limit=3, progress=False)
    summary = await evaluate(engine(), bench, config(), out, limit=2, resume=True, progress=False)
    assert summary["ids"] == ["0", "1"]
    assert "out of date" not in compare_runs([out], tmp_path / "plots")
    first = (out / SAMPLES).read_text().splitlines()[0]
    with open(out / SAMPLES, "a") as f:  # a --limit 4 resume answered question 3, then was killed (-9)
        f.write(first.replace('"id":"0"', '"id":"3"') + "\n")
    text = compare_runs([out], tmp_path / "plots")
    assert "summary out of date" in text and "4 lines in samples.jsonl, 3 when its summary was written" in text, text


def test_a_kill_while_the_samples_are_rewritten_leaves_them_whole(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """samples.jsonl was rewritten in place on resume: a kill during the write cut the answers off."""
    file = tmp_path / SAMPLES
    row = {"id": "0", "prompt": [], "output": "4", "gold": ["4"], "extracted": "4", "correct": True, "value": 1.0,
           "finish_reason": "eos"}
    whole = "".join(json.dumps({**row, "id": str(i)}) + "\n" for i in range(20)).encode()
    file.write_bytes(whole + b'{"id": "20", "prom')  # a line cut off: the file is rewritten without it
    real = Path.write_bytes

    def killed_halfway(self: Path, data: bytes) -> int:  # type: ignore[override]
        real(self, data[: len(data) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_bytes", killed_halfway)
    with pytest.raises(KeyboardInterrupt):
        read_samples(file)
    monkeypatch.undo()
    assert file.read_bytes().startswith(whole)
    assert len(read_samples(file)) == 20 and file.read_bytes() == whole


def test_compare_says_a_run_still_loading_is_going_not_failed(tmp_path: Path) -> None:
    """A run whose eval holds its lock but has answered nothing yet (its members still loading) was
    called a failed start ("skipped ... its start failed" beside other runs, "no summary.json" alone),
    though the README says compare reports such a run as still going."""
    pytest.importorskip("fcntl")
    from shared_engine.evaluation.runner import writer_lock

    out = tmp_path / "going"
    out.mkdir()
    (out / "config.json").write_text("{}")
    with writer_lock(out):
        with pytest.raises(InvalidRequestError, match=r"its run is still going, pid \d+"):
            compare_runs([out], tmp_path / "plots")
