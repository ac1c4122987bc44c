"""Mutation gaps (round i): the LangChain adapter's message conversion, call options and metadata, the
LlamaIndex adapter's request and response mapping, engine options, calibration profiles and the member
and engine flags, each checked where a changed constant, comparison or branch went unnoticed. No model is
loaded: the chat models run on a scripted engine."""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from langchain_core.messages import AIMessage, ChatMessage
from llama_index.core.base.llms.types import ChatMessage as LlamaMessage
from llama_index.core.base.llms.types import ChatResponse, MessageRole, ToolCallBlock
from llama_index.core.tools import FunctionTool

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from langchain_ensemble.chat_models import to_engine_messages
from llamaindex_ensemble import EnsembleLLM
from llamaindex_ensemble.base import _openai_call
from llamaindex_ensemble.base import to_engine_messages as llama_engine_messages
from shared_engine import InvalidRequestError
from shared_engine.engine_args import (
    check_output_file,
    confidence_arg,
    default_method,
    loop_guard_arg,
    method_default_flags,
    weights_arg,
)
from shared_engine.errors import InvalidParametersError
from shared_engine.events import FinishEvent, Stats, TokenEvent, ToolCallEvent
from shared_engine.member_flags import _models, read_members_file
from shared_engine.options import EngineOptions, GenerationParams, ignored_options, validated
from shared_engine.profile import EnsembleProfile, _drafter_index, apply_profile, member_key

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather at a place.",
                                           "parameters": {"type": "object",
                                                          "properties": {"location": {"type": "string"}}}}}]


class RecordingEngine:
    """Stands in for the shared engine: records each request's parameters, answers "Hi" (finish ``finish``)."""

    def __init__(self, finish: FinishEvent | None = None) -> None:
        self.params: list[dict[str, Any]] = []
        self.finish = finish or FinishEvent(reason="eos", text="Hi", stats=Stats(prompt_tokens=4, tokens=1))

    async def astream(self, messages: list[dict[str, Any]], **params: Any) -> AsyncIterator[Any]:
        self.params.append(params)
        await asyncio.sleep(0)
        yield TokenEvent(text="Hi", source="draft", position=0)
        yield self.finish


@pytest.fixture
def engine(monkeypatch: pytest.MonkeyPatch) -> RecordingEngine:
    recording = RecordingEngine()
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: recording)
    return recording


# -- LangChain: message conversion -------------------------------------------------------------------


def test_a_developer_message_is_a_system_turn() -> None:
    """OpenAI's "developer" role is the system prompt (mutant L18: read as a user turn)."""
    assert to_engine_messages([ChatMessage(role="developer", content="Be brief.")]) == [
        {"role": "system", "content": "Be brief."}]


def test_reasoning_blocks_of_an_earlier_answer_are_skipped() -> None:
    """A v1 answer's reasoning is not its text and no error (mutant L13: refused as an unsupported block)."""
    answer = AIMessage(content=[{"type": "reasoning", "reasoning": "think"}, {"type": "text", "text": "Hi"}])
    assert to_engine_messages([answer]) == [{"role": "assistant", "content": "Hi"}]


def test_a_call_block_with_args_keeps_its_arguments() -> None:
    """An answer whose calls are content blocks only, arguments under "args" (a v1 ``tool_call`` block): the
    history keeps them (mutant L14: read "input" alone, the call was sent with no arguments)."""
    answer = AIMessage(content=[{"type": "tool_call", "name": "get_weather", "args": {"location": "Paris"},
                                 "id": "c1"}])
    [converted] = to_engine_messages([answer])
    assert converted["tool_calls"] == [{"id": "c1", "type": "function",
                                        "function": {"name": "get_weather", "arguments": {"location": "Paris"}}}]


# -- LangChain: call options -------------------------------------------------------------------------


def test_bind_tools_passes_parallel_tool_calls_false() -> None:
    """``parallel_tool_calls=False`` asks for one call at most (mutant L23: a False was dropped, as unset)."""
    bound = ChatEnsemble(models=MODELS).bind_tools(TOOLS, parallel_tool_calls=False)
    assert bound.kwargs["parallel_tool_calls"] is False  # type: ignore[attr-defined]


def test_a_call_max_tokens_of_zero_reaches_the_engine(engine: RecordingEngine) -> None:
    """A call's ``max_tokens=0`` is sent (the engine refuses it), not read as "unset" and answered at the
    default length (mutant L35: ``if asked:``)."""
    ChatEnsemble(models=MODELS).invoke("hi", max_tokens=0)
    assert engine.params[-1]["max_new_tokens"] == 0


