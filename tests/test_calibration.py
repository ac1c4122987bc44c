"""``safe-ensemble calibrate`` and profiles on toy models and a tiny labelled GSM8K-format file:
the member that knows the answers gets the weight and drafts, profiles round-trip and are
validated, test splits are refused, and every surface accepts ``profile=``."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.calibration import calibrate, calibration_records, reference_answer
from shared_engine.cli import main
from shared_engine.errors import InvalidRequestError
from shared_engine.evaluation.benchmarks import get_benchmark
from shared_engine.members import HFMember
from shared_engine.profile import EnsembleProfile, FitInfo, apply_profile, member_key
from shared_engine.weighting import mixture_weights, segment_logprobs
from tests.benchdata import DATA
from tests.toy import TOKENIZERS, registered_members, tiny_gpt2, tiny_llama, toy_member

SHOTS = 4  # the evaluation's GSM8K prompt takes the first 4 train rows as exemplars


def _rows(n: int) -> list[dict[str, str]]:
    rows = []
    for i in range(n):
        a, b = 3 + i, 11 + 2 * i
        rows.append({"question": f"Sofia has {a} apples and buys {b} more. How many apples does she have?",
                     "answer": f"She has {a} + {b} = <<{a}+{b}={a + b}>>{a + b} apples.\n#### {a + b}"})
    return rows


@pytest.fixture
def train_file(tmp_path: Path) -> Path:
    path = tmp_path / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in _rows(SHOTS + 4)))
    return path


@cache
def knowing_member(data: str) -> HFMember:
    """A tiny byte-level model trained on the calibration questions' prompts and reference answers:
    a real model that predicts those answers far better than a random one."""
    tok = TOKENIZERS["byte_level"]()
    model = copy.deepcopy(tiny_llama(tok, 21)).train()
    member = HFMember("knows", model, tok)
    _, records, benchmark = calibration_records("gsm8k", data, 10)
    sequences = []
    for record in records:
        prompt = member.prompt_ids(benchmark.messages(record))
        answer = tok(reference_answer("gsm8k", record), add_special_tokens=False)["input_ids"]
        sequences.append((prompt, answer))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.03)
    torch.manual_seed(0)
    for _ in range(8):
        for prompt, answer in sequences:
            ids = torch.tensor([prompt + answer])
            labels = torch.tensor([[-100] * len(prompt) + answer])
            loss = model(input_ids=ids, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    model.eval()
    return HFMember("knows", model, tok)


def test_reference_answer_is_written_like_the_evaluation_exemplars(train_file: Path) -> None:
    _, records, benchmark = calibration_records("gsm8k", str(train_file), 10)
    assert reference_answer("gsm8k", records[0]) == "She has 7 + 19 = 26 apples.\nThe answer is 26."
    shot_answers = [m["content"] for m in benchmark.messages(records[0]) if m["role"] == "assistant"]
    assert shot_answers[0] == "She has 3 + 11 = 14 apples.\nThe answer is 14."  # the same format


def test_the_prompts_exemplars_are_never_fitted_on_and_test_splits_are_refused(train_file: Path,
                                                                               tmp_path: Path) -> None:
    path, records, _ = calibration_records("gsm8k", str(train_file), 100)
    assert path == train_file and len(records) == 4
    assert [r.question for r in records] == [r["question"] for r in _rows(SHOTS + 4)[SHOTS:]]
    test = tmp_path / "test.jsonl"
    test.write_text(train_file.read_text())
    with pytest.raises(InvalidRequestError, match="test split"):
        calibration_records("gsm8k", str(test), 10)
    renamed = tmp_path / "gsm8k_test.jsonl"
    renamed.write_text(train_file.read_text())
    with pytest.raises(InvalidRequestError, match="test split"):
        calibration_records("gsm8k", str(renamed), 10)
    if DATA is not None:  # the benchmark's own test file (needs the data folder; the names above do not)
        with pytest.raises(InvalidRequestError, match="test split"):
            calibration_records("gsm8k", str(get_benchmark("gsm8k").path), 10)
    with pytest.raises(InvalidRequestError, match="calibrate supports"):
        calibration_records("flores", str(train_file), 10)


def test_calibrate_weights_and_drafter_favour_the_member_that_knows_the_answers(train_file: Path) -> None:
    knows = knowing_member(str(train_file))
    plain = toy_member("random", "metaspace", "gpt2", seed=2)
    profile = calibrate([plain, knows], "gsm8k", str(train_file), limit=10, progress=False)
    assert profile.members == ["random", "knows"]
    assert profile.drafter == "knows"
    assert profile.weights[1] > 0.9 and sum(profile.weights) == pytest.approx(1.0, abs=1e-5)
    assert profile.fitted.nll_per_byte["knows"] < profile.fitted.nll_per_byte["random"]
    assert profile.fitted.questions == 4 and profile.fitted.spans > 4 and profile.fitted.positions > 4
    assert profile.fitted.data == str(train_file)
    assert set(profile.fitted.threshold_accuracy) >= {"none", "0.5"}


def test_profile_round_trip_and_validation(tmp_path: Path) -> None:
    fitted = FitInfo(bench="gsm8k", data="train.jsonl", questions=3, method="test")
    profile = EnsembleProfile(members=["a", "b"], weights=[0.25, 0.75], drafter="b", drafter_confidence=0.6,
                              fitted=fitted)
    path = tmp_path / "profile.json"
    profile.save(path)
    assert EnsembleProfile.load(path) == profile
    for bad in ({"weights": [1.0]}, {"drafter": "c"}, {"weights": [-1.0, 2.0]}, {"drafter_confidence": 1.5},
                {"weights": [float("nan"), 1.0]}):
        values = {**profile.model_dump(), **bad}
        path.write_text(json.dumps(values))
        with pytest.raises(InvalidRequestError, match="not a valid profile"):
            EnsembleProfile.load(path)
    with pytest.raises(InvalidRequestError, match="cannot read profile"):
        EnsembleProfile.load(tmp_path / "missing.json")
    path.write_bytes(b"\xff\xfe{ not text")  # a traceback before
    with pytest.raises(InvalidRequestError, match="not UTF-8"):
        EnsembleProfile.load(path)


def _profile(tmp_path: Path, members: list[str], weights: list[float], drafter: str,
             confidence: float | None = 0.7) -> Path:
    path = tmp_path / "profile.json"
    EnsembleProfile(members=members, weights=weights, drafter=drafter, drafter_confidence=confidence,
                    fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="test")).save(path)
    return path


def test_engine_takes_profile_values_as_defaults_that_options_override(tmp_path: Path) -> None:
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    path = _profile(tmp_path, ["b", "a"], [0.8, 0.2], drafter="b")
    engine = EnsembleEngine([a, b], profile=str(path))
    assert engine.options.weights == [0.2, 0.8]  # reordered to the engine's member order
    assert engine.options.drafter == 1 and engine.options.drafter_confidence == 0.7
    assert [m.name for m in engine.members] == ["b", "a"]
    assert engine.generate("Hello", max_new_tokens=2).stats.member_weights == {"b": 0.8, "a": 0.2}
    explicit = EnsembleEngine([a, b], profile=str(path), weights=[1, 1], drafter="a", drafter_confidence=0.4)
    assert (explicit.options.weights, explicit.options.drafter, explicit.options.drafter_confidence) == \
        ([1.0, 1.0], "a", 0.4)
    assert EnsembleEngine([a, b], profile=str(path), weights="auto").options.weights == "auto"
    # SAFE's own default gate (0.5) does not hide the profile's; an explicit None asks for the paper's rule
    assert EnsembleEngine([a, b]).options.drafter_confidence == 0.5
    assert EnsembleEngine([a, b], profile=str(path), drafter_confidence=None).options.drafter_confidence is None
    with pytest.raises(InvalidRequestError, match="fitted for members"):
        EnsembleEngine([a, toy_member("c", "byte_level", "llama", 3)], profile=str(path))


def test_member_keys_ignore_the_backend() -> None:
    assert member_key("llamacpp:qwen2.5-coder-0.5b-instruct") == member_key("qwen2.5-coder-0.5b-instruct")
    assert member_key("/models/smollm2-135m-instruct.gguf") == "smollm2-135m-instruct"
    # a hub id counts by its last part, in process or as a server's tokenizer
    assert member_key("vllm:http://gpu:8000#Qwen/Qwen2.5-0.5B-Instruct") == member_key("Qwen/Qwen2.5-0.5B-Instruct")
    assert member_key("vllm:http://gpu:8000") == "http://gpu:8000"  # no tokenizer named: the address
    assert apply_profile(["x"], {"draft_length": 3}) == {"draft_length": 3}


def test_cli_calibrate_writes_a_profile_that_run_accepts(train_file: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    out = tmp_path / "profile.json"
    with registered_members(members):
        assert main(["calibrate", "--bench", "gsm8k", "--models", "a,b", "--data", str(train_file),
                     "--limit", "2", "--out", str(out), "--no-progress"]) == 0
        profile = EnsembleProfile.load(out)
        assert profile.members == ["a", "b"] and profile.fitted.questions == 2
        assert main(["run", "--models", "a,b", "--profile", str(out), "--max-new-tokens", "2", "--events",
                     "Hello"]) == 0
        finish = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert finish["stats"]["member_weights"][profile.drafter] == pytest.approx(
            profile.weights[profile.members.index(profile.drafter)], abs=1e-5)
        assert main(["run", "--models", "a,b", "--weights", "auto", "--max-new-tokens", "2", "--events",
                     "Hello"]) == 0
        finish = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert set(finish["stats"]["prompt_nll_per_byte"]) == {"a", "b"}
        assert main(["calibrate", "--models", "a,b", "--data", str(tmp_path / "test.jsonl"),
                     "--out", str(out)]) == 2


def test_adapters_accept_a_profile(tmp_path: Path) -> None:
    pytest.importorskip("langchain_core")
    pytest.importorskip("llama_index.core")
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    path = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b", confidence=None)
    with registered_members(members) as names:
        chat = ChatEnsemble(models=names, profile=str(path), max_tokens=2)
        assert chat.engine_options["profile"] == str(path)
        message = chat.invoke("Hello")
        assert isinstance(message.content, str)
        llm = EnsembleLLM(models=names, profile=str(path), max_tokens=2)
        assert llm._engine.options.weights == [0.3, 0.7] and llm._engine.options.drafter == 1
        with pytest.raises(InvalidRequestError, match="fitted for members"):
            EnsembleLLM(models=["a", "a"], profile=str(path))


def test_a_session_reused_across_questions_reads_like_a_fresh_one(train_file: Path) -> None:
    from shared_engine.calibration import teacher_forced

    member = toy_member("a", "byte_level", "llama", 1)
    _, records, benchmark = calibration_records("gsm8k", str(train_file), 2)
    shared = member.new_session()
    for record in records:
        answer = reference_answer("gsm8k", record).encode()
        messages = benchmark.messages(record)
        reused = teacher_forced(member, shared, messages, answer, {0})
        fresh = teacher_forced(member, member.new_session(), messages, answer, {0})
        assert reused.logprobs == pytest.approx(fresh.logprobs, abs=1e-4)
        assert reused.tops[0].ids[:5] == fresh.tops[0].ids[:5]


def test_a_renamed_copy_of_the_test_split_is_not_fitted_on(train_file: Path, tmp_path: Path) -> None:
    """The name rule caught `test.jsonl` only: a copy named `heldout.jsonl` beside it was fitted on.
    Questions of the test split beside the file (or the data folder's) are left out; all of them: refused."""
    rows = _rows(SHOTS + 4)
    (tmp_path / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[SHOTS + 2:]))
    _, records, _ = calibration_records("gsm8k", str(train_file), 100)
    assert [r.question for r in records] == [r["question"] for r in rows[SHOTS:SHOTS + 2]]
    heldout = tmp_path / "heldout.jsonl"
    heldout.write_text("".join(json.dumps(r) + "\n" for r in rows[:SHOTS] + rows[SHOTS + 2:]))
    with pytest.raises(InvalidRequestError, match="every question .* is a test question"):
        calibration_records("gsm8k", str(heldout), 100)


