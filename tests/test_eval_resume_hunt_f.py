"""Resume and compare keep runs of other settings apart (hunt-eval r3, r4): a run folder whose config.json is
gone is not resumed under whatever settings the new command gives, and the few-shot exemplar files the prompts
read (GSM8K train, BBH cot-prompts, ...) are part of what a run is, while runs stored before their hash was
recorded still resume and pair."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from shared_engine.data_paths import GSM8K_SAMPLE, SAMPLE_DIR
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation import evaluate
from shared_engine.evaluation.benchmarks import get_benchmark
from shared_engine.evaluation.compare import compare_runs
from shared_engine.evaluation.runner import CONFIG, SAMPLES, SUMMARY, data_identity, prompt_identity
from tests.test_eval_runner import _run_folder, config, engine, toy_bench


def _reversed_train(folder: Path) -> Path:
    """Another GSM8K train split (the sample's rows in reverse order): other exemplars in the prompt."""
    rows = (SAMPLE_DIR / "train.jsonl").read_text().splitlines()
    (folder / "train.jsonl").write_text("\n".join(reversed(rows)) + "\n")
    return folder / "train.jsonl"


def test_a_run_folder_without_its_config_is_not_resumed(tmp_path: Path) -> None:
    """With config.json gone, --resume with every-token and max_new_tokens 3 was accepted over answers made
    with safe and 12: the summary counted n=4 answers of two settings as one run of the new ones."""
    bench = toy_bench(tmp_path, questions=4)
    out = tmp_path / "run"
    asyncio.run(evaluate(engine(), bench, config(max_new_tokens=12), out, limit=2, progress=False))
    (out / CONFIG).unlink()
    stored = (out / SAMPLES).read_bytes()
    with pytest.raises(InvalidRequestError, match=r"no .*config\.json.*another --out"):
        asyncio.run(evaluate(engine(), bench, config(method="every-token", max_new_tokens=3), out, resume=True,
                             progress=False))
    assert (out / SAMPLES).read_bytes() == stored and not (out / CONFIG).exists()


def test_other_exemplar_files_beside_the_same_test_file_are_another_run(tmp_path: Path) -> None:
    """The same GSM8K test.jsonl with another train.jsonl beside it (other few-shot prompts) had the same
    data_sha256 and nothing else to tell them apart; BBH's cot-prompts/ folder was left out of its hash."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        shutil.copyfile(GSM8K_SAMPLE, tmp_path / name / "test.jsonl")
    shutil.copyfile(SAMPLE_DIR / "train.jsonl", tmp_path / "a" / "train.jsonl")
    _reversed_train(tmp_path / "b")
    a, b = (get_benchmark("gsm8k", str(tmp_path / n / "test.jsonl")) for n in ("a", "b"))
    assert data_identity(a.path)["data_sha256"] == data_identity(b.path)["data_sha256"]  # the data alone: the same
    assert prompt_identity(a)["prompt_sha256"] != prompt_identity(b)["prompt_sha256"]
    # BBH: a task's cot prompt in the data folder's cot-prompts/ (not a top-level file of the data folder)
    hashes = []
    for name, text in (("x", "Q: 1?\nA: So the answer is 1."), ("y", "Q: 2?\nA: So the answer is 2.")):
        folder = tmp_path / f"bbh-{name}"
        (folder / "cot-prompts").mkdir(parents=True)
        (folder / "task.json").write_text(json.dumps({"examples": [{"input": "Q?", "target": "1"}]}))
        (folder / "cot-prompts" / "task.txt").write_text(f"Task.\n\n{text}\n")
        bench = get_benchmark("bbh", str(folder))
        hashes.append((data_identity(bench.path)["data_sha256"], prompt_identity(bench)["prompt_sha256"]))
    assert hashes[0][0] == hashes[1][0] and hashes[0][1] != hashes[1][1]


def test_a_resume_with_other_exemplars_is_refused_and_old_runs_still_resume(tmp_path: Path) -> None:
    """--resume with another exemplar file was accepted (the answers so far asked with other few-shot prompts);
    the same exemplars at another place (a moved data folder) and a run stored before the hash resume."""
    bench = toy_bench(tmp_path, questions=3)
    other = tmp_path / "other"
    other.mkdir()
    out = tmp_path / "run"
    asyncio.run(evaluate(engine(), bench, config(), out, limit=1, progress=False))
    recorded = json.loads((out / CONFIG).read_text())
    assert recorded["prompt_sha256"]
    with pytest.raises(InvalidRequestError, match="different settings.*prompt_sha256"):
        asyncio.run(evaluate(engine(), dataclasses.replace(bench, exemplars=_reversed_train(other)), config(), out,
                             resume=True, progress=False))
    moved = tmp_path / "moved"
    moved.mkdir()
    assert bench.exemplars is not None
    shutil.copyfile(bench.exemplars, moved / "train.jsonl")
    asyncio.run(evaluate(engine(), dataclasses.replace(bench, exemplars=moved / "train.jsonl"), config(), out,
                         limit=2, resume=True, progress=False))
    # a run written before the exemplars' hash was recorded: resumed (what its prompts read is unknown)
    (out / CONFIG).write_text(json.dumps({k: v for k, v in recorded.items() if k != "prompt_sha256"}))
    summary = asyncio.run(evaluate(engine(), bench, config(), out, resume=True, progress=False))
    assert summary["n"] == 3 and summary["prompt_sha256"] == recorded["prompt_sha256"]


def test_compare_pairs_old_runs_and_keeps_runs_of_other_exemplars_apart(tmp_path: Path) -> None:
    """A run stored before prompt_sha256 pairs with a new one over the same data; two runs whose prompts read
    other exemplar files are not paired, and the table says why."""
    rows = [{"id": str(i), "correct": True, "value": 1.0, "gold": [str(i)], "output": f"The answer is {i}.",
             "prompt": [{"role": "user", "content": f"Q {i}"}]} for i in range(3)]
    base = _run_folder(tmp_path / "base", "gsm8k", rows, method="single")
    old = _run_folder(tmp_path / "old", "gsm8k", rows, method="safe")
    other = _run_folder(tmp_path / "other", "gsm8k", rows, method="every-token")
    for folder, prompt_sha in ((base, "p1"), (old, None), (other, "p2")):
        summary = json.loads((folder / SUMMARY).read_text())
        extra = {"prompt_sha256": prompt_sha} if prompt_sha else {}
        (folder / SUMMARY).write_text(json.dumps({**summary, "data_sha256": "d", **extra}))
    text = compare_runs([base, old, other], tmp_path / "plots", baseline=base)
    paired_part = text.split("Paired with")[1].split("not paired")[0]
    assert "| safe (m) | 3 |" in paired_part and "every-token (m)" not in paired_part
    assert "not paired (other few-shot exemplar files than the baseline's): every-token (m)" in text
