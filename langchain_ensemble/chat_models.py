"""``ChatEnsemble``: several local LLMs with different tokenizers as one LangChain chat model.

A thin adapter over :class:`shared_engine.EnsembleEngine`. Streaming is the primitive: ``_astream``
turns engine events into ``AIMessageChunk``s, ``_agenerate`` aggregates it, and the sync paths run
the same engine stream on a helper thread (``shared_engine.engine.iterate_sync``), so they never
block or deadlock a running event loop.

Ensemble decisions reach LangChain as custom events named ``ensemble.<event type>`` (payload: the
engine event as a JSON-ready dict)::

    chain = prompt | ChatEnsemble(models=[...])
    async for ev in chain.astream_events({"q": "..."}, version="v2"):
        if ev["event"] == "on_custom_event" and ev["name"] == "ensemble.ensemble":
            print(ev["data"]["chosen"], ev["data"]["candidates"][:3])

or in a callback handler's ``on_custom_event(name, data, *, run_id, ...)``. Inside a Runnable (a
prompt, a LangGraph node) they belong to the enclosing run; ``invoke``/``ainvoke`` and a bare
``model.astream``/``stream``/``astream_events`` attribute them to the model's own run.
(langchain-core's ``astream``, and ``invoke``/``ainvoke``/``batch`` of a ``streaming=True`` model, call
``_astream``/``_stream`` without its run manager, so ``astream``, ``stream``, ``invoke`` and ``ainvoke``
are wrapped to pass the model run's id and callbacks on; see ``_OwnRun``.)
"""

from __future__ import annotations

import collections
import functools
import json
import threading
import uuid
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal, Self, cast

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.exceptions import OutputParserException
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput, ModelProfile
from langchain_core.language_models.chat_models import agenerate_from_stream, generate_from_stream
from langchain_core.messages import (
    AIMessage,
    AIMessageChunk,
    BaseMessage,
    ChatMessage,
    FunctionMessage,
    HumanMessage,
    SystemMessage,
    ToolMessage,
)
from langchain_core.messages.ai import UsageMetadata
from langchain_core.messages.tool import tool_call_chunk
from langchain_core.output_parsers import JsonOutputParser, PydanticOutputParser
from langchain_core.output_parsers.openai_tools import JsonOutputKeyToolsParser, PydanticToolsParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.runnables import (
    Runnable,
    RunnableConfig,
    RunnableGenerator,
    RunnableLambda,
    RunnableSerializable,
    ensure_config,
)
from langchain_core.runnables.configurable import RunnableConfigurableFields
from langchain_core.runnables.utils import AnyConfigurableField, ConfigurableField
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langchain_core.utils.pydantic import is_basemodel_subclass
from pydantic import BaseModel, Field, PrivateAttr, field_serializer, field_validator, model_validator

from langchain_ensemble.include_raw import with_raw
from shared_engine import (
    EngineClosedError,
    EngineOptions,
    EnsembleEngine,
    GenerationParams,
    InvalidRequestError,
    MemberConfig,
    MemberDefaults,
)
from shared_engine.engine import iterate_sync
from shared_engine.events import Event, FinishEvent
from shared_engine.members import member_config
from shared_engine.members.chat import join_text_parts
from shared_engine.members.remote import load_tokenizer
from shared_engine.options import Method, copy_unsetting, name_hint, unset_field, validated
from shared_engine.profile import profile_digest
from shared_engine.tools import ANSWER_CUT, forced_tool
from shared_engine.zoo import ZOO

EVENT_TYPES = ("token", "draft", "verify", "ensemble", "adafuse", "cache_sync", "tool_call", "format_retry", "finish")
"""Engine event types that can be forwarded as ``ensemble.<type>`` custom events."""

_OWN_GENERATION_KEYS = frozenset({"max_new_tokens", "temperature", "top_p", "seed", "stop"})
"""Generation parameters ChatEnsemble has fields of its own for (LangChain's names: max_tokens, ...)."""
_ENGINE_OPTION_KEYS = frozenset(EngineOptions.model_fields) - _OWN_GENERATION_KEYS - {"method"}
"""Keywords collected into ``engine_options``: every other engine option or generation default
(loop_guard, draft_length, ...)."""
_REMOTE_PROVIDER_KEYS = frozenset({"timeout", "max_retries", "api_key", "base_url"})
"""LangChain's standard parameters for hosted providers (its standard tests and ``init_chat_model``
pass them to every chat model): accepted and unused, since the members run in this process or
behind their own member configs (remote members set their own URL and timeout)."""
_PER_REQUEST_HINTS = {
    "tools": "tools are bound per request: llm.bind_tools([...])",
    "tool_choice": "tool_choice is bound with the tools: llm.bind_tools([...], tool_choice=...)",
    "response_format": "response_format goes per request: llm.with_structured_output(schema), "
                       "llm.bind(response_format=...) or invoke(..., response_format=...)",
    "keep_events": "keep_events is EnsembleEngine.agenerate's; ChatEnsemble sends engine events as custom "
                   "events (custom_events=[...], read with astream_events)",
}
"""Per-request keywords given to the constructor: where each goes instead (the name was refused alone)."""
_CHAT_NAMES = {"max_completion_tokens": "max_tokens"}
"""The length cap by ChatOpenAI's newer name: options' ``name_hint`` maps it to the engine's
``max_new_tokens``, which ChatEnsemble calls ``max_tokens``."""
STRUCTURED_OUTPUT_METHODS = ("function_calling", "json_schema", "json_mode")
PROVIDER = "safe-ensemble"


@dataclass
class _SharedEngine:
    engine: EnsembleEngine
    users: int = 0  # live ChatEnsemble instances of this configuration


_ENGINES: dict[tuple[Any, ...], _SharedEngine] = {}
_ENGINES_LOCK = threading.Lock()
_PENDING_RELEASES: collections.deque[tuple[Any, ...]] = collections.deque()
"""Chat models closed or collected whose count-off has not been applied yet (see ``_release_engine``)."""
_EngineConfig = tuple[Sequence[str | MemberConfig], str, dict[str, Any], str | None]
"""Members, method, options, profile digest: ``_engine_key``'s arguments (``ChatEnsemble._engine_config``)."""
_MOVE_LOCK = threading.Lock()
"""One chat model at a time moves to another configuration's engine (``ChatEnsemble._engine``): two
threads of one model moving at once would both hold the new engine, and one hold would never be given back."""


def _engine_key(members: Sequence[str | MemberConfig], method: str, options: dict[str, Any],
                profile: str | None = None) -> tuple[Any, ...]:
    """``profile``: the digest of the profile file the options name (a profile re-fitted to the same
    path is another configuration)."""
    described = tuple(m if isinstance(m, str) else m.model_dump_json(exclude_none=True) for m in members)
    return (described, method, json.dumps(options, sort_keys=True, default=str), profile)


def _shared_engine(members: Sequence[str | MemberConfig], method: str, options: dict[str, Any],
                   profile: str | None = None, *, hold: bool = False) -> EnsembleEngine:
    """One engine per configuration among the live chat models: constructing ``ChatEnsemble``
    stays cheap, and members (weights) are loaded on first use by ``load_member``. ``hold``:
    count one more chat model using it (``_release_engine`` counts it off)."""
    key = _engine_key(members, method, options, profile)
    with _ENGINES_LOCK:
        entry = _ENGINES.get(key)
        if entry is None:
            entry = _ENGINES[key] = _SharedEngine(EnsembleEngine(list(members), method=method, **options))
        entry.users += hold
        engine = entry.engine
    _apply_pending_releases()  # count-offs queued while the lock was held (e.g. by a collection above)
    return engine


