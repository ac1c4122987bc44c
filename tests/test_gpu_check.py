"""scripts/gpu_check.py's report on the CPU path, toy members (the CUDA-only lines, peak memory per
method, are read, not run: no GPU here). The run through the command line is in test_member_config.py."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from shared_engine import EnsembleEngine
from tests.toy import save_toy_folders

ROOT = Path(__file__).resolve().parents[1]


def _gpu_check() -> ModuleType:
    sys.path.insert(0, str(ROOT / "scripts"))  # its `from _report import ...`, as when run
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy_folders(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return save_toy_folders(tmp_path_factory.mktemp("gpu-check-toys"), "toy-gc")


def test_the_default_prompt_asks_for_a_long_answer() -> None:
    """'What is 17 + 25? Answer with the number.' was answered '42' + EOS: every method was timed over
    two tokens, and SAFE read 5.7x faster than single, noise."""
    prompt = _gpu_check().default_prompt()
    assert "step by step" in prompt and len(prompt) > 200


def test_generate_counts_tokens_as_the_engine_does(toy_folders: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """model.generate's output ends with the EOS it wrote, the engine's tokens do not: Qwen's '42' was
    3 tokens for generate and 2 for the engine. The count stops before the first EOS."""
    from shared_engine import members

    real_load = members.load_member

    def load_ending_early(*args: Any, **kwargs: Any) -> Any:
        member = real_load(*args, **kwargs)
        generate = member.model.generate
        eos = min(member.eos_ids)

        def ends_with_eos(ids: torch.Tensor, max_new_tokens: int, **options: Any) -> torch.Tensor:
            out = generate(ids, max_new_tokens=max_new_tokens - 1, **options)
            return torch.cat([out, torch.tensor([[eos]])], dim=1)

        monkeypatch.setattr(member.model, "generate", ends_with_eos)
        return member

    monkeypatch.setattr(members, "load_member", load_ending_early)
    report = _gpu_check().generate_baseline(str(toy_folders[0]), "cpu", "float32", "hi", 5)
    assert report["tokens"] == 4 and report["tokens_per_s"] > 0


def test_a_failing_method_is_reported_and_the_rest_still_run(toy_folders: list[Path], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A CUDA out-of-memory in one device method ended the run with a traceback, and the CPU reference
    already computed was lost. The method's error is in the report, the others and the ratios are
    there, and the exit code is 1."""
    real_generate = EnsembleEngine.generate

    def out_of_memory(self: EnsembleEngine, *args: Any, **kwargs: Any) -> Any:
        if self.options.method == "adafuse" and self.member_specs[0].dtype == "bfloat16":
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return real_generate(self, *args, **kwargs)

    monkeypatch.setattr(EnsembleEngine, "generate", out_of_memory)
    out = tmp_path / "report.json"
    models = ",".join(str(f) for f in toy_folders)
    code = _gpu_check().main(["--device", "cpu", "--models", models, "--max-new-tokens", "4", "--repeats", "2",
                              "--prompt", "hi", "--json", str(out)])
    report = json.loads(out.read_text())
    assert code == 1 and "failed: adafuse" in capsys.readouterr().err
    assert report["failed"] == ["adafuse"]
    assert "out of memory" in report["methods"]["adafuse"]["error"]
    for method in ("single", "safe"):
        row = report["methods"][method]
        assert row["reference_text"] and len(row["runs_tokens_per_s"]) == 2 and row["tokens"] == 4
    assert report["safe_vs_single"] > 0 and report["single_vs_generate"] > 0
    assert report["adafuse_vs_single"] is None and report["short_runs"] == []


def test_a_run_that_stops_early_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tokens/s over an answer that ended (EOS) before max_new_tokens is measured over few tokens:
    the report names such runs; the ratios are of the medians."""
    gpu_check = _gpu_check()
    rows = {"single": {"text": "a", "tokens": 8, "tokens_per_s": 10.0, "runs_tokens_per_s": [10.0]},
            "safe": {"text": "a", "tokens": 2, "tokens_per_s": 5.0, "runs_tokens_per_s": [5.0]},
            "adafuse": {"text": "a", "tokens": 8, "tokens_per_s": 4.0, "runs_tokens_per_s": [4.0]}}
    monkeypatch.setattr(gpu_check, "run_methods", lambda *args: rows)
    monkeypatch.setattr(gpu_check, "generate_baseline", lambda *args: {"tokens": 7, "tokens_per_s": 20.0})
    report = gpu_check.check(["a", "b"], "cpu", "bfloat16", "p", 8)
    assert report["short_runs"] == ["safe", "generate"]
    assert (report["safe_vs_single"], report["adafuse_vs_single"], report["single_vs_generate"]) == (0.5, 0.4, 0.5)
