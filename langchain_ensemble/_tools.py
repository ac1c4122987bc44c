"""Tool calling through the prompt: tool specs rendered as text, tool calls parsed back out.

Why: the ensemble has no provider-side tool API, and its members read one shared conversation
through their own chat templates. The one format every member can be given is text, so tools
are rendered into the system message in the Qwen2.5 / Hermes format (for Qwen this is,
word for word, what its native template renders with ``tools=``)::

    # Tools

    You may call one or more functions to assist with the user query.

    You are provided with function signatures within <tools></tools> XML tags:
    <tools>
    {"type": "function", "function": {"name": ..., "description": ..., "parameters": {...}}}
    </tools>

    For each function call, return a json object with function name and arguments within
    <tool_call></tool_call> XML tags:
    <tool_call>
    {"name": <function-name>, "arguments": <args-json-object>}
    </tool_call>

Earlier tool calls are written back into assistant turns in that same ``<tool_call>`` syntax and
tool results become a user turn of ``<tool_response>...</tool_response>`` blocks (again what
Qwen's own template does).

Members whose chat template renders ``tools=`` (Qwen2.5) get their native rendering, including
their own default system prompt, which matters for a 0.5B model; the others (SmolLM2, base
models) get the block above in the system message.

Forcing a call (``tool_choice="any"``, "required", True or a tool name) adds a closing system
turn ("Answer with a call to ...") and *prefills* the answer with ``<tool_call>\\n{"name": "``
(plus the name and ``", "arguments":`` when it is known), so a small model only has to write
the arguments; generation stops at ``</tool_call>`` (one call). The engine has neither a
``tools`` nor a prefill option yet, so :class:`ToolPromptMember` does both around each
member's prompt rendering.

Parsing is lenient (code fences, trailing text, arguments as a JSON string, truncated JSON, and
a bare ``{"name": ..., "arguments": ...}`` answer that names a bound tool), and a call that
cannot be parsed is reported as an ``invalid_tool_call`` rather than raised. Limits, honestly:
nothing constrains the decoding, so a 0.5B model may still pick a tool that does not exist
(with "any" and several tools), echo schema keys as arguments, or call the same tool again
after its result; in ``auto`` mode a verifier without tool training (SmolLM2) can outvote the
drafter's call (``weights`` that favour the tool-trained member help).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.utils.json import parse_partial_json

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
DEFAULT_SYSTEM = "You are a helpful assistant."
"""System text put before the tools block when the conversation has no system message."""

_TOOLS_HEADER = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n")
_TOOLS_FOOTER = (
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments "
    "within <tool_call></tool_call> XML tags:\n<tool_call>\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
_FENCE = re.compile(r"^```(?:json)?\s*(.*?)\s*(?:```)?$", re.DOTALL)


def tools_system_prompt(tools: Sequence[dict[str, Any]]) -> str:
    """The tools block of the documented format (appended to the system message)."""
    return _TOOLS_HEADER + "\n".join(json.dumps(t, ensure_ascii=False) for t in tools) + _TOOLS_FOOTER


def forced_instruction(forced: str, tools: Sequence[dict[str, Any]]) -> dict[str, str]:
    """A closing system turn for a forced call: after the question, where a small model heeds it."""
    if forced == "any":
        names = ", ".join(tool_names(tools))
        return {"role": "system", "content": f"Answer with a call to one of these functions: {names}."}
    return {"role": "system", "content": f"Answer with a call to the function {forced}."}


def tool_names(tools: Sequence[dict[str, Any]]) -> list[str]:
    return [t["function"]["name"] for t in tools]


def forced_tool(tool_choice: Any, tools: Sequence[dict[str, Any]]) -> str | None:
    """Normalise LangChain's ``tool_choice`` to None (model decides), "any", or one tool name."""
    names = tool_names(tools)
    if tool_choice in (None, False, "auto", "none"):
        return None
    if tool_choice in (True, "any", "required"):
        return names[0] if len(names) == 1 else "any"
    if isinstance(tool_choice, dict):  # OpenAI style {"type": "function", "function": {"name": ...}}
        tool_choice = (tool_choice.get("function") or {}).get("name") or tool_choice.get("name")
    if isinstance(tool_choice, str) and tool_choice in names:
        return tool_choice
    raise ValueError(f"tool_choice {tool_choice!r} is not 'auto', 'none', 'any' or one of the bound "
                     f"tools {names}")