_hold_shared_engine = functools.partial(_shared_engine, hold=True)
"""Bound here, not looked up per call: tests replace ``_shared_engine`` with a scripted engine."""


def _listed(members: Any) -> list[Any]:
    """``members`` as given, refused readably where it is one string ("a,b" as on the CLI)."""
    if isinstance(members, str):
        names = [name.strip() for name in members.split(",") if name.strip()]
        raise InvalidRequestError(f"give the members as a list, e.g. {names!r}, not the string {members!r}")
    try:
        return list(members)
    except TypeError:
        raise InvalidRequestError(f"members must be a list, not {type(members).__name__}") from None


def _member_config(member: Any) -> MemberConfig:
    """One entry of ``members``: a MemberConfig, its fields as a mapping, or a model name (read by the
    engine's ``member_config``, as a members file's entries are); a Member object needs the engine."""
    if isinstance(member, str | Mapping | MemberConfig):
        return member_config(dict(member) if isinstance(member, Mapping) else member)
    raise InvalidRequestError(f"members: {member!r} is not a MemberConfig, a mapping of its fields or a model name")


def _unknown_hint(name: str, accepted: Sequence[str], values: dict[str, Any]) -> str:
    """Where an unknown constructor argument goes: a per-request keyword to the call or ``bind_tools``, a
    member's own setting (``n_ctx``, ``backend``: "not a member option" sent readers to ``member_options``,
    which refuses them) to ``members``; else the name meant (``name_hint``)."""
    if name in _PER_REQUEST_HINTS:
        return f" ({_PER_REQUEST_HINTS[name]})"
    if name in MemberConfig.model_fields and name != "model":  # "model": the hint says 'models'
        models = values.get("models")
        first = models[0] if isinstance(models, list) and models and isinstance(models[0], str) else "..."
        return (f" ({name} is set per member: members=[{{'model': {first!r}, {name!r}: {values[name]!r}}}, ...] "
                "instead of models)")
    hint = name_hint(name, accepted)
    meant = _CHAT_NAMES.get(name)
    return f" (did you mean {meant!r}?)" if meant and not hint else hint


def _release_engine(key: tuple[Any, ...]) -> None:
    """One chat model of this configuration is closed or collected; the last one closes the
    engine, which releases the members it loaded (unloaded unless another engine holds them).

    Runs from ``weakref.finalize``, so also inside a garbage collection that a thread triggers while
    it holds ``_ENGINES_LOCK`` (building an engine allocates): a blocking acquire there would wait
    for itself forever. So the count-off is queued, and applied now if the lock is free, else by
    whoever holds it when it lets go."""
    _PENDING_RELEASES.append(key)
    _apply_pending_releases()


def _apply_pending_releases() -> None:
    while _PENDING_RELEASES:
        if not _ENGINES_LOCK.acquire(blocking=False):
            return  # the holder applies the queue when it is done
        _count_off_pending()


def _count_off_pending() -> None:
    """Apply the queued count-offs (``_ENGINES_LOCK`` held on entry, released here)."""
    closing: list[EnsembleEngine] = []
    try:
        while _PENDING_RELEASES:
            key = _PENDING_RELEASES.popleft()
            entry = _ENGINES.get(key)
            if entry is None:
                continue
            entry.users -= 1
            if entry.users <= 0:
                del _ENGINES[key]
                closing.append(entry.engine)
    finally:
        _ENGINES_LOCK.release()
    for engine in closing:
        _close_engine(engine)


def _spent_release() -> weakref.finalize[..., Any]:
    """A count-off already given: what a closed model holds (``_closed``; calling it does nothing).
    Registered on this function, which lives as long as the module, and detached at once: it never runs."""
    release = weakref.finalize(_spent_release, int)
    release.detach()
    return release


_CLOSED_STATE = "closed"
"""The key of a pickled ChatEnsemble's state that says it was closed (``__getstate__``)."""


def _close_engine(engine: EnsembleEngine) -> None:
    """``engine.close()``: running requests end at their next round; members go when they have (off an
    event loop's thread: ``close_from_anywhere``)."""
    engine.close_from_anywhere("ChatEnsemble engine close")


def _is_model_profile(value: Any) -> bool:
    """``profile`` names two things: langchain-core's ``ModelProfile`` (a mapping, or None: resolved
    by ``_resolve_model_profile``), which LangChain passes back when it rebuilds a model
    (``configurable_fields``), and the engine's calibration profile (a path). Anything else goes to
    the engine, which refuses it readably."""
    return value is None or isinstance(value, Mapping)


@dataclass
class _Request:
    """One call, translated: engine messages and the engine's keyword arguments."""

    messages: list[dict[str, Any]]
    params: dict[str, Any]


class ChatEnsemble(BaseChatModel):
    """Several local LLMs with different tokenizers answering as one (SAFE by default).

    Setup, in a clone (not on PyPI): ``pip install -e '.[langchain]'``; zoo names are converted on first use.

    Instantiate::

        from langchain_ensemble import ChatEnsemble
        llm = ChatEnsemble(models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"],
                           method="safe", max_tokens=128, temperature=0.0, draft_length=5)

    Any ``EngineOptions`` field (``drafter``, ``draft_length``, ``fusion``, ``sharpen``,
    ``weights``, ``gate_threshold``, ``drafter_confidence``, ``top_k``) can be passed as a
    keyword and lands in ``engine_options``.

    Invoke / stream::

        llm.invoke("What is 17 + 25?").content
        for chunk in llm.stream("Name three colors."):
            print(chunk.content, end="")
        msg = await llm.ainvoke("Hi")
        msg.usage_metadata  # {'input_tokens': ..., 'output_tokens': ..., 'total_tokens': ...}
        msg.response_metadata["ensemble"]  # the engine's stats (ensemble rate, forward passes ...)

    Tool calling and structured output (the engine's one mechanism, ``shared_engine.tools``)::

        llm_with_tools = llm.bind_tools([get_weather])
        llm_with_tools.invoke("Weather in Paris?").tool_calls
        llm.with_structured_output(Joke).invoke("Tell me a joke")                       # forced call
        llm.with_structured_output(Joke, method="json_schema").invoke("Tell me a joke")  # constrained JSON

    ``close()`` (or garbage collection) releases the shared engine once no chat model of the same
    configuration is left; members it loaded are unloaded unless another engine holds them.

    Ensemble events: see the module docstring (``custom_events`` chooses which are sent).
    """

    models: list[str] = Field(min_length=1)
    """Member names (zoo names, local Hugging Face folders, .gguf paths, hub ids or member specs);
    the first drafts. Filled in from ``members`` when those are given instead."""
    members: list[MemberConfig] | None = None
    """Members with their own options (device, dtype, server settings), instead of ``models``."""
    member_options: dict[str, Any] = Field(default_factory=dict)
    """``MemberDefaults`` for every transformers member that sets none (device, device_map, dtype,
    attn_implementation, compile); also collected from plain keywords, e.g. ``dtype="bfloat16"``."""
    method: Method = "safe"
    """How the ensemble decodes (see the engine's README)."""
    max_tokens: int = Field(256, ge=1)
    """Answer length cap, in drafter tokens. Unset (or None, as ChatOpenAI reads it): 256, or less where
    the prompt leaves less room in a member's context window (the answer then ends with finish "length"
    where the window is full, not refused); a length set here, per call or by ``bind`` must fit."""
    temperature: float | None = None
    """Sampling temperature; None or 0 = greedy (the engine's default)."""
    top_p: float | None = None
    """Nucleus sampling mass (None: engine default 1.0)."""
    seed: int | None = None
    """Seed for sampling: a fixed seed gives a reproducible answer."""
    stop: list[str] | None = None
    """Default stop strings (a str is one); a call's own ``stop`` replaces them."""
    streaming: bool = False
    """Make ``invoke`` use the streaming path (LangChain convention)."""
    custom_events: list[str] = Field(default_factory=lambda: ["ensemble", "adafuse", "finish"])
    """Engine event types sent as ``ensemble.<type>`` custom events; any of ``EVENT_TYPES``.
    The default sends fusion decisions (SAFE's and AdaFuse's) and the final stats, not every token or draft."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """Extra ``EngineOptions`` (drafter, draft_length, fusion, ...); keywords are collected here."""
    tool_result_hint: str | None = None
    """With tools bound, a user turn the engine adds after tool results (e.g. "Using the function
    result above, answer my original question in plain text."): small members otherwise call the
    tool again instead of answering. Off by default: it discourages multi-step tool chains."""

    _release: Any = PrivateAttr(default=None)  # weakref.finalize that gives the shared engine back
    _tokenizer: Any = PrivateAttr(default=None)  # the drafter's, for get_token_ids (read on first use)
    _profile_digest: str | None = PrivateAttr(default=None)  # what engine_options' profile held (profile_digest)
    _digested_profile: Any = PrivateAttr(default=None)  # the profile path _profile_digest was read from

    @model_validator(mode="before")
    @classmethod
    def _collect_engine_options(cls, values: Any) -> Any:
        """``ChatEnsemble(models=..., draft_length=3)``: engine options as plain keywords."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        options = dict(values.get("engine_options") or {})
        for key in _ENGINE_OPTION_KEYS & values.keys():
            if key == "profile" and _is_model_profile(values[key]):
                continue  # langchain-core's own field, not the engine's calibration profile
            options[key] = values.pop(key)
        placement = dict(values.get("member_options") or {})
        for key in MemberDefaults.model_fields.keys() & values.keys():
            placement[key] = values.pop(key)
        values["member_options"] = placement
        if values.get("members") and not values.get("models"):
            values["members"] = [_member_config(m) for m in _listed(values["members"])]
            values["models"] = [m.model for m in values["members"]]
        if "max_new_tokens" in values and "max_tokens" not in values:
            values["max_tokens"] = values.pop("max_new_tokens")
        if "max_tokens" in values and values["max_tokens"] is None:  # unset, as ChatOpenAI reads None
            del values["max_tokens"]  # (not in model_fields_set: _answer_length)
        values["engine_options"] = options
        known = set(cls.model_fields) | {f.alias for f in cls.model_fields.values() if f.alias}
        for key in _REMOTE_PROVIDER_KEYS & values.keys():
            values.pop(key)
        unknown = sorted(set(values) - known)
        if unknown:  # a misspelt option would otherwise be dropped without a word
            # the hint EnsembleEngine, EnsembleLLM and --members give ("draft_lenght" had none here)
            accepted = sorted(known | _ENGINE_OPTION_KEYS | MemberDefaults.model_fields.keys())
            found = {name: hint for name in unknown if (hint := _unknown_hint(name, accepted, values))}
            hints = "".join(found.values()) if len(unknown) == 1 else "".join(f"; {n}{h}" for n, h in found.items())
            raise ValueError(f"unknown arguments {unknown}: not a ChatEnsemble field, engine option "
                             f"or member option{hints}")
        return values

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _max_tokens_none_is_default(cls, value: Any) -> Any:
        """``max_tokens=None``: the default, as ChatOpenAI reads it (the model's own)."""
        return cls.model_fields["max_tokens"].default if value is None else value

    @field_serializer("max_tokens")
    def _unset_max_tokens_dumps_none(self, value: int) -> int | None:
        """``model_dump()`` writes an unset length as None (unset, read back by the constructor), so
        ``ChatEnsemble(**llm.model_dump())`` leaves it unset as ``EnsembleLLM.to_dict`` does; 256 dumped
        was read back as a length asked for."""
        return value if "max_tokens" in self.model_fields_set else None

    @field_validator("stop", mode="before")
    @classmethod
    def _str_stop_is_one_stop(cls, value: Any) -> Any:
        """``stop="x"`` (ChatOpenAI takes a str): one stop string, not its characters."""
        return [value] if isinstance(value, str) else value

    @field_validator("custom_events")
    @classmethod
    def _known_event_types(cls, value: list[str]) -> list[str]:
        unknown = sorted(set(value) - set(EVENT_TYPES))
        if unknown:
            raise ValueError(f"unknown event types {unknown}; choose from {list(EVENT_TYPES)}")
        return value

    @model_validator(mode="after")
    def _validate_engine(self) -> ChatEnsemble:
        """Fail at construction on bad options, member configs or generation defaults (no weights
        are loaded here); hold the shared engine until this model is closed or collected."""
        if self.members and self.models != [m.model for m in self.members]:
            raise InvalidRequestError("give models or members, not both")
        validated(MemberDefaults, **self.member_options)
        self._hold(self._engine_config())
        defaults = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "stop": self.stop}
        validated(GenerationParams, max_new_tokens=self.max_tokens,
                  **{k: v for k, v in defaults.items() if v is not None})
        return self

    def __setattr__(self, name: str, value: Any) -> None:
        """``llm.max_tokens = None`` unsets the length, as ``max_tokens=None`` in the constructor does
        (fields are not validated on assignment: the engine was sent None and refused every call)."""
        if name == "max_tokens" and value is None:
            unset_field(self, "max_tokens")
            return
        super().__setattr__(name, value)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """``update={"max_tokens": None}`` unsets the copy's length, as the constructor reads None
        (pydantic's ``model_copy`` validates nothing: the engine was sent None)."""
        return copy_unsetting(super().model_copy, update, deep)

    def configurable_fields(self, **kwargs: AnyConfigurableField) -> RunnableSerializable[LanguageModelInput,
                                                                                          AIMessage]:
        """As langchain-core's, but a configured model keeps this one's unset fields unset
        (``_ConfiguredEnsemble``)."""
        super().configurable_fields(**kwargs)  # its check of the keys
        return _ConfiguredEnsemble(default=self, fields=kwargs)

    def __copy__(self) -> ChatEnsemble:
        return self._holding(super().__copy__())

    def __deepcopy__(self, memo: dict[int, Any] | None = None) -> ChatEnsemble:
        return self._holding(super().__deepcopy__(memo))

    def __getstate__(self) -> dict[Any, Any]:
        """Pickled without its count-off (a ``weakref.finalize`` pickles as a dead one: the restored
        model was closed from the start), with whether it was closed: ``__setstate__`` holds the
        engine anew, or not at all for a closed model (it came back open, loading members again)."""
        state = super().__getstate__()
        private = dict(state.get("__pydantic_private__") or {})
        private["_release"] = None
        return {**state, "__pydantic_private__": private, _CLOSED_STATE: self._closed}

    def __setstate__(self, state: dict[Any, Any]) -> None:
        """A restored model (pickle: multiprocessing, joblib, cloudpickle) starts as a copy does
        (``_holding``); a state pickled before the closed flag was written is an open model's."""
        super().__setstate__(state)
        self._start_like(closed=bool(state.get(_CLOSED_STATE, False)))

    def _holding(self, clone: ChatEnsemble) -> ChatEnsemble:
        """A copy (``model_copy``, ``copy.deepcopy``) is one more user of the shared engine, with a
        count-off of its own: it shared the original's before, so closing or collecting the original
        closed the copy (``EngineClosedError``). A copy of a closed model is closed."""
        return clone._start_like(closed=self._closed)

    def _start_like(self, *, closed: bool) -> ChatEnsemble:
        """How a copy or a restored model starts, from whether its source was closed: a user who closed
        a model expects every copy of it closed (``EngineClosedError``, ``close()`` does nothing),
        holding no engine; else one more user of the shared engine, with a count-off of its own."""
        if closed:
            self._release = _spent_release()
        else:
            self._hold(self._engine_config())
        return self

    def _hold(self, config: _EngineConfig) -> None:
        """Count this model as one more user of ``config``'s shared engine, with a count-off of its own."""
        _hold_shared_engine(*config)
        self._release = weakref.finalize(self, _release_engine, _engine_key(*config))

    def close(self) -> None:
        """Give the shared engine back now (also done when this model is garbage-collected); a
        closed model takes no more calls (``EngineClosedError``)."""
        if self._release is not None:
            self._release()

    # -- LangChain metadata ---------------------------------------------------------------
    def _resolve_model_profile(self) -> ModelProfile | None:
        """What the ensemble can do (langchain-core's beta ``profile``): text in and out, tool
        calling with ``tool_choice``, constrained structured output. ``max_input_tokens`` is the
        smallest member context window, which needs the members loaded, and construction never
        loads them: it is set here when another chat model already loaded them, else by the first
        call (or by reading ``context_window``)."""
        profile = ModelProfile(
            text_inputs=True, text_outputs=True, image_inputs=False, image_url_inputs=False, pdf_inputs=False,
            audio_inputs=False, video_inputs=False, image_tool_message=False, pdf_tool_message=False,
            tool_calling=True, tool_choice=True, tool_call_streaming=True, structured_output=True)
        engine = self._engine()
        if isinstance(engine, EnsembleEngine) and engine.loaded:
            profile["max_input_tokens"] = engine.context_window
        return profile

    @property
    def context_window(self) -> int:
        """The smallest member context window (loads the members, shared while any engine holds them; fills
        ``profile["max_input_tokens"]``)."""
        window = self._engine().context_window
        self._note_context_window(window)
        return window

    def _note_context_window(self, window: int) -> None:
        if self.profile is not None and self.profile.get("max_input_tokens") != window:
            self.profile = ModelProfile(**{**self.profile, "max_input_tokens": window})

    def _after_request(self) -> None:
        """A request ran, so the members are loaded: the profile gets ``max_input_tokens``."""
        if self._closed:  # closed while the request ran
            return
        engine = self._engine()
        if isinstance(engine, EnsembleEngine) and engine.loaded and "max_input_tokens" not in (self.profile or {}):
            self._note_context_window(engine.context_window)

    def get_num_tokens_from_messages(
        self, messages: list[BaseMessage],
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool] | None = None,
    ) -> int:
        """The most prompt tokens any member reads for ``messages`` (each in its own chat template,
        ``EnsembleEngine.prompt_tokens``; loads the members): what ``trim_messages(token_counter=llm)``
        counts, so a history trimmed to ``context_window - max_tokens`` fits every member."""
        formatted = [convert_to_openai_tool(t) for t in tools] if tools else None
        return self._engine().prompt_tokens(to_engine_messages(messages), tools=formatted)

    def get_num_tokens(self, text: str) -> int:
        """The most tokens any member reads for ``text`` as a prompt (its BOS included; loads the members)."""
        return self._engine().prompt_tokens(text, raw_prompt=True)

    def get_token_ids(self, text: str) -> list[int]:
        """Token ids in the drafter's tokenizer (what ``max_tokens`` and the usage count in); no
        weights loaded where its files are local. Not what a prompt costs: another member may spell
        the text in more tokens (``get_num_tokens`` counts the most any member needs). LangChain's
        default would download GPT-2's tokenizer (offline: minutes of retries, then 0)."""
        if self._tokenizer is None:
            self._tokenizer = self._drafter_tokenizer()
        return list(self._tokenizer(text, add_special_tokens=False)["input_ids"])

    def _drafter_tokenizer(self) -> Any:
        """The drafter's tokenizer, read from its files when they are local (a zoo name, a folder, a
        .gguf: no weights loaded), else from the loaded member (a hub id, a server, a registered member)."""
        engine = self._engine()
        drafter = engine.decoding_specs[0]
        if not engine.loaded and isinstance(drafter, MemberConfig):
            spec = drafter.spec
            source = spec.tokenizer or spec.target
            if not spec.is_url or spec.tokenizer:
                if source in ZOO or Path(source).expanduser().exists():
                    return load_tokenizer(source).tokenizer
        tokenizer = engine.members[0].table.tokenizer
        if tokenizer is None:  # a llama.cpp server's own tokenizer, read over HTTP
            raise InvalidRequestError(f"cannot count tokens here: {self.models[0]}'s tokenizer is on its "
                                      "server; add '#TOKENIZER' to its spec")
        return tokenizer

    @property
    def _llm_type(self) -> str:
        return "safe-ensemble"

    @property
    def model_name(self) -> str:
        """The members joined by '+', used as ``response_metadata['model_name']``."""
        return "+".join(self.models)

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"models": list(self.models), "method": self.method, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                # a default stop or tool_result_hint changes the answer: the LLM cache keys on them too
                # ("default_stop": LangChain sets "stop" to the call's own, None where it gives none)
                **({"default_stop": list(self.stop)} if self.stop else {}),
                **({"tool_result_hint": self.tool_result_hint} if self.tool_result_hint else {}),
                **self.engine_options, **self.member_options,
                **({"profile_digest": self._profile_digest} if self._profile_digest is not None else {}),
                **({"members": [m.model_dump(exclude_none=True) for m in self.members]} if self.members else {})}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = PROVIDER
        params["ls_model_name"] = kwargs.get("model") or self.model_name
        params["ls_model_type"] = "chat"
        params["ls_temperature"] = kwargs.get("temperature", self.temperature or 0.0)
        params["ls_max_tokens"] = kwargs.get("max_tokens") or self.max_tokens  # the cap, set or not
        if stop or self.stop:
            params["ls_stop"] = stop or self.stop
        return params

    # -- tools ----------------------------------------------------------------------------
    def bind_tools(
        self,
        tools: Sequence[dict[str, Any] | type | Callable[..., Any] | BaseTool],
        *,
        tool_choice: dict[str, Any] | str | bool | None = None,
        parallel_tool_calls: bool | None = None,
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; ``tool_choice`` "auto" (default), "none", "any"/"required"/True or a tool
        name. A forced choice prefills the answer with the start of a tool call, which makes even
        a 0.5B model produce a parseable call; ``parallel_tool_calls=False`` stops after one call.
        ``strict`` (which code written for ChatOpenAI passes) is accepted and changes nothing: a
        forced call's arguments are already decoded under the tool's schema; an unforced call is
        parsed, not constrained, and one that cannot be read is an ``invalid_tool_call``."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if formatted:  # reject an unknown tool name now, not at invoke
            forced_tool(tool_choice, [t["function"]["name"] for t in formatted])
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, **kwargs)

    def with_structured_output(
        self,
        schema: dict[str, Any] | type | None = None,
        *,
        include_raw: bool = False,
        method: Literal["function_calling", "json_schema", "json_mode"] = "function_calling",
        strict: bool | None = None,
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, dict[str, Any] | BaseModel]:
        """Answers as ``schema`` (pydantic class, TypedDict, JSON schema or OpenAI tool dict; the
        JSON methods take a JSON schema without a "title", and ``json_mode`` takes ``None``: any
        JSON object).

        ``method``: ``"function_calling"`` (default) forces a call of a tool shaped like the schema
        (the answer is prefilled with the call's start, and the arguments are decoded under the
        schema);
        ``"json_schema"`` asks for JSON matching the schema and *decodes under it*
        (``shared_engine.json_constraint``: every committed token keeps the answer a prefix of
        schema-valid JSON), then validates and, if still wrong, retries with the error, up to three
        tries (``shared_engine.tools``); ``"json_mode"`` asks for a JSON object without showing the
        schema (describe the fields in the prompt), decodes under the schema all the same, validates
        and retries the same way, and parses it into ``schema``. ``strict`` is accepted and changes
        nothing: every method already checks the result against the schema. ``include_raw=True``
        returns ``{"raw", "parsed", "parsing_error"}``.
        """
        if kwargs:
            raise ValueError(f"unsupported arguments for with_structured_output: {sorted(kwargs)}")
        if method not in STRUCTURED_OUTPUT_METHODS:
            raise ValueError(f"method {method!r} is not supported; use one of {list(STRUCTURED_OUTPUT_METHODS)}")
        is_pydantic = isinstance(schema, type) and is_basemodel_subclass(schema)
        ls_format = {"kwargs": {"method": method}, "schema": schema}
        parser: Runnable[Any, Any]
        if method == "function_calling":
            if schema is None:
                raise ValueError("method='function_calling' needs a schema (json_mode takes none: any JSON object)")
            # one call, as ChatOpenAI binds it: a forced answer may go on to more calls (abe0399), which only cost
            llm = self.bind_tools([schema], tool_choice="any", parallel_tool_calls=False,
                                  ls_structured_output_format=ls_format)
            name = convert_to_openai_tool(schema)["function"]["name"]
            # LangChain's tools parsers read an answer without a readable call as None: it must fail here
            whole_call = PydanticToolsParser(tools=[schema], first_tool_only=True) if is_pydantic else None
            parser = _readable_call(name, whole_call) | (
                whole_call or JsonOutputKeyToolsParser(key_name=name, first_tool_only=True))
        else:
            if schema is None and method == "json_schema":
                raise ValueError("method='json_schema' needs a schema (json_mode takes none: any JSON object)")
            # json_mode: the schema is not shown to the members (the prompt describes it), but checked
            fmt: dict[str, Any] = {"type": "json_schema" if method == "json_schema" else "json_object"}
            if schema is not None:
                fmt["json_schema"] = _json_schema_format(schema)
            llm = self.bind(response_format=fmt, ls_structured_output_format=ls_format)
            # JsonOutputParser reads cut or invalid JSON leniently ({} or part of a dict): an answer
            # the engine marked invalid must fail here, as a parsing error
            # the whole answer is parsed again there for a pydantic schema: stream's parser drops a failing one
            whole: PydanticOutputParser[Any] | None = (
                PydanticOutputParser(pydantic_object=schema) if is_pydantic else None)
            parser = RunnableLambda(partial(_valid_answer, cut_ok=method == "json_mode", whole=whole)) | (
                whole or JsonOutputParser())
        if not include_raw:
            return llm | parser
        return with_raw(llm, parser)  # parsing_error in stream/astream too (with_fallbacks raised there)

    # -- request translation --------------------------------------------------------------
    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> _Request:
        kwargs = dict(kwargs)
        kwargs.pop("stream", None)  # LangChain routing flag, already acted upon
        model = kwargs.pop("model", None)
        if model is not None and model != self.model_name:
            raise InvalidRequestError(
                f"model={model!r} per call is not supported: this ChatEnsemble runs {self.model_name!r}; "
                "make another ChatEnsemble(models=[...]) for other members")
        if not messages:
            raise InvalidRequestError("the message list is empty")
        params: dict[str, Any] = self._answer_length(kwargs.pop("max_tokens", None))
        for key in ("temperature", "top_p", "seed"):
            value = kwargs.pop(key, getattr(self, key))
            if value is not None:
                params[key] = value
        stops = stop if stop is not None else (self.stop or [])
        params["stop"] = [stops] if isinstance(stops, str) else list(stops)  # a str is one stop, not its chars
        if not kwargs.get("tools"):
            kwargs.pop("tools", None)
        elif self.tool_result_hint:
            params["tool_result_hint"] = self.tool_result_hint
        if isinstance(kwargs.get("response_format"), type):  # bind_tools(..., response_format=Model), as ChatOpenAI
            kwargs["response_format"] = {"type": "json_schema",
                                         "json_schema": _json_schema_format(kwargs["response_format"])}
        params.update(kwargs)  # tools, tool_choice, response_format, ...: the engine checks the names
        return _Request(to_engine_messages(messages), params)

    def _answer_length(self, asked: int | None) -> dict[str, int]:
        """The engine's ``max_new_tokens`` where the call (its keyword or ``bind``) or the constructor set
        one, else nothing: an answer length nobody asked for lets a prompt that leaves less than 256 tokens
        of room be answered until the smallest window is full (finish "length"), as vLLM's or
        llama-server's would, where passing the default 256 had it refused. A call's None means
        this model's own, as in ChatOpenAI."""
        if asked is not None:
            return {"max_new_tokens": asked}
        return {"max_new_tokens": self.max_tokens} if "max_tokens" in self.model_fields_set else {}

    def _engine_config(self) -> _EngineConfig:
        """What identifies the shared engine: members, method, engine plus placement options, and
        what the profile they name held when this model was made (read on the first call, which
        may be langchain-core's profile validator, before ``_validate_engine``: an engine built
        under another key would be held by no one)."""
        profile = self.engine_options.get("profile")
        if profile is None:
            self._profile_digest = None
        elif self._profile_digest is None or profile != self._digested_profile:  # a copy given another profile
            self._digested_profile, self._profile_digest = profile, profile_digest(profile)
        return (self.members or self.models, self.method, {**self.member_options, **self.engine_options},
                self._profile_digest)

    def _engine(self) -> EnsembleEngine:
        """The shared engine this model holds; after ``close()`` an error (building or finding it
        again would hold nothing: an engine no one counts off, its members loaded for good)."""
        if self._closed:
            raise EngineClosedError("this ChatEnsemble is closed (close() gave its engine back); make a new one")
        config = self._engine_config()
        held = self._release.peek() if self._release is not None else None  # None: still being validated
        if held is not None and held[2] != (_engine_key(*config),):
            self._move(config)
        return _shared_engine(*config)

    def _move(self, config: _EngineConfig) -> None:
        """Hold ``config``'s engine and give the old one back: the configuration changed after this
        model took its hold (``model_copy(update={"engine_options": ...})`` copies before it updates,
        or ``engine_options`` was edited), and the new engine would be held by no one, never closed."""
        with _MOVE_LOCK:
            old = self._release
            held = old.peek()
            if held is None:
                raise EngineClosedError("this ChatEnsemble is closed (close() gave its engine back); make a new one")
            if held[2] == (_engine_key(*config),):
                return  # another thread moved it
            self._hold(config)
        old()  # outside the lock: the last user closes the old engine

    @property
    def _closed(self) -> bool:
        return self._release is not None and not self._release.alive

    # -- streaming core -------------------------------------------------------------------
    def invoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> AIMessage:
        """As LangChain's; ``streaming=True`` runs ``_stream`` with no run manager, so the model's
        own run is passed on for its ensemble events (see ``astream``)."""
        config, run = _own_run(config)
        token = _OWN_RUN.set(run)
        try:
            return super().invoke(input, config, stop=stop, **kwargs)
        finally:
            _OWN_RUN.reset(token)

    async def ainvoke(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
                      stop: list[str] | None = None, **kwargs: Any) -> AIMessage:
        config, run = _own_run(config)
        token = _OWN_RUN.set(run)
        try:
            return await super().ainvoke(input, config, stop=stop, **kwargs)
        finally:
            _OWN_RUN.reset(token)

    async def astream(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
                      stop: list[str] | None = None, **kwargs: Any) -> AsyncIterator[AIMessageChunk]:
        config, run = _own_run(config)
        stream = cast(AsyncGenerator[AIMessageChunk, None], super().astream(input, config, stop=stop, **kwargs))
        try:
            while True:
                token = _OWN_RUN.set(run)  # only while LangChain's code runs, never across a yield
                try:
                    chunk = await anext(stream)
                except StopAsyncIteration:
                    return
                finally:
                    _OWN_RUN.reset(token)
                yield chunk
        finally:
            await stream.aclose()

    def stream(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
               stop: list[str] | None = None, **kwargs: Any) -> Iterator[AIMessageChunk]:
        config, run = _own_run(config)
        stream = cast(Generator[AIMessageChunk, None, None], super().stream(input, config, stop=stop, **kwargs))
        try:
            while True:
                token = _OWN_RUN.set(run)
                try:
                    chunk = next(stream)
                except StopIteration:
                    return
                finally:
                    _OWN_RUN.reset(token)
                yield chunk
        finally:
            stream.close()

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        translator = _Translator(self, v1_stream=self.output_version == "v1")
        async for chunk in self._atranslated(translator, messages, stop, run_manager, kwargs):
            yield chunk

    async def _atranslated(self, translator: _Translator, messages: list[BaseMessage], stop: list[str] | None,
                           run_manager: AsyncCallbackManagerForLLMRun | None, kwargs: dict[str, Any]
                           ) -> AsyncIterator[ChatGenerationChunk]:
        request = self._request(messages, stop, kwargs)
        events = self._engine().astream(request.messages, **request.params)
        try:
            async for event in events:
                if event.type in self.custom_events:
                    await _aemit(f"ensemble.{event.type}", event.model_dump(mode="json"), run_manager)
                for chunk in translator.on_event(event):
                    yield chunk
        finally:
            await events.aclose()  # a consumer that stops early also stops the engine request

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        translator = _Translator(self, v1_stream=self.output_version == "v1")
        yield from self._translated(translator, messages, stop, run_manager, kwargs)

    def _translated(self, translator: _Translator, messages: list[BaseMessage], stop: list[str] | None,
                    run_manager: CallbackManagerForLLMRun | None, kwargs: dict[str, Any]
                    ) -> Iterator[ChatGenerationChunk]:
        request = self._request(messages, stop, kwargs)
        # The engine runs on a helper thread; events are handled here, on the caller's thread,
        # where LangChain's context (parent run for custom events) lives.
        events = iterate_sync(self._engine().astream(request.messages, **request.params))
        try:
            for event in events:
                if event.type in self.custom_events:
                    _emit(f"ensemble.{event.type}", event.model_dump(mode="json"), run_manager)
                yield from translator.on_event(event)
        finally:
            events.close()

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        translator = _Translator(self)
        chunks = self._translated(translator, messages, stop, run_manager, kwargs)
        return translator.with_call_errors(generate_from_stream(_announce(chunks, run_manager) if run_manager
                                                                else chunks))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        translator = _Translator(self)
        chunks = self._atranslated(translator, messages, stop, run_manager, kwargs)
        return translator.with_call_errors(await agenerate_from_stream(_aannounce(chunks, run_manager) if run_manager
                                                                       else chunks))


class _ConfiguredEnsemble(RunnableConfigurableFields):  # not parametrized: pydantic then builds an abstract class
    """``ChatEnsemble.configurable_fields(...)``: langchain-core builds the configured model anew from
    every field's value, so a field this model left unset came back set to its default. For
    ``max_tokens`` that is an answer length asked for: 256 was sent, and a prompt leaving less room,
    answered up to the window before, was refused (``_answer_length``). The configured model's set fields
    are this one's plus those the config sets, whatever their value: 256 set by the user or by the
    config is still asked for (a default passed explicitly cannot be told from a length chosen)."""

    def _prepare(self, config: RunnableConfig | None = None) -> tuple[Runnable[LanguageModelInput, AIMessage],
                                                                        RunnableConfig]:
        model, config = super()._prepare(config)
        if model is not self.default and isinstance(model, ChatEnsemble) and isinstance(self.default, ChatEnsemble):
            chosen = config.get("configurable", {})
            configured = {key for key, spec in self.fields.items()  # options always set their field
                          if not isinstance(spec, ConfigurableField) or spec.id in chosen}
            model.__pydantic_fields_set__ &= self.default.model_fields_set | configured
        return model, config


def _json_schema_format(schema: dict[str, Any] | type) -> dict[str, Any]:
    """``response_format``'s ``json_schema`` for a pydantic class, TypedDict, titled JSON schema or
    tool dict; a plain JSON schema without a top-level "title" (which langchain-core's tool
    conversion needs for the name) is taken as it is, as ChatOllama takes it."""
    if isinstance(schema, dict) and "function" not in schema and "parameters" not in schema and (
            "title" not in schema and ("properties" in schema or "type" in schema)
            or schema.get("type", "object") != "object"):  # a titled array or string schema: the engine refuses it
        return {"name": str(schema.get("title") or "response"), "schema": schema}
    spec = convert_to_openai_tool(schema)["function"]
    return {"name": spec["name"], "schema": spec["parameters"]}


def _valid_answer(message: AIMessage, cut_ok: bool, whole: PydanticOutputParser[Any] | None = None
                  ) -> AIMessage:
    """A whole structured answer the engine found invalid (``format_error``, after its retries) is an
    ``OutputParserException``, so ``include_raw=True`` fills ``parsing_error``. An answer cut by
    ``max_tokens`` is one too for ``json_schema`` (LangChain's parser would close the cut JSON into an
    object holding the cut value, ``Rec(name='71 fiasco')``; ChatOpenAI raises LengthFinishReasonError
    there); ``json_mode`` (``cut_ok``) hands it to the parser, which reads it leniently as it reads any
    chat model's (the standard suite's ``test_json_mode`` relies on it at its token cap). Either way
    its ``format_error`` stays in ``response_metadata``. A pydantic schema's parser (``whole``) reads the
    whole answer here too: ``stream`` runs it on a partial object and drops one that fails the schema
    (a cut answer), so it yielded nothing where ``invoke`` raised; now both raise its error."""
    error = message.response_metadata.get("format_error")
    cut = message.response_metadata.get("finish_reason") == "length"
    if error and not (cut and cut_ok):
        why = ANSWER_CUT if cut else "the answer is not the JSON asked for"
        raise OutputParserException(f"{why}: {error}", llm_output=str(message.text))
    if whole is not None:
        whole.parse_result([ChatGeneration(message=message)])
    return message


def _readable_call(name: str, whole: PydanticToolsParser | None = None) -> Runnable[Any, Any]:
    """Passes the answer (or its chunks) on, then raises ``OutputParserException`` where it holds no
    readable call of ``name`` (cut by max_tokens, or unreadable: the engine made it an
    ``invalid_tool_call``): LangChain's tools parsers read that as ``None``, so ``invoke`` gave None,
    ``stream`` nothing and ``include_raw=True`` no ``parsing_error`` (ChatOpenAI raises there). A
    pydantic schema's parser (``whole``) reads the whole call here too: ``stream`` drops a call whose
    arguments fail the model (``Field(ge=0)`` given -1), so it yielded nothing where ``invoke`` raised. A
    dict schema's call the engine found invalid after its retries (``format_error``) raises as a JSON
    answer does: it was returned as the parsed result."""

    def check(message: BaseMessage | None) -> None:
        if not isinstance(message, AIMessage):
            return
        if message.tool_calls:
            if whole is not None:
                whole.parse_result([ChatGeneration(message=message)])
            elif error := message.response_metadata.get("format_error"):  # a dict schema: no model to check it
                raise OutputParserException(f"the call of {name!r} does not match the schema: {error}",
                                            llm_output=json.dumps(message.tool_calls[0]["args"]))
            return
        invalid = message.invalid_tool_calls[0] if message.invalid_tool_calls else None
        raw = str(message.text)
        args = invalid.get("args") if invalid is not None else None
        if args:
            try:  # the translator writes an unreadable call's text as a JSON string
                raw = str(json.loads(args))
            except ValueError:
                raw = args
        if message.response_metadata.get("finish_reason") == "length":
            why = "the call was cut by max_tokens before its JSON ended"
        elif invalid is not None:
            error = invalid.get("error") or message.response_metadata.get("tool_call_errors", {}).get(invalid.get("id"))
            why = f"the call could not be read ({error or 'not a call of it'})"
        else:
            why = "the answer holds no call"
        raise OutputParserException(f"no readable call of {name!r}: {why}", llm_output=raw)

    def transform(chunks: Iterator[Any]) -> Iterator[Any]:
        whole = None
        for chunk in chunks:
            yield chunk
            whole = chunk if whole is None else whole + chunk
        check(whole)

    async def atransform(chunks: AsyncIterator[Any]) -> AsyncIterator[Any]:
        whole = None
        async for chunk in chunks:
            yield chunk
            whole = chunk if whole is None else whole + chunk
        check(whole)

    return RunnableGenerator(transform, atransform, name="readable_call")


def _announce(chunks: Iterator[ChatGenerationChunk], run_manager: CallbackManagerForLLMRun
              ) -> Iterator[ChatGenerationChunk]:
    """``on_llm_new_token`` for a non-streaming ``invoke`` too (as ChatOllama does); the streaming
    paths get theirs from langchain-core, which never passes ``_stream`` a run manager."""
    for chunk in chunks:
        run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk


async def _aannounce(chunks: AsyncIterator[ChatGenerationChunk], run_manager: AsyncCallbackManagerForLLMRun
                     ) -> AsyncIterator[ChatGenerationChunk]:
    async for chunk in chunks:
        await run_manager.on_llm_new_token(chunk.text, chunk=chunk)
        yield chunk


class _Translator:
    """Engine events of one request -> ``ChatGenerationChunk``s (text, tool calls, final chunk)."""

    def __init__(self, model: ChatEnsemble, *, v1_stream: bool = False) -> None:
        self.model = model
        self.call_errors: dict[str | None, str] = {}
        """Why each unreadable call is one, by id: LangChain makes streamed calls whose arguments are no
        object ``invalid_tool_calls`` with ``error`` None, and rebuilds them so as each chunk is added."""
        self.v1_stream = v1_stream
        """Chunks streamed to an ``output_version="v1"`` caller: they are merged by their content
        blocks' ``index``, so each block gets its own (see ``_block_index``)."""
        self._block, self._kind = -1, ""

    def _block_index(self, kind: str) -> int:
        """The index of this chunk's content block among all the answer's blocks, as Anthropic numbers
        them: a run of text is one block, each call one block. langchain-core numbers v1 blocks that
        have none by their type's runs only, so text after two calls would take the second call's
        index, and a call's own index (its place among the calls) the first text's: merged into one."""
        if kind != self._kind or kind == "tool_call":
            self._block += 1
        self._kind = kind
        return self._block

    def on_event(self, event: Event) -> list[ChatGenerationChunk]:
        if event.type == "token":
            if not event.text:
                return []
            content: str | list[str | dict[str, Any]] = event.text
            if self.v1_stream:
                content = [{"type": "text", "text": event.text, "index": self._block_index("text")}]
            return [ChatGenerationChunk(message=AIMessageChunk(content=content))]
        if event.type == "tool_call":
            # an unreadable call's raw text as a JSON string: LangChain reads args that are no
            # object as an invalid_tool_call (raw JSON object text would pass as a call named '')
            args = json.dumps(event.raw, ensure_ascii=False) if event.error else event.arguments_json
            if event.error:
                self.call_errors[event.id] = event.error
            index = self._block_index("tool_call") if self.v1_stream else event.index  # v0: among the calls
            chunk = tool_call_chunk(name=event.name, args=args, id=event.id, index=index)
            return [ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[chunk]))]
        if event.type == "finish":
            event.raise_if_closed_mid_answer("this ChatEnsemble")  # a stream raises after the chunks it gave
            self.model._after_request()
            return [self._final(event)]
        return []

    def with_call_errors(self, result: ChatResult) -> ChatResult:
        """The whole answer's invalid calls say why (``error``), as ChatOpenAI's non-streamed ones do
        (streamed chunks cannot carry it: LangChain rebuilds their invalid calls as it adds them)."""
        for generation in result.generations:
            message = generation.message
            for call in message.invalid_tool_calls if isinstance(message, AIMessage) else ():
                if call.get("error") is None and call.get("id") in self.call_errors:
                    call["error"] = self.call_errors[call["id"]]
        return result

    def _final(self, finish: FinishEvent) -> ChatGenerationChunk:
        """The last chunk carries usage and metadata (set once: LangChain sums/concatenates)."""
        usage = finish.usage
        metadata = {"model_name": self.model.model_name, "model_provider": PROVIDER, "models": list(self.model.models),
                    "method": self.model.method, "finish_reason": finish.openai_finish_reason,
                    "engine_finish_reason": finish.reason, "ensemble": finish.stats.model_dump(mode="json")}
        if finish.format_error:
            metadata["format_error"] = finish.format_error
        if finish.stop_string is not None:
            metadata["stop_string"] = finish.stop_string
        if self.call_errors:  # by id: a streamed invalid_tool_call's own ``error`` is None (see call_errors)
            metadata["tool_call_errors"] = {str(key): error for key, error in self.call_errors.items()}
        message = AIMessageChunk(
            content="", response_metadata=metadata, chunk_position="last",
            usage_metadata=UsageMetadata(input_tokens=usage.prompt_tokens, output_tokens=usage.completion_tokens,
                                         total_tokens=usage.total_tokens))
        return ChatGenerationChunk(message=message)


# -- messages ---------------------------------------------------------------------------------
_ROLE_OF = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
            "system": "system", "developer": "system", "tool": "tool", "function": "tool"}
_CALL_BLOCKS = ("tool_use", "tool_call", "function_call")
_SKIPPED_BLOCKS = _CALL_BLOCKS + ("tool_call_chunk", "invalid_tool_call", "server_tool_call", "server_tool_call_chunk",
                                  "server_tool_result", "reasoning", "thinking")
"""Blocks of an earlier answer that are not its text (LangChain v1 content blocks included): skipped."""


def _text(content: str | list[Any], where: str) -> str:
    """Text of a message's content; tool-call blocks are skipped (``tool_calls`` carries them),
    anything else (images, audio, files) is rejected: no member reads it."""
    if isinstance(content, str):
        return content
    parts = []
    for block in content:
        if isinstance(block, str):
            parts.append(block)
        elif isinstance(block, dict) and block.get("type") == "text":
            parts.append(str(block.get("text", "")))
        elif isinstance(block, dict) and block.get("type") in _SKIPPED_BLOCKS:
            continue
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidRequestError(f"{where}: content blocks of type {kind!r} are not supported "
                                      "(the ensemble reads text only)")
    return join_text_parts(parts)


def _assistant_message(message: AIMessage, where: str) -> dict[str, Any]:
    calls: list[tuple[Any, Any, Any]] = [(c.get("id"), c["name"], c["args"]) for c in message.tool_calls]
    if not calls and isinstance(message.content, list):  # e.g. Anthropic tool_use blocks only
        calls = [(b.get("id"), b.get("name"), b.get("input") or b.get("args") or {}) for b in message.content
                 if isinstance(b, dict) and b.get("type") in _CALL_BLOCKS and b.get("name")]
    out: dict[str, Any] = {"role": "assistant", "content": _text(message.content, where)}
    if calls:
        out["tool_calls"] = [{"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                             for i, n, a in calls]
    return out


def to_engine_messages(messages: Sequence[BaseMessage]) -> list[dict[str, Any]]:
    """LangChain messages -> the engine's OpenAI-style dicts (``tool_calls`` on assistant messages,
    ``tool`` messages for results; the engine renders them, see ``shared_engine.tools``)."""
    out: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"message {i} ({type(message).__name__})"
        if isinstance(message, (ToolMessage, FunctionMessage)) or (
                isinstance(message, ChatMessage) and _ROLE_OF.get(message.role) == "tool"):
            text = _text(message.content, where)
            if getattr(message, "status", None) == "error":
                text = f"Error: {text}"
            out.append({"role": "tool", "content": text, "tool_call_id": getattr(message, "tool_call_id", None)})
        elif isinstance(message, SystemMessage):
            out.append({"role": "system", "content": _text(message.content, where)})
        elif isinstance(message, HumanMessage):
            out.append({"role": "user", "content": _text(message.content, where)})
        elif isinstance(message, AIMessage):
            out.append(_assistant_message(message, where))
        elif isinstance(message, ChatMessage) and message.role in _ROLE_OF:
            out.append({"role": _ROLE_OF[message.role], "content": _text(message.content, where)})
        elif isinstance(message, BaseMessage):
            role = getattr(message, "role", message.type)
            raise InvalidRequestError(f"{where}: unsupported message type/role {role!r}; use system, "
                                      "human, ai or tool messages")
        else:
            raise InvalidRequestError(f"{where}: not a LangChain message")
    return out


# -- custom events ----------------------------------------------------------------------------
@dataclass(frozen=True)
class _OwnRun:
    """The model's own run in a streaming call (``astream``/``stream``), where langchain-core gives
    ``_astream`` no run manager: its id (assigned up front through the config) and callbacks."""

    run_id: uuid.UUID
    callbacks: Any
    tags: list[str]
    metadata: dict[str, Any]


_OWN_RUN: ContextVar[_OwnRun | None] = ContextVar("chat_ensemble_own_run", default=None)


def _own_run(config: RunnableConfig | None) -> tuple[RunnableConfig, _OwnRun]:
    config = ensure_config(config)
    run_id = config.get("run_id")
    if run_id is None:
        run_id = uuid.uuid4()
        config = {**config, "run_id": run_id}
    return config, _OwnRun(run_id, config.get("callbacks"), list(config.get("tags") or []),
                           dict(config.get("metadata") or {}))


async def _aemit(name: str, data: dict[str, Any], run_manager: AsyncCallbackManagerForLLMRun | None) -> None:
    """Send one ensemble event; never fatal. With a run manager (``ainvoke`` path) the event is
    attributed to the model's run; otherwise to the enclosing Runnable, if there is one, else to the
    model's own streaming run."""
    if run_manager is not None:
        manager = AsyncCallbackManager(handlers=run_manager.handlers,
                                       inheritable_handlers=run_manager.inheritable_handlers,
                                       parent_run_id=run_manager.run_id, tags=run_manager.tags,
                                       metadata=run_manager.metadata)
        await manager.on_custom_event(name, data, run_id=run_manager.run_id)
        return
    try:
        await adispatch_custom_event(name, data)
    except RuntimeError:  # a bare top-level call: no enclosing run; the model's own, if streaming
        run = _OWN_RUN.get()
        if run is not None:
            manager = AsyncCallbackManager.configure(run.callbacks, inheritable_tags=run.tags,
                                                     inheritable_metadata=run.metadata)
            await manager.on_custom_event(name, data, run_id=run.run_id)


def _emit(name: str, data: dict[str, Any], run_manager: CallbackManagerForLLMRun | None) -> None:
    """Sync twin of ``_aemit`` (runs on the caller's thread, where LangChain's context is)."""
    if run_manager is not None:
        manager = CallbackManager(handlers=run_manager.handlers,
                                  inheritable_handlers=run_manager.inheritable_handlers,
                                  parent_run_id=run_manager.run_id, tags=run_manager.tags,
                                  metadata=run_manager.metadata)
        manager.on_custom_event(name, data, run_id=run_manager.run_id)
        return
    try:
        dispatch_custom_event(name, data)
    except RuntimeError:
        run = _OWN_RUN.get()
        if run is not None:
            CallbackManager.configure(run.callbacks, inheritable_tags=run.tags,
                                      inheritable_metadata=run.metadata).on_custom_event(name, data, run_id=run.run_id)
