"""Bad input on every in-process surface (issue #10, part 5): the engine, the CLI, LangChain's
``ChatEnsemble`` and LlamaIndex's ``EnsembleLLM``.

Each bad request must fail *before any event* with a typed error (``InvalidRequestError``, or its
subclass ``ContextLengthError``; both are ``ValueError``), and the same error must come out of the
adapters; the CLI exits non-zero with a one-line message and no traceback. Nothing may hang: every
call runs under a timeout. Toy members (tiny random models) keep this fast; the CLI reads them from
Hugging Face folders written to a temporary directory, as a user's local models would be.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from llama_index.core.base.llms.types import ChatMessage

from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM
from shared_engine import ContextLengthError, EnsembleEngine, InvalidRequestError
from shared_engine.cli import main
from tests.toy import registered_members, toy_member

TIMEOUT_S = 30.0
TOYS = ("toy-bpe", "toy-sp")


@pytest.fixture(scope="module")
def toys() -> list:
    return [toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)]


@pytest.fixture
def registered(toys: list) -> Iterator[list[str]]:
    with registered_members(toys) as names:
        yield names


def _first_event(engine: EnsembleEngine, prompt: Any, **params: Any) -> Any:
    """The first event of a stream (or the error it raises), under a timeout: never hangs."""
    async def first() -> Any:
        stream = engine.astream(prompt, **params)
        try:
            return await stream.__anext__()
        finally:
            await stream.aclose()
    return asyncio.run(asyncio.wait_for(first(), TIMEOUT_S))


LONG_PROMPT = "Sofia counted apples. " * 200  # ~1000 toy tokens: over the toy context window of 512

BAD_PROMPTS = [
    pytest.param("", id="empty"),
    pytest.param("   \n\t ", id="whitespace"),
    pytest.param([], id="no-messages"),
    pytest.param([{"role": "user", "content": "  "}], id="blank-message"),
    pytest.param([{"role": "wizard", "content": "hi"}], id="unknown-role"),
    pytest.param([{"content": "hi"}], id="missing-role"),
    pytest.param([{"role": "user", "content": 42}], id="int-content"),
    pytest.param([{"role": "user", "content": None}], id="none-content"),
    pytest.param([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], id="image-part"),
    pytest.param([{"role": "user", "content": ["hi"]}], id="part-not-a-mapping"),
    pytest.param(["hi"], id="message-not-a-mapping"),
    pytest.param(42, id="prompt-not-a-string"),
    pytest.param(None, id="prompt-none"),
    pytest.param(b"hi", id="prompt-bytes"),
    pytest.param("hi \ud800 there", id="lone-surrogate"),  # what JSON "\ud800" decodes to
    pytest.param([{"role": "user", "content": "ok \udfff"}], id="lone-surrogate-in-message"),
]

BAD_PARAMS = [
    pytest.param({"max_new_tokens": -1}, id="negative-max-tokens"),
    pytest.param({"max_new_tokens": 0}, id="zero-max-tokens"),
    pytest.param({"max_new_tokens": "many"}, id="max-tokens-not-int"),
    pytest.param({"temperature": -0.1}, id="negative-temperature"),
    pytest.param({"temperature": float("nan")}, id="nan-temperature"),
    pytest.param({"temperature": float("inf")}, id="inf-temperature"),
    pytest.param({"top_p": 0.0}, id="top-p-zero"),
    pytest.param({"top_p": 1.5}, id="top-p-above-one"),
    pytest.param({"top_p": -0.5}, id="top-p-negative"),
    pytest.param({"top_p": float("nan")}, id="top-p-nan"),
    pytest.param({"stop": [""]}, id="empty-stop"),
    pytest.param({"stop": 7}, id="stop-not-a-string"),
    pytest.param({"seed": 2**64}, id="seed-too-large"),
    pytest.param({"nonsense": 1}, id="unknown-parameter"),
]


# --------------------------------------------------------------------- engine


@pytest.mark.parametrize("prompt", BAD_PROMPTS)
def test_engine_rejects_bad_prompts(toys: list, prompt: Any) -> None:
    with pytest.raises(InvalidRequestError):
        _first_event(EnsembleEngine(toys), prompt)


@pytest.mark.parametrize("params", BAD_PARAMS)
def test_engine_rejects_bad_parameters(toys: list, params: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        _first_event(EnsembleEngine(toys), "hi", **params)
    assert isinstance(raised.value, ValueError)
    assert str(raised.value).startswith("invalid parameters:")


@pytest.mark.parametrize(("name", "hint"), [("max_tokens", "max_new_tokens"), ("temprature", "temperature"),
                                            ("stop_sequences", "stop")])
def test_engine_names_the_parameter_meant(toys: list, name: str, hint: str) -> None:
    """OpenAI's ``max_tokens`` (or a typo) on the engine itself: the error names the engine's parameter."""
    with pytest.raises(InvalidRequestError) as raised:
        _first_event(EnsembleEngine(toys), "hi", **{name: 3})
    assert f"{name}: Extra inputs are not permitted (did you mean '{hint}'?)" in str(raised.value)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_a_forced_tool_choice_without_tools_is_refused(toys: list, choice: Any) -> None:
    """It was ignored: a plain answer came back, while the server refuses the same request."""
    with pytest.raises(InvalidRequestError, match="tool_choice is only allowed when tools are specified"):
        _first_event(EnsembleEngine(toys), "hi", tool_choice=choice)


def test_an_engine_option_given_per_request_says_where_it_goes(toys: list) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        _first_event(EnsembleEngine(toys), "hi", top_k=3)  # a fuzzy match suggested top_p, another control
    assert "top_k: Extra inputs are not permitted (top_k is an engine option: EnsembleEngine(..., top_k=...));" \
        in str(raised.value)


@pytest.mark.parametrize(("http", "hint"), [({"timout_s": 5}, " (did you mean 'timeout_s'?)"), ({"top_k": 5}, ""),
                                            ({"device": 5}, "")])
def test_a_nested_unknown_key_is_matched_against_its_own_model(http: dict[str, Any], hint: str) -> None:
    """``http: {top_k: 5}`` was told "did you mean 'top_k'?" (the member's own field, the same name);
    ``http: {timout_s: 5}`` got no hint."""
    from shared_engine import MemberConfig
    from shared_engine.options import validated

    with pytest.raises(InvalidRequestError) as raised:
        validated(MemberConfig, model="llamacpp:http://127.0.0.1:9", http=http)
    assert str(raised.value).endswith(f"Extra inputs are not permitted{hint}")


def test_engine_guesses_no_parameter_for_an_unrelated_name(toys: list) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        _first_event(EnsembleEngine(toys), "hi", colour=3)
    assert "did you mean" not in str(raised.value)


@pytest.mark.parametrize("options", [
    pytest.param({"method": "bogus"}, id="unknown-method"),
    pytest.param({"draft_length": 0}, id="draft-length-zero"),
    pytest.param({"draft_schedule": "sometimes"}, id="unknown-draft-schedule"),
    pytest.param({"max_draft_length": 0}, id="max-draft-length-zero"),
    pytest.param({"draft_schedule": "adaptive", "draft_length": 20}, id="first-draft-past-max"),
    pytest.param({"weights": [1.0]}, id="too-few-weights"),
    pytest.param({"weights": [-1.0, 2.0]}, id="negative-weight"),
    pytest.param({"weights": [0.0, 0.0]}, id="zero-weights"),
    pytest.param({"weights": [float("nan"), 1.0]}, id="nan-weight"),  # garbled answers, not an error, before
    pytest.param({"weights": [float("inf"), 1.0]}, id="infinite-weight"),
    pytest.param({"drafter": "nobody"}, id="unknown-drafter"),
    pytest.param({"drafter": 5}, id="drafter-index-out-of-range"),
    pytest.param({"top_k": 0}, id="top-k-zero"),
    pytest.param({"max_new_tokens": -5}, id="negative-default-max-tokens"),
    pytest.param({"fusion": "sum"}, id="unknown-fusion"),
    pytest.param({"nonsense": True}, id="unknown-option"),
    pytest.param({"loop_guard": 0}, id="loop-guard-zero"),
    # accepted before, then every AdaFuse request where a member branched crashed (softmax of NaNs)
    pytest.param({"method": "adafuse", "candidate_temperature": float("inf")}, id="infinite-candidate-temperature"),
])
def test_engine_rejects_bad_options(toys: list, options: dict[str, Any]) -> None:
    """Found at construction, before any member loads (impossible weights passed it and failed only at
    the first request, after the members had loaded)."""
    with pytest.raises(InvalidRequestError):
        EnsembleEngine(toys, **options)


def test_engine_rejects_bad_member_lists(toys: list) -> None:
    with pytest.raises(InvalidRequestError):
        EnsembleEngine([])
    with pytest.raises(InvalidRequestError):
        EnsembleEngine(toys[:1], method="safe")  # an ensemble of one
    with pytest.raises(InvalidRequestError):
        EnsembleEngine([toys[0], 42])  # not a name, not a member
    with pytest.raises(InvalidRequestError, match=r"list of names, e\.g\. \['a', 'b'\], not the string 'a,b'"):
        EnsembleEngine("a,b")  # as on the CLI: was split into the members 'a', ',', 'b'
    with pytest.raises(InvalidRequestError, match="unknown model"):
        _first_event(EnsembleEngine([toys[0], "no-such-model-anywhere"]), "hi")


def test_duplicate_members_with_conflicting_options(toys: list) -> None:
    """The same member twice is allowed (labels tell them apart); two *different* members under
    one name are ambiguous (events, drafter=, weights are keyed by name) and rejected."""
    same = EnsembleEngine([toys[0], toys[0]], method="every-token", max_new_tokens=2)
    assert same.labels == ["toy-bpe", "toy-bpe'"]
    assert same.generate("hi").finish_reason in {"length", "eos", "stop"}
    impostor = toy_member("toy-bpe", "metaspace", seed=3)
    with pytest.raises(InvalidRequestError, match="toy-bpe"):
        _first_event(EnsembleEngine([toys[0], impostor]), "hi")


def test_engine_rejects_prompts_over_the_smallest_context_window(toys: list) -> None:
    engine = EnsembleEngine(toys)
    with pytest.raises(ContextLengthError, match="context window"):
        _first_event(engine, LONG_PROMPT)
    with pytest.raises(ContextLengthError):
        _first_event(engine, "hi", max_new_tokens=10**9)  # a very large request
    with pytest.raises(ContextLengthError):
        _first_event(engine, [{"role": "user", "content": "hi"}] * 2000)


def test_engine_rejects_a_huge_prompt_quickly(toys: list) -> None:
    """A multi-megabyte prompt is refused without tokenizing it in full (and without hanging)."""
    import time
    start = time.perf_counter()
    with pytest.raises(ContextLengthError):
        _first_event(EnsembleEngine(toys), "x" * 5_000_000)
    assert time.perf_counter() - start < 60.0  # a hang bound; the refusal itself is checked above


def test_engine_still_serves_after_bad_requests(toys: list) -> None:
    engine = EnsembleEngine(toys, max_new_tokens=4)
    for prompt, params in [("", {}), ("hi", {"top_p": 2.0}), (LONG_PROMPT, {})]:
        with pytest.raises(InvalidRequestError):
            _first_event(engine, prompt, **params)
    good = engine.generate("hi")
    assert good.text == EnsembleEngine(toys, max_new_tokens=4).generate("hi").text


# --------------------------------------------------------------------- CLI


@pytest.fixture(scope="module")
def toy_folders(tmp_path_factory: pytest.TempPathFactory, toys: list) -> str:
    """The toy members saved as local Hugging Face folders, as ``--models`` accepts them."""
    root = tmp_path_factory.mktemp("toy-models")
    paths = []
    for member in toys:
        folder = root / member.name
        member.model.save_pretrained(folder)
        member.tokenizer.save_pretrained(folder)
        paths.append(str(folder))
    return ",".join(paths)


def _cli(args: list[str | bytes]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "shared_engine.cli", *args], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).resolve().parents[1])


CLI_CASES = [
    pytest.param(["run", "--models", "{toys}", ""], id="empty-prompt"),
    pytest.param(["run", "--models", "{toys}", "  "], id="whitespace-prompt"),
    pytest.param(["run", "--models", "{toys}", "--max-new-tokens", "-3", "hi"], id="negative-max-tokens"),
    pytest.param(["run", "--models", "{toys}", "--temperature", "-1", "hi"], id="negative-temperature"),
    pytest.param(["run", "--models", "{toys}", "--top-p", "1.5", "hi"], id="top-p-above-one"),
    pytest.param(["run", "--models", "{toys}", "--draft-length", "0", "hi"], id="draft-length-zero"),
    pytest.param(["run", "--models", "{toys}", "--drafter", "nobody", "hi"], id="unknown-drafter"),
    pytest.param(["run", "--models", "{toys}", "--stop", "", "hi"], id="empty-stop"),
    pytest.param(["run", "--models", "{toys},no-such-model", "hi"], id="unknown-member"),
    pytest.param(["run", "--models", "{toys}", "--max-new-tokens", "1000000000", "hi"], id="too-many-tokens"),
    pytest.param(["run", "--models", "{toys}", LONG_PROMPT], id="prompt-over-context"),
    pytest.param(["run", "--models", "{toys}", "--method", "bogus", "hi"], id="unknown-method"),
    pytest.param(["run", "--models", ",", "hi"], id="no-models"),
    pytest.param(["run", "--models", "{toys}", "--temperature", "warm", "hi"], id="temperature-not-a-number"),
]


@pytest.mark.parametrize("args", CLI_CASES)
def test_cli_fails_with_one_line_and_no_traceback(toy_folders: str, args: list[str],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    args = [a.replace("{toys}", toy_folders) for a in args]
    with pytest.raises(SystemExit) as exited:
        sys.exit(main(args))
    assert exited.value.code not in (0, None)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "error" in lines[-1], err  # the message is the last line (model loading may print progress)
    assert sum("error" in line for line in lines) == 1, err


def test_cli_subprocess_exit_code_and_message(toy_folders: str) -> None:
    """The real entry point: exit status 2, one line on stderr, nothing on stdout."""
    done = _cli(["run", "--models", toy_folders, "--top-p", "0", "hi"])
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().count("\n") == 0 and done.stderr.startswith("error: invalid parameters")


def test_cli_rejects_a_prompt_that_is_not_utf8(toy_folders: str) -> None:
    """Undecodable argv bytes reach Python as lone surrogates: a one-line error, not a crash."""
    done = _cli(["run", "--models", toy_folders, b"caf\xe9 \xff"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: the prompt is not valid Unicode")


# --------------------------------------------------------------------- LangChain


def _lc_invoke(model: ChatEnsemble, messages: Any, **kwargs: Any) -> Any:
    async def go() -> Any:
        return await model.ainvoke(messages, **kwargs)
    return asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))


def _lc_stream_first(model: ChatEnsemble, messages: Any, **kwargs: Any) -> Any:
    async def go() -> Any:
        async for chunk in model.astream(messages, **kwargs):
            return chunk
    return asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))


@pytest.mark.parametrize("call", [_lc_invoke, _lc_stream_first], ids=["ainvoke", "astream"])
@pytest.mark.parametrize("messages, kwargs, error", [
    pytest.param("", {}, InvalidRequestError, id="empty-prompt"),
    pytest.param("   ", {}, InvalidRequestError, id="whitespace-prompt"),
    pytest.param([], {}, InvalidRequestError, id="no-messages"),
    pytest.param([AIMessage(content="")], {}, InvalidRequestError, id="only-empty-ai-message"),
    pytest.param([("wizard", "hi")], {}, ValueError, id="unknown-role"),
    pytest.param("hi \ud800", {}, InvalidRequestError, id="lone-surrogate"),
    pytest.param([HumanMessage(content=[{"type": "image_url", "image_url": {"url": "x"}}])], {},
                 InvalidRequestError, id="image-content"),
    pytest.param("hi", {"max_tokens": -1}, InvalidRequestError, id="negative-max-tokens"),
    pytest.param("hi", {"temperature": -1.0}, InvalidRequestError, id="negative-temperature"),
    pytest.param("hi", {"top_p": 1.5}, InvalidRequestError, id="top-p-above-one"),
    pytest.param("hi", {"top_p": 0.0}, InvalidRequestError, id="top-p-zero"),
    pytest.param("hi", {"stop": [""]}, InvalidRequestError, id="empty-stop"),
    pytest.param("hi", {"nonsense": 1}, InvalidRequestError, id="unknown-parameter"),
    pytest.param(LONG_PROMPT, {}, ContextLengthError, id="prompt-over-context"),
    pytest.param("hi", {"max_tokens": 10**9}, ContextLengthError, id="too-many-tokens"),
])
def test_langchain_surfaces_the_engine_errors(registered: list[str], call: Any, messages: Any,
                                              kwargs: dict[str, Any], error: type[Exception]) -> None:
    model = ChatEnsemble(models=registered, max_tokens=4)
    with pytest.raises(error):
        call(model, messages, **kwargs)


@pytest.mark.parametrize("options", [
    pytest.param({"method": "bogus"}, id="unknown-method"),
    pytest.param({"max_tokens": 0}, id="zero-max-tokens"),
    pytest.param({"temperature": -1.0}, id="negative-temperature"),
    pytest.param({"top_p": 2.0}, id="top-p-above-one"),
    pytest.param({"draft_length": 0}, id="draft-length-zero"),
    pytest.param({"drafter": "nobody"}, id="unknown-drafter"),
    pytest.param({"models": []}, id="no-models"),
    pytest.param({"loop_guard": 3}, id="loop-guard-below-eight"),
    pytest.param({"tempreature": 0.5}, id="misspelt-keyword"),  # was dropped without a word
])
def test_langchain_rejects_bad_construction(registered: list[str], options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):  # pydantic's ValidationError or InvalidRequestError: both ValueError
        ChatEnsemble(**{"models": registered, **options})


def test_langchain_unknown_member_fails_on_first_call() -> None:
    model = ChatEnsemble(models=["no-such-model-anywhere", "nor-this-one"])
    with pytest.raises(InvalidRequestError, match="unknown model"):
        _lc_invoke(model, "hi")


# --------------------------------------------------------------------- LlamaIndex


def _li_chat(llm: EnsembleLLM, messages: list[ChatMessage], **kwargs: Any) -> Any:
    return asyncio.run(asyncio.wait_for(llm.achat(messages, **kwargs), TIMEOUT_S))


def _li_stream_first(llm: EnsembleLLM, messages: list[ChatMessage], **kwargs: Any) -> Any:
    async def go() -> Any:
        stream = await llm.astream_chat(messages, **kwargs)
        async for chunk in stream:
            return chunk
    return asyncio.run(asyncio.wait_for(go(), TIMEOUT_S))


USER = [ChatMessage(role="user", content="hi")]


@pytest.mark.parametrize("call", [_li_chat, _li_stream_first], ids=["achat", "astream_chat"])
@pytest.mark.parametrize("messages, kwargs, error", [
    pytest.param([ChatMessage(role="user", content="")], {}, InvalidRequestError, id="empty-prompt"),
    pytest.param([ChatMessage(role="user", content=" \n")], {}, InvalidRequestError, id="whitespace-prompt"),
    pytest.param([], {}, InvalidRequestError, id="no-messages"),
    pytest.param([ChatMessage(role="user", content="hi \ud800")], {}, InvalidRequestError, id="lone-surrogate"),
    pytest.param(USER, {"max_tokens": -1}, InvalidRequestError, id="negative-max-tokens"),
    pytest.param(USER, {"temperature": -1.0}, InvalidRequestError, id="negative-temperature"),
    pytest.param(USER, {"top_p": 1.5}, InvalidRequestError, id="top-p-above-one"),
    pytest.param([ChatMessage(role="user", content=LONG_PROMPT)], {}, ContextLengthError, id="prompt-over-context"),
    pytest.param(USER, {"max_tokens": 10**9}, ContextLengthError, id="too-many-tokens"),
])
def test_llamaindex_surfaces_the_engine_errors(toys: list, call: Any, messages: list[ChatMessage],
                                               kwargs: dict[str, Any], error: type[Exception]) -> None:
    llm = EnsembleLLM(models=toys, max_tokens=4)
    with pytest.raises(error):
        call(llm, messages, **kwargs)


def test_llamaindex_warns_about_and_ignores_an_unknown_argument(toys: list) -> None:
    # As other LlamaIndex LLMs do (another provider's ``format=`` must not break a shared pipeline).
    with pytest.warns(UserWarning, match="ignores the unknown argument 'nonsense'"):
        assert _li_chat(EnsembleLLM(models=toys, max_tokens=4), USER, nonsense=1) is not None


@pytest.mark.parametrize("options", [
    pytest.param({"method": "bogus"}, id="unknown-method"),
    pytest.param({"max_tokens": 0}, id="zero-max-tokens"),
    pytest.param({"temperature": -1.0}, id="negative-temperature"),
    pytest.param({"draft_length": 0}, id="draft-length-zero"),
    pytest.param({"top_p": 0.0}, id="top-p-zero"),
    pytest.param({"context_window": 0}, id="zero-context-window"),
    pytest.param({"context_window": -5}, id="negative-context-window"),
    pytest.param({"models": "toy-bpe,toy-sp"}, id="models-as-one-string"),
])
def test_llamaindex_rejects_bad_construction(toys: list, options: dict[str, Any]) -> None:
    with pytest.raises(InvalidRequestError):
        EnsembleLLM(**{"models": toys, **options})
