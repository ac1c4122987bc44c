"""``EnsembleLLM``: a LlamaIndex ``FunctionCallingLLM`` over ``shared_engine.EnsembleEngine``.

    llm = EnsembleLLM(models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"], max_tokens=128)
    print(llm.complete("What is 17 + 25?"))
    Settings.llm = llm                                   # query engines, chat engines, agents

Design:
- The async methods drive ``engine.astream`` on the caller's loop; the sync ones drive the same
  stream through ``shared_engine.engine.iterate_sync`` (a helper thread, safe inside a running
  loop). All eight share one undecorated core, so every public call sends exactly one set of
  LlamaIndex LLM events.
- Ensemble decisions are sent as ``EnsembleDecisionEvent``/``EnsembleFinishEvent`` on the span of
  the LLM call (see ``events.py``); usage is in ``raw["usage"]`` of the final response and the
  ensemble statistics in ``raw["ensemble"]``.
- Tools, forced calls (``tool_required``) and parsing are the engine's one mechanism
  (``shared_engine.tools``); this adapter only translates the types.
- ``structured_predict`` (and its async and streaming forms) asks the engine for
  ``response_format=json_schema`` with the output class's schema: decoding is constrained to it
  (``shared_engine.json_constraint``), where LlamaIndex's default for a function-calling LLM is a
  forced tool call with unconstrained arguments. Another ``pydantic_program_mode`` goes the
  LlamaIndex way.
- Unknown keyword arguments (e.g. another provider's ``format=``) are ignored with a warning, as
  other LlamaIndex LLMs do.
- Each ``EnsembleLLM`` builds its own engine, which holds its members in the registry; ``close()``,
  ``aclose()`` or garbage collection of the LLM and of every copy of it closes that engine, so the
  members no other engine holds are unloaded (``_SharedEngine``).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
import warnings
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import llama_index.core
import llama_index_instrumentation
from llama_index.core.base.llms.types import (
    ChatMessage,
    ChatResponse,
    ChatResponseAsyncGen,
    ChatResponseGen,
    CompletionResponse,
    CompletionResponseAsyncGen,
    CompletionResponseGen,
    LLMMetadata,
    MessageRole,
    TextBlock,
    ThinkingBlock,
    ToolCallBlock,
)
from llama_index.core.instrumentation.events.llm import LLMStructuredPredictEndEvent, LLMStructuredPredictStartEvent
from llama_index.core.instrumentation.span import active_span_id
from llama_index.core.llms.callbacks import llm_chat_callback, llm_completion_callback
from llama_index.core.llms.function_calling import FunctionCallingLLM
from llama_index.core.llms.llm import ToolSelection
from llama_index.core.prompts import BasePromptTemplate
from llama_index.core.types import PydanticProgramMode
from pydantic import BaseModel, Field, PrivateAttr

from shared_engine import EngineClosedError, EnsembleEngine, InvalidRequestError, MemberConfig, MemberDefaults
from shared_engine.engine import iterate_sync
from shared_engine.events import Event, FinishEvent
from shared_engine.members import Member
from shared_engine.members.chat import join_text_parts, normalize_messages, template_overhead
from shared_engine.options import GenerationParams, copy_unsetting, unset_field, validated
from shared_engine.tools import ANSWER_CUT, plain_tool_choice

from .events import EnsembleDecisionEvent, EnsembleFinishEvent, EnsembleSpanEvent, EnsembleStepEvent, dispatcher

if TYPE_CHECKING:
    from llama_index.core.tools.types import BaseTool

_ROLES = {MessageRole.SYSTEM: "system", MessageRole.DEVELOPER: "system", MessageRole.USER: "user",
          MessageRole.ASSISTANT: "assistant", MessageRole.CHATBOT: "assistant", MessageRole.MODEL: "assistant",
          MessageRole.TOOL: "tool", MessageRole.FUNCTION: "tool"}
_PARAM_ALIASES = {"max_tokens": "max_new_tokens"}
_SKIPPED_BLOCKS = ("thinking", "cache")  # carry nothing the members should read
_TOOL_KWARGS = ("tools", "tool_choice", "tool_required", "parallel_tool_calls", "response_format")
Model = TypeVar("Model", bound=BaseModel)
DEFAULT_TOOL_RESULT_HINT = "Using the function result above, answer my original question in plain text."


@dataclass
class _Request:
    """One validated call: engine messages and the engine's keyword arguments."""

    messages: list[dict[str, Any]]
    params: dict[str, Any]


@dataclass
class _Turn:
    """One answer in progress: engine events in, cumulative text and the final payload out."""

    text: str = ""
    finish: FinishEvent | None = None
    tool_calls: list[ToolCallBlock] = field(default_factory=list)
    invalid_tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """Calls the engine could not read, as LangChain's ``InvalidToolCall`` (name, args: the text as
    written, id, error: why): an agent gets no call from them, so without these its empty answer
    said nothing of the call it dropped."""

    @property
    def raw(self) -> dict[str, Any] | None:
        """OpenAI-style usage plus the ensemble statistics (and the unreadable calls); only on the
        final response."""
        if self.finish is None:
            return None
        finish = self.finish
        raw: dict[str, Any] = {"usage": finish.usage.model_dump(), "finish_reason": finish.openai_finish_reason,
                               "engine_finish_reason": finish.reason, "ensemble": finish.stats.model_dump()}
        if self.invalid_tool_calls:
            raw["invalid_tool_calls"] = list(self.invalid_tool_calls)
        return raw

    @property
    def additional_kwargs(self) -> dict[str, Any]:
        if self.finish is None:
            return {}
        extra: dict[str, Any] = {"finish_reason": self.finish.openai_finish_reason,
                                 "ensemble_rate": self.finish.stats.ensemble_rate}
        if self.invalid_tool_calls:  # the texts as written (the message's entries say why)
            extra["invalid_tool_calls"] = [call["args"] for call in self.invalid_tool_calls]
        if self.finish.format_error:
            extra["format_error"] = self.finish.format_error
        if self.finish.stop_string is not None:
            extra["stop_string"] = self.finish.stop_string
        return extra


