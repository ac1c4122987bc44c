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
