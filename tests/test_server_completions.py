"""``POST /v1/completions``: OpenAI's legacy completions, a prompt the answer continues as plain text
(the engine's ``raw_prompt``), for clients that speak only it (LangChain's ``OpenAI``, LlamaIndex's
``OpenAILike`` by default, evaluation harnesses' completion backends)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from shared_engine import EnsembleEngine
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.toy import toy_member

MODEL = "every-token-ensemble"
PROMPT = "Sofia walked to the park and"


def toy_engine() -> EnsembleEngine:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    return EnsembleEngine(members, method="every-token", max_new_tokens=24)


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with serve_in_background(create_app(toy_engine())) as url:
        yield url


def post(base_url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base_url}/v1/completions", json=body, timeout=60)


def test_whole_and_streamed_completions_are_the_engines_raw_continuation(base_url: str) -> None:
    expected = toy_engine().generate(PROMPT, raw_prompt=True, max_new_tokens=10)
    whole = post(base_url, {"model": MODEL, "prompt": PROMPT, "max_tokens": 10}).json()
    assert whole["object"] == "text_completion" and whole["id"].startswith("cmpl-")
    choice = whole["choices"][0]
    assert (choice["index"], choice["text"], choice["finish_reason"], choice["logprobs"]) == \
        (0, expected.text, "length", None)
    assert whole["usage"] == {"prompt_tokens": expected.stats.prompt_tokens, "completion_tokens": 10,
                              "total_tokens": expected.stats.prompt_tokens + 10}
    assert choice["ensemble"]["stats"]["tokens"] == 10
    assert len(choice["ensemble"]["decisions"]) == expected.stats.ensembled_tokens >= 1

    with httpx.stream("POST", f"{base_url}/v1/completions", timeout=60,
                      json={"model": MODEL, "prompt": PROMPT, "max_tokens": 10, "stream": True,
                            "stream_options": {"include_usage": True}}) as response:
        assert response.status_code == 200
        payloads = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert payloads[-1] == "[DONE]"
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert all(c["object"] == "text_completion" and c["id"] == chunks[0]["id"] for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"]) == expected.text
    final, usage = chunks[-2], chunks[-1]
    assert final["choices"][0]["finish_reason"] == "length" and final["ensemble"]["stats"]["tokens"] == 10
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 10


def test_the_chat_form_is_not_used() -> None:
    """The continuation differs from the chat answer to the same text (the chat wraps it in a template)."""
    engine = toy_engine()
    raw = engine.generate(PROMPT, raw_prompt=True, max_new_tokens=10)
    chat = engine.generate(PROMPT, max_new_tokens=10)
    assert raw.stats.prompt_tokens < chat.stats.prompt_tokens


def test_a_list_of_prompts_echo_and_the_default_length(base_url: str) -> None:
    prompts = [PROMPT, "def add(a, b):"]
    expected = [toy_engine().generate(p, raw_prompt=True, max_new_tokens=16) for p in prompts]
    whole = post(base_url, {"model": MODEL, "prompt": prompts, "echo": True}).json()  # max_tokens unset: 16
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert [c["text"] for c in whole["choices"]] == [p + e.text for p, e in zip(prompts, expected)]
    assert whole["usage"]["completion_tokens"] == sum(e.stats.tokens for e in expected) == 32
    assert whole["usage"]["prompt_tokens"] == sum(e.stats.prompt_tokens for e in expected)


def test_the_official_clients_speak_to_it(base_url: str) -> None:
    expected = toy_engine().generate(PROMPT, raw_prompt=True, max_new_tokens=8, stop=["\n"])
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="none")
    completion = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=["\n"])
    assert completion.choices[0].text == expected.text
    streamed = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=8, stop=["\n"], stream=True,
                                         echo=True)
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices) == PROMPT + expected.text

    from langchain_openai import OpenAI  # LangChain's completion (not chat) model

    llm = OpenAI(base_url=f"{base_url}/v1", api_key="none", model=MODEL, max_tokens=8, temperature=0)
    assert llm.invoke(PROMPT, stop=["\n"]) == expected.text  # it sends best_of 1 and 0 penalties: accepted


@pytest.mark.parametrize(("body", "param", "says"), [
    ({"prompt": [1, 2, 3]}, "prompt", "prompt"),
    ({"prompt": []}, "prompt", "empty"),
    ({"prompt": "   "}, "prompt", "empty"),
    ({"prompt": [PROMPT, "Tom", " "]}, "prompt", "empty (prompt 2 of the list)"),
    ({"prompt": 5}, "prompt", "a string or a list of strings, got int"),
    ({"prompt": None}, "prompt", "got null"),
    ({"prompt": [PROMPT, None]}, "prompt", "item 1 is null"),
    ({"prompt": [PROMPT] * 2049}, "prompt", "at most 2048"),
    ({"prompt": PROMPT, "stop": ["\n", 1]}, "stop", "item 1 is int"),
    ({"prompt": PROMPT, "logprobs": 0}, "logprobs", "log probabilities"),  # legacy 0: the sampled tokens' own
    ({"prompt": PROMPT, "suffix": "end"}, "suffix", "suffix"),
    ({"prompt": PROMPT, "best_of": 2}, "best_of", "best_of"),
    ({"prompt": PROMPT, "logprobs": 2}, "logprobs", "log probabilities"),
    ({"prompt": [PROMPT, PROMPT], "stream": True}, "prompt", "list of prompts"),
    ({"prompt": PROMPT, "max_tokens": 0}, "max_tokens", "max_tokens"),
])
def test_what_it_cannot_do_is_a_400_naming_the_field(base_url: str, body: dict[str, Any], param: str | None,
                                                     says: str) -> None:
    response = post(base_url, {"model": MODEL, **body})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert says in error["message"] and error["param"] == param, error


def test_a_prompt_too_long_for_a_member_names_the_prompt(base_url: str) -> None:
    for stream in (False, True):
        response = post(base_url, {"model": MODEL, "prompt": "Sofia walked " * 400, "stream": stream})
        assert response.status_code == 400, response.text
        assert response.json()["error"]["code"] == "context_length_exceeded"
        assert response.json()["error"]["param"] == "prompt"


def test_a_list_is_checked_whole_before_any_answer() -> None:
    """A later prompt too long for a member was found only at its turn: the answers before it were
    computed, then thrown away with the 400."""

    class Counting(EnsembleEngine):
        started = 0

        def astream(self, *args: Any, **kwargs: Any) -> Any:
            Counting.started += 1
            return super().astream(*args, **kwargs)

    engine = Counting([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)],
                      method="every-token", max_new_tokens=24)
    with serve_in_background(create_app(engine)) as url:
        response = post(url, {"model": MODEL, "prompt": [PROMPT, "Sofia walked " * 400], "max_tokens": 8})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert (error["code"], error["param"]) == ("context_length_exceeded", "prompt")
        assert error["message"].startswith("prompt 1 of the list: ") and Counting.started == 0
        whole = post(url, {"model": MODEL, "prompt": [PROMPT, "def add(a, b):"], "max_tokens": 4}).json()
        assert len(whole["choices"]) == 2 and Counting.started == 2
        assert "ensemble" not in whole  # the summaries are on the choices: no top-level null
        assert all("ensemble" in c for c in whole["choices"])


def test_a_list_whose_max_tokens_alone_fills_a_window_names_max_tokens(base_url: str) -> None:
    """max_tokens alone filling a member's window was reported as 'prompt 0 of the list: max_tokens (100000) alone
    fills ...' with param 'prompt', blaming a prompt that no shorter prompt would fix; the list gets the error a
    single prompt gets."""
    single = post(base_url, {"model": MODEL, "prompt": PROMPT, "max_tokens": 100000}).json()["error"]
    listed = post(base_url, {"model": MODEL, "prompt": [PROMPT, "Tom"], "max_tokens": 100000}).json()["error"]
    assert (listed["param"], listed["code"]) == ("max_tokens", "context_length_exceeded"), listed
    assert listed["message"] == single["message"] and listed["message"].startswith("max_tokens (100000) alone fills")


def test_another_model_is_a_404(base_url: str) -> None:
    response = post(base_url, {"model": "gpt-4", "prompt": PROMPT})
    assert response.status_code == 404 and response.json()["error"]["code"] == "model_not_found"