def test_models_and_members_naming_other_models_are_refused() -> None:
    """``models`` and ``members`` both given, naming different models: refused, not one silently used
    (mutant L34: the check dropped)."""
    with pytest.raises(ValueError, match="give models or members, not both"):
        ChatEnsemble(models=[MODELS[0]], members=[{"model": MODELS[1]}])


def test_langsmith_params_take_a_call_temperature() -> None:
    """The traced temperature is the call's where it sets one (mutant L38: the model's always)."""
    llm = ChatEnsemble(models=MODELS, temperature=0.2)
    assert llm._get_ls_params(temperature=0.9)["ls_temperature"] == 0.9
    assert llm._get_ls_params()["ls_temperature"] == 0.2


def test_a_call_stop_list_that_is_empty_replaces_the_default_stops(engine: RecordingEngine) -> None:
    """``stop=[]`` per call asks for no stop strings (mutant L20: ``stop or self.stop`` sent the defaults)."""
    ChatEnsemble(models=MODELS, stop=["\n\n"]).invoke("hi", stop=[])
    assert engine.params[-1]["stop"] == []


def test_max_new_tokens_is_max_tokens_unless_both_are_given() -> None:
    """The engine's name is read as ``max_tokens``; with both given it is an unknown argument, not a
    second length that silently wins (mutant L31)."""
    assert ChatEnsemble(models=MODELS, max_new_tokens=16).max_tokens == 16
    with pytest.raises(ValueError, match=r"unknown arguments \['max_new_tokens'\]"):
        ChatEnsemble(models=MODELS, max_tokens=8, max_new_tokens=16)


def test_langsmith_params_take_a_call_max_tokens() -> None:
    """The traced cap is the call's where it sets one (mutant L29: the model's always)."""
    llm = ChatEnsemble(models=MODELS, max_tokens=8)
    assert (llm._get_ls_params(max_tokens=3)["ls_max_tokens"], llm._get_ls_params()["ls_max_tokens"]) == (3, 8)


def test_an_empty_token_is_no_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    """A token event without text (a held-back piece) streams no chunk: the chunks are the text's pieces
    and the final one (mutant L10: an empty chunk before "Hi")."""
    recording = RecordingEngine()
    finish = recording.finish

    async def astream(messages: Any, **params: Any) -> AsyncIterator[Any]:
        yield TokenEvent(text="", source="draft", position=0)
        yield TokenEvent(text="Hi", source="draft", position=0)
        yield finish

    monkeypatch.setattr(recording, "astream", astream)
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: recording)
    chunks = list(ChatEnsemble(models=MODELS).stream("hi"))
    assert [c.content for c in chunks] == ["Hi", ""] and chunks[-1].usage_metadata is not None


def test_the_model_profile_says_tool_choice_and_structured_output_are_supported() -> None:
    """langchain-core's profile is what agents read before passing ``tool_choice`` (mutant L33: False)."""
    profile = ChatEnsemble(models=MODELS).profile
    assert profile is not None
    assert (profile["tool_calling"], profile["tool_choice"], profile["structured_output"]) == (True, True, True)


# -- LlamaIndex: request and response mapping --------------------------------------------------------


class ScriptedLlamaEngine:
    """Replays ``events`` for every request, recording each request's parameters."""

    def __init__(self, *events: Any) -> None:
        self.events = events
        self.params: list[dict[str, Any]] = []

    async def astream(self, messages: Any, **params: Any) -> AsyncIterator[Any]:
        self.params.append(params)
        for event in self.events:
            await asyncio.sleep(0)
            yield event


def scripted_llm(*events: Any) -> tuple[EnsembleLLM, ScriptedLlamaEngine]:
    llm = EnsembleLLM(models=["drafter", "verifier"], context_window=4096)
    engine = ScriptedLlamaEngine(*events)
    llm._engine = engine  # type: ignore[assignment]
    return llm, engine


def weather_tool() -> FunctionTool:
    def get_weather(location: str) -> str:
        """Weather at a place."""
        return "sunny"

    return FunctionTool.from_defaults(fn=get_weather)


