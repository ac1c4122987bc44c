"""Member weights at their edges: fits that score nothing."""

from __future__ import annotations

import math
from collections.abc import Iterator

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

