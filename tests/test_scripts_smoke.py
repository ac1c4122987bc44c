"""Measurement scripts run on toy members or fakes: their main path, and that each figure means what its
docstring says (the figures themselves come from running them on the real zoo; see docs/)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.benchdata import needs_data
from tests.toy import save_toy_folders

ROOT = Path(__file__).resolve().parents[1]


def _script(name: str) -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))  # their `from _report import ...`, as when run
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy_folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return save_toy_folders(tmp_path_factory.mktemp("script-toys"), "toy-sc")


@needs_data
def test_drafter_fit_probe_runs_on_one_prompt(toy_folders: list[Path], monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """It crashed on every run (tokens_inside was given the tokens' lengths, not their bytes)."""
    models = ",".join(str(f) for f in toy_folders)
    monkeypatch.setattr(sys, "argv", ["drafter_fit_probe.py", "--models", models, "--prompts", "1",
                                      "--benchmarks", "gsm8k", "--strides", "2"])
    _script("drafter_fit_probe").main()
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line["benchmark"] == "gsm8k" and line["blocks"] == 1
    for folder in toy_folders:  # GSM8K is few-shot: every part has tokens
        assert all(v is not None and v > 0 for v in line["nll_per_byte"][str(folder)].values())


def test_memory_report_counts_members_not_imports_and_shares_them(toy_folders: list[Path], tmp_path: Path) -> None:
    """A fresh process, as the script runs. The members' RSS counted transformers' lazy import of the
    model class (~150 MiB for a 0.2 MiB toy); the second engine was built after the first was closed,
    so it reloaded the members; --dtype float32 (the default's value) gave no per-member figures."""
    out = tmp_path / "memory.json"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "memory_report.py"), "--models", str(toy_folders[0]),
                    "--method", "single", "--max-new-tokens", "2", "--dtype", "float32", "--json", str(out)],
                   check=True, capture_output=True, text=True, cwd=ROOT)
    report = json.loads(out.read_text())
    assert report["second_engine_shares_members"] is True and report["second_engine_same_answer"] is True
    assert report["members_resident_mb"] < 80, report["rss_mb"]
    [alone] = report["per_member"]
    assert alone["dtype"] == "float32" and alone["rss_mb"] < 80, alone


def test_verify_cost_compares_each_run_with_its_own_first(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """'safe' was compared with 'safe:every-row''s answers (both stored as 'safe'): false at once where
    they differ. Each run is compared with its own first repeat; the default with every-row apart."""
    module = _script("verify_cost")
    # the script replaces these two for its runs: restored after the test
    monkeypatch.setattr(module.llamacpp.LlamaCppMember, "_request", module.llamacpp.LlamaCppMember._request)
    monkeypatch.setattr(module.round_module, "_undecided_offsets", module.round_module._undecided_offsets)
    undecided = module.round_module._undecided_offsets

    class FakeEngine:
        """Answers differ by method and by whether every row is asked for (the script's stand-in)."""

        def __init__(self, members: list, method: str) -> None:
            self.method = method

        def generate(self, prompt: str, **_: Any) -> SimpleNamespace:
            every_row = module.round_module._undecided_offsets is not undecided
            stats = SimpleNamespace(tokens=3, elapsed_s=0.1, draft_s=0.05, verify_s=0.02)
            return SimpleNamespace(text=f"{self.method} {every_row}: {prompt}", stats=stats)

        def close(self) -> None:
            pass

    monkeypatch.setattr(module, "EnsembleEngine", FakeEngine)
    monkeypatch.setattr(module, "bench_prompts", lambda args: (["q1", "q2"], [], "gsm8k"))
    module.main(["--models", "a,b", "--repeats", "2"])
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["run"] for r in rows] == ["single", "safe:every-row", "safe"] * 2
    assert all(r["same_answers_as_first"] is True for r in rows), rows
    assert [r.get("same_answers_as_every_row") for r in rows if r["run"] == "safe"] == [False, False]
    assert all("same_answers_as_every_row" not in r for r in rows if r["run"] != "safe")


class _FakeServer:
    def __init__(self, path: Path, **_: Any) -> None:
        self.url = "http://fake"

    def close(self) -> None:
        pass


class _FakeClient:
    """One decoded token takes 10 ms whatever the number at once: N at once are N times faster."""

    def __init__(self, **_: Any) -> None:
        pass

    def post(self, route: str, json: dict) -> SimpleNamespace:
        if route == "/tokenize":
            return SimpleNamespace(json=lambda: {"tokens": [1, 2, 3]})
        time.sleep(0.01 * json["n_predict"])
        return SimpleNamespace(json=lambda: {"tokens_predicted": json["n_predict"],
                                             "timings": {"predicted_per_token_ms": 10.0}})

    def close(self) -> None:
        pass


def test_decode_batch_cost_is_relative_to_one_request(monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """vs_one was relative to the first level given: '--levels 2,4' printed 1.0 for two at once."""
    module = _script("decode_batch_cost")
    monkeypatch.setattr(module, "LocalLlamaServer", _FakeServer)
    monkeypatch.setattr(module, "gguf_path", lambda name, progress: Path(name))
    monkeypatch.setattr(module.httpx, "Client", _FakeClient)
    module.main(["--models", "toy", "--levels", "2,4", "--tokens", "5", "--repeats", "1"])
    rows = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["requests_at_once"] for r in rows] == [1, 2, 4]
    assert rows[0]["vs_one"] == 1.0 and rows[1]["vs_one"] > 1.5 and rows[2]["vs_one"] > 3