def call_prefix(forced: str | None) -> str:
    """Answer prefill that makes the model write a tool call (empty when nothing is forced).

    Ends before the space that follows a colon: BPE vocabularies attach that space to the next
    token, so the model continues at a natural token boundary.
    """
    if forced is None:
        return ""
    if forced == "any":
        return TOOL_CALL_OPEN + '\n{"name": "'
    return TOOL_CALL_OPEN + "\n" + json.dumps({"name": forced}, ensure_ascii=False)[:-1] + ', "arguments":'


def render_tool_call(name: str, args: dict[str, Any]) -> str:
    """An earlier tool call, written the way the model is asked to write one."""
    body = json.dumps({"name": name, "arguments": args}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def render_tool_results(contents: Sequence[str]) -> str:
    """One user turn holding the results of consecutive tool messages."""
    return "\n".join(f"<tool_response>\n{c}\n</tool_response>" for c in contents)


@dataclass(frozen=True)
class ParsedCall:
    """A tool call found in the answer; ``args`` is a JSON string (what ``tool_call_chunks`` carry).

    ``name`` is None and ``args`` the raw text when the call could not be parsed: LangChain then
    reports it in ``invalid_tool_calls`` instead of failing the whole answer.
    """

    name: str | None
    args: str
    id: str


def _new_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _loads_lenient(text: str) -> Any:
    """JSON from a small model: code fences, trailing junk and truncation are tolerated."""
    text = text.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[start:])[0]  # ignores anything after the object
    except json.JSONDecodeError:
        pass
    try:
        return parse_partial_json(text[start:])  # closes a truncated object
    except (json.JSONDecodeError, ValueError):
        return None


def _as_call(obj: Any) -> tuple[str, dict[str, Any]] | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # OpenAI-style {"function": {"name", "arguments"}}
        obj = obj["function"]
    name = obj.get("name")
    args: Any = next((obj[k] for k in ("arguments", "parameters", "args") if k in obj), {})
    if isinstance(args, str):
        args = _loads_lenient(args) if args.strip() else {}
    if args is None:
        args = {}
    if not isinstance(name, str) or not name or not isinstance(args, dict):
        return None
    return name, args


