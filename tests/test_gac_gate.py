"""gac-threshold's gate reads the drafter's probability of the token it drafted (hunt 2026-12-07c).

It read the row's maximum, the drafter's top choice before a JSON constraint or the loop guard picked
the token: under ``response_format`` the drafter was "sure" (its top key, p 0.74) of a token it was not
allowed to write, and the token it did write (p 0.0006 on the toy pair) was committed without the
other members. Here every token committed without them has a drafter probability >= the threshold."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.decoding import round as decoding_round
from shared_engine.policies import Policy
from tests.test_engine import QUESTION, trained_member


@pytest.mark.parametrize("options", [{"response_format": {"type": "json_object"}}, {}])
def test_no_token_below_the_gate_is_committed_without_the_others(monkeypatch: pytest.MonkeyPatch,
                                                                  options: dict[str, Any]) -> None:
    unverified: list[float] = []
    gate: list[bool] = []  # the gate's last answer: False = committed without the others
    commit_whole, needs_verification = decoding_round._commit_whole, Policy.needs_verification

    def gating(self: Policy, read: Any) -> bool:
        gate.append(needs_verification(self, read))
        return gate[-1]

    def recording(state: Any, draft: Any) -> Any:
        if gate and not gate[-1]:
            unverified.append(float(torch.softmax(draft.logits[0].float(), -1)[draft.ids[0]]))
        gate.clear()
        return commit_whole(state, draft)

    monkeypatch.setattr(Policy, "needs_verification", gating)
    monkeypatch.setattr(decoding_round, "_commit_whole", recording)
    pair = [trained_member("metaspace"), trained_member("byte_level")]
    result = EnsembleEngine(pair, method="gac-threshold", gate_threshold=0.5, max_new_tokens=12).generate(
        QUESTION, **options)
    assert result.stats.tokens > 0 and unverified, result
    assert min(unverified) >= 0.5, unverified
