"""Requests this server cannot honour are refused by a 400 that says why and names a real request
path: an image in a message, audio output, several choices (toy members, no real models)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.test_server import MODEL, USER, post, toy_engine

IMAGE = {"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}
AUDIO_IN = {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}}
FILE = {"type": "file", "file": {"file_id": "file-1"}}


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(toy_engine())) as url:
        yield url


def error_of(base_url: str, extra: dict[str, Any]) -> dict[str, Any]:
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 400, response.text
    error: dict[str, Any] = response.json()["error"]
    return error


@pytest.mark.parametrize(("messages", "param", "kind"), [
    ([{"role": "user", "content": [{"type": "text", "text": "What is in this picture?"}, IMAGE]}],
     "messages.0.content.1", "image_url"),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": [AUDIO_IN]}],
     "messages.1.content.0", "input_audio"),
    ([{"role": "user", "content": [FILE, {"type": "text", "text": "Summarise it."}]}],
     "messages.0.content.0", "file"),
    # two images (or an image and a file): the second failed as pydantic's union error again
    ([{"role": "user", "content": [{"type": "text", "text": "Which differs?"}, IMAGE, IMAGE, FILE]}],
     "messages.0.content.1", "image_url"),
])
def test_a_non_text_part_is_refused_by_name(base_url: str, messages: list[dict[str, Any]], param: str,
                                            kind: str) -> None:
    """OpenAI's usual vision request read 'messages.0.content.str: Input should be a valid string (and 2
    more problems)', param 'messages.0.content.str' (pydantic's union branch): never that images are
    not supported."""
    error = error_of(base_url, {"messages": messages})
    assert error == {"message": f"{param}: '{kind}' parts are not supported (this server reads text only)",
                     "type": "invalid_request_error", "param": param, "code": "unsupported_parameter"}


def test_text_parts_still_work_and_keep_their_errors(base_url: str) -> None:
    parts = [{"type": "text", "text": "Sofia walked"}, {"type": "text", "text": "to the park"}]
    ok = post(base_url, {"model": MODEL, "messages": [{"role": "user", "content": parts}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text
    broken = [{"type": "text", "text": "Sofia"}, {"type": "text", "text": 3}]
    error = error_of(base_url, {"messages": [{"role": "user", "content": broken}]})
    assert error["param"].startswith("messages.0.content") and error["code"] == "invalid_type", error


def test_several_choices_say_why_not(base_url: str) -> None:
    """n=3 read only 'n: Input should be less than or equal to 1'."""
    error = error_of(base_url, {"n": 3})
    assert error["param"] == "n" and error["code"] == "invalid_value", error
    assert error["message"] == ("n: n must be 1: this server returns one choice per request "
                                "(send the request 3 times for 3 answers)"), error
    assert error_of(base_url, {"n": 0})["param"] == "n"
    assert post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, "n": 1}).status_code == 200


@pytest.mark.parametrize(("extra", "param"), [
    ({"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}, "modalities"),
    ({"modalities": ["audio"]}, "modalities"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
])
def test_audio_output_is_refused(base_url: str, extra: dict[str, Any], param: str) -> None:
    """A request for audio came back 200 with plain text, as if audio had not been asked for."""
    error = error_of(base_url, extra)
    assert error["param"] == param and error["code"] == "unsupported_parameter", error
    assert "text" in error["message"] and error["message"].startswith(f"{param}: "), error


@pytest.mark.parametrize("extra", [{"modalities": ["text"]}, {"modalities": None}, {"audio": None}])
def test_text_modalities_are_accepted(base_url: str, extra: dict[str, Any]) -> None:
    response = post(base_url, {"model": MODEL, "messages": USER, "max_tokens": 2, **extra})
    assert response.status_code == 200, response.text
