"""``safe-ensemble bench`` as a user runs it, on toy members (fast): its flags' checks, where its
results go, and what it reports it ran with."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from shared_engine import bench
from shared_engine.bench import parse_method
from shared_engine.cli import build_parser, main


def bench_args(*flags: str) -> argparse.Namespace:
    return build_parser().parse_args(["bench", "--models", "a,b", "--prompts", "1", "--max-new-tokens", "3", *flags])


def fake_bench(monkeypatch: pytest.MonkeyPatch, then: Any = None) -> list[argparse.Namespace]:
    """``run_bench`` replaced by one that returns at once (``then()`` runs first), recording its calls."""
    calls: list[argparse.Namespace] = []

    def measured(args: argparse.Namespace) -> dict[str, Any]:
        calls.append(args)
        if then is not None:
            then()
        return {"safe_vs_single": 0.9}

    monkeypatch.setattr(bench, "run_bench", measured)
    return calls


def test_json_into_a_missing_folder_is_refused_before_measuring(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    calls = fake_bench(monkeypatch)
    out = tmp_path / "no" / "such" / "out.json"
    assert main(["bench", "--models", "a,b", "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert calls == [] and "Traceback" not in err
    assert err.strip().splitlines() == [f"error: --json {out}: the folder {out.parent} does not exist"]
    assert main(["bench", "--models", "a,b", "--json", str(tmp_path)]) == 2  # a folder, not a file
    assert calls == [] and "is a folder" in capsys.readouterr().err


def test_results_are_printed_when_the_json_cannot_be_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "out"
    folder.mkdir()
    fake_bench(monkeypatch, then=folder.rmdir)  # the folder goes while the bench measures
    assert main(["bench", "--models", "a,b", "--json", str(folder / "bench.json")]) == 2
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"safe_vs_single": 0.9}  # not lost
    assert captured.err.count("\n") == 1 and "cannot write the results" in captured.err
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("count", ["0", "-1"])
def test_prompts_must_be_at_least_one(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "--models", "a,b", "--prompts", count])
    assert exit_.value.code == 2 and "--prompts: must be 1 or more" in capsys.readouterr().err


def test_a_bad_methods_entry_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    for entry, says in (("safe:bogus=1", "unrecognized arguments: --bogus 1"),
                        ("safe:draft-schedule=sometimes", "invalid choice: 'sometimes'")):
        with pytest.raises(SystemExit) as exit_:
            parse_method(entry, bench_args())
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err
        assert err.count("\n") == 1 and "usage:" not in err