def test_llamaindex_reports_an_unreadable_call_and_the_stop_string() -> None:
    """An unreadable call's text and the stop string that ended the answer reach ``additional_kwargs``
    (mutants I02, I03: either dropped); ``raw`` holds OpenAI's finish reason beside the engine's (I01)."""
    call = ToolCallEvent(index=0, id="call_1", raw='{"tool": "x"}', error="no function name")
    finish = FinishEvent(reason="stop", text="Hi", stats=Stats(prompt_tokens=3, tokens=1), stop_string="\n\n")
    llm, _ = scripted_llm(TokenEvent(text="Hi", source="draft", position=0), call, finish)
    response = llm.chat([LlamaMessage(role=MessageRole.USER, content="hi")])
    assert response.additional_kwargs["invalid_tool_calls"] == ['{"tool": "x"}']
    assert response.additional_kwargs["stop_string"] == "\n\n"
    eos, _ = scripted_llm(FinishEvent(reason="eos", text="", stats=Stats()))
    raw = eos.chat([LlamaMessage(role=MessageRole.USER, content="hi")]).raw
    assert raw is not None and (raw["finish_reason"], raw["engine_finish_reason"]) == ("stop", "eos")


def test_llamaindex_streams_no_delta_for_an_empty_token() -> None:
    """An empty token publishes nothing (mutant I04: an empty delta before "Hi")."""
    finish = FinishEvent(reason="eos", text="Hi", stats=Stats())
    llm, _ = scripted_llm(TokenEvent(text="", source="draft", position=0),
                          TokenEvent(text="Hi", source="draft", position=0), finish)
    deltas = [r.delta for r in llm.stream_chat([LlamaMessage(role=MessageRole.USER, content="hi")])]
    assert deltas == ["Hi", ""]


def test_llamaindex_call_arguments_of_none_keep_the_llms_own() -> None:
    """``chat(..., temperature=None)`` means this LLM's temperature, as LlamaIndex callers pass it (mutant
    I08: None was sent and refused)."""
    llm, engine = scripted_llm(FinishEvent(reason="eos", text="", stats=Stats()))
    llm.chat([LlamaMessage(role=MessageRole.USER, content="hi")], temperature=None, max_tokens=None)
    assert engine.params[-1]["temperature"] == llm.temperature and "max_new_tokens" not in engine.params[-1]


def test_llamaindex_tool_required_overrides_an_auto_choice_and_false_parallel_calls_are_sent() -> None:
    """``tool_required=True`` with ``tool_choice="auto"`` forces a call (mutant I05: only without a
    choice); ``parallel_tool_calls=False`` reaches the engine (mutant I06: a False was dropped)."""
    llm, _ = scripted_llm()
    params = llm._request([LlamaMessage(role=MessageRole.USER, content="hi")],
                          {"tools": [weather_tool()], "tool_choice": "auto", "tool_required": True,
                           "parallel_tool_calls": False}).params
    assert params["tool_choice"] == "required" and params["parallel_tool_calls"] is False


def test_llamaindex_tool_required_without_tools_asks_for_nothing() -> None:
    """No tools: ``tool_required`` is not passed on (mutant I09: sent, and a request without tools asked for
    a required call)."""
    llm, _ = scripted_llm()
    assert "tool_required" not in llm._prepare_chat_with_tools([], user_msg="hi", tool_required=True)


def test_llamaindex_keeps_the_first_call_only_unless_parallel_calls_are_allowed() -> None:
    """Of three calls one is kept (mutant I10: two were)."""
    llm, _ = scripted_llm()
    blocks = [ToolCallBlock(tool_call_id=f"c{i}", tool_name="get_weather", tool_kwargs={}) for i in range(3)]
    response = ChatResponse(message=LlamaMessage(role=MessageRole.ASSISTANT, blocks=blocks))
    kept = llm._validate_chat_with_tools_response(response, [weather_tool()])
    assert [b.tool_call_id for b in kept.message.blocks if isinstance(b, ToolCallBlock)] == ["c0"]


def test_llamaindex_tool_selections_keep_the_call_ids() -> None:
    """A call's own id is its selection's id: the tool's result is matched to it (mutant I12: call_0, ...)."""
    llm, _ = scripted_llm()
    block = ToolCallBlock(tool_call_id="call_abc", tool_name="get_weather", tool_kwargs={"location": "Paris"})
    response = ChatResponse(message=LlamaMessage(role=MessageRole.ASSISTANT, blocks=[block]))
    [selection] = llm.get_tool_calls_from_response(response)
    assert (selection.tool_id, selection.tool_kwargs) == ("call_abc", {"location": "Paris"})


def test_llamaindex_history_sends_each_call_once_and_tool_results_with_their_ids() -> None:
    """An answer holding its calls as blocks and in the legacy field sends them once (mutant I13: twice);
    calls on a user message are not sent (I14); a tool result keeps its call id (I15)."""
    block = ToolCallBlock(tool_call_id="c1", tool_name="get_weather", tool_kwargs={"location": "Paris"})
    legacy = {"tool_calls": [{"id": "c1", "type": "function",
                              "function": {"name": "get_weather", "arguments": '{"location": "Paris"}'}}]}
    answer = LlamaMessage(role=MessageRole.ASSISTANT, blocks=[block], additional_kwargs=legacy)
    user = LlamaMessage(role=MessageRole.USER, content="hi", additional_kwargs=legacy)
    result = LlamaMessage(role=MessageRole.TOOL, content="sunny", additional_kwargs={"tool_call_id": "c1"})
    converted = llama_engine_messages([user, answer, result])
    assert "tool_calls" not in converted[0]
    assert [c["id"] for c in converted[1]["tool_calls"]] == ["c1"]
    assert converted[2] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}


def test_llamaindex_call_arguments_already_json_are_not_encoded_again() -> None:
    """Arguments held as a JSON string stay that string (mutant I16: encoded twice, a quoted string)."""
    block = ToolCallBlock(tool_call_id="c1", tool_name="get_weather", tool_kwargs='{"location": "Paris"}')
    assert _openai_call(block)["function"]["arguments"] == '{"location": "Paris"}'


# -- engine options ----------------------------------------------------------------------------------


def test_a_stop_of_none_is_no_stop_strings() -> None:
    """``stop=None`` (what an OpenAI client sends for "none") is an empty list (mutant O01: refused)."""
    assert validated(GenerationParams, stop=None).stop == []
    assert validated(GenerationParams, stop="\n").stop == ["\n"]


def test_overlap_true_and_false_read_as_on_and_off() -> None:
    """Mutant O02: the switch read the other way round."""
    assert (EngineOptions(overlap=True).overlap, EngineOptions(overlap=False).overlap) == ("on", "off")


def test_all_zero_weights_are_refused() -> None:
    """Weights that sum to 0 give no member a say (mutant O03: accepted, ``sum(value) < 0``)."""
    with pytest.raises(InvalidParametersError, match="not all zero"):
        validated(EngineOptions, weights=[0.0, 0.0])
    assert validated(EngineOptions, weights=[0.0, 1.0]).weights == [0.0, 1.0]


def test_safe_given_drafter_none_picks_the_drafter_per_request() -> None:
    """``drafter=None`` passed explicitly is the method's default, "auto" for SAFE (mutant O05: left None)."""
    assert EngineOptions(method="safe", drafter=None).drafter == "auto"


def test_a_first_draft_as_long_as_the_longest_is_accepted() -> None:
    """The bound is inclusive (mutant O07: ``draft_length == max_draft_length`` refused)."""
    assert EngineOptions(draft_length=16, max_draft_length=16).draft_length == 16
    with pytest.raises(ValueError, match="exceeds max_draft_length"):
        EngineOptions(draft_length=17, max_draft_length=16)


def test_a_margin_threshold_of_one_is_accepted() -> None:
    """A margin is in [0, 1], 1 included (mutant O08: refused)."""
    assert EngineOptions(method="adafuse", threshold=1.0).threshold == 1.0


def test_an_option_another_method_reads_is_ignored_only_away_from_its_default() -> None:
    """A default passed explicitly is not reported (mutant O09: every option given was)."""
    assert ignored_options("safe", {"max_words"}, {"max_words": 3}) == []
    assert ignored_options("safe", {"max_words"}, {"max_words": 4}) == ["max_words"]


def test_a_deep_copy_with_an_update_marks_the_field_set() -> None:
    """``model_copy(update={"max_tokens": 64}, deep=True)`` asks for 64 tokens (mutant O12: the field was
    not marked set, and the copy sent no length)."""
    copy = ChatEnsemble(models=MODELS).model_copy(update={"max_tokens": 64}, deep=True)
    assert copy._answer_length(None) == {"max_new_tokens": 64}


def test_another_apis_seed_name_gets_a_hint() -> None:
    """Mistral's ``random_seed`` is pointed to ``seed`` (mutant O14: no hint, too far for difflib)."""
    with pytest.raises(InvalidParametersError, match="did you mean 'seed'"):
        validated(GenerationParams, random_seed=3)


# -- calibration profiles ----------------------------------------------------------------------------


def profile_data(**fields: Any) -> dict[str, Any]:
    fitted = {"bench": "b", "data": "dev.jsonl", "questions": 2, "method": "m"}
    return {"members": MODELS, "weights": [0.6, 0.4], "drafter": MODELS[1], "drafter_confidence": 0.3,
            "fitted": fitted, **fields}


