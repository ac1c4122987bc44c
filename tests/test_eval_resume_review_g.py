"""What a prompt folder holds besides the prompts does not make another run (review of 8f1d1d0): a
``.DS_Store`` or an editor's swap file appearing in BBH's cot-prompts/ refused the resume of a run of
hours, with two hashes and no hint which files; a changed prompt is still refused, naming the files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.benchmarks import Benchmark, get_benchmark
from shared_engine.evaluation.runner import CONFIG, SAMPLES, RunConfig, _check_config, data_identity, prompt_identity


def _bbh(folder: Path) -> Benchmark:
    (folder / "cot-prompts").mkdir(parents=True)
    (folder / "task.json").write_text(json.dumps({"examples": [{"input": "Q?", "target": "1"}]}))
    (folder / "cot-prompts" / "task.txt").write_text("Task.\n\nQ: 1?\nA: So the answer is 1.\n")
    return get_benchmark("bbh", str(folder))


def _config(bench: Benchmark) -> RunConfig:
    return RunConfig(bench="bbh", models=["a", "b"], method="safe", max_new_tokens=8, engine_options={},
                     member_options={}, **data_identity(bench.path), **prompt_identity(bench))


def _started(tmp_path: Path, bench: Benchmark) -> Path:
    out = tmp_path / "run"
    _check_config(out, _config(bench), False, bench)
    (out / SAMPLES).write_text('{"id": "0"}\n')
    assert (out / CONFIG).exists()
    return out


@pytest.mark.parametrize("stray", [".DS_Store", ".task.txt.swp", "task.txt~", ".git/HEAD"])
def test_a_file_no_prompt_reads_does_not_refuse_the_resume(tmp_path: Path, stray: str) -> None:
    bench = _bbh(tmp_path / "bbh")
    out = _started(tmp_path, bench)
    before = prompt_identity(bench)["prompt_sha256"]
    path = tmp_path / "bbh" / "cot-prompts" / stray
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0\0\0\1Bud1")
    assert prompt_identity(bench)["prompt_sha256"] == before
    _check_config(out, _config(bench), True, bench)  # was: "different settings {'prompt_sha256': ...}"


def test_a_changed_prompt_is_refused_naming_the_files(tmp_path: Path) -> None:
    bench = _bbh(tmp_path / "bbh")
    out = _started(tmp_path, bench)
    (tmp_path / "bbh" / "cot-prompts" / "task.txt").write_text("Task.\n\nQ: 2?\nA: So the answer is 2.\n")
    with pytest.raises(InvalidRequestError, match=r"few-shot exemplar files .* differ now: .*cot-prompts"):
        _check_config(out, _config(bench), True, bench)


def test_a_hidden_file_in_a_data_folder_is_the_same_data(tmp_path: Path) -> None:
    """The same for the data folder itself (MMLU-Redux's, BBH's): a .DS_Store beside the task files was
    another data file to --resume and to eval compare's pairing."""
    bench = _bbh(tmp_path / "bbh")
    before = data_identity(bench.path)["data_sha256"]
    (tmp_path / "bbh" / ".DS_Store").write_bytes(b"\0\0\0\1Bud1")
    (tmp_path / "bbh" / "task.json~").write_text("{}")
    assert data_identity(bench.path)["data_sha256"] == before
    (tmp_path / "bbh" / "task2.json").write_text(json.dumps({"examples": [{"input": "Q?", "target": "2"}]}))
    assert data_identity(bench.path)["data_sha256"] != before


def test_what_the_hash_leaves_out_no_loader_reads(tmp_path: Path) -> None:
    """pathlib's glob matches hidden files: a hidden task file was read as questions while the data hash
    left it out (a change in it went unnoticed by --resume and eval compare), and macOS's '._task.json'
    resource fork failed the BBH load. One rule (datasets.unread) for the loaders and the hashes."""
    from shared_engine.evaluation.datasets import load_bbh, load_mmlu_redux
    bench = _bbh(tmp_path / "bbh")
    before = [r.id for r in load_bbh(bench.path).records]
    (tmp_path / "bbh" / ".extra.json").write_text(json.dumps({"examples": [{"input": "Q2?", "target": "2"}]}))
    (tmp_path / "bbh" / "._task.json").write_bytes(b"\0\5\26\7Mac OS X        \0\2")
    assert [r.id for r in load_bbh(bench.path).records] == before
    mmlu = tmp_path / "mmlu"
    mmlu.mkdir()
    row = "question,choices,answer,error_type\nQ?,\"['a', 'b', 'c', 'd']\",0,ok\n"
    (mmlu / "mmlu_x.csv").write_text(row)
    count = len(load_mmlu_redux(mmlu).records)
    assert count == 1
    (mmlu / ".mmlu_y.csv").write_text(row)
    assert len(load_mmlu_redux(mmlu).records) == count