def parse_calls(body: str) -> list[ParsedCall]:
    """Tool calls in the text of one ``<tool_call>`` block (usually one; a list is accepted)."""
    obj = _loads_lenient(body)
    items = obj if isinstance(obj, list) and obj else [obj]
    calls = [call for item in items if (call := _as_call(item)) is not None]
    if len(calls) < len(items):
        return [ParsedCall(name=None, args=body.strip(), id=_new_id())]
    return [ParsedCall(name=n, args=json.dumps(a, ensure_ascii=False), id=_new_id()) for n, a in calls]


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``token``."""
    for n in range(min(len(token) - 1, len(text)), 0, -1):
        if text.endswith(token[:n]):
            return n
    return 0


class ToolCallStreamParser:
    """Splits a streamed answer into plain text and tool calls, without leaking tool markup.

    ``feed`` takes text deltas and returns what can be released now (``str`` pieces and
    ``ParsedCall``s); ``close`` releases the rest. Text that may be the start of
    ``<tool_call>`` is held back; an answer that *starts* with ``{`` or a code fence is held
    to the end, because small models often drop the tags and answer with the bare JSON
    object (accepted as a call only when its name is a bound tool). Whitespace next to tool
    calls is dropped so the content is empty when the answer is only calls.
    """

    def __init__(self, names: Sequence[str], prefix: str = "") -> None:
        self.names = set(names)
        self.buffer = ""
        self.in_call = False
        self.hold_all = False
        self.started = False  # some non-whitespace text was released
        self.num_calls = 0
        self._after_call = False
        self._pending_ws = ""  # trailing whitespace, held until we know whether text follows
        self._prefix_out: list[str | ParsedCall] = []
        self._prefix_out = self.feed(prefix) if prefix else []

    def _text(self, text: str) -> list[str | ParsedCall]:
        text = self._pending_ws + text
        body = text.rstrip()
        self._pending_ws = text[len(body):]
        if self._after_call:
            body = body.lstrip()
        if not body:
            return []
        self.started, self._after_call = True, False
        return [body]

    def feed(self, delta: str) -> list[str | ParsedCall]:
        out, self._prefix_out = self._prefix_out, []
        self.buffer += delta
        while True:
            if self.in_call:
                end = self.buffer.find(TOOL_CALL_CLOSE)
                if end < 0:
                    break
                out += self._calls(self.buffer[:end])
                self.buffer, self.in_call = self.buffer[end + len(TOOL_CALL_CLOSE):], False
                continue
            if self.hold_all:
                break
            start = self.buffer.find(TOOL_CALL_OPEN)
            if start >= 0:
                out += self._text(self.buffer[:start])
                self._pending_ws = ""
                self.buffer, self.in_call = self.buffer[start + len(TOOL_CALL_OPEN):], True
                continue
            head = self.buffer.lstrip()
            if not self.started and not self.num_calls and head[:1] in ("{", "`"):
                self.hold_all = True
                break
            if not self.started and not head:
                break  # only whitespace so far: undecided
            keep = _partial_suffix(self.buffer, TOOL_CALL_OPEN)
            out += self._text(self.buffer[:len(self.buffer) - keep])
            self.buffer = self.buffer[len(self.buffer) - keep:]
            break
        return out

    def close(self) -> list[str | ParsedCall]:
        """Release everything: an unterminated call (cut by a stop string or the length limit)
        is still parsed; a held bare-JSON answer becomes a call only if it names a bound tool."""
        out = self.feed("")
        rest, self.buffer = self.buffer, ""
        if self.in_call:
            out += self._calls(rest)
        elif self.hold_all:
            obj = _loads_lenient(rest)
            calls = [_as_call(item) for item in (obj if isinstance(obj, list) and obj else [obj])]
            if all(c is not None and c[0] in self.names for c in calls):
                out += self._calls(rest)
            else:
                out += self._text(rest)
        elif rest:
            out += self._text(rest)
        if not self.num_calls and self.started and self._pending_ws:
            out.append(self._pending_ws)  # trailing whitespace of a plain answer is kept
        return out

    def _calls(self, body: str) -> list[ParsedCall]:
        calls = parse_calls(body)
        self.num_calls += len(calls)
        self._pending_ws, self._after_call = "", True
        return calls


def with_tools_system(messages: Sequence[Mapping[str, Any]], tools: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The documented format: the tools block appended to the system message (one is added)."""
    out = [dict(m) for m in messages]
    block = tools_system_prompt(tools)
    if out and out[0]["role"] == "system":
        out[0]["content"] = f"{out[0]['content']}\n\n{block}"
    else:
        out.insert(0, {"role": "system", "content": f"{DEFAULT_SYSTEM}\n\n{block}"})
    return out


def native_tools(tokenizer: Any) -> bool:
    """Whether a member's chat template renders ``tools=`` itself (Qwen2.5 does, SmolLM2 does not)."""
    template = getattr(tokenizer, "chat_template", None)
    return isinstance(template, str) and "tools" in template


class ToolPromptMember:
    """An engine member that sees the bound tools, and whose prompt ends with ``prefix``.

    Tools go through the member's own chat template where it supports them, else through the
    documented system-message format; ``prefix`` (the start of a forced tool call) is appended
    after the generation prompt. Everything else is delegated to the shared, already loaded
    member, so weights and token tables are not copied. A workaround until the engine's
    ``astream`` accepts ``tools`` and an answer prefix itself.
    """

    def __init__(self, member: Any, tools: Sequence[dict[str, Any]] | None, forced: str | None,
                 prefix: str) -> None:
        self._member = member
        self._tools = list(tools or [])
        self._forced = forced
        self._prefix_ids = list(member.table.encode_fragment(prefix)) if prefix else []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._member, name)

    def prompt_ids(self, messages: Sequence[Mapping[str, Any]]) -> list[int]:
        tokenizer = getattr(self._member, "tokenizer", None)
        if self._forced and self._tools:
            messages = [*messages, forced_instruction(self._forced, self._tools)]
        if not self._tools:
            ids = list(self._member.prompt_ids(messages))
        elif tokenizer is not None and native_tools(tokenizer):
            text = tokenizer.apply_chat_template([dict(m) for m in messages], tools=self._tools,
                                                 tokenize=False, add_generation_prompt=True)
            bos = tokenizer.bos_token  # as the engine's render_prompt_ids: no second BOS
            ids = list(tokenizer(text, add_special_tokens=not (bos and text.startswith(bos)))["input_ids"])
        else:
            ids = list(self._member.prompt_ids(with_tools_system(messages, self._tools)))
        return ids + self._prefix_ids
