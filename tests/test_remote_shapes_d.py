"""Server members against stand-in servers that answer as real ones do where the members misread them:
an older llama-server's placeholder model name, the largest prompt vLLM and SGLang admit with one new
token, SGLang's aborts answered with HTTP 200, and vLLM's cap on logprobs (``--max-logprobs``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from shared_engine.errors import MemberError
from shared_engine.members import load_member
from shared_engine.members.http import HttpSettings
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from shared_engine.members.sglang import SGLangMember
from shared_engine.members.vllm import VLLMMember
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


@pytest.mark.parametrize("restarted", ["gemma", "gpt-3.5-turbo"], ids=["another-alias", "no-alias"])
def test_a_server_with_an_alias_restarted_is_still_refused(restarted: str) -> None:
    """Under another alias, or (an older build) without one, naming the placeholder: 83fb425 let every
    answer naming the placeholder through, so the latter was read through the wrong vocabulary."""
    answers = {"model": "qwen"}
    with serve(_old_llama_server({"model_alias": "qwen", "model_path": "/models/qwen.gguf"}, answers)) as (url, _):
        member = LlamaCppMember("ll", url, toy_tokenizer(), check_tokenizer=False, http=NO_RETRY)
        try:
            assert member.score([1, 2, 3], 3)[0].ids == [5]
            answers["model"] = restarted
            with pytest.raises(MemberError, match=f"now serves {restarted}"):
                member.score([1, 2, 3], 3)
        finally:
            member.close()


# ------------------------------------------------------------------ vLLM / SGLang: the largest prompt admitted
CONTEXT = 40


def _limit_server(folder: str) -> Handler:
    """vLLM's and SGLang's routes with their length rules, for a server whose ``/v1/models`` says
    ``max_model_len = CONTEXT``: vLLM refuses ``prompt + max_tokens > max_model_len``
    (``serving_engine._validate_input``), SGLang ``input + max_new_tokens >= context_len`` (tokenizer
    manager); an admitted request gets one bonus row."""
    tok = toy.byte_level_tokenizer()

    def refuse(message: str) -> tuple[int, bytes]:
        return 400, json.dumps({"object": "error", "code": 400, "message": message}).encode()

    def handler(method: str, path: str, body: Any) -> tuple[int, bytes]:
        if path == "/v1/models":
            return 200, json.dumps({"object": "list", "data": [{"id": "tiny", "object": "model", "root": "tiny",
                                                                 "max_model_len": CONTEXT}]}).encode()
        if path == "/get_model_info":
            return 200, json.dumps({"model_path": folder, "tokenizer_path": folder, "is_generation": True}).encode()
        if path == "/tokenize":
            return 200, json.dumps({"tokens": tok(body["prompt"], add_special_tokens=False)["input_ids"]}).encode()
        if path == "/v1/completions":
            if len(body["prompt"]) + body["max_tokens"] > CONTEXT:
                return refuse(f"This model's maximum context length is {CONTEXT} tokens. However, you requested "
                              f"{len(body['prompt']) + body['max_tokens']} tokens.")
            return 200, json.dumps({"choices": [{"logprobs": {"top_logprobs": [{"token_id:5": -0.1}]}}]}).encode()
        if path == "/generate":
            if len(body["input_ids"]) + body["sampling_params"]["max_new_tokens"] >= CONTEXT:
                return refuse(f"Requested token count exceeds the model's maximum context length of {CONTEXT} tokens.")
            return 200, json.dumps({"text": "", "meta_info": {"finish_reason": {"type": "length"},
                                    "input_token_logprobs": [], "input_top_logprobs": [],
                                    "output_top_logprobs": [[[-0.1, 5, None]]]}}).encode()
        return 404, b"{}"
    return handler


@pytest.mark.parametrize(("backend", "window"), [("vllm", CONTEXT - 1), ("sglang", CONTEXT - 2)])
def test_a_prompt_that_fills_the_servers_window_is_admitted(tmp_path: Path, backend: str, window: int) -> None:
    """The engine lets a verifier score as many ids as its window (decoding/round.py refuses only past
    it), with one new token asked: vLLM's window was max_model_len and SGLang's context_len - 1, one id
    more than either admits, so the last round of an answer that filled the window was an HTTP 400."""
    toy.byte_level_tokenizer().save_pretrained(tmp_path)
    with serve(_limit_server(str(tmp_path))) as (url, _):
        member = load_member(f"{backend}:{url}#{tmp_path}", http=NO_RETRY)
        assert isinstance(member, VLLMMember | SGLangMember)
        try:
            assert member.context_window == window
            ids = [7] * member.context_window
            assert member.score(ids, len(ids))[0].ids == [5]  # the full window: admitted
            with pytest.raises(MemberError, match="maximum context length"):  # the window is the server's, not less
                member.score(ids + [7], len(ids) + 1)
        finally:
            member.close()


# ------------------------------------------------------------------ SGLang: an abort answered with HTTP 200
ABORTED = "Scheduler subprocess is unavailable (dead pid(s): 4321). Please restart the server."


def test_an_sglang_abort_answered_with_200_names_the_servers_reason() -> None:
    """SGLang answers an abort without a status code with HTTP 200, empty logprob lists and
    finish_reason {"type": "abort", "message": ...}: the member reported "unexpected shape (input logprobs
    do not line up ...)" or "list index out of range", hiding the server's reason."""
    def handler(method: str, path: str, body: Any) -> tuple[int, bytes]:
        return 200, json.dumps({"text": "", "meta_info": {
            "id": "x", "finish_reason": {"type": "abort", "message": ABORTED},
            "prompt_tokens": len(body["input_ids"]), "completion_tokens": 0, "input_token_logprobs": [],
            "input_top_logprobs": [], "output_token_logprobs": [], "output_top_logprobs": []}}).encode()

    with serve(handler) as (url, _):
        member = SGLangMember("sg", url, toy_tokenizer(), top_k=3, check_tokenizer=False, http=NO_RETRY)
        try:
            for first_row in (2, 4):  # a block, and the bonus row alone
                with pytest.raises(MemberError, match="aborted the request: Scheduler subprocess is unavailable"):
                    member.score([1, 2, 3, 4], first_row)
        finally:
            member.close()