class _SharedEngine:
    """The engine an ``EnsembleLLM`` built, shared with its copies (``model_copy``, ``copy.deepcopy``):
    each holds it with a token of its own, and the last one to let go (``close()``, ``aclose()``, or a
    ``weakref.finalize`` when it is collected) closes the engine, which releases its members. Without
    this, every dropped ``EnsembleLLM`` kept its members held in the registry, loaded for good.

    Tokens live in a set, whose add and discard need no lock: a finalizer runs inside any garbage
    collection, also one triggered while this thread holds a lock it would wait for."""

    def __init__(self, engine: EnsembleEngine) -> None:
        self.engine = engine
        self._users: set[object] = set()

    def hold(self, llm: EnsembleLLM) -> weakref.finalize[..., Any]:
        """One more user, let go of when ``llm`` is collected or the returned finalizer is called."""
        token = object()
        self._users.add(token)
        return weakref.finalize(llm, self.release, token)

    def let_go(self, token: object) -> EnsembleEngine | None:
        """Count off ``token``; the engine to close if it was the last user."""
        self._users.discard(token)
        return None if self._users else self.engine

    def release(self, token: object) -> None:
        engine = self.let_go(token)
        if engine is not None:
            engine.close_from_anywhere("EnsembleLLM engine close")


def _spent_release() -> weakref.finalize[..., Any]:
    """A hold already let go of: what a closed LLM has (``_closed``; calling it does nothing). Registered
    on this function, which lives as long as the module, and detached at once: it never runs."""
    release = weakref.finalize(_spent_release, int)
    release.detach()
    return release


_CLOSED_STATE = "closed"
"""The key of a pickled EnsembleLLM's state that says it was closed (``__getstate__``)."""


def _member_models(members: Sequence[MemberConfig | dict[str, Any]] | str) -> list[Any] | None:
    """The model of each member (``members`` as given or as ``to_dict`` wrote it); None for a str."""
    if isinstance(members, str):
        return None
    return [m.model if isinstance(m, MemberConfig) else m.get("model") if isinstance(m, dict) else m
            for m in members]


_FRAMEWORK_DIRS = tuple(str(Path(folder).resolve()) + os.sep for folder in
                        [*map(str, llama_index.core.__path__), *map(str, llama_index_instrumentation.__path__),
                         str(Path(__file__).parent)])


def _caller_stacklevel() -> int:
    """The ``stacklevel`` that points a warning at the user's call: the first frame outside LlamaIndex
    and this package (the depth differs between chat, stream_chat, complete and the dispatcher's
    wrappers, so a fixed level pointed into LlamaIndex's dispatcher)."""
    frame: FrameType | None = sys._getframe(2)
    level = 2  # level 1: the function calling warnings.warn
    while frame is not None and str(Path(frame.f_code.co_filename).resolve()).startswith(_FRAMEWORK_DIRS):
        frame, level = frame.f_back, level + 1
    return level


def _pickles(value: object) -> bool:
    try:
        pickle.dumps(value)
    except Exception:  # noqa: BLE001 - anything pickle raises means it does not pickle
        return False
    return True


def _check_context_window(value: int | None) -> None:
    """At least 1 where given, whether at construction, on assignment or in ``model_copy(update=)``:
    -5 reached LlamaIndex's prompt helper, and 0 read as "not given" (it loaded the members)."""
    if value is not None and value < 1:
        raise InvalidRequestError(f"context_window must be at least 1, got {value}")


