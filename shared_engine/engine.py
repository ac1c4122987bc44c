"""``EnsembleEngine``: the async entry point shared by the CLI and the LangChain/LlamaIndex adapters.

    engine = EnsembleEngine(["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"], method="safe")
    async for event in engine.astream("What is 17 + 25?"):
        if event.type == "token":
            print(event.text, end="")
    result = engine.generate("What is 17 + 25?")      # sync; result.text, result.stats
    result = engine.generate("Weather in Oslo?", tools=[weather_tool], tool_choice="required")
    result.tool_calls                                  # parsed calls (see shared_engine.tools)

Concurrency: every request gets its own session (KV cache) in every member, so concurrent
requests never see each other's state. A transformers member runs one forward at a time (its
lock), because on a CPU two forwards of one model only slow each other down; requests interleave
round by round there. A server-backed member has no lock here: a llama.cpp session holds its own
server slot, and the server batches the active slots in one decode (members/llamacpp.py).

Resources: a request's sessions are released when it ends, however it ends (finish, error, the
consumer breaking off, task cancellation). ``close()`` / ``with`` / ``async with`` stop the engine:
new requests raise ``EngineClosedError``, running ones finish at their next round with reason
``cancelled``. Members are shared through the process's registry (``acquire_member``): the first
engine naming one loads it, every engine naming it shares it, and ``close()`` lets go of this engine's
holds: a member no other engine holds is closed and unloaded, and the next engine loads it again.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Generator, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import BaseModel
from typing_extensions import TypeIs

from .auto_weights import ANSWER_TOKENS, FitCache, auto_weights, choose_drafter
from .decoding import (
    AdaFuseSettings,
    FusionSettings,
    RequestMember,
    RequestState,
    adafuse_round,
    decode_round,
    request_members,
)
from .decoding.adafuse import DEFAULT_THRESHOLD, TOKENS_PER_WORD, round_room
from .errors import ContextLengthError, EngineClosedError, InvalidRequestError, MemberError
from .events import Event, FinishEvent, FormatRetryEvent, Stats, ToolCallEvent, Usage
from .fusion import make_fuser
from .members import (
    Member,
    MemberConfig,
    MemberDefaults,
    acquire_member,
    check_members_fit,
    member_config,
    parse_member_spec,
    release_member,
)
from .members.chat import Message, normalize_messages, render_plain
from .members.config import check_placement_used
from .offload import carries_schemas, run_schema_work
from .options import EngineOptions, GenerationParams, check_request_keywords, validated
from .policies import DraftSchedule, make_policy
from .profile import apply_profile
from .sampling import Sampler
from .sync_bridge import iterate_sync, run_sync
from .tools import OutputOptions, OutputPlan
from .zoo import progress_shown

SLOW_DRAFTER_CHOICE_S = 5.0
"""drafter='auto': a choice that kept the first token waiting this long is worth a warning (how to skip it)."""

log = logging.getLogger(__name__)
RoundFunction = Callable[[RequestState, Sampler], AsyncGenerator[Event, None]]
"""A method's decoding round bound to its settings: advances the request, yields its events."""


class GenerationResult(BaseModel):
    """A whole answer (``generate``/``agenerate``): its finish event's fields, and the events with
    ``keep_events``."""

    text: str
    finish_reason: str
    stats: Stats
    tool_calls: list[ToolCallEvent] = []
    format_error: str | None = None
    stop_string: str | None = None
    failed_members: dict[str, str] = {}
    rejected_attempts: list[Stats] = []
    events: list[Event] = []

    @property
    def usage(self) -> Usage:
        """The tokens the whole request cost, every structured-output attempt included (``stats`` is
        the last attempt's)."""
        return Usage.of_attempts([*self.rejected_attempts, self.stats])


EMPTY_RAW_PROMPT = ("the prompt is empty: the answer continues the prompt's tokens, and a member whose "
                    "tokenizer adds no start token (Qwen2.5's, SmolLM2's) has none to continue from")
"""Why a raw prompt "" is refused where OpenAI's completions generate from it: its text encodes to no
token at all for such a member, and a model predicts the next token from at least one."""


@dataclass(frozen=True)
class CheckedRequest:
    """A request ``acheck_request`` checked: that engine's ``astream`` takes it in place of the prompt (with
    no other keyword) and serves it as checked, not checking it again (a tool list's schemas cost tenths
    of a second, each time: a server checking before admitting a request did it twice)."""

    gen: GenerationParams
    plan: OutputPlan
    messages: list[dict[str, Any]]
    checked_by: object = field(repr=False, compare=False)
    """The engine whose defaults ``gen`` holds: another engine's may differ."""


