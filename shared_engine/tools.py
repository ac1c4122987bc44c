"""Tool calling and structured output, once for every surface (CLI, LangChain, LlamaIndex, HTTP).

The ensemble has no provider-side tool API: tools travel through each member's prompt and calls
are parsed back out of the shared answer text. The format is Hermes / Qwen2.5's::

    <tool_call>
    {"name": "get_weather", "arguments": {"location": "Paris"}}
    </tool_call>

Rendering (``render_prompt_ids`` in ``members/chat.py``): a member whose chat template renders
``tools=`` (Qwen2.5) gets its own rendering, default system prompt included (a llama.cpp member
reading its tokenizer from the server: the server's ``/apply-template``, the same text); every
other member (SmolLM2, base models) gets the one documented fallback, the block of
``tools_system_block`` appended to the system message -- for Qwen, word for word what its own
template writes. Earlier calls and tool results are written back as ``<tool_call>`` blocks in the
assistant turn and one user turn of ``<tool_response>`` blocks (``tool_history_as_text``), again
what Qwen's template does.

Forcing a call (``tool_choice`` "required"/"any"/True or a tool's name) adds a closing system turn
("Answer with a call to ...") and prefills the answer with ``<tool_call>\\n{"name": "`` (plus the
name when it is known), so a small model only writes the arguments. The rest of a forced call is
decoded under a constraint (``json_constraint.py``): an offered tool's name (for "any"), then
arguments that match that tool's parameter schema, then the closing ``}``, where the answer ends.
An answer prefix of the caller's own (``prefix=``) works the same way, without the constraint.
With ``parallel_tool_calls=False`` the answer's first call is its only one: generation stops at the
``</tool_call>`` that ends the first call as the parser reads it (``CallEnd``: outside the call's JSON
strings, on a line of its own or right after the JSON), never at the tag written inside an argument,
and what follows the first call is dropped. Otherwise a forced answer may hold several calls, as
OpenAI's does for "required" with parallel calls allowed: after the first (constrained) call the
answer goes on (``call_ends.free_after_call``) while further ``<tool_call>`` blocks follow, each read
as a call, and stops where anything else is written (``CallsEnd``): text after a forced call is no
answer (the request asked for calls), and a small model writes prose there, so it is neither
generated on nor shown. A tool's name forces calls of that tool only: a further call of another one
fails the check below (``call_error``) like arguments out of the schema.

Parsing (``ToolCallParser``) is incremental, so tool markup never reaches the token stream, and
lenient through ``json_repair`` (code fences, single quotes, unquoted keys, a missing closing
brace or tag, arguments given as a JSON string); a bare JSON answer (an object, or a list of them
as some models write several calls) counts as calls only when each names an offered tool; a
tagged block that still cannot be read, or that names a tool never offered (an example in the
answer's prose), is reported as an invalid call, never guessed at or run, and so is
a call whose arguments were written but read as no object, or that the answer's end cut inside
its arguments (``_cut``): json_repair would make ``{}`` or a cut value of them, and the tool would
run on it. A call written without arguments, or with ``{}``, is a call with ``{}``.

Structured output (``response_format`` json_object / json_schema): the members are asked for JSON
(json_schema: with the schema; its root must be an object, as OpenAI's structured outputs require:
``OutputPlan`` refuses any other), the answer is prefilled with ``{`` and **decoded under a
character-level JSON constraint** (``json_constraint.py``: the drafter drafts only tokens that keep
the answer a valid prefix of JSON matching the schema, fusion only chooses such candidates, the
answer ends when the value is complete); json_object constrains to any JSON object, or to the
schema it carries. Not constrained, only validated and retried: AdaFuse (its spans are written by
every member), a request that also offers tools (a call must stay possible), a prefix of the
caller's that is no JSON start, and a schema the parser cannot take (``Stats.constrained`` says
which happened). Either way the answer is held back until it parses (and validates with
``jsonschema``, which also checks keywords the parser does not enforce), and regenerated with the
error fed back if it does not (``FORMAT_ATTEMPTS`` tries in all, fewer where a retry's prompt, which
holds every rejected answer, would not fit; under the constraint only an
answer cut by max_new_tokens or a keyword the parser does not enforce fails). The tokens of the
accepted attempt are then released at once; an answer that never validates is released as is,
with ``FinishEvent.format_error`` saying why. A forced call's arguments are validated against its
tool's parameter schema the same way (``call_error``), and retried.
"""

from __future__ import annotations

import copy
import json
import re
import uuid
from collections.abc import Collection, Mapping, Sequence
from functools import partial
from typing import Any, Literal

import json_repair
import jsonschema
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from .call_ends import (  # noqa: F401 - CallEndFinder and the tags are imported from here too
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    CallEnd,
    CallEndFinder,
    CallsEnd,
    JsonEnd,
    _CallBody,
    _JsonScan,
    free_after_call,
)
from .errors import InvalidRequestError
from .events import Event, TokenEvent, ToolCallEvent
from .json_constraint import JsonPrefix, call_start_state, start_state
from .json_validation import schema_error

