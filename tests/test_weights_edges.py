"""Member weights at their edges: fits that score nothing, a drafter weighted 0 under gac-threshold,
``single``'s reported weight, and weights beyond float32's range."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.toy import toy_member

ONE_TOKEN = "Sofia"  # one token in the byte-level toy and no BOS: the first token is never scored


def _pair() -> list:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


@pytest.fixture(scope="module")
def auto_url() -> Iterator[str]:
    with serve_in_background(create_app(EnsembleEngine(_pair(), weights="auto", max_new_tokens=3))) as url:
        yield url


def _complete(url: str, stream: bool) -> httpx.Response:
    model = httpx.get(url + "/health").json()["model"]
    body = {"model": model, "prompt": ONE_TOKEN, "stream": stream, "max_tokens": 2}
    return httpx.post(url + "/v1/completions", json=body, timeout=60)


def test_a_member_that_scores_no_bytes_of_the_prompt_leaves_no_nan_in_the_stats() -> None:
    stats = EnsembleEngine(_pair(), weights="auto").generate(ONE_TOKEN, raw_prompt=True, max_new_tokens=2).stats
    assert "a" not in stats.prompt_nll_per_byte  # scored nothing: no number to show
    assert all(math.isfinite(v) for v in stats.prompt_nll_per_byte.values())


@pytest.mark.parametrize("stream", [False, True])
def test_weights_auto_on_a_one_token_raw_prompt_is_answered(auto_url: str, stream: bool) -> None:
    """The whole answer failed with HTTP 500 'Out of range float values are not JSON compliant'."""
    response = _complete(auto_url, stream)
    assert response.status_code == 200, response.text
    assert "NaN" not in response.text


def test_a_non_finite_float_in_a_whole_answer_is_written_as_null(auto_url: str,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Whatever number the stats hold, a finished answer is not turned into an HTTP 500 (the stream
    already wrote null)."""
    import shared_engine.engine as engine_module

    monkeypatch.setattr(engine_module, "_finite_by_label", lambda records, values: {"a": math.inf})
    response = _complete(auto_url, stream=False)
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["ensemble"]["stats"]["prompt_nll_per_byte"] == {"a": None}


def test_gac_threshold_with_the_drafter_weighted_0_verifies_every_token() -> None:
    """The drafter's max probability gated verification: a sure drafter weighted 0 wrote the whole answer
    alone (0 fused tokens). Now the others decide every token, as every-token with the same fusion."""
    from tests.test_auto_drafter import FEW_SHOT, answers_member

    sure, plain = answers_member("fits", "metaspace"), toy_member("random", "byte_level", "llama", seed=2)
    gated = EnsembleEngine([sure, plain], method="gac-threshold", drafter=0, weights=[0, 1])
    every = EnsembleEngine([sure, plain], method="every-token", fusion="gac", drafter=0, weights=[0, 1])
    result = gated.generate(FEW_SHOT, max_new_tokens=12)
    assert result.stats.ensembled_tokens > 0
    assert result.text == every.generate(FEW_SHOT, max_new_tokens=12).text


@pytest.mark.parametrize("given", [2, 3])
def test_single_reports_its_one_member_weighing_1(given: int) -> None:
    """With no weights list the one member that ran was reported at 1/N (0.5 with two members given),
    though member_weights sum to 1."""
    members = [*_pair(), toy_member("c", "byte_level", "gpt2", 3)][:given]
    stats = EnsembleEngine(members, method="single").generate("Hi", max_new_tokens=2).stats
    assert stats.member_weights == {"a": 1.0}


@pytest.mark.parametrize(("weights", "expected"), [([1e39, 1], {"a": 1.0, "b": 0.0}),
                                                   ([1e-46, 1e-46], {"a": 0.5, "b": 0.5}),
                                                   ([1e308, 1e308], {"a": 0.5, "b": 0.5})])
def test_weights_beyond_float32_keep_their_ratios(weights: list[float], expected: dict[str, float],
                                                  tmp_path: Path) -> None:
    """Weights the options accept (finite, non-negative, not all 0) were normalised in float32: 1e39
    overflowed, 1e-46 underflowed, 1e308 + 1e308 overflowed the sum; NaN weights then failed the first
    request with an IndexError (`run --weights 1e39,1`: a traceback). Likewise from a profile."""
    from shared_engine.profile import EnsembleProfile, FitInfo

    stats = EnsembleEngine(_pair(), method="every-token", weights=weights).generate("Hi", max_new_tokens=2).stats
    assert stats.member_weights == expected
    path = tmp_path / "profile.json"
    EnsembleProfile(members=["a", "b"], weights=weights, drafter="a",
                    fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="test")).save(path)
    stats = EnsembleEngine(_pair(), method="every-token", profile=str(path)).generate("Hi", max_new_tokens=2).stats
    assert stats.member_weights == expected


def test_a_drafter_weight_beyond_float32_keeps_its_ratio() -> None:
    stats = EnsembleEngine(_pair(), method="every-token", drafter_weight=1e39).generate("Hi", max_new_tokens=2).stats
    assert stats.member_weights == {"a": 1.0, "b": 0.0}