class EnsembleEngine:
    """Several members answering as one (SAFE by default; baselines share the same round)."""

    def __init__(self, members: Sequence[str | MemberConfig | Member], method: str = "safe", *,
                 progress: bool = True, **options: Any) -> None:
        """``members``: names/specs, ``MemberConfig``s or built members. ``options``: any
        ``EngineOptions`` field, plus the ``MemberDefaults`` (``device``, ``device_map``, ``dtype``,
        ``attn_implementation``, ``compile`` for transformers members, ``slots`` for in-process llama.cpp ones)
        applied to every member that does not set its own. ``progress``: the zoo's one-time bars and
        messages while members load (verifying, converting a GGUF; ``eval --no-progress``: False).
        Bad configs (unknown dtype or key, a device this machine lacks) fail here, loading nothing."""
        if isinstance(members, str):  # "a,b" as on the CLI was split into one member per character
            names = [name.strip() for name in members.split(",") if name.strip()]
            raise InvalidRequestError(f"give the members as a list of names, e.g. {names!r}, "
                                      f"not the string {members!r}")
        if not members:
            raise InvalidRequestError("an ensemble needs at least one member")
        placement = {k: options.pop(k) for k in list(options) if k in MemberDefaults.model_fields}
        defaults = validated(MemberDefaults, **placement)
        self._specs: list[MemberConfig | Member] = [
            spec if _is_member(spec) else member_config(spec, defaults)
            for spec in members]
        check_placement_used(defaults, self._specs)  # device="cuda" for llama.cpp members was dropped, silently
        options = apply_profile(self._specs, options)  # a calibration profile fills what is not given
        self.options = validated(EngineOptions, method=method, **options)
        for spec in self._specs:
            if isinstance(spec, MemberConfig):
                spec.check_placement()
        self._names = _display_names(self._specs)
        self.progress = progress
        self._members: list[Member] | None = None
        self._load_lock = threading.Lock()
        if self.options.method != "single" and len(self._specs) < 2:
            raise InvalidRequestError(f"method {method!r} needs at least two members (or use method='single')")
        if isinstance(self.options.weights, list) and len(self.options.weights) != len(self._specs):
            raise InvalidRequestError(f"{len(self.options.weights)} weights for {len(self._specs)} members")
        self._order = self._drafter_first(self.options.drafter)
        self._answer_fits = FitCache(path=self.options.fit_cache)  # drafter='auto': fits per member and prompt prefix
        self._warned_slow_choice = False  # drafter='auto': the slow-choice warning is given once
        self.fuser = make_fuser(self.options.fusion, self.options.top_k)
        self._live: dict[int, RequestState] = {}  # requests that hold sessions, by id()
        self._starting = 0  # requests between their start and holding sessions (loading, rendering)
        self._holds = 0  # requests under way (_holding): the members stay until the last has ended
        self._closed = False
        self._held: list[MemberConfig] = []  # members acquired from the registry, released by close()
        self._release_later: list[MemberConfig] = []  # ... after the requests still running at close()
        _ENGINES.add(self)

    def _forget_parent_process(self) -> None:
        """In a forked child (``_after_fork_in_child``): the members load again on first use, from the
        child's registry (which kept what carries on, transformers weights), and nothing the parent held
        or ran is released or waited for here."""
        self._load_lock = threading.Lock()
        self._members = None
        self._held, self._release_later = [], []
        self._live, self._starting, self._holds = {}, 0, 0
        self._answer_fits.forget_parent_process()

    def _drafter_first(self, drafter: str | int | None) -> list[int]:
        names = [s.model if isinstance(s, MemberConfig) else s.name for s in self._specs]
        if drafter == "auto" and self.options.method == "single":
            raise InvalidRequestError("drafter='auto' chooses among members; method 'single' runs one member "
                                      "(name it with drafter=)")
        if drafter is None or drafter == "auto":
            index = 0
        elif isinstance(drafter, int):
            if not 0 <= drafter < len(names):
                raise InvalidRequestError(f"drafter index {drafter} out of range: {len(names)} members, "
                                          f"0 to {len(names) - 1} ({names})")
            index = drafter
        elif drafter in self._names:
            index = self._names.index(drafter)
        else:
            index = _member_index(drafter, names)
        order = [index] + [i for i in range(len(names)) if i != index]
        return order if self.options.method != "single" else [index]

    @property
    def member_specs(self) -> list[MemberConfig | Member]:
        """The members as given (configs with the engine-wide defaults applied), in the given order."""
        return list(self._specs)

    @property
    def decoding_specs(self) -> list[MemberConfig | Member]:
        """The members this engine runs, in decoding order (drafter first): what ``members`` loads.
        Method ``single`` runs its drafter alone, so the other members given are never loaded."""
        return [self._specs[i] for i in self._order]

    def _check_open(self) -> None:
        if self._closed:
            raise EngineClosedError("the engine is closed")

    @property
    def members(self) -> list[Member]:
        """Members in decoding order (drafter first); loaded on first use, shared while any engine holds them."""
        with self._load_lock:
            if self._members is None:
                self._check_open()
                used = sorted(self._order)  # loaded in the order given
                specs = [self._specs[i] for i in used]
                configs = [s for s in specs if isinstance(s, MemberConfig)]
                loaded: list[Member] = []
                acquired: list[MemberConfig] = []
                try:  # a member that fails to load (or a name clash) lets go of those acquired before it
                    with progress_shown(self.progress):  # the registry loads with progress on
                        check_members_fit(configs)
                        for spec in specs:
                            if isinstance(spec, MemberConfig):
                                loaded.append(acquire_member(spec))
                                acquired.append(spec)
                            else:
                                loaded.append(spec)
                    _reject_ambiguous_names(loaded, [self._names[i] for i in used])
                except BaseException:
                    for spec in acquired:
                        release_member(spec)
                    raise
                self._held = configs
                by_index = dict(zip(used, loaded, strict=True))
                self._members = [by_index[i] for i in self._order]
            return self._members

    @property
    def loaded(self) -> bool:
        """Whether the members are loaded (reading ``members`` or ``context_window`` loads nothing)."""
        return self._members is not None

    @property
    def context_window(self) -> int:
        """The smallest member context window: what a prompt plus its answer must fit in (loads
        the members)."""
        return min(m.context_window for m in self.members)

    def prompt_tokens(self, messages_or_prompt: str | Sequence[Message], *,
                      tools: Sequence[Mapping[str, Any]] | None = None, raw_prompt: bool = False) -> int:
        """The most prompt tokens any member reads for this request: each member renders it as a
        request's start does (its own chat template and tokenizer; ``raw_prompt``: the text as is, its
        BOS included), so a prompt counted to at most ``context_window - max_new_tokens`` fits every
        member. The drafter's count alone does not: SmolLM2 spells Chinese in 3 times Qwen's tokens.
        Loads the members. An empty prompt counts 0; messages a strict template refuses (a history cut
        mid-conversation, as a trimmer tries it) count in the plain format instead."""
        if not messages_or_prompt:
            return 0
        if raw_prompt and isinstance(messages_or_prompt, str):  # any text, blank too (a request refuses that)
            self._check_open()
            return max(len(m.text_prompt_ids(messages_or_prompt)) for m in self.members)
        _, plan, messages = self._prepare(messages_or_prompt, {}, tools=list(tools) if tools else None,
                                          raw_prompt=raw_prompt)

        def count(member: Member) -> int:
            try:
                return len(_render(member, messages, plan))
            except InvalidRequestError:  # the template refuses these messages: the plain format's count
                return len(member.text_prompt_ids(render_plain(messages)))

        return max(count(m) for m in self.members)

    def longest_encoding(self, text: str) -> list[int]:
        """The token ids of ``text`` (no special tokens) in the tokenizer of the member that spells
        it in the most tokens: a tokenizer for counters that take any ``text -> tokens`` callable
        (LlamaIndex's memory ``tokenizer_fn``, ``Settings.tokenizer``), so a history trimmed by it
        fits every member, not just the drafter. Loads the members."""
        self._check_open()
        return max((m.table.encode_fragment(text) for m in self.members), key=len)

    @property
    def labels(self) -> list[str]:
        """How stats and events name the members, in decoding order: a member's ``MemberConfig.name``,
        else its model's name (primed, ``name'``, when that is taken: the same model may appear twice)."""
        given = {name for name in self._names if name is not None}
        labels: list[str] = []
        for index, member in zip(self._order, self.members):
            label = self._names[index]
            if label is None:
                label = member.name
                while label in labels or label in given:
                    label += "'"
            labels.append(label)
        return labels

    def _weights(self) -> torch.Tensor:
        if self.options.method == "single":  # the drafter alone, all the say (its given weight may be 0)
            return torch.ones(1)
        if not isinstance(self.options.weights, list):  # ('auto' replaces these once the prompt is read)
            return self._drafter_weighted(len(self._specs))
        return _normalised([self.options.weights[i] for i in self._order])  # checked when the options were built

    # -- lifecycle ---------------------------------------------------------------------------

    @property
    def live_requests(self) -> int:
        """Requests now running: holding sessions (KV caches) in the members, or starting (loading
        the members, rendering the prompt)."""
        return len(self._live) + self._starting + self._holds

    def close(self) -> None:
        """Take no new requests; running ones finish at their next round (reason ``cancelled``)
        and release their sessions. Members this engine loaded by name are released: one that no
        other engine holds leaves the registry and is closed (remote clients, llama.cpp servers);
        one that others hold stays loaded for them. That close may wait for a call still running
        (a llama.cpp member's, seconds): on an event loop, ``await aclose()`` instead."""
        _release_all(self._stop())

    def close_from_anywhere(self, thread_name: str = "engine close") -> None:
        """``close()`` for a caller that may be on an event loop's thread (an adapter's ``close()``, or a
        finalizer run by a collection in an async app): there it runs in a worker thread, since a member's
        close waits for a call a cancelled request left running (an in-process llama.cpp server's:
        seconds), which froze every coroutine; the members go moments later."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self.close()
            return
        threading.Thread(target=self.close, name=thread_name).start()

    def _stop(self) -> list[MemberConfig]:
        """``close()`` but for releasing: the members to let go of now (none while requests run: the
        last of them lets go)."""
        self._closed = True
        self._answer_fits.close()
        with self._load_lock:
            held, self._held = self._held, []
        if held and (self._live or self._starting or self._holds):
            self._release_later = held  # the last running (or starting) request lets go of them
            return []
        return held

    async def aclose(self, timeout_s: float = 30.0) -> None:
        """``close()``, then wait (up to ``timeout_s``) until every running request has ended. A load
        under way (minutes for a large model) is waited for off the event loop: ``close()`` takes the
        load lock, and on the loop thread it froze every other coroutine until the load ended. The
        members are let go of off the loop too (``_release_off_loop``)."""
        self._closed = True  # no request starts and no load begins from here on
        await asyncio.to_thread(self._wait_for_load)
        await _release_off_loop(self._stop())  # the lock is free now (a later taker sees _closed and lets go at once)
        deadline = time.monotonic() + timeout_s
        while self.live_requests and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    def _wait_for_load(self) -> None:
        with self._load_lock:  # held by a request loading the members
            pass

    def __enter__(self) -> EnsembleEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> EnsembleEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- requests ----------------------------------------------------------------------------

    async def astream(self, messages_or_prompt: str | Sequence[Message] | CheckedRequest, *,
                      tools: Sequence[Mapping[str, Any]] | None = None, tool_choice: Any = None,
                      parallel_tool_calls: bool | None = None, prefix: str = "",
                      response_format: Mapping[str, Any] | None = None, tool_result_hint: str | None = None,
                      raw_prompt: bool = False, **params: Any) -> AsyncGenerator[Event, None]:
        """Stream typed events for one answer; the last event is always ``finish``.

        ``tools`` (OpenAI format), ``tool_choice``, ``parallel_tool_calls``, ``prefix`` (the text the
        answer starts with), ``response_format`` (json_object / json_schema) and ``tool_result_hint``: see
        ``shared_engine.tools``; parsed calls come as ``tool_call`` events and in ``finish.tool_calls``.
        ``raw_prompt``: the string prompt is text the answer continues, in no chat format (OpenAI's
        completions; ``OutputOptions.raw_prompt``). ``messages_or_prompt`` may be what ``acheck_request``
        returned, with no other keyword: the request as checked.
        """
        self._check_open()
        # Held across the validation's hop (a close meanwhile let go of the members, and _decode then opened
        # sessions on them), then handed to _decode, which counts the request before its first await.
        async with self._holding(handed_on=True):
            gen, plan, messages = await self._avalidated(messages_or_prompt, params, tools=tools,
                tool_choice=tool_choice, parallel_tool_calls=parallel_tool_calls, prefix=prefix,
                response_format=response_format, tool_result_hint=tool_result_hint, raw_prompt=raw_prompt)
        rejected: list[tuple[str, str]] = []
        retried: list[Stats] = []
        answer_plan = plan.answer_only()  # a retry beside offered tools answers in JSON, under the schema
        if messages and messages[-1].get("role") == "tool":
            # after a tool result the answer is the final one: free to call again, small members called the
            # same tool with the same arguments until the agent's recursion limit (Qwen + Gemma, create_agent)
            plan = answer_plan
        finish: FinishEvent | None = None
        for attempt in range(1, plan.attempts + 1):
            if attempt > 1:
                plan = answer_plan
                if self._closed and finish is not None:  # closed during the retry's event: members let go
                    # cancelled, no answer (format_retry carried the rejected one), its stats once (usage sums both)
                    yield finish.model_copy(update={"reason": "cancelled", "rejected_attempts": retried[:-1],
                                                    "text": "", "tool_calls": [], "format_error": None})
                    return
            shaper = plan.shaper()
            finish = None
            async with aclosing(self._decode(plan.messages(messages, rejected), plan, gen)) as raw:
                async for event in raw:
                    for shaped in shaper.on_event(event):
                        if isinstance(shaped, FinishEvent):
                            finish = shaped
                        else:
                            yield shaped
            assert finish is not None, "the decoding loop always ends with finish"
            # an answer cut by the request's own stop string ended as asked: another try is cut there too
            if (finish.format_error and attempt < plan.attempts and finish.reason not in ("cancelled", "error")
                    and finish.stop_string is None
                    and await self._retry_fits(answer_plan.messages(messages, [*rejected, (finish.text,
                                                                                     finish.format_error)]),
                                               answer_plan, gen)):
                rejected.append((finish.text, finish.format_error))
                retried.append(finish.stats)
                yield FormatRetryEvent(attempt=attempt, error=finish.format_error, text=finish.text,
                                       stats=finish.stats)
                continue
            for event in shaper.release():
                yield event
            yield finish.model_copy(update={"rejected_attempts": retried}) if retried else finish
            return

    async def _retry_fits(self, messages: list[dict[str, Any]], plan: OutputPlan, gen: GenerationParams) -> bool:
        """Whether a structured-output retry's prompt (the request's, plus every rejected answer and its
        correction) still leaves each member room for the answer. Where it does not, the request ends
        with the last attempt and its format_error, as after the last try: a ContextLengthError there
        lost that answer (a 400, or "generation failed" mid-stream) though the request's prompt fit."""
        try:
            async with self._holding():  # renders in a worker thread: a close meanwhile waits for it
                await self._fitted_prompt_ids(messages, plan, gen)
        except ContextLengthError:
            return False
        return True

    def check_request(self, messages_or_prompt: str | Sequence[Message], **params: Any) -> None:
        """Raise the error ``astream`` would raise for this request before any member loads (bad
        parameters, an empty prompt): a caller about to load the members can fail first, fast.
        Takes ``astream``'s keywords."""
        output = {k: params.pop(k) for k in OutputOptions.model_fields if k in params}
        self._prepare(messages_or_prompt, params, **output)

    def _as_checked(self, checked: CheckedRequest, params: Mapping[str, Any], output_options: Mapping[str, Any]
                    ) -> tuple[GenerationParams, OutputPlan, list[dict[str, Any]]]:
        """A checked request's parts; a keyword beside it (which its check never saw) or another engine's
        check (other defaults) is refused, not silently dropped."""
        given = [*params, *(k for k, v in output_options.items() if v != OutputOptions.model_fields[k].default)]
        if given:
            raise InvalidRequestError(f"a checked request is served as it was checked: {', '.join(given)} given "
                                      "beside it (pass them to acheck_request)")
        if checked.checked_by is not self:
            raise InvalidRequestError("the request was checked by another engine (whose defaults may differ): "
                                      "check it with this one's acheck_request")
        return checked.gen, checked.plan, checked.messages

    def _prepare(self, messages_or_prompt: str | Sequence[Message], params: Mapping[str, Any],
                 **output_options: Any) -> tuple[GenerationParams, OutputPlan, list[dict[str, Any]]]:
        """A request's generation parameters, output plan and messages, validated."""
        self._check_open()
        return self._validated(messages_or_prompt, params, **output_options)

    def _validated(self, messages_or_prompt: str | Sequence[Message], params: Mapping[str, Any],
                   **output_options: Any) -> tuple[GenerationParams, OutputPlan, list[dict[str, Any]]]:
        """``_prepare`` for a request that checked the engine open before this thread hop (astream,
        acheck_fits): a close during the hop ends the request as 'cancelled', as any running one."""
        check_request_keywords(params, _STREAM_KEYWORDS, "astream/stream")
        defaults = self.options.model_dump(include=set(GenerationParams.model_fields))
        if "max_new_tokens" not in self.options.model_fields_set:
            del defaults["max_new_tokens"]  # stays unset in gen: the answer may end at the window (_answer_length)
        gen = validated(GenerationParams, **{**defaults, **params})
        plan = OutputPlan(validated(OutputOptions, **output_options))
        if plan.raw_prompt and not isinstance(messages_or_prompt, str):
            raise InvalidRequestError("a raw prompt is a string (the text the answer continues), "
                                      f"not {type(messages_or_prompt).__name__}")
        if plan.raw_prompt and not messages_or_prompt:
            raise InvalidRequestError(EMPTY_RAW_PROMPT)
        return gen, plan, normalize_messages(messages_or_prompt)

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncGenerator[Event, None]:
        """One generation: the members' raw events (tool markup included), ending with ``finish``."""
        self._starting += 1  # counted before any await: a close() meanwhile must not free the members
        try:
            state, sampler = await self._start(messages, plan, gen)
        finally:
            self._starting -= 1
            await self._release_if_closed()
        try:
            if not self._closed:  # closed while starting: the loop below ends it as cancelled
                await self._request_drafter(state, messages)
                await self._request_weights(state, messages)
            next_round = self._round_function(state.drafter.weight)
            while not state.finish_reason:
                if self._closed:
                    state.finish_reason = "cancelled"
                    break
                try:
                    async with aclosing(next_round(state, sampler)) as events:
                        async for event in events:
                            yield event
                except MemberError as err:
                    index = self._degradable(state, err)
                    if index is None:
                        raise
                    state.drop_member(index, str(err))
                    if index == 0:
                        if self.options.weights is None:  # the heir drafts: the drafter's weight goes to it
                            state.set_weights(self._drafter_weighted(len(state.members)))
                        # the round was bound to the old drafter's weight: an heir weighted 0 only
                        # proposes (no gate lets it write a token alone), one with a say is gated again
                        next_round = self._round_function(state.drafter.weight)
            for event in state.flush():
                yield event
            yield FinishEvent(reason=state.finish_reason, text=state.text, stats=state.finalize_stats(),
                              failed_members=state.failed_members, stop_string=state.stop_string)
        finally:
            self._live.pop(id(state), None)
            try:
                for record in state.members:  # free KV caches now, not when the generator is collected
                    release = getattr(record.session, "close", None)
                    if release is not None:
                        release()
            finally:
                await self._release_if_closed()

    async def acheck_fits(self, messages_or_prompt: str | Sequence[Message], **params: Any) -> None:
        """``check_request``, and that the prompt leaves every member room for the answer in its
        context window: loads the members and renders the prompt for each (off the event loop), as
        the request's start does. A caller about to answer several prompts in turn checks them all
        first, so that a later prompt's error does not throw away the answers before it."""
        output = {k: params.pop(k) for k in OutputOptions.model_fields if k in params}
        self._check_open()
        async with self._holding():
            gen, plan, messages = await self._avalidated(messages_or_prompt, params, **output)
            await self._fitted_prompt_ids(messages, plan, gen)

    async def acheck_request(self, messages_or_prompt: str | Sequence[Message] | CheckedRequest,
                             **params: Any) -> CheckedRequest:
        """``check_request`` off the event loop where it is slow (tools or a response_format: on the schema
        pool, as ``astream``'s check), loading nothing: what a server runs before admitting a request. The
        request is checked before the engine's state: one that cannot be served is an InvalidRequestError
        even from a closed engine (a retry would fail the same way), a servable one an EngineClosedError.
        Returns the request checked, for this engine's ``astream`` to serve without checking it again."""
        output = {k: params.pop(k) for k in OutputOptions.model_fields if k in params}
        gen, plan, messages = await self._avalidated(messages_or_prompt, params, **output)
        self._check_open()
        return CheckedRequest(gen, plan, messages, checked_by=self)

    async def _avalidated(self, messages_or_prompt: str | Sequence[Message] | CheckedRequest,
                          params: Mapping[str, Any], **output_options: Any
                          ) -> tuple[GenerationParams, OutputPlan, list[dict[str, Any]]]:
        """``_validated``, on the schema pool where the options carry schemas (jsonschema: tenths of a second);
        a ``CheckedRequest`` as it was checked."""
        if isinstance(messages_or_prompt, CheckedRequest):
            return self._as_checked(messages_or_prompt, params, output_options)
        if carries_schemas(output_options.get("tools"), output_options.get("response_format")):
            return await run_schema_work(self._validated, messages_or_prompt, params, **output_options)
        return self._validated(messages_or_prompt, params, **output_options)

    @asynccontextmanager
    async def _holding(self, handed_on: bool = False) -> AsyncIterator[None]:
        """Count a request across an await outside ``_decode`` that uses the members (the validation's and
        a retry's fit check's worker threads, acheck_fits): a close() meanwhile neither lets go of them under
        it nor returns before it ends (aclose() saw no request and released the members, and the request then
        opened sessions on them); the last to end lets go. ``handed_on``: the request goes on to ``_decode``,
        which counts it again before its first await, so only a failure here lets go."""
        self._holds += 1
        try:
            yield
        except BaseException:
            self._holds -= 1
            await self._release_if_closed()
            raise
        self._holds -= 1
        if not handed_on:
            await self._release_if_closed()

    async def _fitted_prompt_ids(self, messages: list[dict[str, Any]], plan: OutputPlan,
                                 gen: GenerationParams) -> tuple[list[Member], list[list[int]], int]:
        """The members (loaded), each one's prompt ids and the answer's length cap (``_answer_length``),
        refused with a ContextLengthError where the prompt leaves a member too little room."""
        members = await asyncio.to_thread(lambda: self.members)
        asked = _asked_length(gen)
        _reject_oversized(messages, members, asked)

        prompt_ids = await asyncio.to_thread(lambda: [_render(m, messages, plan) for m in members])
        for member, ids in zip(members, prompt_ids):
            if len(ids) + (asked or 1) > member.context_window:
                raise _too_long(f"prompt ({len(ids)} tokens)", asked, member)
            room = round_room(self.options.max_words)  # else AdaFuse's first round sees a full window: "" answer
            if self.options.method == "adafuse" and len(ids) + room > member.context_window:
                raise ContextLengthError(
                    f"prompt ({len(ids)} tokens) leaves {member.name} {member.context_window - len(ids)} tokens of "
                    f"its {member.context_window}-token context window; AdaFuse needs "
                    f"{room} for one round (a span of up to max_words + 1 = "
                    f"{self.options.max_words + 1} words, {TOKENS_PER_WORD} tokens each, and the scoring of the "
                    f"others' spans): shorten the prompt or lower max_words")
        return members, prompt_ids, _answer_length(gen, members, prompt_ids)

    async def _start(self, messages: list[dict[str, Any]], plan: OutputPlan,
                     gen: GenerationParams) -> tuple[RequestState, Sampler]:
        """A request's state, registered as live: members loaded, prompts rendered, sessions made."""
        members, prompt_ids, max_new_tokens = await self._fitted_prompt_ids(messages, plan, gen)
        # AdaFuse's spans are written by every member unconstrained: its JSON is validated and retried only.
        adafuse = self.options.method == "adafuse"
        # On the schema pool (a schema's parser takes seconds): on the loop it froze every stream, on the default
        # executor a plain request's loading and rendering waited behind it. Before the sessions: a request
        # cancelled meanwhile has nothing to close. None without schemas, or closed while queued (aclose waited).
        constraint = (await run_schema_work(lambda: None if self._closed else plan.constraint())
                      if not adafuse and carries_schemas(plan.tools, plan.response_format) else None)
        records = request_members(members, self.labels, [m.new_session() for m in members], prompt_ids,
                                  self._weights(), chat_turn=not plan.raw_prompt)
        stops = tuple(gen.stop) + tuple(plan.stops)  # the members' turn stops: RequestState.every_member_writes
        state = RequestState(records, max_new_tokens, stop=tuple(dict.fromkeys(stops)), constraint=constraint,
                             loop_guard=gen.loop_guard, every_member_writes=adafuse)
        self._live[id(state)] = state
        return state, Sampler(gen.temperature, gen.top_p, gen.seed)

    async def _release_if_closed(self) -> None:
        """After close(), the last request to end (or to fail while starting) lets go of the members."""
        if self._closed and not self._live and not self._starting and not self._holds and self._release_later:
            held, self._release_later = self._release_later, []
            await _release_off_loop(held)

    async def _request_drafter(self, state: RequestState, messages: Sequence[Message]) -> None:
        """``drafter="auto"``: the member that best predicts the prompt's example answers drafts (auto_weights.py)."""
        if self.options.drafter != "auto" or len(state.members) < 2:
            return
        eligible = state.weighted()  # a member weighted 0 has no say: the choice is among the others
        index = await self._choose_drafter(state, messages, eligible) if len(eligible) > 1 else None
        index = eligible[0] if index is None else index
        if not index:
            return
        state.make_drafter(index)
        if not isinstance(self.options.weights, list):  # the default weights follow the drafter
            state.set_weights(self._drafter_weighted(len(state.members)))

    async def _choose_drafter(self, state: RequestState, messages: Sequence[Message],
                              eligible: list[int]) -> int | None:
        """The index (in ``state.members``) of the ``eligible`` member that best fits the prompt's example
        answers, or None (no examples, a fit failed: the first eligible member drafts)."""
        records = [state.members[i] for i in eligible]
        began = time.perf_counter()
        choice = await choose_drafter([m.member for m in records], [m.session for m in records],
                                      [m.prompt_ids for m in records], messages, self._answer_fits)
        state.stats.drafter_choice_s = round(time.perf_counter() - began, 3)
        state.stats.answer_nll_per_byte = _finite_by_label(records, choice.nll_per_byte)
        if state.stats.drafter_choice_s >= SLOW_DRAFTER_CHOICE_S and not self._warned_slow_choice:
            self._warned_slow_choice = True  # once per engine: the block is cached now, the advice stands
            log.warning(
                "drafter='auto' took %.1f s before the first token to choose the drafter: each member scored "
                "the prompt's example answers (up to %d tokens; a llama.cpp member pays one decode step per "
                "token, llama-server returns no prompt log-probabilities). The fits are cached per few-shot "
                "block, so a block is scored once per engine%s; to skip the choice, name the drafter "
                "(drafter=NAME or an index) or pass a calibrated profile.",
                state.stats.drafter_choice_s, ANSWER_TOKENS,
                "" if self.options.fit_cache else " (fit_cache=FILE keeps them for the next process)")
        return None if choice.index is None else eligible[choice.index]

    def _drafter_weighted(self, members: int) -> torch.Tensor:
        """The default weights (no list given) in decoding order: ``drafter_weight_for(members)`` for the
        drafter, 1 for each other member, normalised."""
        return _normalised([self.options.drafter_weight_for(members)] + [1.0] * (members - 1))

    async def _request_weights(self, state: RequestState, messages: Sequence[Message]) -> None:
        """``weights="auto"``: this request's member weights from the prompt (auto_weights.py)."""
        if self.options.weights == "auto" and len(state.members) > 1:
            records = state.members
            fitted = await auto_weights([m.member for m in records], [m.session for m in records],
                                        [m.prompt_ids for m in records], messages, self.options.weights_temperature)
            state.stats.prompt_nll_per_byte = _finite_by_label(records, fitted.nll_per_byte)
            if fitted.weights is not None:
                state.set_weights(fitted.weights)
                if self.options.drafter == "auto" and state.drafter.weight <= 0:  # no say (a +inf prompt loss):
                    state.make_drafter(state.weighted()[0])  # it does not draft

    def _degradable(self, state: RequestState, err: MemberError) -> int | None:
        """With ``on_member_failure="degrade"``: the index of the failed member if the request can
        go on without it (at least one member left), else None (the error ends the request)."""
        if self.options.on_member_failure != "degrade" or len(state.members) < 2:
            return None
        return _failed_member(state, err)

    def _round_function(self, drafter_weight: float) -> RoundFunction:
        """The method's decoding round, bound to its settings: ``(state, sampler) -> events``.
        ``drafter_weight``: this request's; a drafter weighted 0 only proposes (no confidence gate, no
        gac-threshold gate)."""
        opts = self.options
        if opts.method == "adafuse":
            settings = AdaFuseSettings(
                opts.uncertainty,
                DEFAULT_THRESHOLD[opts.uncertainty] if opts.threshold is None else opts.threshold,
                opts.max_words, opts.num_candidates, opts.candidate_temperature, opts.vote)
            return lambda state, sampler: adafuse_round(state, settings, sampler)
        draft = (DraftSchedule.adaptive(opts.draft_length, opts.max_draft_length, opts.drafter_confidence)
                 if opts.draft_schedule == "adaptive" else DraftSchedule.fixed(opts.draft_length))
        # a drafter weighted 0 (named so, or by weights='auto') only proposes: the others decide every token,
        # neither its confidence (safe) nor its max probability (gac-threshold) lets it write a token alone
        has_say = drafter_weight > 0
        policy = make_policy(opts.method, draft, opts.gate_threshold if has_say else None,
                             opts.drafter_confidence if has_say else None, opts.overlap)
        fusion = FusionSettings(self.fuser, opts.sharpen, opts.plausibility)
        return lambda state, sampler: decode_round(state, policy, fusion, sampler)

    async def agenerate(self, messages_or_prompt: str | Sequence[Message], *, keep_events: bool = False,
                        **params: Any) -> GenerationResult:
        """The whole answer of ``astream`` (same keywords), its events too with ``keep_events``."""
        check_request_keywords(params, (*_STREAM_KEYWORDS, "keep_events"), "agenerate/generate")
        events = []
        async with aclosing(self.astream(messages_or_prompt, **params)) as stream:  # closed at its finish, not by gc
            async for event in stream:
                if keep_events:
                    events.append(event)
                if event.type != "finish":
                    continue
                return GenerationResult(text=event.text, finish_reason=event.reason, stats=event.stats,
                                        tool_calls=event.tool_calls, format_error=event.format_error,
                                        stop_string=event.stop_string, failed_members=event.failed_members,
                                        rejected_attempts=event.rejected_attempts, events=events)
        raise RuntimeError("the event stream ended without a finish event")  # pragma: no cover

    def generate(self, messages_or_prompt: str | Sequence[Message], **params: Any) -> GenerationResult:
        """Blocking ``agenerate``; safe to call inside a running event loop (runs on a helper thread)."""
        return run_sync(self.agenerate(messages_or_prompt, **params))

    def stream(self, messages_or_prompt: str | Sequence[Message], **params: Any) -> Generator[Event, None, None]:
        """Blocking iterator over ``astream``'s events."""
        return iterate_sync(self.astream(messages_or_prompt, **params))


