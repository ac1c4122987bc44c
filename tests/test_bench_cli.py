"""``safe-ensemble bench`` as a user runs it, on toy members (fast): its flags' checks, where its
results go, and what it reports it ran with."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from shared_engine import bench
from shared_engine.bench import parse_method, run_bench
from shared_engine.cli import build_parser, main
from shared_engine.profile import EnsembleProfile, FitInfo
from tests.toy import registered_members, toy_member


def members() -> list:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


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


def test_json_with_a_tilde_is_written_in_the_home_folder(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """--json=~/bench.json (no shell expands ~ after '=') was refused: 'the folder ~ does not exist'."""
    monkeypatch.setenv("HOME", str(tmp_path))
    fake_bench(monkeypatch)
    assert main(["bench", "--models", "a,b", "--json=~/bench.json"]) == 0
    assert json.loads((tmp_path / "bench.json").read_text()) == {"safe_vs_single": 0.9}


@pytest.mark.parametrize("count", ["0", "-1"])
def test_prompts_must_be_at_least_one(count: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        build_parser().parse_args(["bench", "--models", "a,b", "--prompts", count])
    assert exit_.value.code == 2 and "--prompts: must be 1 or more" in capsys.readouterr().err


def test_a_bad_methods_entry_is_one_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    for entry, says in (("safe:bogus=1", "unrecognized arguments: --bogus 1"),
                        ("safe:draft-schedule=sometimes", "invalid choice: 'sometimes'"),
                        # a mistyped method: refused in the flag's words, not pydantic's after the
                        # earlier entries' members loaded and warmed up
                        ("safee", "unknown method 'safee' in --methods (choose from safe, ")):
        with pytest.raises(SystemExit) as exit_:
            parse_method(entry, bench_args())
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err
        assert err.count("\n") == 1 and "usage:" not in err


@pytest.mark.parametrize("methods", ["", ",", " , "])
def test_an_empty_methods_list_is_a_usage_error_before_anything_loads(
        methods: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--methods ","`` named no method: the members loaded, then a StopIteration traceback."""
    calls = fake_bench(monkeypatch)
    with pytest.raises(SystemExit) as exit_:
        main(["bench", "--models", "a,b", "--methods", methods])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and calls == [] and "Traceback" not in err
    assert "--methods: name at least one method" in err


def drafters_run(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Each method's drafter option, as its engine answered the bench's prompts."""
    from shared_engine import EnsembleEngine as Engine

    seen: dict[str, Any] = {}
    generate = Engine.generate

    def recording(self: Any, prompt: Any, **params: Any) -> Any:
        seen[self.options.method] = self.options.drafter
        return generate(self, prompt, **params)

    monkeypatch.setattr(Engine, "generate", recording)
    return seen


def test_every_method_drafts_with_singles_drafter(monkeypatch: pytest.MonkeyPatch) -> None:
    """SAFE's default drafter='auto' picks a drafter per prompt (on a few-shot prompt maybe the second
    member), single runs the first: safe_vs_single divided two models' speeds. Unless --drafter or a
    profile names one, the bench pins every method to single's drafter and says so."""
    seen = drafters_run(monkeypatch)
    with registered_members(members()):
        results = run_bench(bench_args("--methods", "single,safe,every-token"))
    assert seen == {"single": 0, "safe": 0, "every-token": 0}
    assert results["drafter"] == "a" and "drafter_note" in results
    assert {row["drafter"] for row in results["methods"].values()} == {"a"}
    seen.clear()
    with registered_members(members()):  # a drafter given is used as given, by every method
        results = run_bench(bench_args("--methods", "single,safe", "--drafter", "b"))
    assert seen == {"single": "b", "safe": "b"} and results["drafter"] == "b" and "drafter_note" not in results
    with registered_members(members()):  # an entry may still measure the per-prompt choice
        results = run_bench(bench_args("--methods", "safe,safe:drafter=auto"))
    assert results["methods"]["safe:drafter=auto"]["drafter"] == "auto" and results["methods"]["safe"]["drafter"] == "a"


def test_bench_reports_the_settings_its_engines_ran_with(tmp_path: Path) -> None:
    """With --profile the results showed SAFE's defaults (drafter_confidence 0.5, drafter_weight 2) and
    no profile: they are read from the engines now, per method."""
    path = tmp_path / "profile.json"
    EnsembleProfile(members=["a", "b"], weights=[0.1, 0.9], drafter="b", drafter_confidence=0.9,
                    fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="t")).save(str(path))
    with registered_members(members()):
        results = run_bench(bench_args("--methods", "single,safe", "--profile", str(path)))
    assert results["drafter_confidence"] == 0.9 and results["weights"] == [0.1, 0.9]
    assert results["drafter"] == "b" and results["drafter_weight"] is None and results["profile"] == str(path)
    safe, single = results["methods"]["safe"], results["methods"]["single"]
    assert (safe["drafter"], safe["drafter_confidence"], safe["weights"], safe["profile"]) == ("b", 0.9, [0.1, 0.9],
                                                                                                str(path))
    assert single["drafter"] == "b" and "drafter_confidence" not in single
    with registered_members(members()):  # no profile: SAFE's defaults, as its engine holds them
        results = run_bench(bench_args("--methods", "safe", "--drafter-confidence", "0.3"))
    assert (results["drafter_confidence"], results["drafter_weight"], results["weights"]) == (0.3, 2.0, None)
