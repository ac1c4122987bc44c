"""An answer length nobody asked for ends at the smallest window, not in a refusal.

A 3856-token prompt against a 4096-token window, sent without ``max_tokens``, was refused (prompt +
the engine's default 256 exceed the window) where vLLM or llama-server alone answer until the window
is full. The default now caps the answer at the room the prompt leaves; a length the request (or the
engine's constructor) asks for is still refused where it does not fit. Toy members, small windows."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from shared_engine import ContextLengthError, EnsembleEngine
from shared_engine.members import HFMember
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.toy import toy_member

PROMPT = "Hello"
ROOM = 20
"""Tokens the prompt leaves in the verifier's window: fewer than the default 256."""


def _narrow_verifier(room: int) -> HFMember:
    """A verifier whose window holds the prompt and ``room`` tokens more (a copy: toys are cached)."""
    verifier = copy.copy(toy_member("b", "metaspace", "gpt2", 2))
    verifier.context_window = len(verifier.prompt_ids([{"role": "user", "content": PROMPT}])) + room
    return verifier


def _engine(room: int = ROOM, **options: Any) -> EnsembleEngine:
    return EnsembleEngine([toy_member("a", "byte_level", "llama", 1), _narrow_verifier(room)],
                          method="every-token", **options)


def test_no_length_asked_answers_up_to_the_window() -> None:
    engine = _engine()
    asyncio.run(engine.acheck_fits(PROMPT))  # the check every surface runs first passes too
    result = engine.generate(PROMPT)
    assert result.finish_reason == "length"
    assert 0 < result.stats.tokens <= ROOM


def test_a_length_asked_that_does_not_fit_is_still_refused() -> None:
    too_many = ROOM + 1
    with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({too_many}\) exceed"):
        _engine().generate(PROMPT, max_new_tokens=too_many)
    with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({too_many}\) exceed"):
        _engine(max_new_tokens=too_many).generate(PROMPT)  # given to the constructor: asked too


def test_a_length_asked_that_fits_is_kept() -> None:
    result = _engine(room=ROOM + 5).generate(PROMPT, max_new_tokens=3)
    assert result.finish_reason == "length" and result.stats.tokens == 3


def test_no_room_for_one_token_is_refused() -> None:
    with pytest.raises(ContextLengthError, match="leaves no room for an answer in b's context window"):
        _engine(room=0).generate(PROMPT)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(_engine(), model_name="ens")) as url:
        yield url


def _chat(base_url: str, **fields: Any) -> httpx.Response:
    body = {"model": "ens", "messages": [{"role": "user", "content": PROMPT}], **fields}
    return httpx.post(f"{base_url}/v1/chat/completions", json=body, timeout=60)


def test_server_without_max_tokens_answers_to_the_window(base_url: str) -> None:
    response = _chat(base_url)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert 0 < body["usage"]["completion_tokens"] <= ROOM


def test_server_with_max_tokens_too_big_names_it(base_url: str) -> None:
    response = _chat(base_url, max_tokens=ROOM + 1)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"  # the client's field named, not the engine's:
    assert f"+ max_tokens ({ROOM + 1}) exceed" in error["message"] and "max_new_tokens" not in error["message"]