_STREAM_KEYWORDS = tuple(OutputOptions.model_fields)
"""``astream``'s own keywords besides the generation parameters: a misspelt one is told the name meant."""

_ENGINES: weakref.WeakSet[EnsembleEngine] = weakref.WeakSet()
"""Every engine of this process, for ``_after_fork_in_child``."""


def _after_fork_in_child() -> None:
    """A process forked after an engine loaded its members (multiprocessing's fork start method, a
    ``ProcessPoolExecutor`` such as LlamaIndex's ``arun(num_workers=...)``, gunicorn's preload) found them
    bound to the parent's threads, and its first call waited forever: engines load theirs again."""
    for engine in list(_ENGINES):
        engine._forget_parent_process()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _normalised(weights: Sequence[float]) -> torch.Tensor:
    """Finite non-negative ``weights``, not all 0, scaled to sum to 1 (float32): divided by the largest first,
    in float64, so that weights of any finite size keep their ratios (weights=[1e39, 1] overflowed float32,
    [1e-46, 1e-46] underflowed it: NaN weights failed the first request with an IndexError)."""
    values = torch.tensor(list(weights), dtype=torch.float64)
    values = values / values.max()
    return (values / values.sum()).to(torch.float32)


def _failed_member(state: RequestState, err: MemberError) -> int | None:
    """The index of the member whose failure ``err`` is, or None when that is not certain.

    ``err`` names a model, and the same model may be listed twice (labels ``m``, ``m'``; even one
    member object twice, one session each): the name alone then picked the first copy, and degrade
    dropped a healthy member and went on with the failed one. So the member is found by identity:
    the session or member object whose method the error was raised in (a frame of its traceback).
    By name only where one member bears it; where neither tells one member, None (the error is raised
    rather than a guess dropping a healthy member)."""
    records = state.members
    raisers = _raisers(err)
    for attribute in ("session", "member"):
        found = [i for i, record in enumerate(records) if id(getattr(record, attribute)) in raisers]
        if len(found) == 1:
            return found[0]
    named = [i for i, record in enumerate(records) if record.member.name == err.member]
    return named[0] if len(named) == 1 else None