DEFAULT_SYSTEM = "You are a helpful assistant."
"""System text put before the tools block when the conversation has no system message."""
FORMAT_ATTEMPTS = 3
"""Generations a structured-output request may take: the first answer plus two corrections."""

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')


# -- request options -----------------------------------------------------------------------------

class FunctionSpec(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$")
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})

    @field_validator("parameters")
    @classmethod
    def _valid_parameters(cls, value: dict[str, Any]) -> dict[str, Any]:
        """A schema the members are asked to fill and the forced call is decoded under: an invalid one
        ({"type": 5}) was accepted and the forced call's arguments came out as noise (OpenAI answers 400)."""
        try:
            jsonschema.validators.validator_for(value).check_schema(value)
        except jsonschema.SchemaError as err:
            raise ValueError(f"not a valid JSON schema: {err.message}") from None
        return value


class ToolSpec(BaseModel):
    """An OpenAI-format tool: ``{"type": "function", "function": {"name", "description", "parameters"}}``."""

    model_config = ConfigDict(extra="allow")

    type: Literal["function"] = "function"
    function: FunctionSpec


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)

    name: str = "response"
    description: str | None = None
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's ``response_format``: text (default), any JSON object, or JSON matching a schema.
    A ``json_object`` format may carry a ``json_schema`` too (an extension LangChain's json_mode
    uses): the answer is validated against it, but the schema is not put into the prompt."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"] = "text"
    json_schema: JsonSchemaFormat | None = Field(None, validate_default=True)

    @field_validator("json_schema")
    @classmethod
    def _valid_schema(cls, value: JsonSchemaFormat | None, info: ValidationInfo) -> JsonSchemaFormat | None:
        if value is None and info.data.get("type") == "json_schema":
            # OpenAI refuses it too: answering free JSON instead would hide the client's missing schema
            raise PydanticCustomError("missing", "Field required where type is 'json_schema'")
        if value is not None and value.json_schema:
            try:
                jsonschema.validators.validator_for(value.json_schema).check_schema(value.json_schema)
            except jsonschema.SchemaError as err:
                raise ValueError(f"not a valid JSON schema: {err.message}") from None
        return value


class OutputOptions(BaseModel):
    """Per-request tool and format options of ``EnsembleEngine.astream``."""

    model_config = ConfigDict(extra="forbid")

    tools: list[ToolSpec] | None = Field(None, description="Tools the members may call (OpenAI format).")
    tool_choice: str | bool | dict[str, Any] | None = Field(
        None, description="'auto' (default), 'none', 'required'/'any'/True, a tool name or "
                          "{'type': 'function', 'function': {'name': ...}}; Anthropic's {'type': 'any'} "
                          "(and 'auto', 'none', 'required') reads as that string.")
    parallel_tool_calls: bool | None = Field(None, description="False: stop after the first call.")
    prefix: str = Field("", description="Text the answer starts with (prefill): the members continue it.")
    response_format: ResponseFormat | None = None
    tool_result_hint: str | None = Field(
        None, description="With tools offered and a conversation that ends with tool results: a user turn "
                          "added after them, e.g. 'Using the function result above, answer my original "
                          "question in plain text.' Small members otherwise call the tool again instead of "
                          "answering; it discourages multi-step tool chains, so it is off by default.")
    raw_prompt: bool = Field(
        False, description="The prompt is plain text the answer continues, in no chat format (OpenAI's "
                           "completions): each member reads its tokenizer's encoding of it (its BOS, special-"
                           "token names as those tokens). A string prompt only; no tools or response_format, "
                           "which are rendered as turns of a conversation.")


_CHOICE_TYPES = ("auto", "any", "none", "required")


def plain_tool_choice(tool_choice: Any) -> Any:
    """Anthropic's ``{"type": "auto"|"any"|"none"}`` (and ``"required"``) as that string.

    LangChain's and Anthropic's callers pass these dicts; without this they read as a tool's name
    that names no tool. Any other value is returned as it is.
    """
    if isinstance(tool_choice, Mapping) and tool_choice.get("type") in _CHOICE_TYPES:
        return tool_choice["type"]
    return tool_choice


def forced_tool(tool_choice: Any, names: Sequence[str]) -> str | None:
    """``tool_choice`` as None (the model decides), "any", or the one tool name that must be called."""
    choice = plain_tool_choice(tool_choice)
    if choice in (None, False, "auto", "none"):
        return None
    if choice in (True, "any", "required"):
        return names[0] if len(names) == 1 else "any"
    if isinstance(choice, Mapping):
        function = choice.get("function")
        choice = (function.get("name") if isinstance(function, Mapping) else None) or choice.get("name")
    if isinstance(choice, str) and choice in names:
        return choice
    raise InvalidRequestError(f"tool_choice {tool_choice!r} is not 'auto', 'none', 'required' or one of the "
                              f"tools {list(names)}")


# -- prompt rendering ----------------------------------------------------------------------------

def tools_system_block(tools: Sequence[Mapping[str, Any]]) -> str:
    """The documented tools block (appended to the system message by the fallback)."""
    return _TOOLS_HEADER + "\n".join(json.dumps(dict(t), ensure_ascii=False) for t in tools) + _TOOLS_FOOTER


