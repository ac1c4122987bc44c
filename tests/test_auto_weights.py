"""weights="auto" on toy models: the member that fits the prompt gets the larger weight, whichever
tokenizer it has; the prefill is not repeated; the weights are reported in the finish stats."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.auto_weights import prefill_nlls
from shared_engine.members import HFMember
from shared_engine.members.chat import normalize_messages
from shared_engine.weighting import content_spans, packllm_weights, tokens_inside
from tests.toy import byte_level_tokenizer, fitted_member, tiny_llama, toy_member

PROMPT = "Sofia counted 42 apples; Maria counted 17 books."


@pytest.mark.parametrize("fits", ["byte_level", "metaspace"])
def test_the_member_that_fits_the_prompt_weighs_more(fits: str) -> None:
    other = "metaspace" if fits == "byte_level" else "byte_level"
    good = fitted_member("fits", fits, PROMPT)
    plain = toy_member("random", other, "llama" if other == "byte_level" else "gpt2", seed=2)
    for members in ([good, plain], [plain, good]):  # drafter first, then verifier first
        engine = EnsembleEngine(members, weights="auto")
        result = engine.generate(PROMPT, max_new_tokens=4)
        weights, nll = result.stats.member_weights, result.stats.prompt_nll_per_byte
        assert set(weights) == {"fits", "random"} and sum(weights.values()) == pytest.approx(1.0, abs=1e-4)
        assert nll["fits"] < nll["random"]
        assert weights["fits"] > 0.9


def test_auto_weights_match_packllm_on_the_measured_losses() -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    engine = EnsembleEngine(members, weights="auto", weights_temperature=20.0)
    stats = engine.generate(PROMPT, max_new_tokens=2).stats
    per_byte = [stats.prompt_nll_per_byte["a"], stats.prompt_nll_per_byte["b"]]
    # The reference unit: bytes per drafter token over the drafter's tokens inside the content.
    drafter = members[0]
    ids = drafter.prompt_ids(normalize_messages(PROMPT))
    pieces = [drafter.table.pieces[t] for t in ids]
    lengths = [len(p) for p in pieces]
    scored = tokens_inside(pieces, content_spans(drafter.table.to_bytes(ids), [PROMPT]))
    bytes_per_token = sum(lengths[i] for i in scored) / len(scored)
    expected = packllm_weights([v * bytes_per_token for v in per_byte], temperature=20.0)
    assert [stats.member_weights["a"], stats.member_weights["b"]] == pytest.approx(expected, abs=1e-4)
    assert 0.55 < expected[0] < 0.9  # a real contest, not a rounding artefact


def test_auto_weights_repeat_no_prefill_and_change_only_weights() -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    fixed = EnsembleEngine(members).generate(PROMPT, max_new_tokens=6)
    assert fixed.stats.member_weights == pytest.approx({"a": 2 / 3, "b": 1 / 3}, abs=1e-4)  # SAFE's drafter_weight 2
    assert fixed.stats.prompt_nll_per_byte == {}
    schedule = "fixed"  # every round drafts 5 and is verified: the first block carries the verifier's prompt
    auto = EnsembleEngine(members, weights="auto", weights_temperature=20.0,
                          draft_schedule=schedule).generate(PROMPT, max_new_tokens=6)
    given = [auto.stats.member_weights["a"], auto.stats.member_weights["b"]]
    same = EnsembleEngine(members, weights=given, draft_schedule=schedule).generate(PROMPT, max_new_tokens=6)
    assert same.text == auto.text
    # The scored prefill IS the prefill: the drafter runs no extra forward; a verifier reads its
    # prompt in a forward of its own instead of together with the first draft block (same tokens).
    assert auto.stats.forward_passes["a"] == same.stats.forward_passes["a"]
    assert auto.stats.forward_passes["b"] == same.stats.forward_passes["b"] + 1


def test_chunked_prefill_gives_the_same_nlls_as_one_forward() -> None:
    member = toy_member("a", "byte_level", "llama", 1)
    ids = member.prompt_ids(normalize_messages(PROMPT * 3))
    whole = prefill_nlls(member.new_session(), ids, chunk=len(ids))
    chunked_session = member.new_session()
    chunked = prefill_nlls(chunked_session, ids, chunk=7)
    assert chunked.shape == (len(ids) - 1,)
    assert torch.allclose(whole, chunked, atol=1e-4)
    assert chunked_session.ids == ids  # the session holds the prompt for the first round


def test_auto_weights_with_a_single_member_or_bad_values() -> None:
    from shared_engine.errors import InvalidRequestError

    engine = EnsembleEngine([toy_member("a")], method="single", weights="auto")
    assert engine.generate(PROMPT, max_new_tokens=2).stats.member_weights == {"a": 1.0}
    with pytest.raises(InvalidRequestError):
        EnsembleEngine([toy_member("a"), toy_member("b")], weights="best")
    with pytest.raises(InvalidRequestError):
        EnsembleEngine([toy_member("a"), toy_member("b")], weights="auto", weights_temperature=0)


def test_cli_weights_auto_reaches_the_engine_and_labels_the_run() -> None:
    from shared_engine.cli import build_parser
    from shared_engine.engine_args import engine_from_args
    from shared_engine.evaluation.compare import run_label

    args = build_parser().parse_args(["run", "--models", "a,b", "--weights", "auto", "--weights-temperature",
                                      "2", "hi"])
    engine = engine_from_args(args, "safe")  # members load on first request
    assert (engine.options.weights, engine.options.weights_temperature) == ("auto", 2.0)
    summary = {"method": "safe", "models": ["a", "b"], "engine_options": engine.options.model_dump()}
    assert run_label(summary) == "safe (a+b) drafter=auto dc=0.5 w=auto"  # SAFE's defaults are part of the run


class _BrokenSession:
    """A session whose server is down: every sync fails the way a remote member's does."""

    def __init__(self, name: str) -> None:
        self.name, self.ids, self.num_forwards, self.last_sync = name, [], 0, (0, 0)

    def sync(self, target: list[int], first_row: int) -> torch.Tensor:
        from shared_engine.errors import MemberError

        raise MemberError(self.name, "http://127.0.0.1:9", "connection refused")

    def step(self, token: int) -> torch.Tensor:
        return self.sync(self.ids + [token], len(self.ids) + 1)

    def rows_at(self, target: list[int], positions: list[int]) -> dict[int, torch.Tensor]:
        return {p: row for p, row in zip(positions, self.sync(target, min(positions)))}