def _raisers(err: BaseException) -> set[int]:
    """The ids of the objects whose methods ``err`` passed through (``self`` of each frame of its
    traceback, the session or member call that raised it included)."""
    ids: set[int] = set()
    tb = err.__traceback__
    while tb is not None:
        owner = tb.tb_frame.f_locals.get("self")
        if owner is not None:
            ids.add(id(owner))
        tb = tb.tb_next
    return ids


def _finite_by_label(records: Sequence[RequestMember], values: Sequence[float]) -> dict[str, float]:
    """The members' fits for the stats, by label: a member that scored no bytes (NaN: a prompt too short,
    its first token is never scored) or gave a token no probability (+inf) is left out, as JSON holds no
    such number (a whole server answer failed with HTTP 500 on a NaN)."""
    return {m.label: round(v, 5) for m, v in zip(records, values) if math.isfinite(v)}


def _release_all(specs: Sequence[MemberConfig]) -> None:
    for spec in specs:
        release_member(spec)


async def _release_off_loop(specs: Sequence[MemberConfig]) -> None:
    """Let go of members in a worker thread: the last hold closes a member, and a llama.cpp member's
    close waits for the calls still running in its server (a cancelled request's: seconds), which on
    the loop thread froze every other request. The release is handed over before the first await, so
    it happens (and holder counts stay right) even if the awaiting request is cancelled again."""
    if specs:
        await asyncio.to_thread(_release_all, list(specs))


