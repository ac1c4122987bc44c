"""Server members against stand-in servers that answer as real ones do where the members misread them:
an older llama-server's placeholder model name."""

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


def toy_tokenizer() -> LocalTokenizer:
    tok = toy.byte_level_tokenizer()
    return LocalTokenizer(tok, len(tok), frozenset(), 512)


# ------------------------------------------------------------------ llama.cpp: the placeholder model name
def _old_llama_server(props: dict[str, Any], answers: dict[str, str]) -> Handler:
    """A llama-server as built before llama.cpp PR #17668 (2025-12): ``/props`` names the model's path
    (and ``model_alias`` "" without ``--alias``), every ``/completion`` answer names ``answers["model"]``
    (``DEFAULT_OAICOMPAT_MODEL``, "gpt-3.5-turbo", or "gpt-3.5-turbo-0613" in older builds)."""
    def handler(method: str, path: str, body: object) -> tuple[int, bytes]:
        if path == "/props":
            return 200, json.dumps({"total_slots": 1, "default_generation_settings": {"n_ctx": 512},
                                    **props}).encode()
        return 200, json.dumps({"index": 0, "id_slot": 0, "model": answers["model"], "completion_probabilities": [
            {"id": 5, "logprob": -0.1, "top_logprobs": [{"id": 5, "logprob": -0.1}]}]}).encode()
    return handler


@pytest.mark.parametrize("placeholder", ["gpt-3.5-turbo", "gpt-3.5-turbo-0613"])
def test_an_older_llama_server_without_an_alias_is_read_not_taken_for_a_restart(placeholder: str) -> None:
    """A llama-server from before Dec 2025 started without --alias answers "model": "gpt-3.5-turbo" while
    its /props names /models/qwen.gguf: every score was refused as "the server now serves gpt-3.5-turbo ...
    (restarted on another model?)". The placeholder names no model now."""
    answers = {"model": placeholder}
    props = {"model_alias": "", "model_path": "/models/qwen.gguf"}
    with serve(_old_llama_server(props, answers)) as (url, _):
        member = LlamaCppMember("ll", url, toy_tokenizer(), check_tokenizer=False, http=NO_RETRY)
        try:
            assert member.score([1, 2, 3], 3)[0].ids == [5]
            answers["model"] = "/models/gemma.gguf"  # a newer server restarted on another model: still refused
            with pytest.raises(MemberError, match="now serves /models/gemma.gguf, not /models/qwen.gguf"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()


def test_a_server_with_an_alias_restarted_under_another_alias_is_still_refused() -> None:
    answers = {"model": "qwen"}
    with serve(_old_llama_server({"model_alias": "qwen", "model_path": "/models/qwen.gguf"}, answers)) as (url, _):
        member = LlamaCppMember("ll", url, toy_tokenizer(), check_tokenizer=False, http=NO_RETRY)
        try:
            assert member.score([1, 2, 3], 3)[0].ids == [5]
            answers["model"] = "gemma"
            with pytest.raises(MemberError, match="now serves gemma"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()
