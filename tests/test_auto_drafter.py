"""drafter="auto" on toy models: the member that predicts the prompt's example answers drafts,
whichever position and tokenizer it has; the fit is exact, cached per prompt prefix, and reported."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared_engine import EnsembleEngine
from shared_engine.auto_weights import (
    FitCache,
    answer_tokens,
    answers_fit,
    choose_drafter,
    example_answers,
    prefill_nlls,
)
from shared_engine.errors import InvalidRequestError
from shared_engine.members import HFMember
from shared_engine.members.chat import normalize_messages
from tests.eval_files import gsm8k_file
from tests.toy import fitted_member, registered_members, toy_member

FEW_SHOT = [
    {"role": "user", "content": "What did Sofia count?"},
    {"role": "assistant", "content": "Sofia counted 42 apples."},
    {"role": "user", "content": "And Maria?"},
    {"role": "assistant", "content": "Maria counted 17 books."},
    {"role": "user", "content": "And Pedro?"},
]


def answers_member(name: str, tokenizer: str) -> HFMember:
    """A tiny model trained on the few-shot prompt: it predicts the example answers far better than a
    random model of the same size."""
    return fitted_member(name, tokenizer, FEW_SHOT)


def _random(tokenizer: str) -> HFMember:
    return toy_member("random", tokenizer, "llama" if tokenizer == "byte_level" else "gpt2", seed=2)


@pytest.mark.parametrize("fits", ["byte_level", "metaspace"])
def test_the_member_that_predicts_the_example_answers_drafts(fits: str) -> None:
    good, plain = answers_member("fits", fits), _random("metaspace" if fits == "byte_level" else "byte_level")
    chosen = EnsembleEngine([good, plain], drafter="fits").generate(FEW_SHOT, max_new_tokens=6)
    for members in ([good, plain], [plain, good]):  # listed first, then listed second
        result = EnsembleEngine(members, drafter="auto").generate(FEW_SHOT, max_new_tokens=6)
        stats = result.stats
        assert stats.drafter == "fits"
        assert stats.answer_nll_per_byte["fits"] < stats.answer_nll_per_byte["random"]
        assert stats.member_weights == pytest.approx({"fits": 2 / 3, "random": 1 / 3}, abs=1e-4)  # dw follows
        assert result.text == chosen.text  # exactly the run with that drafter named
        assert stats.prompt_tokens == len(good.prompt_ids(normalize_messages(FEW_SHOT)))


def test_given_weights_stay_with_their_members() -> None:
    good, plain = answers_member("fits", "metaspace"), _random("byte_level")
    stats = EnsembleEngine([plain, good], drafter="auto", weights=[1, 3]).generate(FEW_SHOT, max_new_tokens=2).stats
    assert stats.drafter == "fits"
    assert stats.member_weights == pytest.approx({"fits": 0.75, "random": 0.25}, abs=1e-5)


@pytest.mark.parametrize("tokenizer", ["byte_level", "metaspace"])
def test_answers_fit_is_the_full_prefill_nll_of_the_answer_tokens(tokenizer: str) -> None:
    member = _random(tokenizer)
    ids = member.prompt_ids(normalize_messages(FEW_SHOT))
    scored = answer_tokens(member, ids, example_answers(normalize_messages(FEW_SHOT)))
    spelled = member.table.to_bytes([ids[i] for i in scored]).decode()
    assert "42 apples" in spelled and "17 books" in spelled and "Pedro" not in spelled and "Maria?" not in spelled
    assert scored != list(range(scored[0], scored[-1] + 1))  # two runs of tokens, scored apart
    reference = prefill_nlls(member.new_session(), ids)  # entry i - 1 is token i's
    fit = answers_fit(member, member.new_session(), ids, scored)
    assert fit.nll == pytest.approx(float(sum(reference[i - 1] for i in scored)), rel=1e-4)
    assert fit.num_bytes == len(spelled.encode()) and fit.num_tokens == len(scored)
    cache_ = FitCache()
    answers_fit(member, member.new_session(), ids, scored, cache_)
    assert answers_fit(member, member.new_session(), ids, scored, cache_) == fit  # read back, not recomputed


def test_a_fixed_few_shot_block_is_scored_once() -> None:
    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    named = EnsembleEngine([good, plain], drafter="fits").generate(FEW_SHOT, max_new_tokens=4).stats
    engine = EnsembleEngine([plain, good], drafter="auto")
    first = engine.generate(FEW_SHOT, max_new_tokens=4).stats
    other_question = FEW_SHOT[:-1] + [{"role": "user", "content": "And Lucia?"}]
    second = engine.generate(other_question, max_new_tokens=4).stats
    again = engine.generate(FEW_SHOT, max_new_tokens=4).stats
    assert first.forward_passes["fits"] > named.forward_passes["fits"]  # the scoring forwards
    assert again.forward_passes == named.forward_passes  # found in the cache: nothing scored again
    assert second.drafter == "fits" and second.answer_nll_per_byte == first.answer_nll_per_byte


def test_a_slow_choice_is_timed_and_explained_once_per_engine(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    """The seconds the choice kept the first token waiting are in the stats (0 with the drafter named), and
    a choice slower than SLOW_DRAFTER_CHOICE_S is explained once per engine: why, and how to skip it."""
    import shared_engine.engine as engine_module

    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    named = EnsembleEngine([plain, good], drafter="fits").generate(FEW_SHOT, max_new_tokens=2).stats
    assert named.drafter_choice_s == 0
    with caplog.at_level("WARNING", logger="shared_engine.engine"):
        quick = EnsembleEngine([plain, good], drafter="auto").generate(FEW_SHOT, max_new_tokens=2).stats
        assert quick.drafter_choice_s > 0 and not caplog.records  # toy members choose in well under 5 s
        monkeypatch.setattr(engine_module, "SLOW_DRAFTER_CHOICE_S", 0.0)
        engine = EnsembleEngine([plain, good], drafter="auto")
        for _ in range(2):
            assert engine.generate(FEW_SHOT, max_new_tokens=2).stats.drafter == "fits"
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert "drafter='auto' took" in message and "name the drafter" in message and "profile" in message
    assert "fit_cache=FILE keeps them for the next process" in message  # no file was given


def test_without_example_answers_the_first_member_drafts() -> None:
    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    stats = EnsembleEngine([plain, good], drafter="auto").generate("And Pedro?", max_new_tokens=2).stats
    assert stats.drafter == "random" and stats.answer_nll_per_byte == {}
    assert stats.member_weights == pytest.approx({"random": 2 / 3, "fits": 1 / 3}, abs=1e-4)


def test_auto_drafter_needs_a_choice() -> None:
    with pytest.raises(InvalidRequestError, match="single"):
        EnsembleEngine([toy_member("a"), toy_member("b")], method="single", drafter="auto")


def test_fit_cache_is_bounded_and_keyed_by_member_and_prefix() -> None:
    from shared_engine.weighting import TextFit

    a, b = toy_member("a"), toy_member("b", seed=3)
    cache_ = FitCache(size=2)
    cache_.put(a, 1, [1, 2], TextFit(1.0, 1, 1))
    cache_.put(b, 1, [1, 2], TextFit(2.0, 1, 1))
    assert cache_.get(a, 1, [1, 2]) == TextFit(1.0, 1, 1) and cache_.get(a, 1, [1, 3]) is None
    assert cache_.get(a, 0, [1, 2]) is None
    cache_.put(a, 0, [4], TextFit(3.0, 1, 1))  # evicts the least recently read: b's
    assert cache_.get(b, 1, [1, 2]) is None and cache_.get(a, 1, [1, 2]) is not None


def test_a_growing_conversation_scores_only_its_newest_answer() -> None:
    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    grown = FEW_SHOT + [{"role": "assistant", "content": "Pedro counted 9 pens."},
                        {"role": "user", "content": "And Lucia?"}]
    named = EnsembleEngine([good, plain], drafter="fits").generate(grown, max_new_tokens=3).stats
    engine = EnsembleEngine([good, plain], drafter="auto")
    engine.generate(FEW_SHOT, max_new_tokens=3)
    stats = engine.generate(grown, max_new_tokens=3).stats
    assert stats.drafter == "fits"
    assert stats.forward_passes["fits"] == named.forward_passes["fits"] + 1  # one run scored: the new answer
    fresh = EnsembleEngine([good, plain], drafter="auto").generate(grown, max_new_tokens=3).stats
    assert fresh.answer_nll_per_byte == pytest.approx(stats.answer_nll_per_byte, rel=1e-4)  # cache changes nothing
    assert fresh.forward_passes["fits"] == named.forward_passes["fits"] + 3


def test_choose_drafter_keeps_the_configured_one_when_a_prompt_hides_the_answers() -> None:
    import asyncio

    a, b = toy_member("a"), toy_member("b", "metaspace", "gpt2", 2)
    messages = normalize_messages(FEW_SHOT)
    ids = [a.prompt_ids(messages), b.prompt_ids(messages)[:3]]  # b's prompt shows none of the answers
    choice = asyncio.run(choose_drafter([a, b], [a.new_session(), b.new_session()], ids, messages, FitCache()))
    assert choice.index is None and "none of the example answers" in choice.reason


def test_cli_drafter_auto_reaches_the_engine_and_labels_the_run() -> None:
    from shared_engine.cli import build_parser
    from shared_engine.engine_args import engine_from_args
    from shared_engine.evaluation.compare import run_label

    args = build_parser().parse_args(["run", "--models", "a,b", "--drafter", "auto", "hi"])
    engine = engine_from_args(args, "safe")
    assert engine.options.drafter == "auto"
    summary = {"method": "safe", "models": ["a", "b"], "engine_options": engine.options.model_dump()}
    assert run_label(summary) == "safe (a+b) drafter=auto dc=0.5"
    summary["engine_options"]["drafter"] = "1"
    assert run_label(summary) == "safe (a+b) drafter=b dc=0.5"


def test_safe_chooses_its_drafter_by_default_and_the_baselines_draft_with_the_first_member() -> None:
    from shared_engine.options import EngineOptions

    assert EngineOptions(method="safe").drafter == "auto"
    assert EngineOptions(method="safe", drafter=None).drafter == "auto"  # None: the method's default
    assert EngineOptions(method="safe", drafter=0).drafter == 0
    assert EngineOptions(method="every-token").drafter is None and EngineOptions(method="adafuse").drafter is None
    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    assert EnsembleEngine([plain, good]).generate(FEW_SHOT, max_new_tokens=2).stats.drafter == "fits"
    assert EnsembleEngine([plain, good], method="every-token").generate(FEW_SHOT, max_new_tokens=2).stats.drafter \
        == "random"


def test_a_drafter_given_as_a_number_on_the_command_line_is_an_index() -> None:
    """``--drafter 1`` arrives as the string "1": the member at that index, as eval's run labels read it
    (it was refused as "not a member"); a member really named "1" keeps its name."""
    from shared_engine.cli import build_parser
    from shared_engine.engine_args import engine_from_args

    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    with registered_members([plain, good]) as names:
        args = build_parser().parse_args(["run", "--models", ",".join(names), "--drafter", "1", "hi"])
        engine = engine_from_args(args, "safe")
        assert engine.generate(FEW_SHOT, max_new_tokens=2).stats.drafter == "fits"
    assert EnsembleEngine([plain, good], drafter="0").generate(FEW_SHOT, max_new_tokens=2).stats.drafter == "random"
    with pytest.raises(InvalidRequestError, match="out of range: 2 members, 0 to 1"):
        EnsembleEngine([plain, good], drafter="2")
    with pytest.raises(InvalidRequestError, match="out of range: 2 members, 0 to 1"):
        EnsembleEngine([plain, good], drafter=2)


# --------------------------------------------------------------------------- fits kept across processes


def test_fits_kept_in_a_file_are_read_by_the_next_engine_instead_of_scored_again(tmp_path: Path) -> None:
    """A second engine (another process, as far as the cache knows: its memory starts empty) finds the
    few-shot block's fits in the file: it chooses the same drafter with the same fits and pays none of
    the scoring forwards; the answer is the one the named drafter gives."""
    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    named = EnsembleEngine([good, plain], drafter="fits").generate(FEW_SHOT, max_new_tokens=4)
    path = tmp_path / "runs" / "fits.sqlite"  # its folder is created
    with EnsembleEngine([plain, good], drafter="auto", fit_cache=str(path)) as first_engine:
        first = first_engine.generate(FEW_SHOT, max_new_tokens=4)
    assert path.is_file() and first.stats.forward_passes["fits"] > named.stats.forward_passes["fits"]
    with EnsembleEngine([plain, good], drafter="auto", fit_cache=str(path)) as second_engine:
        second = second_engine.generate(FEW_SHOT, max_new_tokens=4)
    assert second.stats.drafter == "fits" and second.stats.answer_nll_per_byte == first.stats.answer_nll_per_byte
    assert second.stats.forward_passes == named.stats.forward_passes  # nothing scored
    assert second.text == first.text == named.text


def test_the_fit_file_is_keyed_by_the_model_not_its_name(tmp_path: Path) -> None:
    """Another model under the same name, a run starting elsewhere or another prompt finds nothing; a
    member with no fingerprint (a server at a URL) keeps its fits in memory only."""
    from types import SimpleNamespace

    from shared_engine.weighting import TextFit

    member, renamed = toy_member("m", seed=1), toy_member("other-name", seed=1)  # the same weights
    retrained = toy_member("m", seed=4)
    remote = SimpleNamespace(name="remote")
    writer = FitCache(path=tmp_path / "fits.sqlite")
    writer.put(member, 3, [1, 2, 3, 4], TextFit(2.5, 7, 2))
    writer.put(remote, 3, [1, 2, 3, 4], TextFit(1.0, 1, 1))
    assert writer.get(remote, 3, [1, 2, 3, 4]) == TextFit(1.0, 1, 1)  # in memory
    writer.close()
    reader = FitCache(path=tmp_path / "fits.sqlite")
    assert reader.get(member, 3, [1, 2, 3, 4]) == TextFit(2.5, 7, 2)
    assert reader.get(renamed, 3, [1, 2, 3, 4]) == TextFit(2.5, 7, 2)
    assert reader.get(retrained, 3, [1, 2, 3, 4]) is None
    assert reader.get(member, 2, [1, 2, 3, 4]) is None and reader.get(member, 3, [1, 2, 3, 5]) is None
    assert reader.get(remote, 3, [1, 2, 3, 4]) is None


def test_a_fit_file_that_cannot_be_kept_is_refused_when_the_engine_is_built(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    members = [toy_member("a"), toy_member("b", seed=3)]
    for unusable in (blocker / "fits.sqlite", blocker, tmp_path):  # under a file, not a database, a folder
        with pytest.raises(InvalidRequestError, match="fit_cache: cannot keep fits in"):
            EnsembleEngine(members, fit_cache=str(unusable))


def test_the_fit_file_is_created_by_the_first_fit_only(tmp_path: Path) -> None:
    """A run whose prompts show no example answer (zero-shot) leaves no empty file behind; a file another
    process wrote after this engine was built is read, not scored again."""
    good, plain = answers_member("fits", "byte_level"), _random("metaspace")
    path = tmp_path / "fits.sqlite"
    with EnsembleEngine([plain, good], drafter="auto", fit_cache=str(path)) as zero_shot:
        zero_shot.generate("And Pedro?", max_new_tokens=2)
    assert not path.exists()
    reader = EnsembleEngine([plain, good], drafter="auto", fit_cache=str(path))  # built before the file exists
    with EnsembleEngine([plain, good], drafter="auto", fit_cache=str(path)) as writer:
        written = writer.generate(FEW_SHOT, max_new_tokens=2)
    assert path.is_file()
    with reader:
        read = reader.generate(FEW_SHOT, max_new_tokens=2)
    assert read.stats.answer_nll_per_byte == written.stats.answer_nll_per_byte
    assert read.stats.forward_passes == EnsembleEngine([plain, good], drafter="fits").generate(
        FEW_SHOT, max_new_tokens=2).stats.forward_passes  # nothing scored


def test_a_model_fingerprint_follows_its_weights() -> None:
    import copy

    import torch

    member = toy_member("a", seed=1)
    twin = HFMember("twin", copy.deepcopy(member.model), member.tokenizer)
    assert twin.fingerprint() == member.fingerprint()
    changed = copy.deepcopy(member.model)
    with torch.no_grad():
        next(changed.parameters()).view(-1)[0] += 0.5
    assert HFMember("a", changed, member.tokenizer).fingerprint() != member.fingerprint()


def test_a_llamacpp_fingerprint_is_its_gguf_file_and_none_at_a_url(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from shared_engine.members.llamacpp import LlamaCppMember

    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF" + bytes(16))

    def fingerprint(server: object) -> str | None:
        return LlamaCppMember.fingerprint(SimpleNamespace(server=server, top_k=10))  # type: ignore[arg-type]

    assert fingerprint(None) is None  # a server at a URL: its model may change behind it
    before = fingerprint(SimpleNamespace(gguf=gguf))
    assert before is not None and str(gguf.resolve()) in before and before == fingerprint(SimpleNamespace(gguf=gguf))
    gguf.write_bytes(b"GGUF" + bytes(32))  # re-quantised in place
    assert fingerprint(SimpleNamespace(gguf=gguf)) != before


def test_eval_keeps_its_fits_beside_its_answers_and_out_of_its_config(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """So a run resumed in tiers (one process each) finds its few-shot blocks scored; where the fits
    live changes no answer, so it is not part of what makes two runs comparable."""

    import shared_engine.evaluation.cli as eval_cli
    from shared_engine.cli import main

    seen = {}

    async def fake_evaluate(engine, bench, config, out, **_):  # noqa: ANN001, ANN202 - the runner's signature
        seen.update(engine=engine, config=config, out=out)
        return {"score": 0.0, "ci95": [0.0, 0.0], "n": 0, "ensemble_rate": 0.0, "tokens_per_s": 0.0,
                "truncated": 0, "failures": 0, "skipped": {}}

    monkeypatch.setattr(eval_cli, "evaluate", fake_evaluate)
    data = gsm8k_file(tmp_path, [("1 + 1?", "2")])
    common = ["eval", "--bench", "gsm8k", "--data", str(data), "--models", "a,b", "--no-progress"]
    assert main([*common, "--out", str(tmp_path / "run")]) == 0
    assert seen["engine"].options.fit_cache == str(tmp_path / "run" / eval_cli.FITS)
    assert "fit_cache" not in seen["config"].engine_options
    assert main([*common, "--out", str(tmp_path / "run2"), "--fit-cache", str(tmp_path / "shared.sqlite")]) == 0
    assert seen["engine"].options.fit_cache == str(tmp_path / "shared.sqlite")
    assert main([*common, "--out", str(tmp_path / "run3"), "--drafter", "0"]) == 0
    assert seen["engine"].options.fit_cache is None  # no choice, nothing to keep


def test_the_drafter_choice_scores_an_example_answer_from_its_second_word_where_a_space_leads_it() -> None:
    """The rule Results measured: a token wholly inside an example answer, its leading whitespace too.
    weights='auto' scores the first word as well (dd3bf7e); applied to the drafter choice it flipped
    SQuAD's drafter from Qwen (alone 51%) to Gemma-3-270m (alone 21%), a default never measured."""
    from shared_engine.auto_weights import answer_tokens

    member = toy_member("a", "byte_level", "llama", 1)
    ids = member.table.encode_fragment("User: Question?\nAssistant: Sofia walked to the park\n")
    pieces = [member.table.pieces[t] for t in ids]
    scored = b"".join(pieces[i] for i in answer_tokens(member, ids, ["Sofia walked to the park"]))
    assert scored.strip() == b"walked to the park"
