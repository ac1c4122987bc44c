"""A member weighted 0 has no say in the answer: it adds no fusion candidates, is never the
automatic drafter, does not commit its own tokens through the confidence gate, and never leads an
AdaFuse round."""

from __future__ import annotations

import pytest

from shared_engine import EnsembleEngine
from tests.test_auto_drafter import FEW_SHOT, answers_member
from tests.toy import toy_member

PROMPTS = ["Sofia visited Berlin", "Q: What is 3 + 4?", "Hello 😀 世界", "def add(a, b):", "Lena said:"]


@pytest.mark.parametrize("method", ["every-token", "safe"])
def test_a_member_weighted_0_adds_no_fusion_candidates(method: str) -> None:
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    c = toy_member("c", "metaspace", "llama", 5)
    three = EnsembleEngine([a, b, c], method=method, drafter=0, weights=[1, 1, 0])
    two = EnsembleEngine([a, b], method=method, drafter=0, weights=[1, 1])
    for prompt in PROMPTS:
        assert three.generate(prompt, max_new_tokens=40).text == two.generate(prompt, max_new_tokens=40).text


def test_drafter_auto_never_picks_a_member_weighted_0() -> None:
    good, plain = answers_member("fits", "metaspace"), toy_member("random", "byte_level", "llama", seed=2)
    stats = EnsembleEngine([plain, good], weights=[1, 0]).generate(FEW_SHOT, max_new_tokens=4).stats
    assert stats.drafter == "random"
    stats = EnsembleEngine([good, plain], weights=[0, 1]).generate(FEW_SHOT, max_new_tokens=4).stats
    assert stats.drafter == "random"  # also where no choice is made (one member has a say)


def test_a_named_drafter_weighted_0_only_proposes() -> None:
    """Its confidence gate is off: the others decide every token, as with drafter_confidence=None."""
    good, plain = answers_member("fits", "metaspace"), toy_member("random", "byte_level", "llama", seed=2)
    gated = EnsembleEngine([plain, good], drafter="fits", weights=[1, 0])
    ungated = EnsembleEngine([plain, good], drafter="fits", weights=[1, 0], drafter_confidence=None)
    result = gated.generate(FEW_SHOT, max_new_tokens=12)
    assert result.text == ungated.generate(FEW_SHOT, max_new_tokens=12).text
    assert result.stats.drafter == "fits"


def test_a_member_weighted_0_never_leads_an_adafuse_round() -> None:
    good, plain = answers_member("fits", "metaspace"), toy_member("random", "byte_level", "llama", seed=2)
    engine = EnsembleEngine([plain, good], method="adafuse", vote="uncertain", drafter=0, weights=[1, 0])
    result = engine.generate(FEW_SHOT, max_new_tokens=12, keep_events=True)
    leaders = {e.leader for e in result.events if e.type == "adafuse"}
    assert leaders == {"random"}


def test_a_member_weighted_0_neither_proposes_nor_scores_in_an_adafuse_vote() -> None:
    """vote='always' (the default): a member weighted 0 offered its spans to the vote, and one could
    win (the answer then differed from the ensemble without it); it also scored every candidate,
    where 0 * an infinite NLL (a top-K backend) would have made every score NaN."""
    good, other = answers_member("fits", "metaspace"), answers_member("silent", "byte_level")
    plain = toy_member("random", "byte_level", "llama", seed=2)
    three = EnsembleEngine([plain, good, other], method="adafuse", drafter=0, weights=[1, 1, 0], threshold=1.0)
    two = EnsembleEngine([plain, good], method="adafuse", drafter=0, weights=[1, 1], threshold=1.0)
    result = three.generate(FEW_SHOT, max_new_tokens=16, keep_events=True)
    assert result.text == two.generate(FEW_SHOT, max_new_tokens=16).text
    candidates = [c for e in result.events if e.type == "adafuse" for c in e.candidates]
    assert candidates and all("silent" not in c.proposed_by and "silent" not in c.member_nll for c in candidates)


def test_weights_auto_that_give_the_drafter_0_follow_the_same_rules(monkeypatch: pytest.MonkeyPatch) -> None:
    """weights='auto' gives exactly 0 to a member with an infinite prompt loss (a top-K backend that
    gave a prompt token no probability): drafter='auto' moves to a weighted member; a named drafter
    only proposes (no confidence gate)."""
    import torch

    import shared_engine.engine as engine_module
    from shared_engine.auto_weights import AutoWeights

    async def drafter_weighs_nothing(members, *_):  # noqa: ANN001, ANN002, ANN202 - in decoding order
        return AutoWeights(torch.tensor([0.0] + [1.0 / (len(members) - 1)] * (len(members) - 1)), [1.0] * len(members))

    monkeypatch.setattr(engine_module, "auto_weights", drafter_weighs_nothing)
    good, plain = answers_member("fits", "metaspace"), toy_member("random", "byte_level", "llama", seed=2)
    stats = EnsembleEngine([plain, good], weights="auto").generate(FEW_SHOT, max_new_tokens=4).stats
    assert stats.drafter == "random" and stats.member_weights == {"random": 1.0, "fits": 0.0}
    gated = EnsembleEngine([plain, good], drafter="fits", weights="auto").generate(FEW_SHOT, max_new_tokens=12)
    ungated = EnsembleEngine([plain, good], drafter="fits", weights="auto",
                             drafter_confidence=None).generate(FEW_SHOT, max_new_tokens=12)
    assert gated.text == ungated.text
