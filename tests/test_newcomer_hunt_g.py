"""A newcomer's first runs (hunt g): errors and silences that left them guessing. ``--data`` an existing
folder holding none of the benchmark's files; a GSM8K run given another benchmark's file; a misspelt
``ChatEnsemble`` keyword without the hint the engine gives; a bench Ctrl-C before anything was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from shared_engine.cli import main
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.benchmarks import get_benchmark
from tests.test_bench_edges import interrupt_after
from tests.toy import registered_members, toy_member


@pytest.mark.parametrize(("bench", "looked_for", "accepts"), [
    ("gsm8k", "neither gsm8k/test.jsonl nor test.jsonl", "the gsm8k folder or a GSM8K .jsonl file"),
    ("math500", "neither math500/test.jsonl nor test.jsonl", "the math500 folder or a MATH-500 .jsonl file"),
    ("arc-challenge", "neither arc_challenge/test.jsonl nor test.jsonl", "the arc_challenge folder or an ARC"),
    ("mmlu-redux", "neither mmlu_redux/*.csv nor *.csv", "the mmlu_redux folder or one subject's"),
    ("bbh", "neither bbh/*.json nor *.json", "the bbh folder or one BBH task's .json file"),
    ("nq", "neither nq_open/test.jsonl nor test.jsonl", "the nq_open folder or an NQ-open .jsonl file"),
    ("triviaqa", "neither triviaqa/test.jsonl nor test.jsonl", "the triviaqa folder"),
    ("squad", "neither squad/test.jsonl nor test.jsonl", "the squad folder"),
])
def test_a_data_folder_without_the_benchmark_says_what_was_looked_for(
        bench: str, looked_for: str, accepts: str, tmp_path: Path) -> None:
    """``--data /tmp`` said "benchmark file not found: /tmp" of a folder that exists (MMLU-Redux and BBH:
    "no ... files in /tmp", without what --data takes)."""
    (tmp_path / "notes.txt").write_text("not a benchmark")
    with pytest.raises(InvalidRequestError) as caught:
        get_benchmark(bench, data=str(tmp_path)).dataset()
    message = str(caught.value)
    assert message.startswith(f"{tmp_path}: a folder, but it holds {looked_for} ")
    assert f"--data takes the data folder, {accepts}" in message


def test_a_missing_file_says_what_data_takes(tmp_path: Path) -> None:
    missing = tmp_path / "de-en.jsonl"
    with pytest.raises(InvalidRequestError, match=r"benchmark file not found: .*de-en\.jsonl \(--data takes the "
                                                  r"data folder, the flores folder or a FLORES de-en\.jsonl file\)"):
        get_benchmark("flores", data=str(missing)).dataset()


def test_a_gsm8k_run_on_another_benchmarks_file_names_the_file_and_row(tmp_path: Path) -> None:
    """``--bench gsm8k --data flores/de-en.jsonl``: "GSM8K solution without '####': '...'", no file, no row."""
    data = tmp_path / "de-en.jsonl"
    rows = [{"question": "Wir haben", "answer": "We have"}, {"question": "Gut", "answer": "Good"}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    with pytest.raises(InvalidRequestError) as caught:
        get_benchmark("gsm8k", data=str(data)).dataset()
    assert str(caught.value) == (f"{data} row 0: GSM8K solution without '####': 'We have' "
                                 "(is this a GSM8K file?)")


def test_a_misspelt_chat_ensemble_keyword_gets_the_engines_hint() -> None:
    """``ChatEnsemble(draft_lenght=5)``: "unknown arguments" without the "did you mean" that
    EnsembleEngine, EnsembleLLM and --members give."""
    from langchain_ensemble import ChatEnsemble

    with pytest.raises(ValueError, match=r"unknown arguments \['draft_lenght'\]: .*\(did you mean 'draft_length'\?\)"):
        ChatEnsemble(models=["a", "b"], draft_lenght=5)
    with pytest.raises(ValueError, match=r"; draft_lenght \(did you mean 'draft_length'\?\); "
                                         r"temperatur \(did you mean 'temperature'\?\)"):
        ChatEnsemble(models=["a", "b"], draft_lenght=5, temperatur=0.2, zzz=1)


def test_bench_ctrl_c_before_a_prompt_was_measured_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C before every method answered one prompt exited 130 without a word: --json not written, and
    nothing said why."""
    interrupt_after(monkeypatch, 1)
    out = tmp_path / "bench.json"
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        rc = main(["bench", "--models", "a,b", "--prompts", "2", "--max-new-tokens", "3", "--methods", "single,safe",
                   "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 130 and not out.exists() and captured.out == ""
    assert captured.err.splitlines()[-1] == ("interrupted before every method answered a prompt: nothing measured, "
                                             f"nothing written to {out}")


def test_bench_help_states_the_methods_default(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    assert "(default:single,safe,every-token,adafuse)" in "".join(capsys.readouterr().out.split())  # wrapped