def _is_member(spec: object) -> TypeIs[Member]:
    """A built member (anything with the Member interface), as opposed to a description of one."""
    return not isinstance(spec, (str, dict, MemberConfig)) and all(
        hasattr(spec, a) for a in ("name", "table", "new_session"))


def _display_names(specs: Sequence[MemberConfig | Member]) -> list[str | None]:
    """Each member's ``MemberConfig.name`` (None where it has none). A name must single out one
    member: no two members share one, and none is another member's model (``drafter=`` and the
    stats' keys would be ambiguous)."""
    names = [spec.name if isinstance(spec, MemberConfig) else None for spec in specs]
    models = [spec.model if isinstance(spec, MemberConfig) else spec.name for spec in specs]
    for i, name in enumerate(names):
        if name is None:
            continue
        if name in names[:i]:
            raise InvalidRequestError(f"two members are both named {name!r}; member names must be unique")
        other = next((m for j, m in enumerate(models) if j != i and name in (m, _spec_target(m))), None)
        if other is not None:
            raise InvalidRequestError(f"member name {name!r} is also the model of another member ({other!r}); "
                                      "choose a name that no other member goes by")
    return names


def _reject_ambiguous_names(members: Sequence[Member], given: Sequence[str | None]) -> None:
    """The same model twice is fine (labels tell them apart, wrappers such as LangChain's tool
    prompts share its table and weights); two different models under one name are not: events,
    ``drafter=`` and stats are keyed by name. A member given a name (``MemberConfig.name``, ``given``
    beside ``members``) goes by it: two replicas of one served model named "east" and "west" were
    refused with "give them distinct names", which they had."""
    by_name: dict[str, Member] = {}
    for member, name in zip(members, given, strict=True):
        if name is not None:
            continue
        first = by_name.setdefault(member.name, member)
        if first.table is not member.table or getattr(first, "model", None) is not getattr(member, "model", None):
            raise InvalidRequestError(f"two different members are both named {member.name!r}; give them "
                                      "distinct names")


