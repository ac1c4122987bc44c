"""A stop string that cuts a token's text away entirely ends the decisions there too: the fusion
decision of that token (SAFE's and every-token's ``ensemble`` event, AdaFuse's span decision) was
still sent with no text at its position, and counted in ``stats.ensembled_tokens`` (the stop was
found in a counted token, and only positions past the counted tokens were dropped)."""
from __future__ import annotations

import pytest

from shared_engine import EnsembleEngine
from tests.toy import toy_member

CASES = [  # (method, prompt, temperature, stop): each cut a fused token's text away entirely
    ("safe", "Tom wrote about numbers", 0, [" "]),
    ("safe", "Sofia walked to the park", 0.9, ["a"]),
    ("every-token", "Tom wrote about numbers", 0, [" "]),
    ("adafuse", "Maria looked at the river", 0.9, ["e", " t"]),
]


@pytest.mark.parametrize(("method", "prompt", "temperature", "stop"), CASES)
def test_no_decision_is_sent_for_text_a_stop_string_cut_away(method: str, prompt: str, temperature: float,
                                                              stop: list[str]) -> None:
    members = [toy_member("sc-a", "byte_level", "llama", 1), toy_member("sc-b", "metaspace", "gpt2", 2)]
    result = EnsembleEngine(members, method=method, max_new_tokens=12).generate(
        [{"role": "user", "content": prompt}], stop=stop, temperature=temperature, seed=3, keep_events=True)
    assert result.finish_reason == "stop" and result.stop_string in stop
    held = [e.position for e in result.events if e.type == "token" and e.text]
    end = max(held) + 1 if held else 0  # the positions the answer's released text reaches
    decisions = [e for e in result.events if e.type in ("ensemble", "adafuse")]
    # A token holding only a character's first bytes has its text released with the token completing it.
    assert all(d.position < end for d in decisions), ([d.position for d in decisions], end, result.text)
    if method == "adafuse":  # a voted span's tokens are ensembled, up to where the answer's text ends
        starts = [d.position for d in decisions] + [end]
        counted = sum(min(starts[i + 1], end) - d.position for i, d in enumerate(decisions) if d.fused)
    else:
        counted = len(decisions)
    assert result.stats.ensembled_tokens == counted
    assert result.stats.tokens >= end  # usage still counts the token holding the stop string
