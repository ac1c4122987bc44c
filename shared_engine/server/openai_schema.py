"""The slice of the OpenAI Chat Completions API this server speaks, as pydantic models.

Requests are validated strictly (``"5"`` is not an integer, as with OpenAI) so that a client bug
surfaces as a 400 naming the parameter instead of a silent coercion. Unknown request fields are
accepted and ignored, as OpenAI-compatible servers usually do, except those whose silent omission
would change the answer's meaning (the legacy ``functions``, ``logprobs``, audio output, an image
part in a message): those get a 400 saying they are not supported. ``tools``, ``tool_choice``,
``parallel_tool_calls``, ``response_format`` and the extension ``tool_result_hint`` go to the engine's
one mechanism (``shared_engine.tools``); calls come back as OpenAI ``tool_calls``, streamed as one
delta per call.

The ensemble extension: every response carries an extra top-level ``ensemble`` object (OpenAI
clients keep unknown fields in ``model_extra`` and otherwise ignore them); see ``EnsembleDelta``,
``EnsembleSummary`` and the two kinds of ``Decision``.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterable
from difflib import SequenceMatcher
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ModelWrapValidatorHandler,
    PrivateAttr,
    SerializerFunctionWrapHandler,
    ValidationInfo,
    field_validator,
    model_serializer,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ..events import AdaFuseEvent, EnsembleEvent, OpenAIFinishReason, Stats, ToolCallEvent, Usage
from ..members.chat import join_text_parts
from ..tools import plain_tool_choice

Role = Literal["system", "developer", "user", "assistant", "tool"]


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    type: Literal["text"]
    text: str


def _squashed(key: str) -> str:
    return re.sub(r"[^a-z0-9]", "", key.lower())


def misspells(key: str, fields: Iterable[str]) -> bool:
    """Whether ``key`` reads as one of ``fields`` misspelt: written otherwise (``toolCalls``, ``Content``),
    a letter more or less (``tool_call``), or two letters swapped (``contnet``, ``arguemnts``), while other
    providers' own keys (Azure's ``context``) are not."""
    squashed = _squashed(key)
    return any(SequenceMatcher(None, squashed, other).ratio() >= 0.9 or sorted(squashed) == sorted(other)
               for other in map(_squashed, fields))


class _Replayed(BaseModel):
    """A part of a conversation that clients replay from earlier responses. Keys this server does not
    read are ignored: providers and clients add their own (OpenAI's ``annotations``, ``refusal``,
    ``audio``; the ``parse()`` helpers' ``parsed`` and ``parsed_arguments``; vLLM's ``reasoning``, ...),
    and replayed responses are served, as other OpenAI-compatible servers serve them. A key that reads
    as a misspelt field is refused by name (``unknown_parameter``, as OpenAI says it): ignored, a
    ``toolCalls`` dropped the conversation's calls without a word."""

    model_config = ConfigDict(strict=True, extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _ignore_foreign_keys(cls, data: object) -> object:
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {key: value for key, value in data.items()
                if key in fields or (isinstance(key, str) and misspells(key, fields))}


class FunctionCallIn(_Replayed):
    """The function of an earlier call."""

    name: str
    arguments: str  # required, as OpenAI requires it: a call replayed under another key ("args") lost its arguments


class ToolCallIn(_Replayed):
    """An earlier call in an assistant message of the conversation."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Replayed):
    """One input message; ``content`` may be a string or a list of text parts (no images)."""

    role: Role
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    _non_text_part: tuple[int, str] | None = PrivateAttr(None)

    @model_validator(mode="wrap")
    @classmethod
    def _note_non_text_part(cls, data: object, handler: ModelWrapValidatorHandler[ChatMessage]) -> ChatMessage:
        """A part this server cannot read (``image_url``, ``input_audio``, ``file``: OpenAI's vision and
        audio requests) is noted, for ``ChatCompletionRequest.unsupported`` to refuse by name, rather
        than failing as pydantic's union error ("content.str: Input should be a valid string"). It
        stands in the list as empty text meanwhile (every such part: a second image failed as the union
        error again), so that the other parts keep their indexes; the first is named."""
        found = None
        if isinstance(data, dict) and isinstance(content := data.get("content"), list):
            other = [isinstance(part, dict) and isinstance(part.get("type"), str) and part["type"] != "text"
                     for part in content]
            if any(other):
                index = other.index(True)
                found = (index, content[index]["type"])
                data = {**data, "content": [{"type": "text", "text": ""} if odd else part
                                            for odd, part in zip(other, content)]}
        message = handler(data)
        message._non_text_part = found
        return message

    def as_engine_message(self) -> dict[str, Any]:
        """The engine's message form: ``developer`` is OpenAI's newer name for ``system``."""
        content = self.content if isinstance(self.content, str) else join_text_parts(
            [part.text for part in self.content or []])
        message: dict[str, Any] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    include_usage: bool = False

    @field_validator("include_usage", mode="before")
    @classmethod
    def _null_is_false(cls, value: object) -> object:
        return False if value is None else value


_NO_PENALTY = ("repetition penalties are not applied by the ensemble (its members tokenize the answer "
               "differently); omit it or send 0, and use the loop_guard extension (a byte limit on exact "
               "repetition at the answer's end) to stop loops")
UNSUPPORTED: dict[str, str] = {
    "functions": "the legacy functions API is not supported; use tools",
    "logprobs": "log probabilities are not returned by this server",
    "top_logprobs": "log probabilities are not returned by this server",
    "frequency_penalty": _NO_PENALTY,
    "presence_penalty": _NO_PENALTY,
    "logit_bias": "token ids differ between the members, so a logit bias has no single meaning",
    "audio": "audio output is not supported (this server writes text only)",
}
"""Request fields this server refuses with a 400 rather than silently ignore (any other unknown field is ignored)."""


MAX_STOPS = 4
"""The most ``stop`` sequences one request may send: OpenAI's limit, which it refuses past with a 400."""


TOOL_CHOICES = ("none", "auto", "required")
"""The strings OpenAI's ``tool_choice`` takes. The engine also reads Anthropic's ``"any"`` (and a bare tool
name) for its Python callers; an OpenAI server refuses them, as OpenAI does: a client sending ``"any"`` was
served as ``"required"`` and never told that OpenAI would refuse it."""

MAX_PROMPTS = 2048
"""The most prompts one legacy completions request may list: they are answered one after another on
one admission slot, and each is checked before the first is answered."""


def _text_or_texts(value: object, field: str) -> object:
    """A field that is a string or a list of strings, refused with the item that is neither:
    pydantic's union error named a branch (``prompt.str``: "Input should be a valid string") even
    when a list was sent."""
    if value is None or isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(f"{field} must be a string or a list of strings, got {type(value).__name__}")
    for index, item in enumerate(value):
        if not isinstance(item, str):
            raise ValueError(f"{field} must be a string or a list of strings: item {index} is "
                             f"{'null' if item is None else type(item).__name__}")
    return value


class _GenerationRequest(BaseModel):
    """What both completion endpoints take: the model, streaming, sampling and the extensions."""

    model_config = ConfigDict(strict=True, extra="allow")

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, ge=0.0, le=1.0, description="0 (OpenAI takes it): the most likely token only.")
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = Field(None, ge=1, description="Only one choice per request.")
    loop_guard: int | None = Field(
        None, ge=0, le=4096,
        description="Extension: an exact repetition at the answer's end may reach this many bytes, then no "
                    "token repeats it further (shared_engine/repetition.py); 0: off for this request; "
                    "unset: the server's default.")
    ensemble_events: bool | Literal["all"] = Field(
        True, description="Extension: send ensemble decisions along; 'all' adds AdaFuse's confident "
                          "(not voted) spans.")

    @field_validator("stream", "ensemble_events", mode="before")
    @classmethod
    def _null_is_the_default(cls, value: object, info: ValidationInfo) -> object:
        """Null is the default: OpenAI's spec makes ``stream`` nullable (clients that send unset
        options as null do), and the extension follows it."""
        return cls.model_fields[str(info.field_name)].default if value is None else value

    @field_validator("n")
    @classmethod
    def _one_choice(cls, value: int | None) -> int | None:
        """Said why: pydantic's bound read "Input should be less than or equal to 1"."""
        if value is not None and value > 1:
            raise PydanticCustomError(
                "less_than_equal", "n must be 1: this server returns one choice per request (send the request "
                                   "{n} times for {n} answers)", {"n": value})
        return value

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_texts(cls, value: object) -> object:
        return _text_or_texts(value, "stop")

    @field_validator("stop")
    @classmethod
    def _stops_non_empty(cls, value: str | list[str] | None) -> str | list[str] | None:
        """Non-empty, and at most ``MAX_STOPS`` of them, as OpenAI refuses more (a client written against
        this server must not fail on OpenAI's)."""
        stops = [value] if isinstance(value, str) else value or []
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        if len(stops) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop sequences are allowed, got {len(stops)}")
        return value

    def unsupported(self) -> tuple[str, str] | None:
        """(param, message) for a feature this server cannot honour, rather than ignore."""
        extra = self.model_extra or {}
        modalities = extra.get("modalities")
        if modalities and not (isinstance(modalities, list) and all(m == "text" for m in modalities)):
            # ["text", "audio"] would get text alone
            return "modalities", (f"only text output is supported (send [\"text\"] or leave it out), "
                                  f"not {json.dumps(modalities)}")
        # a falsy value (OpenAI's neutral 0, {}, false) changes nothing and is accepted
        return next(((param, why) for param, why in UNSUPPORTED.items() if extra.get(param)), None)

    def conflict(self) -> tuple[str, str] | None:
        """(param, message) for fields that only make sense together, refused as OpenAI refuses them."""
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed when stream is true"
        return None

    def answer_tokens(self) -> int | None:
        """The answer's token limit the request sets (None: the server's default)."""
        return self.max_tokens

    def answer_tokens_field(self) -> str | None:
        """The field that set ``answer_tokens`` (None: the server's default), for errors to name."""
        return "max_tokens" if self.max_tokens is not None else None

    def generation_params(self) -> dict[str, Any]:
        """The engine's per-request parameters; unset ones fall back to the engine's defaults."""
        params: dict[str, Any] = {
            "max_new_tokens": self.answer_tokens(),
            "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed, "stop": self.stop}
        params = {k: v for k, v in params.items() if v is not None}
        if self.top_p == 0:  # a nucleus of no mass keeps the most likely token (clients send it for greedy): greedy
            params["temperature"] = 0.0
            del params["top_p"]
        if self.loop_guard is not None:
            params["loop_guard"] = self.loop_guard or None
        return params


class ChatCompletionRequest(_GenerationRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    response_format: dict[str, Any] | None = None
    tool_result_hint: str | None = Field(
        None, min_length=1,
        description="Extension: with tools offered and a conversation that ends with tool results, a user "
                    "turn added after them asking for a plain-text answer (shared_engine.tools.OutputOptions).")

    def unsupported(self) -> tuple[str, str] | None:
        """A message part that is not text first: its path, as pydantic's errors name one."""
        for m, message in enumerate(self.messages):
            if message._non_text_part is not None:
                index, kind = message._non_text_part
                return (f"messages.{m}.content.{index}",
                        f"{kind!r} parts are not supported (this server reads text only)")
        return super().unsupported()

    def missing(self) -> str | None:
        """The path of a field OpenAI requires inside a message or the response format that the request
        left out (pydantic cannot name it: it is required for one role or one type only): a tool result
        answers one call, every message but an assistant's has content (one under another key, "text",
        was served as empty), and a json_schema format is named."""
        for m, message in enumerate(self.messages):
            if message.role == "tool" and message.tool_call_id is None:
                return f"messages.{m}.tool_call_id"
            if message.role != "assistant" and message.content is None:  # OpenAI: only an assistant's may be absent
                return f"messages.{m}.content"
        schema = (self.response_format or {}).get("json_schema")
        if (self.response_format or {}).get("type") == "json_schema" and isinstance(schema, dict) \
                and "name" not in schema:
            return "response_format.json_schema.name"
        return None

    def conflict(self) -> tuple[str, str] | None:
        if isinstance(self.tool_choice, str) and self.tool_choice not in TOOL_CHOICES:
            return "tool_choice", (f"invalid value {json.dumps(self.tool_choice)}: supported values are "
                                   f"{', '.join(map(json.dumps, TOOL_CHOICES))}, or "
                                   '{"type": "function", "function": {"name": ...}} naming the tool to call')
        if plain_tool_choice(self.tool_choice) not in (None, "auto", "none") and not self.tools:
            return "tool_choice", "tool_choice is only allowed when tools are specified"
        if (unanswered := self.unanswered_tool_result()) is not None:
            return unanswered
        return super().conflict()

    def unanswered_tool_result(self) -> tuple[str, str] | None:
        """(param, message) for the first tool result whose ``tool_call_id`` is the id of no call in an
        earlier assistant message, as OpenAI refuses it: served, the result stood in the prompt as an answer
        to nothing. Ids may repeat across turns (a client replays every turn); a call replayed without an
        id may be the one answered, so then any id is."""
        called: set[str] = set()
        anonymous = False
        for m, message in enumerate(self.messages):
            if message.role == "assistant":
                for call in message.tool_calls or []:
                    if call.id is None:
                        anonymous = True
                    else:
                        called.add(call.id)
            elif message.role == "tool" and message.tool_call_id is not None \
                    and message.tool_call_id not in called and not anonymous:
                return (f"messages.{m}.tool_call_id",
                        "messages with role 'tool' must be a response to a preceding message with 'tool_calls' "
                        f"(no earlier assistant message has a call with id {json.dumps(message.tool_call_id)})")
        return None

    def answer_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def answer_tokens_field(self) -> str | None:
        return "max_completion_tokens" if self.max_completion_tokens else super().answer_tokens_field()

    def output_options(self) -> dict[str, Any]:
        """The engine's tool and format options (``shared_engine.tools.OutputOptions``)."""
        options = {"tools": self.tools or None, "tool_choice": self.tool_choice,
                   "parallel_tool_calls": self.parallel_tool_calls, "response_format": self.response_format,
                   "tool_result_hint": self.tool_result_hint}
        return {k: v for k, v in options.items() if v is not None}


class CompletionRequest(_GenerationRequest):
    """OpenAI's (legacy) completions: a prompt the answer continues as plain text, in no chat format
    (the engine's ``raw_prompt``). A list of prompts is answered one after another, a choice each;
    token-id prompts are refused (each member has its own vocabulary)."""

    prompt: str | list[str] = Field(description="Text, or a list of texts: one choice each.")
    max_tokens: int | None = Field(16, ge=1, description="16 when unset, as OpenAI's completions.")
    echo: bool = Field(False, description="The prompt is sent back before the completion.")

    @field_validator("prompt", mode="before")
    @classmethod
    def _text_prompts(cls, value: object) -> object:
        if isinstance(value, list) and not value:
            raise ValueError("the list of prompts is empty")
        if isinstance(value, list) and any(isinstance(v, int | list) for v in value):
            raise ValueError("token-id prompts are not supported (each member has its own vocabulary): send text")
        if isinstance(value, list) and len(value) > MAX_PROMPTS:
            raise ValueError(f"a list of {len(value)} prompts: at most {MAX_PROMPTS} in one request (they are "
                             "answered one after another); send several requests")
        if value is None:
            raise ValueError("the prompt must be a string or a list of strings, got null")
        return _text_or_texts(value, "the prompt")

    @field_validator("echo", mode="before")
    @classmethod
    def _null_echo(cls, value: object) -> object:
        return False if value is None else value

    @field_validator("max_tokens", mode="before")
    @classmethod
    def _null_max_tokens(cls, value: object) -> object:
        return 16 if value is None else value

    @property
    def prompts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)

    def unsupported(self) -> tuple[str, str] | None:
        extra = self.model_extra or {}
        logprobs = extra.get("logprobs")
        if logprobs is not None and logprobs is not False:  # legacy 0 asks for the sampled tokens' log-probabilities
            return "logprobs", UNSUPPORTED["logprobs"]
        if extra.get("suffix"):
            return "suffix", "insertion (a suffix after the completion) is not supported"
        if extra.get("best_of") not in (None, 1):
            return "best_of", "best_of is not supported: one completion per prompt"
        return super().unsupported()

    def conflict(self) -> tuple[str, str] | None:
        if self.stream and len(self.prompts) > 1:
            return "prompt", "a list of prompts is answered whole: send stream false, or one prompt"
        return super().conflict()


# ----------------------------------------------------------------------------- responses


FinishReason = OpenAIFinishReason  # the engine's one mapping: FinishEvent.openai_finish_reason


class FunctionCallOut(BaseModel):
    name: str
    arguments: str = Field(description="The arguments as a JSON string, as OpenAI sends them.")


class ToolCallOut(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCallOut

    @classmethod
    def from_event(cls, call: ToolCallEvent) -> ToolCallOut:
        return cls(id=call.id, function=FunctionCallOut(name=call.name or "", arguments=call.arguments_json))


class ToolCallDelta(ToolCallOut):
    """A streamed call: sent whole, in one delta (a valid form of OpenAI's incremental deltas)."""

    index: int


class TokenDecision(EnsembleEvent):
    """A token fusion (SAFE, every-token, gac-threshold): the engine's ``ensemble`` event as is,
    tagged ``kind="token"``. Its ``position`` is the fused token's."""

    kind: Literal["token"] = "token"


class SpanDecision(AdaFuseEvent):
    """An AdaFuse span (``method="adafuse"``): the engine's ``adafuse`` event as is, tagged
    ``kind="span"``. Its ``position`` is the span's first token; the chunks whose ``span`` equals
    it carry the span's text."""

    kind: Literal["span"] = "span"


Decision = Annotated[TokenDecision | SpanDecision, Field(discriminator="kind")]


def as_decision(event: EnsembleEvent | AdaFuseEvent) -> TokenDecision | SpanDecision:
    if isinstance(event, AdaFuseEvent):
        return SpanDecision(**dict(event))
    return TokenDecision(**dict(event))


class EnsembleDelta(BaseModel):
    """Extension on a streamed chunk: where its text came from and the decisions made so far.

    ``decisions`` lists the ensemble decisions made since the previous chunk; a decision arrives
    on the chunk of the text it concerns or an earlier one (match a token decision to every chunk
    whose ``positions`` hold its position, a span decision by ``span``). ``stats``, ``format_error``
    and ``failed_members`` are set on the final chunk only, whatever ``ensemble_events`` says (it
    lists decisions only)."""

    source: Literal["draft", "ensemble", "prefix"] | None = Field(
        None, description="'ensemble': fusion chose this text over the drafter's own continuation "
                          "(a fused token that changed the draft, or a voted span); a fused position "
                          "that kept the drafted token reads 'draft'.")
    position: int | None = Field(None, description="Answer position (drafter tokens) of this text.")
    span: int | None = Field(None, description="AdaFuse: position of the span decision this text "
                                               "belongs to (listed or not).")
    positions: list[int] | None = Field(
        None, description="Every answer position this text comes from, in order (``position`` among them): "
                          "a character split over several tokens goes out with the token that completes it, "
                          "so the tokens holding its first bytes are listed here; text that one fused choice "
                          "wrote as several drafter tokens also lists the fused token's position. A token "
                          "decision concerns every chunk whose positions hold its own.")
    decisions: list[Decision] = []
    stats: Stats | None = None
    format_error: str | None = Field(
        None, description="Final chunk, response_format given: why the answer is still not the JSON asked "
                          "for after every attempt (OpenAI has no field for it; the answer is sent as written).")
    stop_string: str | None = Field(
        None, description="Final chunk: the request's stop string that ended the answer (vLLM's stop_reason).")
    failed_members: dict[str, str] | None = Field(
        None, description="Final chunk: the members dropped mid-answer (on_member_failure='degrade'): "
                          "member -> the error; {} when none was.")


class EnsembleSummary(BaseModel):
    """Extension on a non-streamed completion: every decision and the run's statistics."""

    method: str
    members: list[str]
    decisions: list[Decision] = []
    stats: Stats
    format_error: str | None = Field(
        None, description="response_format given: why the answer is still not the JSON asked for after every "
                          "attempt (OpenAI has no field for it; the answer is sent as written).")
    stop_string: str | None = Field(
        None, description="The request's stop string that ended the answer (vLLM's stop_reason).")
    failed_members: dict[str, str] = Field(
        default_factory=dict, description="The members dropped mid-answer (on_member_failure='degrade'): "
                                          "member -> the error.")


class Delta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None

    @model_serializer
    def _only_set(self) -> dict[str, Any]:
        """OpenAI sends only the delta's present fields (``{}`` on the final chunk)."""
        calls = [c.model_dump() for c in self.tool_calls] if self.tool_calls is not None else None
        return {k: v for k, v in (("role", self.role), ("content", self.content), ("tool_calls", calls))
                if v is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: FinishReason | None = None
    logprobs: None = None


def completion_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex}"


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    ensemble: EnsembleDelta | None = None


def _left_out_when_none(data: dict[str, Any], key: str) -> dict[str, Any]:
    """A serialised object without ``key`` where it is None (a field OpenAI's own objects lack)."""
    if data.get(key) is None:
        data.pop(key, None)
    return data


class AssistantMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None = Field(description="None when the answer is tool calls only, as with OpenAI.")
    tool_calls: list[ToolCallOut] | None = None

    @model_serializer(mode="wrap")
    def _calls_when_any(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """OpenAI leaves ``tool_calls`` out of a message without calls, but sends ``content: null``."""
        return _left_out_when_none(handler(self), "tool_calls")


class Choice(BaseModel):
    index: int = 0
    message: AssistantMessage
    finish_reason: FinishReason
    logprobs: None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage
    ensemble: EnsembleSummary | None = None


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: FinishReason | None = None
    logprobs: None = None
    ensemble: EnsembleSummary | None = Field(
        None, description="Extension, on a whole completion: this choice's decisions and statistics (a list "
                          "of prompts is answered a choice each).")

    @model_serializer(mode="wrap")
    def _summary_when_any(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _left_out_when_none(handler(self), "ensemble")


class TextCompletion(BaseModel):
    """A legacy completion, whole or one streamed chunk of it (OpenAI sends both as ``text_completion``)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None
    ensemble: EnsembleDelta | None = Field(
        None, description="Extension, on a streamed chunk: as on a chat chunk (``EnsembleDelta``).")

    @model_serializer(mode="wrap")
    def _delta_when_any(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """A whole completion carries its summaries on its choices: no top-level ``ensemble: null``."""
        return _left_out_when_none(handler(self), "ensemble")


def text_completion_id() -> str:
    return f"cmpl-{uuid.uuid4().hex}"


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "safe-ensemble"
    method: str = Field(description="Extension: the ensemble method.")
    members: list[str] = Field(description="Extension: member models, drafter first.")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


# ----------------------------------------------------------------------------- errors


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail
