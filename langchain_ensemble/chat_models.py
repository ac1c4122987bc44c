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
(langchain-core's ``astream`` calls ``_astream`` without its run manager, so ``astream`` and
``stream`` are wrapped to pass the model run's id and callbacks on; see ``_OwnRun``.)
"""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, cast

from langchain_core.callbacks import (
    AsyncCallbackManager,
    AsyncCallbackManagerForLLMRun,
    CallbackManager,
    CallbackManagerForLLMRun,
    adispatch_custom_event,
    dispatch_custom_event,
)
from langchain_core.language_models import BaseChatModel, LangSmithParams, LanguageModelInput
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
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_core.runnables import Runnable, RunnableConfig, ensure_config
from langchain_core.tools import BaseTool
from langchain_core.utils.function_calling import convert_to_openai_tool
from pydantic import Field, field_validator, model_validator

from shared_engine import (
    EngineOptions,
    EnsembleEngine,
    GenerationParams,
    InvalidRequestError,
    MemberConfig,
    MemberDefaults,
)
from shared_engine.engine import iterate_sync
from shared_engine.events import Event, FinishEvent
from shared_engine.members import load_member
from shared_engine.options import Method, validated

from ._tools import (
    TOOL_CALL_CLOSE,
    ParsedCall,
    ToolCallStreamParser,
    ToolPromptMember,
    call_prefix,
    forced_tool,
    render_tool_call,
    render_tool_results,
    tool_names,
)

EVENT_TYPES = ("token", "draft", "verify", "ensemble", "adafuse", "cache_sync", "finish")
"""Engine event types that can be forwarded as ``ensemble.<type>`` custom events."""

_ENGINE_OPTION_KEYS = frozenset(EngineOptions.model_fields) - frozenset(GenerationParams.model_fields) - {"method"}
_FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length", "cancelled": "cancelled", "error": "error"}

_ENGINES: dict[tuple[Any, ...], EnsembleEngine] = {}
_ENGINES_LOCK = threading.Lock()


def _shared_engine(members: Sequence[str | MemberConfig], method: str, options: dict[str, Any]) -> EnsembleEngine:
    """One engine per configuration and process: constructing ``ChatEnsemble`` stays cheap, and
    members (weights) are loaded on first use, once per process, by ``load_member``."""
    described = tuple(m if isinstance(m, str) else m.model_dump_json(exclude_none=True) for m in members)
    key = (described, method, json.dumps(options, sort_keys=True, default=str))
    with _ENGINES_LOCK:
        engine = _ENGINES.get(key)
        if engine is None:
            engine = _ENGINES[key] = EnsembleEngine(list(members), method=method, **options)
        return engine


@dataclass
class _Request:
    """One call, translated: engine messages, generation params, tool handling."""

    messages: list[dict[str, str]]
    params: dict[str, Any]
    tools: list[dict[str, Any]] | None  # OpenAI-format tools; None: the answer is plain text
    forced: str | None  # None (model decides), "any" or a tool name
    prefix: str  # answer prefill (forced tool call); not part of the engine's answer text


class ChatEnsemble(BaseChatModel):
    """Several local LLMs with different tokenizers answering as one (SAFE by default).

    Setup: ``pip install 'safe-ensemble[langchain]'``; zoo names are converted on first use.

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

    Tool calling (prompted, Hermes/Qwen ``<tool_call>`` format; see ``_tools``)::

        llm_with_tools = llm.bind_tools([get_weather])
        llm_with_tools.invoke("Weather in Paris?").tool_calls
        llm.with_structured_output(Joke).invoke("Tell me a joke")

    Ensemble events: see the module docstring (``custom_events`` chooses which are sent).
    """

    models: list[str] = Field(min_length=1)
    """Member names (zoo names, local Hugging Face folders, .gguf paths, hub ids or member specs);
    the first drafts. Filled in from ``members`` when those are given instead."""
    members: list[MemberConfig] | None = None
    """Members with their own options (device, dtype, server settings), instead of ``models``."""
    member_options: dict[str, Any] = Field(default_factory=dict)
    """``MemberDefaults`` for every transformers member that sets none (device, device_map, dtype,
    attn_implementation); also collected from plain keywords, e.g. ``dtype="bfloat16"``."""
    method: Method = "safe"
    """How the ensemble decodes (see the engine's README)."""
    max_tokens: int = Field(256, ge=1)
    """Answer length cap, in drafter tokens."""
    temperature: float | None = None
    """Sampling temperature; None or 0 = greedy (the engine's default)."""
    top_p: float | None = None
    """Nucleus sampling mass (None: engine default 1.0)."""
    seed: int | None = None
    """Seed for sampling: a fixed seed gives a reproducible answer."""
    stop: list[str] | None = None
    """Default stop strings; a call's own ``stop`` replaces them."""
    streaming: bool = False
    """Make ``invoke`` use the streaming path (LangChain convention)."""
    custom_events: list[str] = Field(default_factory=lambda: ["ensemble", "adafuse", "finish"])
    """Engine event types sent as ``ensemble.<type>`` custom events; any of ``EVENT_TYPES``.
    The default sends fusion decisions (SAFE's and AdaFuse's) and the final stats, not every token or draft."""
    engine_options: dict[str, Any] = Field(default_factory=dict)
    """Extra ``EngineOptions`` (drafter, draft_length, fusion, ...); keywords are collected here."""

    @model_validator(mode="before")
    @classmethod
    def _collect_engine_options(cls, values: Any) -> Any:
        """``ChatEnsemble(models=..., draft_length=3)``: engine options as plain keywords."""
        if not isinstance(values, dict):
            return values
        values = dict(values)
        options = dict(values.get("engine_options") or {})
        for key in _ENGINE_OPTION_KEYS & values.keys():
            options[key] = values.pop(key)
        placement = dict(values.get("member_options") or {})
        for key in MemberDefaults.model_fields.keys() & values.keys():
            placement[key] = values.pop(key)
        values["member_options"] = placement
        if values.get("members") and not values.get("models"):
            values["members"] = [m if isinstance(m, MemberConfig) else validated(MemberConfig, **m)
                                 for m in values["members"]]
            values["models"] = [m.model for m in values["members"]]
        if "max_new_tokens" in values and "max_tokens" not in values:
            values["max_tokens"] = values.pop("max_new_tokens")
        values["engine_options"] = options
        return values

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
        are loaded here)."""
        if self.members and self.models != [m.model for m in self.members]:
            raise InvalidRequestError("give models or members, not both")
        validated(MemberDefaults, **self.member_options)
        self._shared()
        defaults = {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "stop": self.stop}
        validated(GenerationParams, max_new_tokens=self.max_tokens,
                  **{k: v for k, v in defaults.items() if v is not None})
        return self

    # -- LangChain metadata ---------------------------------------------------------------
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
                **self.engine_options, **self.member_options,
                **({"members": [m.model_dump(exclude_none=True) for m in self.members]} if self.members else {})}

    def _get_ls_params(self, stop: list[str] | None = None, **kwargs: Any) -> LangSmithParams:
        params = super()._get_ls_params(stop=stop, **kwargs)
        params["ls_provider"] = "safe-ensemble"
        params["ls_model_name"] = kwargs.get("model") or self.model_name
        params["ls_model_type"] = "chat"
        params["ls_temperature"] = kwargs.get("temperature", self.temperature or 0.0)
        params["ls_max_tokens"] = kwargs.get("max_tokens", self.max_tokens)
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
        **kwargs: Any,
    ) -> Runnable[LanguageModelInput, AIMessage]:
        """Bind tools; ``tool_choice`` "auto" (default), "none", "any"/"required"/True or a tool
        name. A forced choice prefills the answer with the start of a tool call, which makes even
        a 0.5B model produce a parseable call; ``parallel_tool_calls=False`` stops after one call."""
        formatted = [convert_to_openai_tool(t) for t in tools]
        if formatted:
            forced_tool(tool_choice, formatted)  # reject an unknown tool name now, not at invoke
        if tool_choice is not None:
            kwargs["tool_choice"] = tool_choice
        if parallel_tool_calls is not None:
            kwargs["parallel_tool_calls"] = parallel_tool_calls
        return super().bind(tools=formatted, **kwargs)

    # -- request translation --------------------------------------------------------------
    def _request(self, messages: list[BaseMessage], stop: list[str] | None, kwargs: dict[str, Any]) -> _Request:
        kwargs = dict(kwargs)
        tools = kwargs.pop("tools", None) or None
        tool_choice = kwargs.pop("tool_choice", None)
        parallel = kwargs.pop("parallel_tool_calls", None)
        kwargs.pop("stream", None)  # LangChain routing flag, already acted upon
        kwargs.pop("model", None)  # only names the run in LangSmith; members are fixed per instance
        if not messages:
            raise InvalidRequestError("the message list is empty")
        engine_messages = to_engine_messages(messages)
        if tools and tool_choice == "none":
            tools = None
        forced = forced_tool(tool_choice, tools) if tools else None

        params: dict[str, Any] = {"max_new_tokens": kwargs.pop("max_tokens", self.max_tokens)}
        for key in ("temperature", "top_p", "seed"):
            value = kwargs.pop(key, getattr(self, key))
            if value is not None:
                params[key] = value
        stops = list(stop if stop is not None else (self.stop or []))
        if forced or parallel is False:
            stops.append(TOOL_CALL_CLOSE)  # one call is enough; saves the tokens a small model rambles on
        params["stop"] = stops
        params.update(kwargs)  # anything else goes to the engine, which rejects unknown names
        return _Request(engine_messages, params, tools, forced, call_prefix(forced))

    def _engine(self, request: _Request) -> EnsembleEngine:
        """The shared engine, or, with tools bound, one whose members render the tools (and a
        forced call's prefix) into their prompts. The latter loads members here (blocking, once
        per process) and shares their weights; building the engine itself is cheap."""
        shared = self._shared()
        if not request.tools:
            return shared
        members = [ToolPromptMember(load_member(spec) if isinstance(spec, MemberConfig) else spec,
                                    request.tools, request.forced, request.prefix)
                   for spec in shared.member_specs]
        return EnsembleEngine(members, method=self.method, **self.engine_options)

    def _shared(self) -> EnsembleEngine:
        """The engine shared by every instance with this configuration."""
        return _shared_engine(self.members or self.models, self.method,
                              {**self.member_options, **self.engine_options})

    # -- streaming core -------------------------------------------------------------------
    async def astream(self, input: LanguageModelInput, config: RunnableConfig | None = None, *,
                      stop: list[str] | None = None, **kwargs: Any) -> AsyncIterator[AIMessageChunk]:
        config, run = _own_run(config)
        # LangChain annotates AsyncIterator; it is an async generator, closed below
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
        request = self._request(messages, stop, kwargs)
        engine = await asyncio.to_thread(self._engine, request) if request.tools else self._engine(request)
        translator = _Translator(self, request)
        events = engine.astream(request.messages, **request.params)
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
        request = self._request(messages, stop, kwargs)
        engine = self._engine(request)
        translator = _Translator(self, request)
        # The engine runs on a helper thread; events are handled here, on the caller's thread,
        # where LangChain's context (parent run for custom events) lives.
        events = iterate_sync(engine.astream(request.messages, **request.params))
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
        return generate_from_stream(self._stream(messages, stop, run_manager=run_manager, **kwargs))

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return await agenerate_from_stream(self._astream(messages, stop, run_manager=run_manager, **kwargs))


class _Translator:
    """Engine events of one request -> ``ChatGenerationChunk``s (text, tool calls, final chunk)."""

    def __init__(self, model: ChatEnsemble, request: _Request) -> None:
        self.model = model
        self.parser = ToolCallStreamParser(tool_names(request.tools), request.prefix) \
            if request.tools else None
        self.num_calls = 0

    def on_event(self, event: Event) -> list[ChatGenerationChunk]:
        if event.type == "token":
            pieces = self.parser.feed(event.text) if self.parser else [event.text]
            return [self._chunk(p) for p in pieces if p]
        if event.type == "finish":
            pieces = self.parser.close() if self.parser else []
            return [self._chunk(p) for p in pieces if p] + [self._final(event)]
        return []

    def _chunk(self, piece: str | ParsedCall) -> ChatGenerationChunk:
        if isinstance(piece, str):
            return ChatGenerationChunk(message=AIMessageChunk(content=piece))
        chunk = tool_call_chunk(name=piece.name, args=piece.args, id=piece.id, index=self.num_calls)
        self.num_calls += 1
        return ChatGenerationChunk(message=AIMessageChunk(content="", tool_call_chunks=[chunk]))

    def _final(self, finish: FinishEvent) -> ChatGenerationChunk:
        """The last chunk carries usage and metadata (set once: LangChain sums/concatenates)."""
        stats = finish.stats
        usage = UsageMetadata(input_tokens=stats.prompt_tokens, output_tokens=stats.tokens,
                              total_tokens=stats.prompt_tokens + stats.tokens)
        reason = _FINISH_REASONS.get(finish.reason, finish.reason)
        if self.num_calls and reason != "length":  # "length" stays visible: a cut call may lack arguments
            reason = "tool_calls"
        metadata = {"model_name": self.model.model_name, "models": list(self.model.models),
                    "method": self.model.method, "finish_reason": reason, "engine_finish_reason": finish.reason,
                    "ensemble": stats.model_dump(mode="json")}
        message = AIMessageChunk(content="", usage_metadata=usage, response_metadata=metadata,
                                 chunk_position="last")
        return ChatGenerationChunk(message=message)


# -- messages ---------------------------------------------------------------------------------
_ROLE_OF = {"human": "user", "user": "user", "ai": "assistant", "assistant": "assistant",
            "system": "system", "developer": "system", "tool": "tool", "function": "tool"}
_CALL_BLOCKS = ("tool_use", "tool_call", "function_call")


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
        elif isinstance(block, dict) and block.get("type") in _CALL_BLOCKS + ("reasoning", "thinking"):
            continue
        else:
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise InvalidRequestError(f"{where}: content blocks of type {kind!r} are not supported "
                                      "(the ensemble reads text only)")
    return "".join(parts)


def _assistant_text(message: AIMessage, where: str) -> str:
    calls: list[tuple[Any, Any]] = [(c["name"], c["args"]) for c in message.tool_calls]
    if not calls and isinstance(message.content, list):  # e.g. Anthropic tool_use blocks only
        calls = [(b.get("name"), b.get("input") or b.get("args") or {}) for b in message.content
                 if isinstance(b, dict) and b.get("type") in _CALL_BLOCKS and b.get("name")]
    parts = [_text(message.content, where).strip()] + [render_tool_call(n, a) for n, a in calls]
    return "\n".join(p for p in parts if p)


def to_engine_messages(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages -> the engine's OpenAI-style dicts with string content.

    Tool calls and tool results are written in the prompt format of ``_tools`` (assistant
    ``<tool_call>`` blocks; consecutive tool results in one user turn of ``<tool_response>``).
    """
    out: list[dict[str, str]] = []
    pending_results: list[str] = []

    def flush_results() -> None:
        if pending_results:
            out.append({"role": "user", "content": render_tool_results(pending_results)})
            pending_results.clear()

    for i, message in enumerate(messages):
        where = f"message {i} ({type(message).__name__})"
        if isinstance(message, (ToolMessage, FunctionMessage)) or (
                isinstance(message, ChatMessage) and _ROLE_OF.get(message.role) == "tool"):
            text = _text(message.content, where)
            if getattr(message, "status", None) == "error":
                text = f"Error: {text}"
            pending_results.append(text)
            continue
        flush_results()
        if isinstance(message, SystemMessage):
            out.append({"role": "system", "content": _text(message.content, where)})
        elif isinstance(message, HumanMessage):
            out.append({"role": "user", "content": _text(message.content, where)})
        elif isinstance(message, AIMessage):
            out.append({"role": "assistant", "content": _assistant_text(message, where)})
        elif isinstance(message, ChatMessage) and message.role in _ROLE_OF:
            out.append({"role": _ROLE_OF[message.role], "content": _text(message.content, where)})
        elif isinstance(message, BaseMessage):
            role = getattr(message, "role", message.type)
            raise InvalidRequestError(f"{where}: unsupported message type/role {role!r}; use system, "
                                      "human, ai or tool messages")
        else:
            raise InvalidRequestError(f"{where}: not a LangChain message")
    flush_results()
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