def test_the_data_folder_is_read_as_eval_reads_it(tmp_path: Path) -> None:
    """`--data DATA_FOLDER` (as `eval --data` takes it) looked for DATA_FOLDER/train.jsonl."""
    (tmp_path / "gsm8k").mkdir()
    split = tmp_path / "gsm8k" / "train.jsonl"
    split.write_text("".join(json.dumps(r) + "\n" for r in _rows(SHOTS + 2)))
    path, records, _ = calibration_records("gsm8k", str(tmp_path), 100)
    assert path == split and len(records) == 2


@pytest.mark.parametrize("out", ["missing/profile.json", "."])
def test_an_unwritable_out_fails_before_fitting(train_file: Path, tmp_path: Path, out: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`--out` in a missing folder (or a folder) was a traceback after every question was fitted."""
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "1",
                     "--out", str(tmp_path / out), "--no-progress"]) == 2
    assert "error: --out" in capsys.readouterr().err


def test_a_profile_that_cannot_be_written_is_printed_not_lost(train_file: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    def full_disk(self: EnsembleProfile, path: str | Path) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(EnsembleProfile, "save", full_disk)
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "1",
                     "--out", str(tmp_path / "p.json"), "--no-progress"]) == 2
    captured = capsys.readouterr()
    assert EnsembleProfile.model_validate_json(captured.out).members == ["a", "b"]
    assert "No space left on device" in captured.err


def test_a_saved_profile_replaces_the_old_one_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b", confidence=None)
    before = path.read_text()
    profile = EnsembleProfile.load(path)

    write_text = Path.write_text

    def interrupted(self: Path, text: str, *args: object, **kwargs: object) -> None:
        write_text(self, text[: len(text) // 2])  # half written when the interrupt comes
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        profile.save(path)
    monkeypatch.undo()
    assert path.read_text() == before and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_a_loaded_members_key_is_its_names_key() -> None:
    """A hub id's member is named "org/name": calibrate(loaded members) keyed it so, the string
    surfaces "name", and each refused the other's profile."""
    member = toy_member("org/tiny", "byte_level", "llama", 1)
    assert member_key(member) == member_key("org/tiny") == "tiny"


def test_a_profile_refitted_to_the_same_path_is_read_again_by_langchain(tmp_path: Path) -> None:
    """ChatEnsemble shares an engine per configuration and keyed the profile by its path: while an
    earlier chat model lived, a profile re-fitted to the same path kept its old weights (LangChain's
    response cache, keyed on the identifying params, too)."""
    pytest.importorskip("langchain_core")
    from langchain_ensemble import ChatEnsemble

    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    with registered_members(members) as names:
        path = _profile(tmp_path, ["a", "b"], [0.9, 0.1], drafter="a")
        first = ChatEnsemble(models=names, profile=str(path), max_tokens=2)
        assert first._engine().options.weights == [0.9, 0.1]
        _profile(tmp_path, ["a", "b"], [0.2, 0.8], drafter="a")  # calibrate again, the same --out
        second = ChatEnsemble(models=names, profile=str(path), max_tokens=2)
        assert second._engine().options.weights == [0.2, 0.8]
        assert first._identifying_params != second._identifying_params


def test_two_checkpoints_with_the_same_folder_name_are_two_members(train_file: Path, tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    """run1/final and run2/final were one member to profiles (keyed by the last part): calibrate
    refused them as not distinct, and a profile fitted with run1/final was applied to run2/final
    without a word."""
    from shared_engine.members import register_member, unregister_member

    first, second = tmp_path / "run1" / "final", tmp_path / "run2" / "final"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    members = {str(first): toy_member("x1", "byte_level", "llama", 1),
               str(second): toy_member("x2", "byte_level", "llama", 5),
               "other": toy_member("other", "metaspace", "gpt2", 2)}
    for name, member in members.items():
        register_member(member, name)
    try:
        both = calibrate([str(first), str(second)], "gsm8k", str(train_file), limit=1, progress=False)
        assert both.members == ["run1/final", "run2/final"]
        one = calibrate([str(first), "other"], "gsm8k", str(train_file), limit=1, progress=False)
        assert one.members == ["final", "other"] and one.sources == [str(first.resolve()), None]
        one.save(tmp_path / "p.json")
        with caplog.at_level("WARNING"):
            EnsembleEngine([str(second), "other"], profile=str(tmp_path / "p.json"))
        assert "was fitted from" in caplog.text and str(second.resolve()) in caplog.text
    finally:
        for name in members:
            unregister_member(name)


def _member_reading(name: str, sync: Callable[[Any, list[int], int], torch.Tensor]) -> HFMember:
    """A fresh toy member (the cached ones stay intact) whose teacher-forced reads go through
    ``sync(inner_session, ids, start)``."""
    tok = TOKENIZERS["metaspace"]()
    member = HFMember(name, tiny_gpt2(tok, 2), tok)
    new_session = member.new_session

    class Session:
        def __init__(self) -> None:
            self.inner = new_session()

        def __getattr__(self, key: str) -> object:
            return getattr(self.inner, key)

        def sync(self, ids: list[int], start: int) -> torch.Tensor:
            return sync(self.inner, ids, start)

    member.new_session = Session  # type: ignore[method-assign]
    return member


def _broken_member(name: str, breaks: str) -> HFMember:
    """A toy member whose teacher-forced rows give a reference token -inf mid-answer (``"neginf"``),
    the last token -inf (``"neginf_last"``), or NaN (``"nan"``)."""

    def sync(inner: Any, ids: list[int], start: int) -> torch.Tensor:
        rows = inner.sync(ids, start).clone()
        if breaks == "nan":
            rows[3:] = float("nan")
        elif breaks == "neginf_last":
            rows[len(ids) - start - 1, ids[-1]] = -float("inf")
        else:
            rows[2, ids[start + 2]] = -float("inf")
        return rows

    return _member_reading(name, sync)


@pytest.mark.parametrize("breaks", ["neginf", "neginf_last"])
def test_a_reference_token_given_no_probability_still_fits_a_loadable_profile(
        breaks: str, train_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A member giving one reference token -inf: mid-answer, every later span was NaN (running sums
    differenced) and the fit ended in an IndexError after every question was read; on the last
    token calibrate exited 0 with nll_per_byte null, a profile every surface refused."""
    members = [toy_member("good", "byte_level", "llama", 1), _broken_member("bad", breaks)]
    out = tmp_path / "p.json"
    with registered_members(members):
        assert main(["calibrate", "--models", "good,bad", "--data", str(train_file), "--limit", "3",
                     "--out", str(out), "--no-progress"]) == 0
    profile = EnsembleProfile.load(out)
    assert all(math.isfinite(v) for v in profile.fitted.nll_per_byte.values())
    assert profile.fitted.nll_per_byte["bad"] > profile.fitted.nll_per_byte["good"]


def test_a_member_giving_nan_is_refused_by_name_at_once(train_file: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    members = [toy_member("good", "byte_level", "llama", 1), _broken_member("bad", "nan")]
    out = tmp_path / "p.json"
    with registered_members(members):
        assert main(["calibrate", "--models", "good,bad", "--data", str(train_file), "--limit", "3",
                     "--out", str(out), "--no-progress"]) == 2
    assert "member bad gives NaN" in capsys.readouterr().err and not out.exists()


def test_span_log_probabilities_after_a_token_given_no_probability() -> None:
    spans = segment_logprobs([[1, 2, 3, 4], [2, 4]], [[-0.1, -math.inf, -0.2, -0.3], [-1.0, -1.0]], [0, 2, 4])
    assert spans.tolist() == [[-math.inf, -1.0], [pytest.approx(-0.5), -1.0]]
    nan_as_none = mixture_weights(torch.tensor([[math.nan, -1.0], [-0.5, -1.0]]))
    assert nan_as_none.weights == mixture_weights(torch.tensor([[-math.inf, -1.0], [-0.5, -1.0]])).weights
    assert all(math.isfinite(w) for w in nan_as_none.weights)


def test_eval_resume_takes_the_same_profile_spelled_another_way(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`eval --resume` compared the profile's path as typed: p.json, ./p.json and its absolute path
    were three runs, and the resume was refused ("different settings")."""
    _profile(tmp_path, ["a", "b"], [0.9, 0.1], drafter="a")
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps({"question": f"{i} + 1?", "answer": f"#### {i + 1}"}) + "\n"
                            for i in range(3)))
    # the prompt's exemplars come from the train split beside the data: a clone without ../shared has none
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(SHOTS)))
    monkeypatch.chdir(tmp_path)
    run = ["eval", "--bench", "gsm8k", "--data", str(data), "--models", "a,b", "--max-new-tokens", "2",
           "--no-progress", "--out", str(tmp_path / "run")]
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        assert main([*run, "--profile", "profile.json", "--limit", "1"]) == 0
        for spelling, limit in (("./profile.json", "2"), (str(tmp_path / "profile.json"), "3")):
            assert main([*run, "--profile", spelling, "--limit", limit, "--resume"]) == 0, capsys.readouterr().err
        config = tmp_path / "run" / "config.json"  # a run recorded before: the path as typed, kept
        config.write_text(config.read_text().replace(json.dumps(str(tmp_path / "profile.json")), '"profile.json"'))
        assert main([*run, "--profile", "./profile.json", "--limit", "3", "--resume"]) == 0
        assert json.loads(config.read_text())["engine_options"]["profile"] == "profile.json"
    assert len((tmp_path / "run" / "samples.jsonl").read_text().splitlines()) == 3