def with_tools_system(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]]
                      ) -> list[dict[str, Any]]:
    """The fallback for templates without tool support: the tools block in the system message."""
    out = [dict(m) for m in messages]
    block = tools_system_block(tools)
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{block}"
    else:
        out.insert(0, {"role": "system", "content": f"{DEFAULT_SYSTEM}\n\n{block}"})
    return out


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether a chat template renders ``tools=`` itself (Qwen2.5's does, SmolLM2's does not)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


def tool_call_text(name: str, arguments: Mapping[str, Any] | str | None) -> str:
    """An earlier tool call, written the way the members are asked to write one. Arguments that read as
    no object (OpenAI's own answers may carry them: "the model does not always generate valid JSON")
    are shown as the string they are: as ``{}`` the members saw a call made with no arguments."""
    shown: Any
    if isinstance(arguments, str):
        loaded = _loads(arguments)
        written = arguments.strip()
        shown = loaded if isinstance(loaded, dict) else {} if written in ("", "null") else written
    else:
        shown = dict(arguments or {})
    body = json.dumps({"name": name, "arguments": shown}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def tool_history_as_text(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI-style tool history -> plain turns every template can render.

    An assistant message's ``tool_calls`` become ``<tool_call>`` blocks after its text; a run of
    ``tool`` messages becomes one user turn of ``<tool_response>`` blocks (Qwen2.5's own form).
    """
    out: list[dict[str, Any]] = []
    results: list[str] = []
    for message in messages:
        if message.get("role") == "tool":
            results.append(f"<tool_response>\n{message.get('content') or ''}\n</tool_response>")
            continue
        if results:
            out.append({"role": "user", "content": "\n".join(results)})
            results = []
        calls = message.get("tool_calls") or []
        if message.get("role") == "assistant" and calls:
            parts = [(message.get("content") or "").strip()]
            for i, call in enumerate(calls):
                function = call.get("function", call) if isinstance(call, Mapping) else None
                if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
                    raise InvalidRequestError(f"tool call {i} of an assistant message has no function name")
                parts.append(tool_call_text(function["name"], function.get("arguments")))
            out.append({"role": "assistant", "content": "\n".join(p for p in parts if p)})
        else:
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
    if results:
        out.append({"role": "user", "content": "\n".join(results)})
    return out


def forced_instruction(forced: str, names: Sequence[str]) -> dict[str, str]:
    """A closing system turn for a forced call: after the question, where a small model heeds it."""
    if forced == "any":
        return {"role": "system", "content": f"Answer with a call to one of these functions: {', '.join(names)}."}
    return {"role": "system", "content": f"Answer with a call to the function {forced}."}


def call_prefix(forced: str | None) -> str:
    """The prefill of a forced call. It ends before the space after a colon: BPE vocabularies
    attach that space to the next token, so the model continues at a natural token boundary."""
    if forced is None:
        return ""
    if forced == "any":
        return TOOL_CALL_OPEN + '\n{"name": "'
    return TOOL_CALL_OPEN + "\n" + json.dumps({"name": forced}, ensure_ascii=False)[:-1] + ', "arguments":'


def format_instruction(response_format: ResponseFormat, tools: bool = False) -> dict[str, str]:
    """The system turn that asks for JSON (and shows the schema). With ``tools`` offered beside it (an
    agent's tools and its answer schema), the JSON is the final answer: "Answer with one JSON object
    only" made the members answer at once, never calling a tool (a made-up product instead of multiply's)."""
    text = ("If a function would help, call it first; your final answer, once you have what you need, is one "
            "JSON object only: no prose, no code fence.") if tools else \
        "Answer with one JSON object only: no prose, no code fence."
    spec = response_format.json_schema
    if response_format.type == "json_schema" and spec is not None and spec.json_schema:
        text += (f" It must match this JSON schema:\n{json.dumps(spec.json_schema, ensure_ascii=False)}")
    return {"role": "system", "content": text}


# -- parsing -------------------------------------------------------------------------------------

def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _loads(text: str) -> Any:
    """JSON as a small model writes it; None when there is no object or list in ``text``."""
    text = text.strip()
    if not text:
        return None
    try:
        return json.JSONDecoder().raw_decode(text)[0]  # the common, clean case; trailing text ignored
    except json.JSONDecodeError:
        pass
    try:
        loaded = json_repair.loads(text)
    except Exception:  # noqa: BLE001 - json_repair's own failures (an AssertionError on some garbage): no JSON
        return None
    return loaded if isinstance(loaded, dict | list) and loaded else None


def _as_call(obj: Any) -> tuple[str, dict[str, Any] | None] | None:
    """(name, arguments) from ``{"name", "arguments"}`` (or ``parameters``/``args``, or OpenAI's
    ``{"function": {...}}`` wrapper); None if ``obj`` is no call. The arguments are None when they
    were written but read as no object (json_repair keeps garbage as a string, which reads as none):
    such a call is reported, not run on ``{}``; none written, null or ``""`` is a call with ``{}``."""
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name")
    args: Any = next((obj[k] for k in ("arguments", "parameters", "args", "input") if k in obj), {})
    if isinstance(args, str):
        args = _loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            args = None  # unreadable, or a list where an object belongs
    elif args is None:
        args = {}
    elif not isinstance(args, dict):
        return None
    if not isinstance(name, str) or not name.strip():
        return None
    return name.strip(), args


def _cut(body: str, closed: bool) -> bool:
    """Whether a call's JSON stops where json_repair would make up the rest (and the tool be run on
    a value cut short, ``"Ber"``, or on ``{}``): right after a key, or, in a block its close tag did
    not end (``closed`` False: max_new_tokens, a stop or the end of turn came first), inside a string
    or a bracket the call opened inside itself. A call that leaves off its own closing brace, as
    small models do, and one whose close tag ends an unclosed string, are read as written."""
    scan = _JsonScan()
    level = 0  # the depth of the call object: 1, or 2 in a list of calls
    for char in body:
        scan.step(char)
        if not level and scan.depth:
            level = scan.depth + (char == "[")
        elif level and not scan.depth:
            return False  # the value closed; what follows is no part of it
    if not scan.quote and scan.depth and scan.last == ":":
        return True
    return not closed and (bool(scan.quote) or scan.depth > level)


def parse_calls(body: str, first_index: int = 0, closed: bool = True,
                names: Collection[str] | None = None, bare: bool = False) -> list[ToolCallEvent]:
    """The calls in the text of one ``<tool_call>`` block (usually one; a list is accepted),
    numbered from ``first_index``; a block that cannot be read, is cut inside a call (``_cut``;
    ``closed`` False: the answer stopped before the block's close tag), holds a call whose
    arguments are unreadable or (``names`` given) one that names no offered tool is one call with
    ``error`` set: a tagged example of a made-up tool in a reply's prose is no call to run. Each call
    says which tags were written around it (``ToolCallEvent.tags``; ``bare``: none, a JSON answer)."""
    tags: Literal["both", "open", "none"] = "none" if bare else "both" if closed else "open"
    obj = _loads(body)
    items = obj if isinstance(obj, list) and obj else [obj]
    calls = [_as_call(item) for item in items]
    error = None
    if any(c is None for c in calls):
        error = 'not a {"name": ..., "arguments": {...}} object'
    elif names is not None and (unoffered := [c[0] for c in calls if c is not None and c[0] not in names]):
        error = f"{unoffered[0]!r} is not an offered tool"
    elif _cut(body, closed):
        error = "cut off before the call's JSON ends"
    elif unreadable := [c[0] for c in calls if c is not None and c[1] is None]:
        error = f"the arguments of {unreadable[0]} are not a JSON object"
    if error is not None:  # the tool it meant, where one was named: an agent's retry message can say it
        name = calls[0][0] if len(calls) == 1 and calls[0] is not None else None
        return [ToolCallEvent(index=first_index, id=_new_id(), name=name, raw=body.strip(), error=error, tags=tags)]
    return [ToolCallEvent(index=first_index + i, id=_new_id(), name=call[0], arguments=call[1], raw=body.strip(),
                          tags=tags) for i, call in enumerate(calls) if call is not None]


def _value_end(text: str, start: int) -> int | None:
    """The end of the JSON object or list that starts at ``text[start]`` (None: it is not closed)."""
    scan = _JsonScan()
    for i in range(start, len(text)):
        scan.step(text[i])
        if not scan.depth and not scan.quote:
            return i + 1
    return None


def _next_value(text: str, start: int) -> int | None:
    """The end of the JSON object or list that starts at ``start`` after whitespace (a value cut
    short ends with the text); None where no value starts there."""
    i = len(text) - len(text[start:].lstrip())
    if text[i:i + 1] not in ("{", "["):
        return None
    end = _value_end(text, i)
    return len(text) if end is None else end


def names_offered(names: Collection[str], body: str) -> bool:
    """Whether ``body`` is a bare call (or a list of them) of tools in ``names``, as the parser reads one."""
    obj = _loads(body)
    calls = [_as_call(item) for item in (obj if isinstance(obj, list) and obj else [obj])]
    return all(c is not None and c[0] in names for c in calls)


def _complete(body: str) -> bool:
    """Whether ``body`` is one whole, strict JSON value (in a code fence or not)."""
    body = body.strip()
    if body.startswith("```"):
        body = body[body.find("\n") + 1 if "\n" in body else len(body):].removesuffix("```")
    try:
        json.loads(body)
    except json.JSONDecodeError:
        return False
    return True


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for n in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:n]):
            return n
    return 0


def coerce_arguments(arguments: Mapping[str, Any], schema: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level arguments written as a string where the tool's schema wants a number or a boolean
    (``"1234"`` for an integer: small models quote numbers) become that type when the whole string
    reads as one; everything else is left as written (a tool's own validation has the last word)."""
    properties = schema.get("properties") or {}
    fixed = dict(arguments)
    for key, value in arguments.items():
        wanted = (properties.get(key) or {}).get("type")
        if not isinstance(value, str) or wanted not in ("integer", "number", "boolean"):
            continue
        text = value.strip()
        if wanted == "boolean" and text.lower() in ("true", "false"):
            fixed[key] = text.lower() == "true"
        elif wanted == "integer" and re.fullmatch(r"[-+]?\d+", text):
            fixed[key] = int(text)
        elif wanted == "number" and re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", text):
            fixed[key] = float(text) if any(c in text for c in ".eE") else int(text)
    return fixed


class ToolCallParser:
    """Splits a streamed answer into plain text and tool calls, without leaking tool markup.

    ``feed`` takes text deltas and returns what can be released now (``str`` pieces and
    ``ToolCallEvent``s); ``close`` releases the rest. Text that may be the start of ``<tool_call>``
    is held back; an answer that *starts* with ``{``, a list of objects (``[{``) or a code fence is
    held to the end, because small models often drop the tags and answer with the bare JSON object
    or a list of them (calls only when each names an offered tool; several in a row are several
    calls, and text after them is text). A ``</tool_call>`` inside one of a call's JSON strings is
    part of its arguments, not its end (unless the string is never closed: then the answer's end
    decides). Whitespace-only text next to calls is dropped, so an answer of calls only has empty
    text, but text before calls and text after them keep one separator between them (the
    whitespace written after the calls, else the one written before them), so their sentences do
    not run together.
    """

    def __init__(self, names: Sequence[str], schemas: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        self.names = set(names)
        self.schemas = dict(schemas or {})  # tool name -> its parameters' JSON schema
        self.buffer = ""
        self.in_call = False
        self.hold_all = False
        self.started = False  # some non-whitespace text was released
        self.num_calls = 0
        self._after_call = False
        self._pending_ws = ""  # trailing whitespace, held until we know whether text follows
        self._separator = ""  # the whitespace between the text and the calls after it
        self._call = _CallBody()  # where the open call's close tag is in the buffer

    def _text(self, text: str) -> list[str | ToolCallEvent]:
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body):]
        if self._after_call:  # text after calls: one separator from the text before them, if any
            stripped = body.lstrip()
            if stripped and self.started:
                stripped = (body[:len(body) - len(stripped)] or self._separator) + stripped
            body = stripped
        if not body:
            return []
        self.started, self._after_call = True, False
        return [body]

    def feed(self, delta: str) -> list[str | ToolCallEvent]:
        out: list[str | ToolCallEvent] = []
        self.buffer += delta
        while True:
            if self.in_call:
                end = self._call.close_tag(self.buffer)
                value_end = self._call.value_end  # a next call's open tag right after the JSON: this one
                nxt = -1 if value_end is None else self.buffer.find(TOOL_CALL_OPEN, value_end)  # was left
                if nxt >= 0 and (end < 0 or nxt < end) and not self.buffer[value_end:nxt].strip():  # unclosed
                    out += self._calls(self.buffer[:value_end], closed=False)  # (CallsEnd goes on to it)
                    self.buffer, self.in_call = self.buffer[nxt:], False
                    continue
                if end < 0:
                    break
                out += self._calls(self.buffer[:end])
                self.buffer, self.in_call = self.buffer[end + len(TOOL_CALL_CLOSE):], False
                continue
            start = self.buffer.find(TOOL_CALL_OPEN)
            if start >= 0:  # a tagged call ends a held bare-JSON guess: what came before is text
                self.hold_all = False
                out += self._text(self.buffer[:start])
                self.buffer, self.in_call = self.buffer[start + len(TOOL_CALL_OPEN):], True
                self._call = _CallBody()
                continue
            if self.hold_all:
                break
            head = self.buffer.lstrip()
            if not self.started and not self.num_calls and head[:1] in ("{", "[", "`"):
                after = head[1:].lstrip()
                if head[0] != "[" or after[:1] == "{":  # a list may be a list of calls
                    self.hold_all = True
                    break
                if not after:
                    break  # "[" alone: undecided
            if not self.started and not head:
                break  # only whitespace so far: undecided
            keep = _partial_suffix(self.buffer, TOOL_CALL_OPEN)
            out += self._text(self.buffer[:len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep:]
            break
        return out

    def close(self) -> list[str | ToolCallEvent]:
        """Release everything: an unterminated call (cut by a stop string or the length limit) is
        still parsed, and reported invalid if it stops inside its arguments (``_cut``); a held
        bare-JSON answer becomes a call only if it names an offered tool."""
        out = self.feed("")
        while self.in_call and self._call.in_string and not _complete(self.buffer):
            # a string never closed (or the call was cut): its first close tag ends the call after all
            end = self._call.in_string[0]
            out += self._calls(self.buffer[:end])
            self.buffer, self.in_call = self.buffer[end + len(TOOL_CALL_CLOSE):], False
            out += self.feed("")
        rest, self.buffer = self.buffer, ""
        if self.in_call:
            out += self._calls(rest, closed=False)
        elif self.hold_all:
            out += self._bare(rest)
        elif rest:
            out += self._text(rest)
        if not self.num_calls and self.started and self._pending_ws:
            out.append(self._pending_ws)  # trailing whitespace of a plain answer is kept
        return out

    def _names_offered(self, body: str) -> bool:
        return names_offered(self.names, body)

    def _bare(self, rest: str) -> list[str | ToolCallEvent]:
        """A held answer that starts with JSON: each value in a row (bare or in a code fence) that
        names an offered tool is a call (a list: each of its items); what follows the last call, or
        the whole answer if the first value is none, is text."""
        bodies: list[str] = []
        start = 0
        while True:
            i = len(rest) - len(rest[start:].lstrip())
            fenced = rest.startswith("```", i)
            j = (rest.find("\n", i) + 1 or len(rest)) if fenced else i  # past the fence's ```json line
            found: list[str] = []
            while (end := _next_value(rest, j)) is not None and self._names_offered(rest[j:end]):
                found.append(rest[j:end].strip())
                j = end
                if not fenced:
                    break
            if not found:
                break
            if fenced and rest.startswith("```", k := len(rest) - len(rest[j:].lstrip())):
                j = k + 3
            bodies, start = bodies + found, j
        if not bodies:
            return self._text(rest)
        out: list[str | ToolCallEvent] = []
        for body in bodies:
            out += self._calls(body, closed=False, bare=True)  # no tag: only a value that closes is whole
        return out + self._text(rest[start:])

    def _calls(self, body: str, closed: bool = True, bare: bool = False) -> list[ToolCallEvent]:
        calls = [call.model_copy(update={"arguments": coerce_arguments(call.arguments, self.schemas[call.name])})
                 if call.name in self.schemas and call.arguments else call
                 for call in parse_calls(body, self.num_calls, closed, self.names, bare)]
        self.num_calls += len(calls)
        if not self._after_call:
            self._separator = self._pending_ws
        self._pending_ws, self._after_call = "", True
        return list(calls)


ANSWER_CUT = "the answer was cut by max_tokens before its JSON ended"
"""Why a structured answer the engine found invalid (``format_error``) failed where it ended at its length
cap (finish "length"), as both adapters say it: it names ``max_tokens``, the user's remedy, where "not
valid JSON" alone read as the members' fault."""


def format_error(text: str, response_format: ResponseFormat) -> str | None:
    """Why ``text`` is not the JSON ``response_format`` asks for (None: it is)."""
    body = text.strip()
    try:
        value = json.loads(body)
    except json.JSONDecodeError as err:
        # some of json's messages end in "at" ("Unterminated string starting at"): not "at at character 6"
        return f"not valid JSON ({err.msg.removesuffix(' at')} at character {err.pos})"
    if not isinstance(value, dict):
        return f"a JSON {type(value).__name__}, not an object"
    spec = response_format.json_schema  # json_object may carry one too: checked, not shown to the members
    if spec is not None and spec.json_schema:
        return schema_error(value, spec.json_schema)
    return None


def call_error(calls: Sequence[ToolCallEvent], schemas: Mapping[str, Mapping[str, Any]],
               only: str | None = None, unreadable: bool = False) -> str | None:
    """Why a call's arguments do not match its tool's parameter schema (None: each call's do; a call
    that could not be read says so itself, ``ToolCallEvent.error``), or (``only``: the tool a request
    named) why a call of another tool is not the one asked for. Every call of a forced answer is
    checked. The arguments are shown: a retry's prompt holds no rejected call (``AnswerShaper.text``
    is the answer's text only)."""
    for call in calls:
        if only is not None and call.name is not None and call.name != only:
            return f"{call.name} was called, but only {only} may be called"
        if unreadable and call.error is not None:  # a forced answer's free calls (after the first) are
            return f"a call could not be read: {call.error}"  # decoded unconstrained: junk is retried
        if call.name is None or call.arguments is None or call.name not in schemas:
            continue
        problem = schema_error(call.arguments, schemas[call.name] or {"type": "object"})
        if problem is not None:
            return f"the arguments of {call.name}, {json.dumps(call.arguments, ensure_ascii=False)}: {problem}"
    return None


def _root_not_object(schema: Mapping[str, Any]) -> str | None:
    """What a schema's root is where it can be no object (None: it can): such an answer is refused,
    as OpenAI's structured outputs refuse it, since the answer is prefilled with ``{``."""
    kind = schema.get("type")
    if isinstance(kind, str) and kind != "object" or isinstance(kind, list) and "object" not in kind:
        return f"type {kind!r}"
    if isinstance(schema.get("enum"), list) and not any(isinstance(v, dict) for v in schema["enum"]):
        return f"enum {schema['enum']!r}"
    if "const" in schema and not isinstance(schema["const"], dict):
        return f"const {schema['const']!r}"
    return None


# -- one request's plan and answer shaping ----------------------------------------------------------

class OutputPlan:
    """What ``OutputOptions`` mean for one request: extra turns, prefill, stops, and how the
    engine's raw events are shaped into the answer the caller sees (``AnswerShaper``)."""

    def __init__(self, options: OutputOptions) -> None:
        tools = [t.model_dump(exclude_none=True) for t in options.tools or []]
        self.names = [t["function"]["name"] for t in tools]
        if len(set(self.names)) != len(self.names):
            raise InvalidRequestError(f"tool names must be unique, got {self.names}")
        fmt = options.response_format
        self.response_format = fmt if fmt is not None and fmt.type != "text" else None
        schema = fmt.json_schema.json_schema if self.response_format and fmt and fmt.json_schema else {}
        if (root := _root_not_object(schema)) is not None:
            raise InvalidRequestError(
                f"response_format's schema must have an object at its root (as OpenAI's structured outputs "
                f"require), not {root}: wrap the value in an object, e.g. {{\"type\": \"object\", \"properties\": "
                f"{{\"items\": <the schema>}}, \"required\": [\"items\"]}}")
        self.raw_prompt = options.raw_prompt
        if self.raw_prompt and (tools or self.response_format or options.tool_result_hint):
            raise InvalidRequestError("a raw prompt takes no tools, response_format or tool_result_hint: "
                                      "they are rendered as turns of a conversation; send messages instead")
        choice = plain_tool_choice(options.tool_choice)
        if not tools and choice not in (None, False, "none", "auto"):  # as OpenAI (and the server) say
            raise InvalidRequestError("tool_choice is only allowed when tools are specified (it asks for a call "
                                      f"but no tool is offered: {options.tool_choice!r})")
        if self.response_format is not None and tools and choice not in (None, "none", "auto"):
            raise InvalidRequestError("a forced tool call and a JSON response_format cannot be combined")
        self.forced = forced_tool(choice, self.names) if tools else None
        self.tools = tools if tools and choice != "none" else None
        self.schemas = {t["function"]["name"]: t["function"].get("parameters") or {} for t in self.tools or []}
        """Each offered tool's parameter schema: what a forced call is constrained to and what parsed
        arguments are typed by."""
        # no "{" beside offered tools: it would shut out a <tool_call> (an agent's tools plus its
        # answer schema); the answer is then validated only, and a call is no JSON answer to check
        self.prefix = options.prefix or call_prefix(self.forced) or (
            "{" if self.response_format and not self.tools else "")
        self._own_prefix = bool(options.prefix)
        self.tool_result_hint = options.tool_result_hint if tools else None
        self.one_call = bool(self.tools and options.parallel_tool_calls is False)
        """The answer holds one call at most: generation stops after it, what follows is dropped."""
        self.calls_only = bool(self.forced and self.tools)
        """A forced answer: calls only, text after them is neither generated on nor shown (``CallsEnd``)."""
        self.stops: list[str] = [CallEnd(self.prefix)] if self.one_call else \
            [CallsEnd(self.prefix)] if self.calls_only else []
        if self.response_format is not None:  # unconstrained under AdaFuse, beside tools, or for an odd schema
            is_call = partial(names_offered, frozenset(self.names)) if self.tools else None
            self.stops.append(JsonEnd(self.prefix, is_call))

    def constraint(self) -> JsonPrefix | None:
        """The decoding constraint after the prefix: of a JSON answer, or of a forced call's name
        and arguments. None when there is nothing to constrain (no response_format and no forced
        call; a response_format with tools offered; a prefix of the caller's own) or it cannot be
        constrained (the parser does not take the schema, the prefix is no JSON start): then the
        answer is only validated (and a JSON one retried)."""
        fmt = self.response_format
        if fmt is None:
            if not self.forced or not self.tools or self._own_prefix:
                return None
            state = call_start_state(self.schemas, self.forced)
            return state if self.one_call else free_after_call(state)  # further calls may follow
        if self.tools:
            return None
        schema = fmt.json_schema.json_schema if fmt.json_schema is not None else None
        return start_state(schema or None, self.prefix)

    def answer_only(self) -> OutputPlan:
        """The plan of a structured-output retry beside offered tools: the first attempt, free to call
        a tool, wrote neither a call nor the JSON asked for (a small model copied the schema itself, at
        every try), so the retry answers in JSON, prefilled and decoded under the schema like a request
        without tools. Any other plan retries as itself."""
        if not self.tools or self.response_format is None:
            return self
        plan = copy.copy(self)
        plan.tools, plan.schemas, plan.one_call, plan.calls_only = None, {}, False, False
        plan.prefix = self.prefix if self._own_prefix else "{"
        plan.stops = [JsonEnd(plan.prefix)]  # AdaFuse decodes the retry unconstrained too
        return plan

    @property
    def checked(self) -> bool:
        """Whether the answer is validated (and retried, held until then): a JSON answer, or a forced
        call, whose arguments are checked against the tool's parameter schema as a JSON answer is
        against its own (``call_error``): the constraint leaves ``minimum``, ``format``, ... unchecked,
        and a forced call with arguments out of range was returned as valid, never retried."""
        return self.response_format is not None or bool(self.forced and self.tools)

    @property
    def attempts(self) -> int:
        return FORMAT_ATTEMPTS if self.checked else 1

    def messages(self, messages: list[dict[str, Any]], earlier: Sequence[tuple[str, str]] = ()) -> list[dict[str, Any]]:
        """The conversation one attempt sees: tool history as text, the format instruction, a
        forced call's instruction, the tool-result hint, and the rejected earlier answers with what
        was wrong."""
        out = tool_history_as_text(messages)
        if self.tool_result_hint and messages and messages[-1].get("role") == "tool":
            out.append({"role": "user", "content": self.tool_result_hint})
        if self.response_format is not None:
            instruction = format_instruction(self.response_format, tools=bool(self.tools))
            if self.tools and not (messages and messages[-1].get("role") == "tool"):
                # before the conversation: as its last turn it overrode the tools (the members answered
                # in JSON at once, never calling one); after a tool result it asks for the final answer
                out.insert(next((i for i, m in enumerate(out) if m.get("role") != "system"), len(out)), instruction)
            else:
                out.append(instruction)
            for answer, problem in earlier:
                out += [{"role": "assistant", "content": answer},
                        {"role": "user", "content": f"That is not valid: {problem}. Reply with the corrected "
                                                    "JSON object only."}]
        if self.forced:
            for answer, problem in earlier if self.response_format is None else ():  # a rejected call
                out += [{"role": "assistant", "content": answer}] if answer.strip() else []
                out.append({"role": "user", "content": f"That call is not valid: {problem}. Call the function "
                                                       "again with corrected arguments."})
            out.append(forced_instruction(self.forced, self.names))
        return out

    def shaper(self) -> AnswerShaper:
        return AnswerShaper(self)


class AnswerShaper:
    """Raw engine events of one attempt -> the events the caller sees.

    Prepends the prefix (a ``token`` event with ``source="prefix"``), routes text through the
    tool-call parser when tools are offered (text as ``token`` events, calls as ``tool_call``
    events), holds a structured-output answer's events (text, calls and the decisions behind them)
    until ``finish`` decides whether it is valid (an answer that calls a tool is not checked as JSON;
    a rejected answer's events never reach the caller), and completes the ``finish``
    event (text, tool calls, format error). Text the parser holds back as a possible tag's start goes
    out with the token that shows it is text (the next one, or the last at the end): its position can
    lie one token late (the engine's own held stop-string text keeps each token's place, state.py)."""

    def __init__(self, plan: OutputPlan) -> None:
        self.plan = plan
        self.parser = ToolCallParser(plan.names, plan.schemas) if plan.tools else None
        self.text = ""  # what the caller has been (or, when held, will be) shown
        self.calls: list[ToolCallEvent] = []
        self.held: list[Event] = []
        self.format_error: str | None = None
        self._prefix_pending = bool(plan.prefix)
        self._last: TokenEvent | None = None  # the answer's last token: what the parser still holds came from it

    def on_event(self, event: Event) -> list[Event]:
        out: list[Event] = []
        if self._prefix_pending:
            self._prefix_pending = False
            out += self._text(TokenEvent(text=self.plan.prefix, source="prefix", position=0))
        if event.type == "token":
            out += self._text(event)
        elif event.type == "finish":
            if self.parser is not None:  # the text it held back (a possible tag's start) is the last token's
                last = self._last or TokenEvent(text="", source="draft", position=0)
                out += self._pieces(self.parser.close(), last)
            if self.plan.response_format is not None and not self.calls:  # an answer that calls a tool
                self.format_error = format_error(self.text, self.plan.response_format)  # is no JSON answer
            elif self.plan.response_format is None and self.plan.checked:
                only = self.plan.forced if self.plan.forced != "any" else None
                self.format_error = call_error(self.calls, self.plan.schemas, only,
                                               unreadable=event.reason != "length")  # a cut call: no retry
            out.append(event.model_copy(update={"text": self.text, "tool_calls": self.calls,
                                                "format_error": self.format_error}))
        else:
            out.append(event)
        if not self.plan.checked:
            return out
        # everything but finish is released by release() once the attempt is accepted, in its order: a
        # rejected attempt's call must not reach the caller (it would be run, and the retry call again),
        # nor its decisions (each attempt numbers its positions from 0: they overlapped the accepted
        # answer's, and outnumbered its stats' ensembled_tokens)
        self.held += [e for e in out if e.type != "finish"]
        return [e for e in out if e.type == "finish"]

    def release(self) -> list[Event]:
        """The held events of a structured-output attempt (after its ``finish`` was decided): its text,
        calls and decisions (``draft``/``verify``/``ensemble``/``adafuse``/``cache_sync``), as they came."""
        held, self.held = self.held, []
        return held

    def _text(self, token: TokenEvent) -> list[Event]:
        if self.parser is None:
            self.text += token.text
            return [token]
        self._last = token
        return self._pieces(self.parser.feed(token.text), token)

    def _pieces(self, pieces: list[str | ToolCallEvent], token: TokenEvent) -> list[Event]:
        out: list[Event] = []
        for piece in pieces:
            if self.calls and self.plan.one_call:
                break  # one call asked for; what follows it was written past a close tag that was no stop
            if isinstance(piece, str) and self.calls and self.plan.calls_only:
                continue  # text after a forced call is no answer (``CallsEnd`` stops at it)
            if isinstance(piece, str):
                if piece:
                    self.text += piece
                    out.append(TokenEvent(text=piece, source=token.source, position=token.position))
            else:
                self.calls.append(piece)
                out.append(piece)
        return out