_NORMALISER_SHRINK = 4
"""Safety factor for the size bound below: a normaliser may shrink text (NFC composes Hangul jamo 3:1)."""


def _render(member: Member, messages: list[dict[str, Any]], plan: OutputPlan) -> list[int]:
    """``member``'s prompt ids for a request: its chat format (tools included) or the raw prompt, then the prefill."""
    if plan.raw_prompt:  # one user message: the prompt string (_prepare)
        ids = member.text_prompt_ids(messages[0]["content"])
    else:
        ids = member.prompt_ids(messages, tools=plan.tools) if plan.tools else member.prompt_ids(messages)
    return list(ids) + list(member.table.encode_fragment(plan.prefix))


def _reject_oversized(messages: Sequence[Message], members: Sequence[Member], max_new_tokens: int | None) -> None:
    """Refuse a prompt that cannot fit before tokenizing it: no token spells more than
    ``longest_piece`` bytes, so N bytes of content need at least N / longest_piece tokens
    (a multi-megabyte prompt would otherwise be tokenized for seconds only to be refused).
    ``max_new_tokens`` None: none asked, the prompt must leave room for one."""
    size = sum(len(m["content"].strip().encode("utf-8")) for m in messages)
    for member in members:
        least = size // (member.table.longest_piece * _NORMALISER_SHRINK)
        if least + (max_new_tokens or 1) > member.context_window:
            raise _too_long(f"prompt ({size} bytes: at least {least} tokens)", max_new_tokens, member)


