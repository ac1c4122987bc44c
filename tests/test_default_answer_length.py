"""An answer length nobody asked for ends at the smallest window, not in a refusal.

A 3856-token prompt against a 4096-token window, sent without ``max_tokens``, was refused (prompt +
the engine's default 256 exceed the window) where vLLM or llama-server alone answer until the window
is full. The default now caps the answer at the room the prompt leaves; a length the request (or the
engine's constructor) asks for is still refused where it does not fit. Toy members, small windows."""

from __future__ import annotations

import asyncio
import copy
import pickle
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from shared_engine import ContextLengthError, EnsembleEngine
from shared_engine.cli import build_parser, main
from shared_engine.members import HFMember
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.toy import registered_members, toy_member

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


# -- the surfaces that passed a length of their own: serve / run flags, LangChain, LlamaIndex -------
# Each passed 256 where the user set none (--max-new-tokens' default, ChatEnsemble's and EnsembleLLM's
# max_tokens), so the engine read it as asked and refused the prompt above.

@contextmanager
def narrow_names(prefix: str) -> Iterator[list[str]]:
    """The narrow ensemble (ROOM tokens after PROMPT) registered as ``{prefix}-a``, ``{prefix}-b``, names the
    CLI and the adapters load (each module its own: others register toys too)."""
    drafter = copy.copy(toy_member("a", "byte_level", "llama", 1))
    drafter.name = f"{prefix}-a"
    verifier = _narrow_verifier(ROOM)
    verifier.name = f"{prefix}-b"
    with registered_members([drafter, verifier]) as registered:
        yield registered


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    with narrow_names("dal") as registered:
        yield registered


def _flags_engine(names: list[str], *flags: str) -> EnsembleEngine:
    from shared_engine.engine_args import engine_from_args

    return engine_from_args(build_parser().parse_args(["serve", "--models", ",".join(names), *flags]),
                            "every-token", progress=False)


def test_serve_without_max_new_tokens_answers_to_the_window(names: list[str]) -> None:
    result = _flags_engine(names).generate(PROMPT)
    assert result.finish_reason == "length" and 0 < result.stats.tokens <= ROOM


def test_serve_with_max_new_tokens_too_big_is_refused(names: list[str]) -> None:
    with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({ROOM + 1}\) exceed"):
        _flags_engine(names, "--max-new-tokens", str(ROOM + 1)).generate(PROMPT)


def test_run_without_max_new_tokens_answers_to_the_window(names: list[str],
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--models", ",".join(names), "--method", "every-token", "--no-color", PROMPT]) == 0
    assert "finish=length" in capsys.readouterr().err
    assert main(["run", "--models", ",".join(names), "--method", "every-token", "--max-new-tokens",
                 str(ROOM + 1), PROMPT]) == 2
    assert f"max_new_tokens ({ROOM + 1}) exceed" in capsys.readouterr().err


def test_bench_and_eval_keep_a_fixed_answer_length() -> None:
    """bench's 128 and eval's benchmark default are set explicitly (recorded in their results and run
    config, which --resume compares): an unset flag there is not the window's length."""
    parse = build_parser().parse_args
    assert parse(["bench", "--models", "a,b"]).max_new_tokens == 128
    assert parse(["bench", "--models", "a,b", "--max-new-tokens", "7"]).max_new_tokens == 7
    assert parse(["eval", "--bench", "gsm8k", "--models", "a"]).max_new_tokens is None  # filled from the benchmark
    assert parse(["run", "--models", "a,b", "hi"]).max_new_tokens is None


def test_langchain_without_max_tokens_answers_to_the_window(names: list[str]) -> None:
    from langchain_ensemble import ChatEnsemble

    unset = ChatEnsemble(models=names, method="every-token")
    for llm in (unset, ChatEnsemble(models=names, method="every-token", max_tokens=None),
                pickle.loads(pickle.dumps(unset)), unset.model_copy()):
        message = llm.invoke(PROMPT)
        assert message.response_metadata["engine_finish_reason"] == "length"
        assert 0 < message.usage_metadata["output_tokens"] <= ROOM
        assert llm.invoke(PROMPT, max_tokens=None).response_metadata["engine_finish_reason"] == "length"
        assert llm.max_tokens == 256 and llm._get_ls_params()["ls_max_tokens"] == 256  # the cap it answers under


def test_langchain_with_max_tokens_too_big_is_refused(names: list[str]) -> None:
    from langchain_ensemble import ChatEnsemble

    too_many = ROOM + 1
    llm = ChatEnsemble(models=names, method="every-token")
    for asked in (ChatEnsemble(models=names, method="every-token", max_tokens=too_many),
                  ChatEnsemble(models=names, method="every-token", max_new_tokens=too_many),
                  llm.bind(max_tokens=too_many)):
        with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({too_many}\) exceed"):
            asked.invoke(PROMPT)
    with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({too_many}\) exceed"):
        llm.invoke(PROMPT, max_tokens=too_many)


def test_llamaindex_without_max_tokens_answers_to_the_window(names: list[str]) -> None:
    from llama_index.core.llms import ChatMessage

    from llamaindex_ensemble import EnsembleLLM

    llm = EnsembleLLM(models=names, method="every-token")
    assert llm.max_tokens == 256 and llm.metadata.num_output == 256  # LlamaIndex budgets prompts with it
    again = [pickle.loads(pickle.dumps(llm)), EnsembleLLM.from_dict(llm.to_dict()),
             EnsembleLLM.from_json(llm.to_json()), llm.model_copy(), EnsembleLLM(models=names, method="every-token",
                                                                                 max_tokens=None)]
    for each in (llm, *again):
        response = each.complete(PROMPT)
        assert response.raw["engine_finish_reason"] == "length"
        assert 0 < response.raw["usage"]["completion_tokens"] <= ROOM
    chat = llm.chat([ChatMessage(role="user", content=PROMPT)])
    assert chat.raw["engine_finish_reason"] == "length"


def test_llamaindex_with_max_tokens_too_big_is_refused(names: list[str]) -> None:
    from llamaindex_ensemble import EnsembleLLM

    too_many = ROOM + 1
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=too_many)
    assigned = EnsembleLLM(models=names, method="every-token")
    assigned.max_tokens = too_many
    for asked in (llm, pickle.loads(pickle.dumps(llm)), EnsembleLLM.from_dict(llm.to_dict()), assigned,
                  EnsembleLLM(models=names, method="every-token").model_copy(update={"max_tokens": too_many})):
        with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({too_many}\) exceed"):
            asked.complete(PROMPT)
    with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({too_many}\) exceed"):
        EnsembleLLM(models=names, method="every-token").complete(PROMPT, max_tokens=too_many)