def saved_profile(tmp_path: Any, **fields: Any) -> str:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_data(**fields)), encoding="utf-8")
    return str(path)


def test_a_profile_of_zero_weights_or_a_foreign_drafter_is_refused() -> None:
    """Mutants P04 (``sum < 0``) and P05 (the drafter check dropped): both loaded."""
    with pytest.raises(ValueError, match="not all zero"):
        EnsembleProfile.model_validate(profile_data(weights=[0.0, 0.0]))
    with pytest.raises(ValueError, match="is not one of the members"):
        EnsembleProfile.model_validate(profile_data(drafter="gemma-3-270m"))


def test_a_gguf_member_is_known_by_its_stem() -> None:
    """``models/qwen.Q8_0.gguf`` is the model ``qwen.Q8_0`` (mutant P06: the suffix kept, no profile matched)."""
    assert member_key("models/qwen.Q8_0.gguf") == "qwen.Q8_0"


def test_an_explicit_drafter_weight_keeps_the_profiles_weights_out(tmp_path: Any) -> None:
    """``drafter_weight`` counts as weights given (mutant P08: the profile's weights filled in anyway)."""
    merged = apply_profile(MODELS, {"profile": saved_profile(tmp_path), "drafter_weight": 3.0})
    assert merged.get("weights") is None and merged["drafter"] == 1


def test_an_explicit_drafter_confidence_of_none_is_kept(tmp_path: Any) -> None:
    """None asks for the paper's rule (mutant P09: the profile's 0.3 filled it)."""
    merged = apply_profile(MODELS, {"profile": saved_profile(tmp_path), "drafter_confidence": None})
    assert merged["drafter_confidence"] is None
    assert apply_profile(MODELS, {"profile": saved_profile(tmp_path)})["drafter_confidence"] == 0.3


def test_a_drafter_given_as_a_digit_string_is_that_member() -> None:
    """``--drafter 1`` reaches the profile as "1" (mutant P14: not read as an index)."""
    assert _drafter_index(MODELS, MODELS, "1") == 1


# -- member and engine flags -------------------------------------------------------------------------


def test_models_flag_of_only_commas_is_refused() -> None:
    """Mutant M01: ``--models ,`` gave no member and no error."""
    with pytest.raises(argparse.ArgumentTypeError, match="at least one model"):
        _models(" , ")


def test_members_file_errors_name_the_entry_and_refuse_an_empty_list(tmp_path: Any) -> None:
    """The bad entry is counted from 1 (mutant M04: from 0); an empty list is refused (M03); a mapping with
    keys beside ``members`` is no members file (M02: its list was read)."""
    bad = tmp_path / "members.json"
    bad.write_text(json.dumps([MODELS[0], {"model": MODELS[1], "dtype": "float99"}]), encoding="utf-8")
    with pytest.raises(ValueError, match=r"member 2: "):
        read_members_file(bad)
    empty = tmp_path / "empty.json"
    empty.write_text("[]", encoding="utf-8")
    with pytest.raises(ValueError, match="non-empty list"):
        read_members_file(empty)
    extra = tmp_path / "extra.json"
    extra.write_text(json.dumps({"members": [MODELS[0]], "method": "safe"}), encoding="utf-8")
    with pytest.raises(ValueError, match="non-empty list"):
        read_members_file(extra)


def test_weights_auto_with_spaces_and_off_for_none() -> None:
    """``--weights " auto"`` is auto (mutant E02: a number error); ``--loop-guard off`` is none (E03)."""
    assert weights_arg(" auto ") == "auto"
    assert loop_guard_arg("off") == "none" and confidence_arg("None") == "none"


def test_one_model_runs_single_and_a_none_flag_is_none() -> None:
    """Mutant E04: one model ran safe; E05: ``--sharpen none`` reached the engine as the string "none"."""
    assert (default_method(["a"]), default_method(["a", "b"])) == ("single", "safe")
    args = argparse.Namespace(fusion=None, sharpen="none", drafter_confidence=0.4, drafter_weight=None,
                              plausibility="none", loop_guard=None)
    assert method_default_flags(args) == {"sharpen": None, "drafter_confidence": 0.4, "plausibility": None}


def test_an_output_path_that_is_a_folder_is_refused(tmp_path: Any) -> None:
    """Mutant E07: a folder passed the check, and the command failed after its work."""
    with pytest.raises(InvalidRequestError, match="is a folder"):
        check_output_file(tmp_path, "--out", "report")
