"""Where benchmark questions come from: the full data folder, else the packaged GSM8K sample."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine import data_paths
from shared_engine.bench import gsm8k_questions
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation import get_benchmark


def test_without_a_data_folder_the_bench_reads_the_packaged_sample(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path / "absent"))  # explicit: no other candidate
    assert data_paths.find_data_dir() is None
    assert data_paths.gsm8k_file() == data_paths.GSM8K_SAMPLE
    questions = gsm8k_questions(None, 3)
    first = json.loads(data_paths.GSM8K_SAMPLE.read_text().splitlines()[0])["question"]
    assert len(questions) == 3 and questions[0].startswith(first)
    with pytest.raises(InvalidRequestError, match="SAFE_ENSEMBLE_DATA"):
        data_paths.data_dir()
    with pytest.raises(InvalidRequestError, match="benchmark data not found"):  # evaluations never fall back
        get_benchmark("gsm8k").dataset()
    with pytest.raises(InvalidRequestError) as refused:  # the path it tried, not only "set" what was set
        get_benchmark("gsm8k").dataset()
    assert f"SAFE_ENSEMBLE_DATA={tmp_path / 'absent'} is no folder" in str(refused.value)
    monkeypatch.delenv("SAFE_ENSEMBLE_DATA")
    monkeypatch.chdir(tmp_path)  # no ../shared/data beside it (nor, unless this checkout has one, beside the package)
    if data_paths.find_data_dir() is None:
        with pytest.raises(InvalidRequestError, match="looked in .*shared/data.* set SAFE_ENSEMBLE_DATA"):
            data_paths.data_dir()
    monkeypatch.chdir(Path(data_paths.__file__).resolve().parents[1])  # the checkout's root, as `make` runs
    if data_paths.find_data_dir() is None:  # its ../shared/data is the one beside the package: named once
        with pytest.raises(InvalidRequestError) as once:
            data_paths.data_dir()
        assert str(once.value).count("shared/data") == 1, once.value


def test_the_sample_ships_with_its_license_and_has_a_few_dozen_valid_records() -> None:
    rows = [json.loads(line) for line in data_paths.GSM8K_SAMPLE.read_text().splitlines()]
    assert len(rows) == 32 and all(r["question"] and "####" in r["answer"] for r in rows)
    assert "MIT License" in (data_paths.SAMPLE_DIR / "GSM8K_LICENSE").read_text()


def test_a_data_folder_is_preferred_and_an_explicit_file_must_exist(monkeypatch: pytest.MonkeyPatch,
                                                                    tmp_path: Path) -> None:
    (tmp_path / "gsm8k").mkdir()
    full = tmp_path / "gsm8k" / "test.jsonl"
    full.write_text(json.dumps({"question": "Q?", "answer": "#### 1"}) + "\n")
    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path))
    assert data_paths.data_dir() == tmp_path and data_paths.gsm8k_file() == full
    assert gsm8k_questions(None, 5)[0].startswith("Q?")  # fewer questions than asked: what there is
    with pytest.raises(InvalidRequestError, match="not found"):
        data_paths.gsm8k_file(tmp_path / "missing.jsonl")
    # `bench --data FOLDER` takes the data folder or the benchmark's folder, as eval's --data does
    assert data_paths.gsm8k_file(tmp_path) == full and data_paths.gsm8k_file(tmp_path / "gsm8k") == full
    with pytest.raises(InvalidRequestError, match="not found"):
        data_paths.gsm8k_file(tmp_path / "empty-folder")


def test_the_readmes_sample_eval_builds_its_few_shot_prompt(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """README Evaluation: `--data shared_engine/sample_data/gsm8k_test_sample.jsonl` tries eval on a clone
    without the data folder; it failed after the members loaded ("GSM8K exemplars need the train split:
    shared_engine/sample_data/train.jsonl not found"), leaving a config.json and an empty samples file."""
    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path / "absent"))  # no data folder to take exemplars from
    bench = get_benchmark("gsm8k", str(data_paths.GSM8K_SAMPLE))
    messages = bench.messages(bench.dataset().records[0])
    train = (data_paths.GSM8K_SAMPLE.parent / "train.jsonl").read_text().splitlines()
    first_exemplar = json.loads(train[0])["question"]
    assert len(train) == 4 and any(first_exemplar in str(m["content"]) for m in messages)


def test_data_sample_names_the_packaged_sample_from_any_folder(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """The README's path into the package (`--data shared_engine/sample_data/...`) works only from a
    clone's root: an installed user got "benchmark file not found". `--data sample` names it anywhere."""
    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path / "absent"))
    monkeypatch.chdir(tmp_path)
    bench = get_benchmark("gsm8k", "sample")
    assert len(bench.dataset().records) == 32 and bench.messages(bench.dataset().records[0])
    with pytest.raises(InvalidRequestError, match="GSM8K sample only"):
        get_benchmark("arc-challenge", "sample")
    (tmp_path / "sample").write_text(data_paths.GSM8K_SAMPLE.read_text())  # a file named so is that file
    assert get_benchmark("gsm8k", "sample").path == Path("sample")


def test_an_installed_package_looks_for_data_beside_the_working_folder_only(monkeypatch: pytest.MonkeyPatch,
                                                                          tmp_path: Path) -> None:
    """Installed, "beside the package" is inside the environment: the error named
    '.../venv/lib/python3.11/shared/data' as a place the data was looked for."""
    monkeypatch.delenv("SAFE_ENSEMBLE_DATA", raising=False)
    monkeypatch.chdir(tmp_path)
    installed = tmp_path / "venv" / "lib" / "python3.11" / "site-packages" / "shared_engine" / "data_paths.py"
    monkeypatch.setattr(data_paths, "__file__", str(installed))
    assert data_paths._candidates() == [tmp_path.parent / "shared" / "data"]
    assert "venv" not in str(data_paths.not_found())


async def test_an_eval_whose_prompt_cannot_be_built_fails_before_anything_is_written(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from shared_engine import EnsembleEngine
    from shared_engine.evaluation.runner import RunConfig, evaluate

    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path / "absent"))
    data = tmp_path / "test.jsonl"  # a GSM8K file with no train.jsonl beside it
    data.write_text(data_paths.GSM8K_SAMPLE.read_text().splitlines()[0] + "\n")
    engine = EnsembleEngine(["never-loaded-a", "never-loaded-b"])  # loading these would fail: never tried
    config = RunConfig(bench="gsm8k", method="safe", models=["a", "b"], max_new_tokens=8)
    with pytest.raises(InvalidRequestError, match="train split"):
        await evaluate(engine, get_benchmark("gsm8k", str(data)), config, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