class EnsembleLLM(FunctionCallingLLM):
    """Several local LLMs with different tokenizers answering as one LlamaIndex LLM (SAFE by default).

    ``EnsembleLLM(models=[...], method="safe", max_tokens=256, temperature=0.0, **engine_options)``:
    ``engine_options`` are ``shared_engine.EngineOptions`` (``drafter``, ``draft_length``, ``fusion``,
    ``weights``, ...); LlamaIndex ``LLM`` fields (``system_prompt``, ``callback_manager``, ...) are
    recognised by name. ``members=[MemberConfig(...)]`` instead of ``models`` gives each member its
    own device / dtype / server options; ``member_options={"dtype": "bfloat16"}`` (or ``dtype=``)
    sets them for every transformers member. Members load on first use, shared while any engine holds them.
    ``close()`` / ``aclose()`` (or garbage collection of the LLM and its copies) releases them.
    """

    # The fields that built the engine are frozen: assigning one (``llm.method = "adafuse"``) changed
    # ``model_name`` while the engine went on running the original ensemble.
    models: list[str] = Field(frozen=True,
                              description="Member names (zoo names, local folders, .gguf paths, hub ids, specs).")
    members: list[MemberConfig] | None = Field(
        None, frozen=True,
        description="Members with their own options (device, dtype, server settings), instead of models.")
    member_options: dict[str, Any] = Field(
        default_factory=dict, frozen=True,
        description="MemberDefaults for every transformers member that sets none "
                    "(device, device_map, dtype, attn_implementation, compile).")
    method: str = Field("safe", frozen=True, description="safe | every-token | gac-threshold | single | adafuse")
    max_tokens: int = Field(
        256, ge=1,
        description="Default answer length cap (drafter tokens). Unset (or None): 256, or less where the prompt "
                    "leaves less room in a member's context window (the answer then ends with finish 'length' "
                    "where the window is full, not refused); a length set here or per call must fit.")
    temperature: float = Field(0.0, ge=0.0, description="0 = greedy.")
    context_window: int | None = Field(
        None, ge=1, description="Override, taken as is; default: the smallest member's context window less the "
                                "most tokens a member's chat template adds to a prompt (loads the members).")
    engine_options: dict[str, Any] = Field(default_factory=dict, frozen=True,
                                           description="Extra EnsembleEngine options.")
    step_events: bool = Field(False, description="Also send draft/verify/cache_sync as EnsembleStepEvent.")
    tool_result_hint: str | None = Field(
        DEFAULT_TOOL_RESULT_HINT,
        description="User turn the engine adds after tool results when tools are offered (the engine's "
                    "tool_result_hint): small members otherwise repeat the call instead of answering. "
                    "None disables it (multi-step tool chains).")

    _engine: EnsembleEngine = PrivateAttr()
    _shared: _SharedEngine = PrivateAttr()
    _release: weakref.finalize[..., Any] = PrivateAttr()  # this LLM's hold on the engine (see _SharedEngine)
    _template_room: tuple[EnsembleEngine, int] | None = PrivateAttr(default=None)  # per engine (its members are fixed)

    def __init__(self, models: Sequence[str | Member] | None = None, method: str = "safe",
                 max_tokens: int | None = None, temperature: float = 0.0, context_window: int | None = None,
                 step_events: bool = False, members: Sequence[MemberConfig | dict[str, Any]] | None = None,
                 member_options: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if models is not None and members is not None and list(models) == _member_models(members):
            models = None  # what to_dict()/to_json() and pickling write beside members: the same members
        if models is None and members is None:
            raise InvalidRequestError("give models=[names] or members=[MemberConfig(...)]")
        if models is not None and members is not None:
            raise InvalidRequestError("give models or members (MemberConfig list), not both")
        _check_context_window(context_window)
        if "max_new_tokens" in kwargs:  # the engine's name for it (ChatEnsemble takes it too)
            if max_tokens is not None:
                raise InvalidRequestError("give max_tokens or max_new_tokens, not both")
            max_tokens = kwargs.pop("max_new_tokens")
        # unset (None) stays unset, in the engine and in this LLM's fields (_answer_length)
        length: dict[str, int] = {} if max_tokens is None else {"max_tokens": max_tokens}
        engine_options = dict(kwargs.pop("engine_options", None) or {})
        doubled = sorted(engine_options.keys() & {"max_new_tokens", "max_tokens", "temperature"})
        if doubled:  # EnsembleLLM's own fields: the engine got them twice (a TypeError)
            raise InvalidRequestError(f"engine_options {doubled}: set them as EnsembleLLM(max_tokens=..., "
                                      "temperature=...)")
        fields = {k: kwargs.pop(k) for k in list(kwargs) if k in type(self).model_fields}
        engine_options.update(kwargs)  # whatever is not a field is an engine option
        placement = dict(member_options or {})
        for key in MemberDefaults.model_fields.keys() & engine_options.keys():
            placement[key] = engine_options.pop(key)
        validated(MemberDefaults, **placement)
        # Validates method, options, member configs, parameters and member count first, so bad values
        # raise the engine's InvalidRequestError (not LlamaIndex's field errors); loads nothing yet.
        given = members if members is not None else models
        specs: Any = given if isinstance(given, str) else list(given or [])  # the engine refuses a str
        asked: dict[str, Any] = {} if max_tokens is None else {"max_new_tokens": max_tokens}  # the engine's name
        engine = EnsembleEngine(specs, method=method, **asked, temperature=temperature, **placement, **engine_options)
        names = [s.model if isinstance(s, MemberConfig) else s.name for s in engine.member_specs]
        configs = [s for s in engine.member_specs if isinstance(s, MemberConfig)] if members is not None else None
        super().__init__(models=names, members=configs, member_options=placement, method=method,
                         **length, temperature=temperature, context_window=context_window,
                         engine_options=engine_options, step_events=step_events, **fields)
        self._engine = engine
        self._shared = _SharedEngine(engine)
        self._release = self._shared.hold(self)

    def __getstate__(self) -> dict[str, Any]:
        """The fields and whether this LLM was closed: unpickling (``IngestionPipeline(num_workers=N)``
        pickles its transformations) builds a new engine from them in ``__setstate__``."""
        built = [s.name for s in self._engine.member_specs if not isinstance(s, MemberConfig)]
        if built:
            raise InvalidRequestError(f"an EnsembleLLM over built members ({', '.join(built)}) cannot be pickled: "
                                      "unpickling rebuilds it from names; give names or MemberConfigs")
        # pydantic's state, not LlamaIndex's: that one tries to pickle the engine and logs a warning
        # ("Removing unpickleable private attribute _engine") on every pickle, as IngestionPipeline's workers do;
        # the private attributes are rebuilt anyway. Its filter of the fields that do not pickle stays.
        state = BaseModel.__getstate__(self)
        for key in [k for k, v in state["__dict__"].items() if not _pickles(v)]:
            logging.warning("Removing unpickleable attribute %s", key)  # as LlamaIndex says it
            del state["__dict__"][key]
        return {**state, "__pydantic_private__": None, _CLOSED_STATE: self._closed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Build a new engine from the pickled fields. LlamaIndex's fallback, when ``__init__`` failed
        (``models`` beside ``members`` did), restored an LLM without an engine that said it was closed;
        here the error surfaces. A restored LLM then starts as a copy does (``_holding``): a closed
        LLM's is closed (it came back open, loading members again); a state pickled before the closed
        flag was written is an open LLM's."""
        fields = dict(state["__dict__"])
        if "max_tokens" not in state.get("__pydantic_fields_set__", {"max_tokens"}):
            fields["max_tokens"] = None  # unset, as pickled (_answer_length)
        self.__init__(**fields)  # type: ignore[misc]  # holds the engine it built, as a new LLM does
        if state.get(_CLOSED_STATE, False):
            self._start_like(closed=True)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy sharing this LLM's engine; ``update`` may not change the fields that built the engine
        (they would describe another ensemble than the one running)."""
        frozen = sorted(k for k in update or {} if (info := type(self).model_fields.get(k)) and info.frozen)
        if frozen:
            raise InvalidRequestError(f"model_copy cannot update {frozen}: they built this LLM's engine; "
                                      "make a new EnsembleLLM(...) for another ensemble")
        if update and "context_window" in update:  # model_copy validates nothing: -5 went on to the prompt helper
            _check_context_window(update["context_window"])
        return copy_unsetting(super().model_copy, update, deep)

    def __setattr__(self, name: str, value: Any) -> None:
        """``llm.context_window = -5`` is refused as ``__init__`` refuses it (fields are not validated on
        assignment; LlamaIndex's prompt helper used -5); ``llm.max_tokens = None`` unsets the length, as
        ``max_tokens=None`` in ``__init__`` does (the engine was sent None, ``metadata`` failed)."""
        if name == "context_window":
            _check_context_window(value)
        if name == "max_tokens" and value is None:
            unset_field(self, "max_tokens")
            return
        super().__setattr__(name, value)

    def to_dict(self, **kwargs: Any) -> dict[str, Any]:
        """The fields, with ``max_tokens`` None where it was never set: ``from_dict`` then builds an LLM
        that answers until the smallest window is full (``_answer_length``), as this one does, not one
        asking for 256 tokens, refused where the prompt leaves less room. ``to_json`` writes this."""
        data = super().to_dict(**kwargs)
        if "max_tokens" in data and "max_tokens" not in self.model_fields_set:
            data["max_tokens"] = None
        return data

    def to_json(self, **kwargs: Any) -> str:
        """The fields as JSON; refused where a member has an ``http.api_key``: json.dumps failed on it
        (a ``SecretStr``), and writing it masked ('**********') would be refused by the server later.

        JSON (and ``to_dict``) is a recipe, not this live object: it says which ensemble to build, not
        whether this one was closed, so ``from_json`` / ``from_dict`` of a closed LLM build an open one,
        as ``EnsembleLLM(**fields)`` would (a config saved with a storage context, read by a later
        process, must work there). Pickling and copying carry the object itself, closed state included."""
        keyed = [c.model for c in self.members or [] if c.http is not None and c.http.api_key is not None]
        if keyed:
            raise InvalidRequestError(
                f"to_json does not write an api_key (members {keyed}): JSON would hold it masked ('**********'), "
                "which the server refuses; use to_dict() or pickle, which keep it")
        return super().to_json(**kwargs)

    def __copy__(self) -> EnsembleLLM:
        return self._holding(super().__copy__())

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> EnsembleLLM:
        """A deep copy (``copy.deepcopy``, ``model_copy(deep=True)``) shares the engine: it holds the
        loaded members and their locks and threads, which cannot be copied (a TypeError before), and
        requests on one engine are independent. The fields are copied as usual."""
        memo = {} if memo is None else memo
        for shared in (self._engine, self._shared, self._release):
            memo[id(shared)] = shared
        return self._holding(super().__deepcopy__(memo))

    def _holding(self, clone: EnsembleLLM) -> EnsembleLLM:
        """A copy is one more user of the engine with a hold of its own (closing or collecting the
        original leaves it working); a copy of a closed LLM is closed."""
        return clone._start_like(closed=self._closed)

    def _start_like(self, *, closed: bool) -> EnsembleLLM:
        """How a copy or a restored LLM starts, from whether its source was closed: a user who closed an
        LLM expects every copy of it closed (``EngineClosedError``; ``close()`` does nothing), so a
        restored LLM lets go of the hold ``__init__`` gave it, closing the engine it built, which loaded
        nothing; else (a copy: a restored open LLM holds already) one more user with a hold of its own."""
        if closed:
            if self._release.alive:
                self._release()
            self._release = _spent_release()
        else:
            self._release = self._shared.hold(self)
        return self

    def close(self) -> None:
        """Release the members (also done when this LLM is garbage-collected): the engine closes once
        this LLM and its copies are all closed, unloading members no other engine holds (on an event
        loop's thread in a worker thread). A closed LLM takes no more calls (``EngineClosedError``)."""
        self._release()

    async def aclose(self) -> None:
        """``close()`` for async code: waits (``EnsembleEngine.aclose``) until the engine has stopped and
        let go of its members, off the event loop."""
        detached = self._release.detach()
        if detached is None:
            return
        engine = self._shared.let_go(detached[2][0])
        if engine is not None:
            await engine.aclose()

    @property
    def _closed(self) -> bool:
        return not self._release.alive

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("this EnsembleLLM is closed (close() released its members); make a new one")

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleLLM"

    @property
    def engine(self) -> EnsembleEngine:
        """The underlying engine (shared by every call; members shared while any engine holds them)."""
        self._check_open()
        return self._engine

    @property
    def model_name(self) -> str:
        return f"{self.method}({'+'.join(self.models)})"

    @property
    def metadata(self) -> LLMMetadata:
        """What LlamaIndex sizes prompts by. ``context_window`` (unless given) is the smallest member's
        window less ``template_room()``: LlamaIndex's prompt helper counts a chat prompt as its
        messages' role words and texts (plus 3 a message, less a padding of 5 a chunk) and packs
        ``tree_summarize``/``compact`` chunks up to the window, but each member reads the prompt
        through its own chat template, whose markers, generation prompt and default system prompt
        are not in those texts: with the exact window, 3 of 4 RAG queries came to 4093 prompt
        tokens + 4 to answer in SmolLM2's 4096 (``ContextLengthError``)."""
        window = self.context_window or max(1, self.engine.context_window - self.template_room())
        return LLMMetadata(context_window=window, num_output=self.max_tokens, is_chat_model=True,
                           is_function_calling_model=True, model_name=self.model_name)

    def template_room(self) -> int:
        """The most tokens any member's chat template writes around the texts of a one- or two-message
        prompt (``chat.template_overhead``, measured on each member's own rendering; Qwen2.5 29,
        SmolLM2 30 with their default system prompts): what ``metadata`` leaves out of the window.
        Loads the members; measured once (``metadata`` is read for every prompt LlamaIndex sizes)."""
        engine = self.engine
        if self._template_room is None or self._template_room[0] is not engine:
            self._template_room = engine, max(template_overhead(member.prompt_ids) for member in engine.members)
        return self._template_room[1]

    def tokenizer_fn(self, text: str) -> list[int]:
        """``text``'s token ids in the member that spells it in the most tokens
        (``EnsembleEngine.longest_encoding``): LlamaIndex's memory counts with its own global
        tokenizer (tiktoken's) and reads only ``context_window`` from an LLM, so a history it kept
        could overflow a member whose tokenizer needs more tokens. Pass it as
        ``ChatMemoryBuffer.from_defaults(llm=llm, tokenizer_fn=llm.tokenizer_fn)`` or set
        ``Settings.tokenizer = llm.tokenizer_fn``. Loads the members."""
        return self.engine.longest_encoding(text)

    def to_payload(self) -> dict[str, Any]:
        """What LlamaIndex puts in its LLM events; unlike ``metadata`` it never loads the members."""
        return {"class_name": self.class_name(), "model_name": self.model_name, "models": self.models,
                "method": self.method, "max_tokens": self.max_tokens, "temperature": self.temperature,
                "engine_options": self.engine_options, "is_chat_model": True, "is_function_calling_model": True}

    # -- requests ---------------------------------------------------------------------------

    def _request(self, messages: Sequence[ChatMessage], kwargs: dict[str, Any]) -> _Request:
        """Validate now, so bad input fails at call time even for streams (InvalidRequestError)."""
        self._check_open()
        kwargs = dict(kwargs)
        output = {k: kwargs.pop(k) for k in _TOOL_KWARGS if k in kwargs}
        # Fields are read per request, so ``llm.max_tokens = 64`` after construction takes effect.
        params: dict[str, Any] = {**self._answer_length(), "temperature": self.temperature}
        for key, value in kwargs.items():
            name = _PARAM_ALIASES.get(key, key)
            if name not in GenerationParams.model_fields:
                warnings.warn(f"EnsembleLLM ignores the unknown argument {key!r}", UserWarning,
                              stacklevel=_caller_stacklevel())
            elif value is not None:
                params[name] = value
        validated(GenerationParams, **params)
        converted = to_engine_messages(messages)
        if output.get("tools"):
            params["tools"] = [_tool_spec(t) for t in output["tools"]]
            choice = plain_tool_choice(output.get("tool_choice"))  # {"type": "auto"} too
            params["tool_choice"] = "required" if output.get("tool_required") and choice in (None, "auto") else choice
            if output.get("parallel_tool_calls") is not None:
                params["parallel_tool_calls"] = output["parallel_tool_calls"]
            if self.tool_result_hint:
                params["tool_result_hint"] = self.tool_result_hint
        if output.get("response_format") is not None:
            params["response_format"] = output["response_format"]
        return _Request(normalize_messages(converted), params)

    def _answer_length(self) -> dict[str, int]:
        """``max_new_tokens`` where this LLM's ``max_tokens`` was set (constructor, assignment,
        ``model_copy(update=)``), else nothing: an answer length nobody asked for lets a prompt that
        leaves less than 256 tokens of room be answered until the smallest window is full (finish
        "length"), as vLLM's or llama-server's would, where passing the default 256 had it refused. A
        call's own ``max_tokens`` replaces this."""
        return {"max_new_tokens": self.max_tokens} if "max_tokens" in self.model_fields_set else {}

    def _completion_messages(self, prompt: str) -> list[ChatMessage]:
        messages = [ChatMessage(role=MessageRole.USER, content=prompt)]
        return self._extend_messages(messages)

    # -- the shared core: engine events -> turns (no LlamaIndex callbacks here) ---------------

    def _dispatch(self, event: Event, span_id: str | None) -> None:
        """Forward an engine side-channel event on the LLM call's span."""
        if event.type == "ensemble":
            dispatcher.event(EnsembleDecisionEvent(
                model_name=self.model_name, position=event.position, offset=event.offset, chosen=event.chosen,
                drafted=event.drafted, changed=event.changed, sharpened=event.sharpened,
                candidates=event.candidates, span_id=span_id))
        elif event.type == "adafuse":
            dispatcher.event(EnsembleSpanEvent(
                model_name=self.model_name, position=event.position, offset=event.offset, fused=event.fused,
                leader=event.leader, member_uncertainty=event.member_uncertainty,
                candidates=event.candidates, chosen=event.chosen, span_id=span_id))
        elif event.type == "finish":
            dispatcher.event(EnsembleFinishEvent(model_name=self.model_name, reason=event.reason,
                                                 stats=event.stats, span_id=span_id))
        elif self.step_events:
            data = event.model_dump(exclude={"type"})
            dispatcher.event(EnsembleStepEvent(model_name=self.model_name, name=event.type, data=data,
                                               span_id=span_id))

    def _step(self, turn: _Turn, event: Event, span_id: str | None) -> str | None:
        """Apply one engine event; return a delta to publish (None: nothing to publish)."""
        if event.type == "token":
            turn.text += event.text
            return event.text or None
        if event.type == "tool_call":
            if event.error is None:
                turn.tool_calls.append(ToolCallBlock(tool_call_id=event.id, tool_name=event.name,
                                                     tool_kwargs=event.arguments))
            else:
                turn.invalid_tool_calls.append({"name": event.name, "args": event.raw, "id": event.id,
                                                "error": event.error})
            return None
        self._dispatch(event, span_id)
        if event.type == "finish":
            event.raise_if_closed_mid_answer("this EnsembleLLM")  # a stream raises after the deltas it gave
            turn.finish = event
            return ""
        return None

    async def _aturns(self, request: _Request, span_id: str | None) -> AsyncIterator[tuple[_Turn, str]]:
        turn = _Turn()
        stream = self._engine.astream(request.messages, **request.params)
        try:
            async for event in stream:
                delta = self._step(turn, event, span_id)
                if delta is not None:
                    yield turn, delta
        finally:
            await stream.aclose()  # cancels the engine request when the consumer stops early

    def _turns(self, request: _Request, span_id: str | None) -> Iterator[tuple[_Turn, str]]:
        turn = _Turn()
        events = iterate_sync(self._engine.astream(request.messages, **request.params))
        try:
            for event in events:
                delta = self._step(turn, event, span_id)
                if delta is not None:
                    yield turn, delta
        finally:
            events.close()

    @staticmethod
    def _chat_response(turn: _Turn, delta: str | None) -> ChatResponse:
        blocks: list[Any] = [TextBlock(text=turn.text), *turn.tool_calls]
        message = ChatMessage(role=MessageRole.ASSISTANT, blocks=blocks)
        if turn.tool_calls:  # LlamaIndex's streaming programs look for calls here only (as OpenAI's LLM sets it)
            message.additional_kwargs["tool_calls"] = [_openai_call(block) for block in turn.tool_calls]
        if turn.invalid_tool_calls:  # where an agent's output (AgentOutput.response) shows them
            message.additional_kwargs["invalid_tool_calls"] = list(turn.invalid_tool_calls)
        return ChatResponse(message=message, delta=delta, raw=turn.raw, additional_kwargs=turn.additional_kwargs)

    @staticmethod
    def _completion_response(turn: _Turn, delta: str | None) -> CompletionResponse:
        return CompletionResponse(text=turn.text, delta=delta, raw=turn.raw,
                                  additional_kwargs=turn.additional_kwargs)

    # -- the eight LlamaIndex entry points -----------------------------------------------------

    @llm_chat_callback()
    def chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request, span_id = self._request(messages, kwargs), active_span_id.get()
        return self._chat_response(_last(self._turns(request, span_id)), None)

    @llm_chat_callback()
    def stream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseGen:
        request, span_id = self._request(messages, kwargs), active_span_id.get()

        def gen() -> ChatResponseGen:
            for turn, delta in self._turns(request, span_id):
                yield self._chat_response(turn, delta)

        return gen()

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        request = self._request(self._completion_messages(prompt), kwargs)
        return self._completion_response(_last(self._turns(request, active_span_id.get())), None)

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        request = self._request(self._completion_messages(prompt), kwargs)
        span_id = active_span_id.get()

        def gen() -> CompletionResponseGen:
            for turn, delta in self._turns(request, span_id):
                yield self._completion_response(turn, delta)

        return gen()

    @llm_chat_callback()
    async def achat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponse:
        request, span_id = self._request(messages, kwargs), active_span_id.get()
        return self._chat_response(await _alast(self._aturns(request, span_id)), None)

    @llm_chat_callback()
    async def astream_chat(self, messages: Sequence[ChatMessage], **kwargs: Any) -> ChatResponseAsyncGen:
        # A coroutine that *returns* the generator: the decorator then wraps it (see integrations.md §3.2).
        request, span_id = self._request(messages, kwargs), active_span_id.get()

        async def gen() -> ChatResponseAsyncGen:
            async for turn, delta in self._aturns(request, span_id):
                yield self._chat_response(turn, delta)

        return gen()

    @llm_completion_callback()
    async def acomplete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        request = self._request(self._completion_messages(prompt), kwargs)
        return self._completion_response(await _alast(self._aturns(request, active_span_id.get())), None)

    @llm_completion_callback()
    async def astream_complete(self, prompt: str, formatted: bool = False,
                               **kwargs: Any) -> CompletionResponseAsyncGen:
        request = self._request(self._completion_messages(prompt), kwargs)
        span_id = active_span_id.get()

        async def gen() -> CompletionResponseAsyncGen:
            async for turn, delta in self._aturns(request, span_id):
                yield self._completion_response(turn, delta)

        return gen()

    # -- tools -------------------------------------------------------------------------------

    def _prepare_chat_with_tools(self, tools: Sequence[BaseTool], user_msg: str | ChatMessage | None = None,
                                 chat_history: list[ChatMessage] | None = None, verbose: bool = False,
                                 allow_parallel_tool_calls: bool = False, tool_required: bool = False,
                                 **kwargs: Any) -> dict[str, Any]:
        """Chat kwargs for ``chat``/``achat``/...: the tools travel as ``tools=`` and are rendered there."""
        messages = list(chat_history or [])
        if user_msg is not None:
            messages.append(ChatMessage(role=MessageRole.USER, content=user_msg)
                            if isinstance(user_msg, str) else user_msg)
        tool_choice = kwargs.pop("tool_choice", None)
        prepared: dict[str, Any] = {"messages": messages, "tools": list(tools) or None, **kwargs}
        if tool_choice is not None:
            prepared["tool_choice"] = tool_choice
        if tool_required and tools:
            prepared["tool_required"] = True
        if tools and not allow_parallel_tool_calls:  # the engine stops after one call: streams too
            prepared["parallel_tool_calls"] = False
        return prepared

    def _validate_chat_with_tools_response(self, response: ChatResponse, tools: Sequence[BaseTool],
                                           allow_parallel_tool_calls: bool = False,
                                           **kwargs: Any) -> ChatResponse:
        """Keep only the first tool call unless parallel calls are allowed (as the OpenAI adapter
        does; the engine was asked for one already, see ``_prepare_chat_with_tools``)."""
        if not allow_parallel_tool_calls:
            calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
            for extra in calls[1:]:
                response.message.blocks.remove(extra)
        return response

    # -- structured output: constrained JSON, not a forced tool call --------------------------

    def _structured_request(self, output_cls: type[BaseModel], prompt: BasePromptTemplate,
                            llm_kwargs: dict[str, Any] | None, prompt_args: dict[str, Any]
                            ) -> tuple[list[ChatMessage], dict[str, Any]]:
        messages = self._extend_messages(prompt.format_messages(llm=self, **prompt_args))
        schema = {"name": output_cls.__name__, "schema": output_cls.model_json_schema()}
        return messages, {**(llm_kwargs or {}), "response_format": {"type": "json_schema", "json_schema": schema}}

    @staticmethod
    def _structured_result(output_cls: type[Model], response: ChatResponse) -> Model:
        problem = response.additional_kwargs.get("format_error")
        if problem:  # one cut at max_tokens says so, as ChatEnsemble's does
            if response.additional_kwargs.get("finish_reason") == "length":
                problem = f"{ANSWER_CUT}: {problem}"
            raise ValueError(f"the ensemble's answer is not a valid {output_cls.__name__}: {problem}")
        return output_cls.model_validate_json(response.message.content or "")

    @dispatcher.span
    def structured_predict(self, output_cls: type[Model], prompt: BasePromptTemplate,
                           llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        """``output_cls`` from JSON decoded under its schema (see the module docstring)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt,
                                                        template_args=prompt_args))
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        result = self._structured_result(output_cls, self.chat(messages, **kwargs))
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    @dispatcher.span
    async def astructured_predict(self, output_cls: type[Model], prompt: BasePromptTemplate,
                                  llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any) -> Model:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        dispatcher.event(LLMStructuredPredictStartEvent(output_cls=output_cls, template=prompt,
                                                        template_args=prompt_args))
        messages, kwargs = self._structured_request(output_cls, prompt, llm_kwargs, prompt_args)
        result = self._structured_result(output_cls, await self.achat(messages, **kwargs))
        dispatcher.event(LLMStructuredPredictEndEvent(output=result))
        return result

    def stream_structured_predict(self, output_cls: type[Model], prompt: BasePromptTemplate,
                                  llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
                                  ) -> Generator[Model, None, None]:
        """One item, the whole object: a JSON answer is held until it validates (shared_engine.tools)."""
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return super().stream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)  # type: ignore[return-value]

        def gen() -> Generator[Model, None, None]:
            yield self.structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        return gen()

    async def astream_structured_predict(self, output_cls: type[Model], prompt: BasePromptTemplate,
                                         llm_kwargs: dict[str, Any] | None = None, **prompt_args: Any
                                         ) -> AsyncGenerator[Model, None]:
        if self.pydantic_program_mode != PydanticProgramMode.DEFAULT:
            return await super().astream_structured_predict(output_cls, prompt, llm_kwargs, **prompt_args)  # type: ignore[return-value]

        async def gen() -> AsyncGenerator[Model, None]:
            yield await self.astructured_predict(output_cls, prompt, llm_kwargs, **prompt_args)
        return gen()

    def get_tool_calls_from_response(self, response: ChatResponse, error_on_no_tool_call: bool = True,
                                     **kwargs: Any) -> list[ToolSelection]:
        """The ``ToolCallBlock``s parsed from the answer, as ``ToolSelection``s."""
        calls = [b for b in response.message.blocks if isinstance(b, ToolCallBlock)]
        if not calls and error_on_no_tool_call:
            raise ValueError(f"Expected at least one tool call, but got 0 tool calls; "
                             f"{_unreadable_calls(response.message)}the answer was: {response.message.content!r}")
        return [ToolSelection(tool_id=c.tool_call_id or f"call_{i}", tool_name=c.tool_name,
                              tool_kwargs=c.tool_kwargs if isinstance(c.tool_kwargs, dict) else {})
                for i, c in enumerate(calls)]


def _unreadable_calls(message: ChatMessage) -> str:
    """What a no-call error says of the calls the engine could not read (empty where none): without
    it, an unknown tool's or a cut call's error showed only an empty answer."""
    invalid = message.additional_kwargs.get("invalid_tool_calls") or []
    if not invalid:
        return ""
    said = "; ".join(f"{call.get('error')}: {call.get('args')!r}" for call in invalid)
    return f"{len(invalid)} unreadable call(s): {said}; "


def _last(turns: Iterator[tuple[_Turn, str]]) -> _Turn:
    """Drain a turn stream; the engine always ends with ``finish``, so there is a last turn."""
    last = None
    for last, _ in turns:
        pass
    assert last is not None and last.finish is not None
    return last


async def _alast(turns: AsyncIterator[tuple[_Turn, str]]) -> _Turn:
    last = None
    async for last, _ in turns:
        pass
    assert last is not None and last.finish is not None
    return last


def to_engine_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """LlamaIndex messages -> the engine's OpenAI-style dicts (text; ``tool_calls`` on assistant
    messages; ``tool`` messages for results -- the engine renders them, see ``shared_engine.tools``)."""
    if isinstance(messages, (str, ChatMessage)) or not isinstance(messages, Sequence):
        raise InvalidRequestError(f"messages must be a sequence of ChatMessage, got {type(messages).__name__}")
    converted = []
    for i, message in enumerate(messages):
        if not isinstance(message, ChatMessage):
            raise InvalidRequestError(f"message {i} is a {type(message).__name__}, not a ChatMessage")
        role = _ROLES.get(message.role)
        if role is None:  # pragma: no cover - every MessageRole is mapped
            raise InvalidRequestError(f"message {i} has unsupported role {message.role!r}")
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        for block in message.blocks:
            if isinstance(block, TextBlock):
                texts.append(block.text)
            elif isinstance(block, ToolCallBlock):
                calls.append({"id": block.tool_call_id, "type": "function",
                              "function": {"name": block.tool_name, "arguments": block.tool_kwargs}})
            elif isinstance(block, ThinkingBlock) or block.block_type in _SKIPPED_BLOCKS:
                continue
            else:
                raise InvalidRequestError(f"message {i} has a {block.block_type!r} block; EnsembleLLM is "
                                          "text-only (text and tool-call blocks)")
        # the legacy OpenAI-style field, read only where no block holds the calls: an answer of
        # ours (as OpenAI's LLM's) carries them in both, and the calls would be sent twice
        legacy = [] if calls else message.additional_kwargs.get("tool_calls") or []
        for call in legacy:
            function = call.get("function", call) if isinstance(call, Mapping) else getattr(call, "function", call)
            name = function.get("name") if isinstance(function, Mapping) else getattr(function, "name", None)
            args = function.get("arguments") if isinstance(function, Mapping) else getattr(function, "arguments", {})
            if name:
                calls.append({"type": "function", "function": {"name": name, "arguments": args or {}}})
        entry: dict[str, Any] = {"role": role, "content": join_text_parts(texts)}
        if calls and role == "assistant":
            entry["tool_calls"] = calls
        if role == "tool" and message.additional_kwargs.get("tool_call_id"):
            entry["tool_call_id"] = message.additional_kwargs["tool_call_id"]
        converted.append(entry)
    return converted


def _openai_call(block: ToolCallBlock) -> dict[str, Any]:
    """A tool call as OpenAI's message field holds it (arguments as a JSON string)."""
    args = block.tool_kwargs
    return {"id": block.tool_call_id, "type": "function",
            "function": {"name": block.tool_name,
                         "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)}}


def _tool_spec(tool: Any) -> dict[str, Any]:
    """An OpenAI tool dict from a LlamaIndex tool (or a ready-made dict)."""
    if isinstance(tool, Mapping):
        if "function" not in tool or "name" not in tool["function"]:
            raise InvalidRequestError("a tool dict must look like {'type': 'function', 'function': {'name': ...}}")
        return dict(tool)
    metadata = getattr(tool, "metadata", None)
    if metadata is None or not hasattr(metadata, "to_openai_tool"):
        raise InvalidRequestError(f"not a LlamaIndex tool: {tool!r}")
    return metadata.to_openai_tool(skip_length_check=True)