def _asked_length(gen: GenerationParams) -> int | None:
    """The answer length the request or the engine's constructor set, or None where neither did
    (then the default only caps the answer, ``_answer_length``)."""
    return gen.max_new_tokens if "max_new_tokens" in gen.model_fields_set else None


def _answer_length(gen: GenerationParams, members: Sequence[Member], prompt_ids: Sequence[Sequence[int]]) -> int:
    """The answer's length cap: an asked length as asked (it fits, ``_fitted_prompt_ids`` checked); with
    none asked, the default cut to the smallest room the prompt leaves in a window, so the answer ends
    with finish "length" where a window is full, as vLLM's or llama-server's own would, instead of a
    refusal its members alone would not give (a 3856-token prompt in a 4096-token window)."""
    if _asked_length(gen) is not None:
        return gen.max_new_tokens
    room = min(m.context_window - len(ids) for m, ids in zip(members, prompt_ids))
    return max(1, min(gen.max_new_tokens, room))


def _too_long(prompt: str, max_new_tokens: int | None, member: Member) -> ContextLengthError:
    """The error for a request that does not fit ``member``'s window, naming the part to cut: where
    ``max_new_tokens`` alone fills the window, no prompt could fit (a short prompt with
    ``max_tokens=100000`` read as if the prompt were too long). ``max_new_tokens`` None: none was
    asked, and the prompt leaves no room for even one new token."""
    window = f"{member.name}'s context window of {member.context_window} tokens"
    if max_new_tokens is None:
        return ContextLengthError(f"{prompt} leaves no room for an answer in {window}")
    if max_new_tokens >= member.context_window:
        return ContextLengthError(f"max_new_tokens ({max_new_tokens}) alone fills {window}: ask for fewer new "
                                  f"tokens (at most {member.context_window - 1} with any prompt)")
    return ContextLengthError(f"{prompt} + max_new_tokens ({max_new_tokens}) exceed {window}")


def _member_index(name: str, names: list[str]) -> int:
    """Which member ``name`` means: the member spec as given, or the model it names without its
    backend prefix (``--drafter qwen2.5-coder-0.5b-instruct`` for ``llamacpp:qwen2.5-coder-0.5b-instruct``),
    or, naming none, digits: an index (``--drafter 1`` arrives as a string; eval's run labels read it so)."""
    if name in names:
        return names.index(name)
    targets = [_spec_target(n) for n in names]
    matching = sorted({names[i] for i, t in enumerate(targets) if t == _spec_target(name)})
    if len(matching) > 1:
        raise InvalidRequestError(f"drafter {name!r} could be any of {matching}: give the member spec as listed")
    if not matching and name.isdigit():
        if int(name) >= len(names):
            raise InvalidRequestError(f"drafter index {name} out of range: {len(names)} members, "
                                      f"0 to {len(names) - 1} ({names})")
        return int(name)
    if not matching:
        raise InvalidRequestError(f"drafter {name!r} is not a member; members: {names}")
    return names.index(matching[0])


def _spec_target(name: str) -> str:
    try:
        return parse_member_spec(name).target
    except InvalidRequestError:
        return name