def _split_with_a_long_question(tmp_path: Path) -> tuple[list[dict[str, str]], Path, list]:
    """A training split whose second question past the shots is too long for the toy members' 512-token
    window, its file, and the two toy members."""
    rows = _rows(SHOTS + 3)
    rows.insert(SHOTS + 1, {"question": "Sofia has 3 apples. " * 80 + "How many apples does she have?",
                            "answer": "She has 3 apples.\n#### 3"})
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return rows, data, [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


def test_a_question_longer_than_a_members_context_window_is_left_out_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    """A prompt + reference answer past a member's context window was a raw IndexError from its
    forward, mid-run. The question is now checked before the forward and left out (named in a
    warning): one long question does not end the fit; when none fits, a one-line error."""
    rows, data, members = _split_with_a_long_question(tmp_path)
    with caplog.at_level("WARNING"):
        profile = calibrate(members, "gsm8k", str(data), limit=10, progress=False)
    assert profile.fitted.questions == 3
    assert "1 of 4 questions left out" in caplog.text and "context window of 512 tokens" in caplog.text
    only_long = tmp_path / "long" / "train.jsonl"
    only_long.parent.mkdir()
    only_long.write_text("".join(json.dumps(r) + "\n" for r in rows[:SHOTS] + [rows[SHOTS + 1]]))
    with registered_members(members):
        assert main(["calibrate", "--models", "a,b", "--data", str(only_long), "--out", str(tmp_path / "p.json"),
                     "--no-progress"]) == 2
    assert "no question fits" in capsys.readouterr().err


def test_a_question_too_long_for_a_member_is_replaced_by_the_next(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """--limit 2 with the second question too long fitted on 1 question (its warning said only that
    one was left out); the next question is read in its place. Where the split runs out, the warning
    says how many of those asked were fitted on."""
    rows, data, members = _split_with_a_long_question(tmp_path)
    with caplog.at_level("WARNING"):
        assert calibrate(members, "gsm8k", str(data), limit=2, progress=False).fitted.questions == 2
    assert "1 of 3 questions left out" in caplog.text and "asked" not in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING"):
        assert calibrate(members, "gsm8k", str(data), limit=10, progress=False).fitted.questions == 3
    assert "no more questions in the split: fitted on 3 of the 10 asked" in caplog.text


def test_an_arc_dev_question_in_the_test_split_with_other_options_is_left_out(tmp_path: Path) -> None:
    """ARC's dev question Mercury_7175455 is in the test split too, its options differing by a plural:
    compared with its options, it was fitted on. Test questions are compared by their text."""
    def arc(i: int, stem: str, last: str) -> str:
        choices = [{"label": label, "text": text} for label, text in zip("ABCD", ["rock", "sand", "clay", last])]
        return json.dumps({"id": f"q{i}", "question": {"stem": stem, "choices": choices}, "answerKey": "A"}) + "\n"

    dev = tmp_path / "dev.jsonl"
    dev.write_text("".join(arc(i, f"Which soil holds water best, case {i}?", "silt") for i in range(30))
                   + arc(30, "Which  layer of Earth\nis the thinnest?", "crust"))
    (tmp_path / "test.jsonl").write_text(arc(99, "Which layer of Earth is the thinnest?", "crusts"))
    _, records, _ = calibration_records("arc-challenge", str(dev), 100)
    assert records and "q30" not in [r.id for r in records]


def test_a_profile_refused_for_a_server_member_says_to_name_the_model_it_serves(tmp_path: Path) -> None:
    """A profile fitted with zoo names, used with the same model behind vLLM (`vllm:http://host:8000`,
    known by its address), was refused with "calibrate again for these members", which would tie the
    profile to host:port. The error says to name the model after '#', a spelling that is taken."""
    path = _profile(tmp_path, ["qwen2.5-coder-0.5b-instruct", "b"], [0.8, 0.2], drafter="b")
    for server in ("vllm:http://gpu:8000", "vllm:http://gpu:8000#Qwen/Qwen2.5-Coder-0.5B-Instruct"):
        with pytest.raises(InvalidRequestError, match="add '#<profile member name>', e.g. "
                                                      "vllm:http://gpu:8000#qwen2.5-coder-0.5b-instruct"):
            apply_profile([server, "b"], {"profile": str(path)})
    named = apply_profile(["vllm:http://gpu:8000#qwen2.5-coder-0.5b-instruct", "b"], {"profile": str(path)})
    assert named["weights"] == [0.8, 0.2]
    with pytest.raises(InvalidRequestError, match="calibrate again for these members"):
        apply_profile(["c", "b"], {"profile": str(path)})


def test_calibrate_refuses_to_write_the_profile_over_its_data(train_file: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`--out` naming the `--data` file (another spelling of it too) overwrote the training split."""
    before = train_file.read_text()
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        for out in (train_file, tmp_path / "." / train_file.name):
            assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "1",
                         "--out", str(out), "--no-progress"]) == 2
            assert "would overwrite it" in capsys.readouterr().err
    assert train_file.read_text() == before


def test_a_tilde_after_an_equals_sign_is_the_home_folder(train_file: Path, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibrate --out=~/p.json` (the shell expands no ~ after '=') was refused: "the folder ~ does
    not exist"; `eval --out=~/run` wrote into a folder named ~ under the current one."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    data = tmp_path / "gsm8k.jsonl"
    data.write_text(json.dumps({"question": "1 + 1?", "answer": "#### 2"}) + "\n")
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "1",
                     "--out=~/p.json", "--no-progress"]) == 0
        assert main(["eval", "--bench", "gsm8k", "--data", str(data), "--models", "a,b", "--max-new-tokens", "2",
                     "--no-progress", "--limit", "1", "--out=~/run"]) == 0
    assert EnsembleProfile.load(home / "p.json").members == ["a", "b"]
    assert (home / "run" / "samples.jsonl").exists() and not (tmp_path / "~").exists()


def test_an_explicit_drafter_weight_wins_over_the_profiles_weights(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """`--drafter-weight N` / drafter_weight= with a profile was silently ignored: the profile's
    weights filled `weights`, which drafter_weight only stands in for. An explicit option wins."""
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    path = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b")
    engine = EnsembleEngine([a, b], profile=str(path), drafter_weight=5)
    assert engine.options.weights is None and engine.options.drafter == 1 and engine.options.drafter_confidence == 0.7
    weights = engine.generate("Hello", max_new_tokens=2).stats.member_weights
    assert weights == {"b": pytest.approx(5 / 6, abs=1e-4), "a": pytest.approx(1 / 6, abs=1e-4)}
    assert EnsembleEngine([a, b], profile=str(path)).options.weights == [0.3, 0.7]
    with registered_members([a, b]):
        assert main(["run", "--models", "a,b", "--profile", str(path), "--drafter-weight", "3",
                     "--max-new-tokens", "2", "--events", "Hello"]) == 0
    finish = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert finish["stats"]["member_weights"] == {"b": pytest.approx(0.75), "a": pytest.approx(0.25)}


def test_a_mistyped_data_setting_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A SAFE_ENSEMBLE_DATA with a typo: calibrate said only "no data folder found: give --data"."""
    monkeypatch.setenv("SAFE_ENSEMBLE_DATA", str(tmp_path / "shraed"))
    with pytest.raises(InvalidRequestError, match=r"SAFE_ENSEMBLE_DATA=.*shraed is no folder\) or pass --data"):
        calibration_records("gsm8k", None, 10)


def test_the_same_model_twice_is_refused_before_loading_any(train_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`calibrate --models X,X` (or X,llamacpp:X) loaded every member before "needs distinct members"."""
    import shared_engine.calibration as calibration

    def no_load(spec: str) -> HFMember:
        raise AssertionError(f"{spec} loaded")

    monkeypatch.setattr(calibration, "load_member", no_load)
    for models in (["a", "a"], ["qwen2.5-coder-0.5b-instruct", "llamacpp:qwen2.5-coder-0.5b-instruct"]):
        with pytest.raises(InvalidRequestError, match="needs distinct members"):
            calibrate(models, "gsm8k", str(train_file), limit=1, progress=False)


def _interrupted_member(name: str, at_read: int) -> HFMember:
    """A toy member whose ``at_read``-th teacher-forced read (1-based) is a Ctrl-C."""
    reads = [0]

    def sync(inner: Any, ids: list[int], start: int) -> torch.Tensor:
        reads[0] += 1
        if reads[0] == at_read:
            raise KeyboardInterrupt
        return inner.sync(ids, start)

    return _member_reading(name, sync)


def test_ctrl_c_fits_on_the_questions_read(train_file: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during calibrate lost every question read (20 min at the default 50) without a word.
    The questions read are fitted and saved, with a warning; before the first, nothing is written.
    Then the partial fit exited 0 with the summary of a full one, and replaced a good profile already at
    --out: now it exits 130 (as an interrupted eval), says "interrupted after k of n", the profile records
    it, and an existing file at --out is kept, the partial fit written beside it."""
    out = tmp_path / "p.json"

    def calibrate_cli(at_read: int) -> int:
        with registered_members([toy_member("a", "byte_level", "llama", 1), _interrupted_member("b", at_read)]):
            with caplog.at_level("WARNING"):
                return main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "4",
                             "--out", str(out), "--no-progress"])

    assert calibrate_cli(1) == 130  # before the first question: nothing
    assert "no profile was written" in capsys.readouterr().err and not out.exists()

    assert calibrate_cli(2) == 130  # no file at --out: the partial fit goes there, marked
    partial = EnsembleProfile.load(out).fitted
    assert (partial.questions, partial.asked, partial.interrupted) == (1, 4, True)
    assert "interrupted after 1 of 4 questions" in caplog.text
    printed = capsys.readouterr()
    assert printed.out.startswith(f"interrupted after 1 of 4 questions: {out}: weights ")
    assert f"is in {out}, marked interrupted" in printed.err

    before = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b").read_bytes()
    out.write_bytes(before)  # an earlier, full profile at --out
    assert calibrate_cli(3) == 130
    beside = tmp_path / "p.interrupted.json"
    assert out.read_bytes() == before  # kept, not replaced by a fit on 2 questions
    partial = EnsembleProfile.load(beside).fitted
    assert (partial.questions, partial.asked, partial.interrupted) == (2, 4, True)
    printed = capsys.readouterr()
    assert printed.out.startswith(f"interrupted after 2 of 4 questions: {beside}: weights ")
    assert f"the profile already at {out} is kept" in printed.err
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith((".p.", "p."))) == \
        ["p.interrupted.json", "p.json"]  # written whole: no temporary left

    assert calibrate_cli(99) == 0  # not interrupted: replaces --out as before, asked recorded
    whole = EnsembleProfile.load(out).fitted
    assert (whole.questions, whole.asked, whole.interrupted) == (4, 4, False)
    assert "interrupted" not in capsys.readouterr().out


def test_profile_files_small_faults(tmp_path: Path) -> None:
    """A profile saved with a UTF-8 BOM (a Windows editor) failed to load ("Invalid JSON"); one of a
    newer version was read as if it were this one (or refused for its new fields), also written as "2" or 2.0."""
    path = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b")
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert EnsembleProfile.load(path).weights == [0.3, 0.7]
    values = json.loads(path.read_text(encoding="utf-8-sig"))
    path.write_text(json.dumps({**values, "version": 2, "new_field": 1}))
    with pytest.raises(InvalidRequestError, match="profile version 2 is newer than this safe-ensemble reads"):
        EnsembleProfile.load(path)
    # written as a string or a float (a hand edit, another writer), version 2 was read as this version
    for newer in ("2", 2.0, " 2 "):
        path.write_text(json.dumps({**values, "version": newer}))
        with pytest.raises(InvalidRequestError, match="profile version 2 is newer than this safe-ensemble reads"):
            EnsembleProfile.load(path)
    for odd in ("two", 1.5, [1]):
        path.write_text(json.dumps({**values, "version": odd, "new_field": 1}))
        with pytest.raises(InvalidRequestError, match="profile version must be a whole number .*reads 1"):
            EnsembleProfile.load(path)
    for same in ("1", 1.0, 1):
        path.write_text(json.dumps({**values, "version": same}))
        assert EnsembleProfile.load(path).version == 1


def test_a_drafter_other_than_the_profiles_is_told_its_confidence_was_fitted_for_another(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """--drafter other than the profile's kept the profile's drafter_confidence, fitted for another
    drafter, without a word."""
    path = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b")
    with caplog.at_level("WARNING"):
        # no other method reads drafter_confidence: nothing to tell (review 2026-12-07c)
        others = [{"drafter": "a", "method": m} for m in ("every-token", "gac-threshold", "adafuse", "single")]
        for quiet in ({"drafter": "b"}, {"drafter": 1}, {"drafter": "a", "drafter_confidence": 0.4}, {}, *others):
            apply_profile(["a", "b"], {"profile": str(path), **quiet})
        assert "fitted for drafter" not in caplog.text
        for drafter in ("a", 0, "llamacpp:a", "auto"):
            assert apply_profile(["a", "b"], {"profile": str(path), "drafter": drafter})["drafter_confidence"] == 0.7
    assert caplog.text.count("its drafter_confidence 0.7 was fitted for drafter b") == 4


def test_a_profile_version_below_1_is_refused(tmp_path: Path) -> None:
    """"version": 0 or -1 (no safe-ensemble writes one) loaded as this version and the engine used it."""
    path = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b")
    values = json.loads(path.read_text())
    for below in (0, -1, "0", -1.0):
        path.write_text(json.dumps({**values, "version": below}))
        with pytest.raises(InvalidRequestError, match=r"profile version must be 1 or more \(this safe-ensemble "
                                                      rf"reads 1\), got {below!r}"):
            EnsembleProfile.load(path)


def test_a_profile_whose_fit_was_interrupted_is_warned_about_where_it_is_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A profile an interrupted calibrate wrote (fitted.interrupted, a287da2) was applied through
    profile= / --profile without a word, as if fitted on every question."""
    path = tmp_path / "partial.json"
    fitted = FitInfo(bench="gsm8k", data="train.jsonl", questions=3, asked=40, interrupted=True, method="test")
    EnsembleProfile(members=["a", "b"], weights=[0.3, 0.7], drafter="b", fitted=fitted).save(path)
    full = _profile(tmp_path, ["a", "b"], [0.3, 0.7], drafter="b")
    toys = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    with caplog.at_level("WARNING"):
        apply_profile(["a", "b"], {"profile": str(full)})
        assert "interrupted" not in caplog.text  # a complete fit: nothing to say
        engine = EnsembleEngine(toys, profile=str(path))
    assert engine.options.weights == [0.3, 0.7]  # still applied: the user chose it
    assert caplog.text.count(f"profile {path}: its fit was interrupted after 3 of 40 questions (a partial fit)") == 1
    caplog.clear()
    unknown = fitted.model_copy(update={"asked": None})  # interrupted, the questions asked not recorded
    EnsembleProfile(members=["a", "b"], weights=[0.3, 0.7], drafter="b", fitted=unknown).save(path)
    with caplog.at_level("WARNING"):
        apply_profile(["a", "b"], {"profile": str(path)})
    assert "its fit was interrupted after 3 questions (a partial fit)" in caplog.text


def test_the_calibrate_summary_shows_a_small_weight_and_help_names_calibrate(
        train_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The summary printed weights with .3f: 0.000189 read 0.000; `safe-ensemble --help` described
    every command but calibrate."""
    import shared_engine.calibration as calibration

    fitted = FitInfo(bench="gsm8k", data=str(train_file), questions=1, method="test")
    profile = EnsembleProfile(members=["a", "b"], weights=[0.999811, 0.000189], drafter="a", fitted=fitted)
    monkeypatch.setattr(calibration, "calibrate", lambda *args, **kwargs: profile)
    assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--out", str(tmp_path / "p.json")]) == 0
    assert "b=0.000189" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "safe-ensemble calibrate" in " ".join(capsys.readouterr().out.split("positional arguments")[0].split())


def test_calibrate_says_while_its_members_load(train_file: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """calibrate printed nothing while its members loaded (26 s for the zoo pair, before the first bar);
    bench, eval, run and serve say "loading N members ... loaded in X s". --no-progress keeps it quiet, as eval."""
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "1",
                     "--out", str(tmp_path / "p.json")]) == 0
        err = capsys.readouterr().err
        assert "loading 2 members (a, b) ...\n" in err and "\nloaded in " in err
        assert err.index("loading 2 members") < err.index("calibrate gsm8k")  # before the questions' bar
        assert main(["calibrate", "--models", "a,b", "--data", str(train_file), "--limit", "1",
                     "--out", str(tmp_path / "p.json"), "--no-progress"]) == 0
        assert "loading" not in capsys.readouterr().err


def test_zoo_names_are_read_on_transformers_and_the_profile_says_how_each_member_was_read(
        train_file: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """calibrate read zoo names on their default backend, llama.cpp, whose rows hold 20 exact entries
    (SmolLM2's answer: -96.4 nats against transformers' -88.3), while the profile said "top-64
    distributions". Names without a prefix now load on transformers (exact), a top-K member is warned
    about, and the profile's method names each member's backend and what of its distribution was exact."""
    from shared_engine import calibration
    from tests.test_remote_members import TopKOfHF

    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    asked: list[str] = []

    def load(spec: str, progress: bool = True) -> HFMember:
        asked.append(spec)
        return a if "qwen" in spec else b

    monkeypatch.setattr(calibration, "load_member", load)
    zoo = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
    profile = calibrate(zoo, "gsm8k", str(train_file), limit=1, progress=False)
    assert asked == [f"transformers:{name}" for name in zoo]
    assert "qwen2.5-coder-0.5b-instruct (transformers, full distributions)" in profile.fitted.method
    calibrate(zoo, "gsm8k", str(train_file), limit=1, progress=False, backend="llamacpp")  # asked for: as asked
    assert asked[2:] == [f"llamacpp:{name}" for name in zoo]

    with caplog.at_level("WARNING"):
        profile = calibrate([a, TopKOfHF(b, 10)], "gsm8k", str(train_file), limit=1, progress=False)
    assert "member b gives only its top-10 log-probabilities per position" in caplog.text
    assert "b (TopKOfHF, top-10 per position exact, the rest spread evenly)" in profile.fitted.method
    assert "a (transformers, full distributions)" in profile.fitted.method
