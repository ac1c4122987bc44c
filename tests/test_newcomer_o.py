"""A newcomer's first runs (o): a BBH / MMLU-Redux folder holding a link to a missing file (a
FileNotFoundError traceback), member options given where they are not taken or misspelt (no hint),
``calibrate --data`` a folder without the split or ``sample`` (one path named, "not found"), and
``make bench`` writing bench.json into the repository root."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from shared_engine import EnsembleEngine
from shared_engine.calibration import calibration_records
from shared_engine.cli import main
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.datasets import load_bbh, load_mmlu_redux
from shared_engine.members import member_config

REPO = Path(__file__).resolve().parents[1]
MODELS = ["smollm2-135m-instruct", "gemma-3-270m"]
GGUF_MEMBER = "llamacpp:smollm2-135m-instruct"
BBH_TASK = {"examples": [{"input": "Is 2 even? Options:\n(A) yes\n(B) no", "target": "(A)"}]}
MMLU_SHEET = 'question,choices,answer,error_type\n"2+2?","[\'3\', \'4\']",1,ok\n'


# --- a dangling link inside a data folder -----------------------------------------------------------

@pytest.mark.parametrize(("load", "real", "dangling", "text"), [
    (load_bbh, "causal.json", "sports.json", json.dumps(BBH_TASK)),
    (load_mmlu_redux, "mmlu_anatomy.csv", "mmlu_virology.csv", MMLU_SHEET),
])
def test_a_dangling_link_in_a_data_folder_is_named(load, real: str, dangling: str, text: str, tmp_path: Path) -> None:
    """One task's git-annex link not fetched: a FileNotFoundError traceback out of eval and calibrate,
    where the same link named alone already said what it is."""
    (tmp_path / real).write_text(text)
    (tmp_path / dangling).symlink_to(tmp_path / "annex" / dangling)
    assert load(tmp_path / real).records  # the real file alone loads
    with pytest.raises(InvalidRequestError) as caught:
        load(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"{tmp_path / dangling} is a link to a missing file ")
    assert f"'git annex get {dangling}'" in message


def test_eval_on_a_bbh_folder_with_a_dangling_link_is_one_error_line(tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """The whole CLI path, as a user runs it: no traceback, the link named (the members are not loaded:
    the data is read first)."""
    bbh = tmp_path / "bbh"
    bbh.mkdir()
    (bbh / "causal.json").write_text(json.dumps(BBH_TASK))
    (bbh / "sports.json").symlink_to(tmp_path / "annex" / "sports.json")
    code = main(["eval", "--bench", "bbh", "--models", ",".join(MODELS), "--data", str(tmp_path),
                 "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert f"error: {bbh / 'sports.json'} is a link to a missing file" in err


# --- member options: one hint wherever a name is refused --------------------------------------------

GPU_HINT = "no GPU offload option"
PER_MEMBER = "n_ctx is set per member: members=[MemberConfig(model=..., n_ctx=...)]"


@pytest.mark.parametrize(("options", "hint"), [
    ({"n_ctxx": 512}, f"did you mean 'n_ctx'? {PER_MEMBER}"),
    ({"n_ctx": 512}, PER_MEMBER),
    ({"n_gpu_layers": 99}, GPU_HINT),
])
def test_engine_wide_member_options_say_where_they_go(options: dict, hint: str) -> None:
    """``EnsembleEngine(models, n_ctx=...)``: "Extra inputs are not permitted" alone."""
    with pytest.raises(InvalidRequestError) as caught:
        EnsembleEngine(MODELS, **options)
    assert hint in str(caught.value)


def test_a_members_entry_with_n_gpu_layers_says_there_is_none() -> None:
    """The engine, LangChain's and LlamaIndex's ``members=[...]`` and ``--members FILE`` all read entries
    with ``member_config``."""
    with pytest.raises(InvalidRequestError) as caught:
        member_config({"model": GGUF_MEMBER, "n_gpu_layers": 99})
    message = str(caught.value)
    assert GPU_HINT in message and "device='cuda'" in message and "-ngl" in message
    with pytest.raises(InvalidRequestError, match=r"did you mean 'threads'\?"):
        member_config({"model": GGUF_MEMBER, "n_threads": 2})  # llama-cpp-python's name


def test_the_cli_members_file_gets_the_hint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    members = tmp_path / "members.json"
    members.write_text(json.dumps([{"model": GGUF_MEMBER, "n_gpu_layers": 99}, {"model": MODELS[1]}]))
    with pytest.raises(SystemExit) as exited:  # argparse reads the file: its one-line usage error
        main(["run", "--members", str(members), "hello"])
    err = capsys.readouterr().err
    assert exited.value.code == 2
    assert "Traceback" not in err and GPU_HINT in err


def test_chat_ensemble_member_options_and_model_kwargs_get_hints() -> None:
    from langchain_ensemble import ChatEnsemble

    with pytest.raises(ValueError, match=rf"n_ctxx: .*did you mean .n_ctx.\? {re.escape(PER_MEMBER)}"):
        ChatEnsemble(models=MODELS, member_options={"n_ctxx": 512})
    with pytest.raises(ValueError, match=GPU_HINT):
        ChatEnsemble(models=MODELS, n_gpu_layers=99)
    with pytest.raises(ValueError, match="no model_kwargs: engine options are keywords of their own"):
        ChatEnsemble(models=MODELS, model_kwargs={"n_ctxx": 512})


def test_ensemble_llm_member_options_get_the_hint() -> None:
    from llamaindex_ensemble import EnsembleLLM

    with pytest.raises(InvalidRequestError, match=rf"did you mean .n_ctx.\? {re.escape(PER_MEMBER)}"):
        EnsembleLLM(models=MODELS, member_options={"n_ctxx": 512})


# --- calibrate --data --------------------------------------------------------------------------------

def test_calibrate_on_a_folder_without_the_split_names_both_paths(tmp_path: Path) -> None:
    """``calibrate --data /tmp`` said "benchmark file not found: /tmp/train.jsonl", with eval's hint to
    use ``--data sample``."""
    with pytest.raises(InvalidRequestError) as caught:
        calibration_records("gsm8k", str(tmp_path), None)
    message = str(caught.value)
    assert f"{tmp_path / 'gsm8k' / 'train.jsonl'} nor {tmp_path / 'train.jsonl'}" in message
    assert "pass --data with the data folder (holding gsm8k/train.jsonl)" in message
    assert "--data sample" not in message


def test_calibrate_data_sample_says_the_sample_is_test_questions(monkeypatch: pytest.MonkeyPatch,
                                                                 tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)  # no folder named "sample" here
    with pytest.raises(InvalidRequestError) as caught:
        calibration_records("gsm8k", "sample", None)
    message = str(caught.value)
    assert message.startswith("--data sample: the GSM8K sample the package ships is test questions")
    assert "never fits on the questions evaluated" in message and "gsm8k/train.jsonl" in message


# --- make bench -------------------------------------------------------------------------------------

@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_bench_writes_into_an_ignored_folder_not_the_repository_root() -> None:
    """``make bench`` wrote bench.json beside the README."""
    dry = subprocess.run(["make", "-n", "-o", ".venv/.installed", "bench"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    command = next(line for line in dry.splitlines() if "safe-ensemble bench" in line)
    target = command.split("--json ", 1)[1].split()[0]
    assert Path(target).parent != Path(".") and f"mkdir -p {Path(target).parent}" in dry
    ignored = subprocess.run(["git", "check-ignore", "-q", "--no-index", target], cwd=REPO, check=False)
    assert ignored.returncode == 0


def test_bench_says_where_the_results_were_written(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_bench_cli import fake_bench

    fake_bench(monkeypatch)
    out = tmp_path / "bench.json"
    assert main(["bench", "--models", "a,b", "--json", str(out)]) == 0
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"results written to {out}"
