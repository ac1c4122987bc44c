"""A llama.cpp server restarted behind a member's URL on a model with a smaller vocabulary refuses the
member's ids (HTTP 400 "Prompt contains invalid tokens") before any answer could name the new model: the
member gave that bare 400 instead of its "the server now serves X ... reconnect the member" error."""

from __future__ import annotations

import json
from typing import Any

import pytest

from shared_engine.errors import MemberError
from shared_engine.members.http import HttpSettings
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from tests import toy
from tests.fixture_server import Handler, serve

NO_RETRY = HttpSettings(retries=0)
INVALID = {"error": {"code": 400, "message": "Prompt contains invalid tokens", "type": "invalid_request_error"}}


class Server:
    """A llama-server whose model (``props``), and what ``/completion`` answers, the test changes."""

    def __init__(self, props: dict[str, Any]) -> None:
        self.props = props
        self.completion: tuple[int, dict[str, Any]] | None = None  # None: an answer naming the model
        self.props_status = 200

    def handler(self) -> Handler:
        def handle(method: str, path: str, body: Any) -> tuple[int, bytes]:
            if path == "/props":
                return self.props_status, json.dumps({"total_slots": 1, "default_generation_settings": {"n_ctx": 512},
                                                      **self.props}).encode()
            if self.completion is not None:
                return self.completion[0], json.dumps(self.completion[1]).encode()
            name = self.props.get("model_alias") or self.props["model_path"]
            return 200, json.dumps({"index": 0, "id_slot": 0, "model": name, "completion_probabilities": [
                {"id": 5, "logprob": -0.1, "top_logprobs": [{"id": 5, "logprob": -0.1}]}]}).encode()
        return handle


def _member(url: str) -> LlamaCppMember:
    tok = toy.byte_level_tokenizer()
    return LlamaCppMember("ll", url, LocalTokenizer(tok, len(tok), frozenset(), 512), check_tokenizer=False,
                          http=NO_RETRY)


def _props_asked(log: list[tuple[str, str, Any]]) -> int:
    return sum(path == "/props" for _, path, _ in log)


@pytest.mark.parametrize("alias", ["", "qwen"], ids=["no-alias", "same-alias"])
def test_a_restart_on_a_smaller_vocabulary_says_the_server_now_serves_another_model(alias: str) -> None:
    server = Server({"model_alias": alias, "model_path": "/models/qwen.gguf"})
    with serve(server.handler()) as (url, _):
        member = _member(url)
        try:
            assert member.score([1, 2, 3], 3)[0].ids == [5]
            server.props = {"model_alias": alias, "model_path": "/models/gemma.gguf"}
            server.completion = (400, INVALID)
            with pytest.raises(MemberError, match="now serves /models/gemma.gguf, not .*/models/qwen.gguf.* "
                                                  "reconnect the member") as err:
                member.score([1, 2, 3], 3)
            assert "Prompt contains invalid tokens" in str(err.value.__cause__)  # the server's words kept
        finally:
            member.close()


def test_a_refusal_by_the_same_model_is_the_servers_own_error() -> None:
    server = Server({"model_alias": "", "model_path": "/models/qwen.gguf"})
    with serve(server.handler()) as (url, log):
        member = _member(url)
        try:
            server.completion = (400, INVALID)
            with pytest.raises(MemberError, match="HTTP 400: .*Prompt contains invalid tokens") as err:
                member.score([1, 2, 3], 3)
            assert "now serves" not in str(err.value)
            server.props = {"model_alias": "other-name", "model_path": "/models/qwen.gguf"}  # a new alias only
            with pytest.raises(MemberError, match="HTTP 400") as err:
                member.score([1, 2, 3], 3)
            assert "now serves" not in str(err.value)
        finally:
            member.close()


def test_props_failing_too_gives_the_refusal() -> None:
    server = Server({"model_alias": "", "model_path": "/models/qwen.gguf"})
    with serve(server.handler()) as (url, _):
        member = _member(url)
        try:
            server.completion, server.props_status = (400, INVALID), 500
            with pytest.raises(MemberError, match="HTTP 400: .*Prompt contains invalid tokens"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()


def test_a_server_error_is_not_taken_for_a_restart() -> None:
    """Only a refusal (4xx) asks /props: a server failing (5xx) would not say more there."""
    server = Server({"model_alias": "", "model_path": "/models/qwen.gguf"})
    with serve(server.handler()) as (url, log):
        member = _member(url)
        try:
            asked = _props_asked(log)
            server.props = {"model_alias": "", "model_path": "/models/gemma.gguf"}
            server.completion = (500, {"error": {"code": 500, "message": "boom"}})
            with pytest.raises(MemberError, match="HTTP 500: .*boom"):
                member.score([1, 2, 3], 3)
            assert _props_asked(log) == asked
        finally:
            member.close()
