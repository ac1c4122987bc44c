"""Tool calling as text: the engine takes plain chat messages, so tools travel inside the prompt.

Format (the one Qwen2.5 was trained on, also known as Hermes style): the tool specs are rendered into
the system message, and the model answers with

    <tool_call>
    {"name": "multiply", "arguments": {"a": 6, "b": 7}}
    </tool_call>

Parsing is lenient because small models are sloppy: a missing ``</tool_call>`` at the end of the
answer, code fences, ``"parameters"``/``"args"`` instead of ``"arguments"``, arguments given as a
JSON string, single quotes, unquoted keys, and (only when no ``<tool_call>`` tag was written at
all) a bare or fenced JSON object whose ``name`` is one of the offered tools -- what
Qwen2.5-Coder-0.5B actually writes. Tagged blocks that still cannot be read are reported as
invalid rather than guessed at.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel

OPEN, CLOSE = "<tool_call>", "</tool_call>"
DEFAULT_SYSTEM = "You are a helpful assistant."
DEFAULT_TOOL_RESULT_HINT = "Using the function result above, answer my original question in plain text."

FENCE = "```"
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_BARE_KEY = re.compile(r'([{,]\s*)([A-Za-z_][A-Za-z0-9_]*)\s*:')
_LINE_JSON = re.compile(r"(?:^|\n)[ \t]*([{\[])")
_ARGUMENT_KEYS = ("arguments", "parameters", "args", "input", "kwargs")


class ParsedCall(BaseModel):
    """One tool call read from the answer text."""

    name: str
    arguments: dict[str, Any]


def tools_system_prompt(specs: Sequence[Mapping[str, Any]], system: str | None = None,
                        tool_choice: str | None = None, required: bool = False) -> str:
    """The system message that offers ``specs`` (OpenAI tool dicts), in Qwen2.5's own wording."""
    lines = "\n".join(json.dumps(spec, ensure_ascii=False) for spec in specs)
    text = (
        f"{system or DEFAULT_SYSTEM}\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>')
    if tool_choice:
        text += f"\n\nCall the function {tool_choice} now."
    elif required:
        text += "\n\nYou must call one of these functions now."
    return text


def tool_call_text(name: str, arguments: Mapping[str, Any] | str) -> str:
    """How an earlier assistant tool call is written back into the conversation."""
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return f'{OPEN}\n{{"name": {json.dumps(name)}, "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n{CLOSE}'


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that could still grow into ``marker``."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def streamable_text(raw: str) -> str:
    """The part of a tool-enabled answer that may stream now; grows monotonically with ``raw``.

    Everything from the first ``<tool_call>``, code fence, or ``{``/``[`` opening a line is held
    back until the answer is complete, because it may be a tool call (small models often write bare
    or fenced JSON instead of the tags); a trailing partial ``<tool_call`` or fence is held too.
    ``parse_tool_calls`` then settles the final text, which always starts with what was streamed.
    """
    hold = len(raw)
    for marker in (OPEN, FENCE):
        found = raw.find(marker)
        hold = min(hold, found if found >= 0 else len(raw) - _partial_suffix(raw, marker))
    if line := _LINE_JSON.search(raw):
        hold = min(hold, line.start(1))
    return raw[:hold]


def visible_text(raw: str) -> str:
    """``raw`` without its ``<tool_call>`` blocks (an unclosed last block counts as a block)."""
    parts: list[str] = []
    start = 0
    while True:
        begin = raw.find(OPEN, start)
        if begin < 0:
            parts.append(raw[start:])
            return "".join(parts)
        parts.append(raw[start:begin])
        end = raw.find(CLOSE, begin)
        if end < 0:
            return "".join(parts)
        start = end + len(CLOSE)


def _load_object(text: str) -> Any:
    """The first JSON (or Python-literal) object in ``text``; None when there is none."""
    text = text.strip()
    if fenced := _FENCE.search(text):
        text = fenced.group(1).strip()
    begin = text.find("{")
    if begin < 0:
        return None
    try:
        return json.JSONDecoder().raw_decode(text[begin:])[0]
    except ValueError:
        pass
    end = text.rfind("}")
    body = text[begin:end + 1]
    try:  # single quotes, True/False/None: small models write Python dicts
        return ast.literal_eval(body)
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        pass
    try:  # unquoted keys, JavaScript style: {name: "City", arguments: {...}}
        return json.JSONDecoder().raw_decode(_BARE_KEY.sub(r'\1"\2":', body))[0]
    except ValueError:
        return None


def _to_call(payload: Any) -> ParsedCall | None:
    """A call from ``{"name": ..., "arguments": {...}}`` (or the OpenAI ``function`` wrapper)."""
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("function"), dict):
        payload = payload["function"]
    name = payload.get("name")
    if not isinstance(name, str) or not name.strip():
        return None
    arguments: Any = next((payload[k] for k in _ARGUMENT_KEYS if k in payload), {})
    if isinstance(arguments, str):
        arguments = _load_object(arguments) if arguments.strip() else {}
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        return None
    return ParsedCall(name=name.strip(), arguments=arguments)


def parse_tool_calls(raw: str, tool_names: Iterable[str] = ()) -> tuple[str, list[ParsedCall], list[str]]:
    """Split a finished answer into (visible text, tool calls, unreadable tool-call blocks)."""
    calls: list[ParsedCall] = []
    invalid: list[str] = []
    if OPEN in raw:
        for chunk in raw.split(OPEN)[1:]:
            body = chunk.split(CLOSE, 1)[0]
            call = _to_call(_load_object(body))
            if call is None:
                invalid.append(body.strip())
            else:
                calls.append(call)
        return visible_text(raw), calls, invalid
    names = set(tool_names)
    if not names:
        return raw, calls, invalid
    # No tags at all: accept fenced JSON blocks, else the rest of the answer from a line opening with
    # "{" or "[", when that JSON names an offered tool. Only the JSON is removed from the text, so the
    # final text still starts with what was streamed (see streamable_text).
    candidates = [(m.group(0), m.group(1).strip()) for m in _FENCE.finditer(raw)]
    if not candidates and (line := _LINE_JSON.search(raw)):
        candidates = [(raw[line.start(1):], raw[line.start(1):].strip())]
    text = raw
    for whole, body in candidates:
        if not body.startswith(("{", "[")):
            continue
        try:
            payload = json.loads(body)
        except ValueError:
            payload = _load_object(body)
        found = [c for item in (payload if isinstance(payload, list) else [payload])
                 if (c := _to_call(item)) is not None and c.name in names]
        if found:
            calls.extend(found)
            text = text.replace(whole, "", 1)
    return text, calls, invalid