class _BrokenMember:
    """A toy member whose sessions fail (the rest of the Member interface is the toy's)."""

    def __init__(self, member: HFMember) -> None:
        self._member = member
        self.name, self.table, self.context_window = "broken", member.table, member.context_window
        self.stop_strings, self.capabilities, self.eos_ids = member.stop_strings, member.capabilities, member.eos_ids

    def prompt_ids(self, messages: list) -> list[int]:
        return self._member.prompt_ids(messages)

    def new_session(self) -> _BrokenSession:
        return _BrokenSession(self.name)

    async def run(self, fn, *args):  # noqa: ANN001, ANN202
        return fn(*args)


def test_a_member_failing_while_scoring_the_prompt_is_handled_by_the_round() -> None:
    members = [toy_member("a", "byte_level", "llama", 1), _BrokenMember(toy_member("b", "metaspace", "gpt2", 2))]
    engine = EnsembleEngine(members, weights="auto", on_member_failure="degrade")
    result = engine.generate(PROMPT, max_new_tokens=3, keep_events=True)
    finish = result.events[-1]
    assert finish.type == "finish" and "broken" in finish.failed_members  # dropped by the round
    assert result.stats.member_weights == {"a": 1.0}  # the configured 0.5/0.5, renormalised without "broken"
    assert result.stats.tokens == 3
    from shared_engine.errors import MemberError

    with pytest.raises(MemberError, match="connection refused"):
        EnsembleEngine(members, weights="auto").generate(PROMPT, max_new_tokens=3)


def test_every_member_scores_the_first_word_of_a_message() -> None:
    """A token carrying the space before the content (" Sofia" after "User:", SentencePiece's
    "▁Sofia") lay not wholly inside it and was never scored: the members scored different words, and
    a one-word message fell back to the configured weights (nan per byte)."""
    plain_tokenizer = copy.deepcopy(byte_level_tokenizer())
    plain_tokenizer.chat_template = None  # a base model: the plain "User: ..." prompt
    members = [toy_member("a", "byte_level", "llama", 1), HFMember("plain", tiny_llama(byte_level_tokenizer(), 3),
                                                                    plain_tokenizer),
               toy_member("b", "metaspace", "gpt2", 2)]
    for member in members:
        ids = member.prompt_ids(normalize_messages("Hello Sofia counted apples"))
        pieces = [member.table.pieces[t] for t in ids]
        scored = b"".join(pieces[i] for i in tokens_inside(pieces, content_spans(b"".join(pieces),
                                                                                  ["Hello Sofia counted apples"])))
        assert scored.strip() == b"Hello Sofia counted apples", (member.name, scored)
    stats = EnsembleEngine(members[:2], weights="auto").generate("Sofia", max_new_tokens=1).stats
    assert all(math.isfinite(v) for v in stats.prompt_nll_per_byte.values())
    assert stats.member_weights["plain"] not in (pytest.approx(1 / 3), pytest.approx(2 / 3))  # not the fallback


def test_a_member_with_a_nan_fit_falls_back_to_the_configured_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN prompt fit (a member's NaN logits) raised out of weights='auto' and failed the request."""
    import shared_engine.auto_weights as auto
    from shared_engine.weighting import TextFit

    real = auto.prompt_fit

    def nan_for_b(member, *args):  # noqa: ANN001, ANN002, ANN202
        fit = real(member, *args)
        return TextFit(math.nan, fit.num_bytes, fit.num_tokens) if member.name == "b" else fit

    monkeypatch.setattr(auto, "prompt_fit", nan_for_b)
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    stats = EnsembleEngine(members, weights="auto").generate(PROMPT, max_new_tokens=2).stats
    assert stats.member_weights == pytest.approx({"a": 2 / 3, "b": 1 / 3}, abs=1e-4)