# ------------------------------------------------------------------ vLLM: --max-logprobs below top_k
def test_a_vllm_server_capping_logprobs_below_top_k_says_what_to_do() -> None:
    """vLLM started with --max-logprobs 5 and a member of top_k 20: every score failed with vLLM's bare
    400 "Requested sample logprobs of 20, which is greater than max allowed: 5"; the error now says to
    restart vLLM with --max-logprobs 20 or give the member top_k 5 or less."""
    cap = 5

    def handler(method: str, path: str, body: Any) -> tuple[int, bytes]:
        for key in ("logprobs", "prompt_logprobs"):
            if body.get(key) is not None and body[key] > cap:
                return 400, json.dumps({"error": {"message": f"Requested sample logprobs of {body[key]}, which is "
                                                             f"greater than max allowed: {cap}",
                                                  "type": "BadRequestError", "code": 400}}).encode()
        return 200, json.dumps({"choices": [{"logprobs": {"top_logprobs": [{"token_id:5": -0.1}]}}]}).encode()

    with serve(handler) as (url, _):
        member = VLLMMember("v", url, toy_tokenizer(), model="tiny", check_tokenizer=False, http=NO_RETRY)
        try:
            with pytest.raises(MemberError, match=r"restart vLLM with --max-logprobs 20 .*top_k=5 or less") as err:
                member.score([1, 2, 3, 4], 4)
            assert "max allowed: 5" in str(err.value)  # the server's own words too
        finally:
            member.close()
        small = VLLMMember("v", url, toy_tokenizer(), model="tiny", top_k=cap, check_tokenizer=False, http=NO_RETRY)
        try:
            assert small.score([1, 2, 3, 4], 4)[0].ids == [5]  # the advice works
        finally:
            small.close()
