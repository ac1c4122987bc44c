"""Where the calls of a tool-call answer end, read as the answer is written (``tools.py`` plans them).

``CallEnd``: the stop of an answer of one call (``parallel_tool_calls=False``): the ``</tool_call>``
that closes its first call. ``CallsEnd``: the stop of a forced answer (``tool_choice`` "required" or a
tool's name) that may hold several calls, as OpenAI's does when parallel calls are allowed: the
answer goes on while further ``<tool_call>`` blocks follow, and ends where anything else would
(text after a forced call is no answer: the request asked for calls). ``free_after_call``: the
decoding constraint of such an answer, the forced first call's, then no constraint, so the
answer can go on past the call's closing brace (the plain constraint ended the answer there).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .json_constraint import JsonPrefix

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FENCE = "```"


class _JsonScan:
    """Where a JSON value's strings and brackets are, character by character, as a small model
    writes them: a string opens with ``"`` or ``'`` (a Python dict) where JSON puts one (after
    ``{``, ``[``, ``,`` or ``:``), ends at the same quote, and a backslash escapes."""

    def __init__(self) -> None:
        self.depth = 0
        self.quote = ""  # the quote of the string we are in, "" outside strings
        self.escaped = False
        self.last = ""  # the last non-whitespace character outside strings

    def step(self, char: str) -> None:
        if self.quote:
            if self.escaped:
                self.escaped = False
            elif char == "\\":
                self.escaped = True
            elif char == self.quote:
                self.quote, self.last = "", char
            return
        if char in "\"'" and self.depth and self.last in ("{", "[", ",", ":"):
            self.quote = char
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth = max(self.depth - 1, 0)
        if not char.isspace():
            self.last = char


class _CallBody:
    """Where an open call's close tag is, read as the call's text grows: ``</tool_call>`` outside
    the call's JSON strings. A close tag inside one (code that prints it) is part of the arguments,
    not the end."""

    def __init__(self, start: int = 0) -> None:
        self.scan = _JsonScan()  # the call's strings, up to pos
        self.pos = start  # where the call's text starts, then how far it has been read
        self.in_string: list[int] = []  # where close tags inside the call's strings start
        self.value_end: int | None = None  # where the call's JSON value closed (None: not yet)

    def close_tag(self, text: str) -> int:
        """Where the close tag starts in ``text`` (the same text each time, grown; -1: not yet)."""
        scan, close = self.scan, TOOL_CALL_CLOSE
        while (i := self.pos) < len(text):
            if text[i] == "<":
                if text.startswith(close, i):
                    if not scan.quote:
                        return i
                    self.in_string.append(i)
                    for char in close:
                        scan.step(char)
                    self.pos += len(close)
                    continue
                if len(text) - i < len(close) and close.startswith(text[i:]):
                    return -1  # maybe the start of a close tag: wait for more
            opened = bool(scan.depth)
            scan.step(text[i])
            self.pos += 1
            if opened and not scan.depth and self.value_end is None:
                self.value_end = self.pos
        return -1


class CallEnd(str):
    """The stop string of an answer of one call: ``</tool_call>`` where it ends the answer's first
    call as ``ToolCallParser`` reads it (``_CallBody``), on a line of its own or right after the JSON
    as Qwen writes it; never the tag inside one of the call's JSON strings (a plain stop string cut
    such an argument, and one at a line start did not stop an inline tag: the answer ran on to its
    end). Generation stops after it, so nothing the answer would drop is written; unlike other
    stop strings the tag stays in the answer (``CallEndFinder.find``). ``prefix``: the answer's
    prefill, which the engine's text does not hold (a forced call's opens the call)."""

    prefix: str

    def __new__(cls, prefix: str = "") -> CallEnd:
        end = super().__new__(cls, TOOL_CALL_CLOSE)
        end.prefix = prefix
        return end

    def __getnewargs__(self) -> tuple[str]:
        return (self.prefix,)  # a copy or pickle is made from the prefix (str's own: the tag, read as one)

    def finder(self) -> CallEndFinder:
        """A search of one answer for this stop (``RequestState`` keeps one per request)."""
        return CallEndFinder(self.prefix)


class CallEndFinder:
    """Where one answer's ``CallEnd`` is: its first ``<tool_call>``, then that call's close tag."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.pos = 0  # where the open tag is looked for, in prefix + text
        self.call: _CallBody | None = None

    def find(self, text: str) -> int:
        """Where the answer ends in ``text``, the answer after the prefix (it only grows between
        calls): right after the close tag, which stays for the parser to read (cut off, the parser
        would read the call as never closed, and cut a lenient call at a tag in its strings); -1:
        not yet. A call that the prefix already closes ends the answer at its start."""
        seen = self.prefix + text
        if self.call is None:
            start = seen.find(TOOL_CALL_OPEN, self.pos)
            if start < 0:
                self.pos = max(self.pos, len(seen) - len(TOOL_CALL_OPEN) + 1)
                return -1
            self.call = _CallBody(start + len(TOOL_CALL_OPEN))
        end = self.call.close_tag(seen)
        return -1 if end < 0 else max(end + len(TOOL_CALL_CLOSE) - len(self.prefix), 0)


class CallsEnd(CallEnd):
    """The stop of a forced answer that may hold several calls (``tool_choice`` "required" or a tool's
    name, ``parallel_tool_calls`` not False): the answer ends where, after a call, anything but
    whitespace and another ``<tool_call>`` block is written (``CallsEndFinder``). The forced call
    stopped at its first call, so an answer of two calls lost the second (OpenAI returns both)."""

    def finder(self) -> CallsEndFinder:
        return CallsEndFinder(self.prefix)


class CallsEndFinder(CallEndFinder):
    """Where a forced answer of calls ends: after a call's ``</tool_call>``, or after its JSON value
    where text that is no close tag follows it (the forced call's constraint closes the value, and a
    small model goes on with prose, not the tag), unless another ``<tool_call>`` follows."""

    def __init__(self, prefix: str) -> None:
        super().__init__(prefix)
        self.last_end = -1  # where the last call ended, in prefix + text (-1: no call yet)

    def find(self, text: str) -> int:
        seen = self.prefix + text
        while True:
            if self.call is None and self.last_end < 0:  # before the first call: its open tag anywhere
                start = seen.find(TOOL_CALL_OPEN, self.pos)
                if start < 0:
                    self.pos = max(self.pos, len(seen) - len(TOOL_CALL_OPEN) + 1)
                    return -1
                self.call = _CallBody(start + len(TOOL_CALL_OPEN))
            if self.call is None:  # between calls: only whitespace, then the next open tag
                after = seen[self.last_end:].lstrip()
                if TOOL_CALL_OPEN.startswith(after):
                    return -1  # nothing yet, or maybe the open tag's start: wait for more
                if not after.startswith(TOOL_CALL_OPEN):
                    return self._end(self.last_end)
                self.call = _CallBody(len(seen) - len(after) + len(TOOL_CALL_OPEN))
            end = self.call.close_tag(seen)
            if end >= 0:
                self.call, self.last_end = None, end + len(TOOL_CALL_CLOSE)
                continue
            value_end = self.call.value_end
            if value_end is None:
                return -1
            after = seen[value_end:].lstrip()
            if after.startswith(FENCE):  # a fenced call inside its tags (the parser reads those): its closing fence
                after = after[len(FENCE):].lstrip()
            if any(tag.startswith(after) for tag in (FENCE, TOOL_CALL_CLOSE, TOOL_CALL_OPEN)):
                return -1  # the close tag, or the next call's open tag, may be coming ("<tool" of "<tool_call>")
            if not after.startswith(TOOL_CALL_OPEN):
                return self._end(value_end)
            self.call, self.last_end = None, value_end  # a next call, this one left unclosed

    def _end(self, end: int) -> int:
        return max(end - len(self.prefix), 0)


class JsonEnd(CallEnd):
    """The stop of a JSON answer decoded without a constraint (AdaFuse, whose spans every member
    writes; a JSON answer beside offered tools; a schema the parser cannot take): the answer ends
    where its top-level object or list closes (``JsonEndFinder``). A small model goes on after the
    value ("This object has one key."): the answer was then no JSON ("Extra data") and was retried
    until its attempts ran out. Under a constraint it ends where the constraint does. ``is_call``:
    whether a value is a bare call of an offered tool, which the parser reads (several may follow
    in a row): such an answer is left to go on. Its text is no string a model writes."""

    is_call: Callable[[str], bool] | None

    def __new__(cls, prefix: str = "", is_call: Callable[[str], bool] | None = None) -> JsonEnd:
        end = str.__new__(cls, "\x00json-end")
        end.prefix, end.is_call = prefix, is_call
        return end

    def __getnewargs__(self) -> tuple[str, Callable[[str], bool] | None]:  # type: ignore[override]
        return (self.prefix, self.is_call)

    def finder(self) -> JsonEndFinder:
        return JsonEndFinder(self.prefix, self.is_call)


class JsonEndFinder(CallEndFinder):
    """Where a JSON answer's top-level value closes (``_JsonScan``: braces inside its strings are
    text). Only an answer that starts (after whitespace) with ``{`` or ``[`` ends there: one that
    starts with prose, a ``<tool_call>`` (a call beside the tools) or a code fence (the parser reads
    a fenced call; a fenced answer is no JSON answer either way) keeps today's end."""

    def __init__(self, prefix: str, is_call: Callable[[str], bool] | None) -> None:
        super().__init__(prefix)
        self.is_call = is_call
        self.scan = _JsonScan()
        self.start = -1  # where the value starts in prefix + text (-1: not yet seen)
        self.off = False  # the answer is no bare JSON value: never ends here
        self.end = -1  # where the answer ends, once found

    def find(self, text: str) -> int:
        if self.off or self.end >= 0:
            return self.end
        seen = self.prefix + text
        if self.start < 0:
            body = seen.lstrip()
            if not body:
                return -1
            if body[0] not in "{[":
                self.off = True
                return -1
            self.start = self.pos = len(seen) - len(body)
        scan = self.scan
        while self.pos < len(seen):
            scan.step(seen[self.pos])
            self.pos += 1
            if not scan.depth and not scan.quote:
                if self.is_call is not None and self.is_call(seen[self.start:self.pos]):
                    self.off = True  # a bare call: the parser's to read, with any calls after it
                    return -1
                self.end = max(self.pos - len(self.prefix), 0)
                return self.end
        return -1


_FREE = JsonPrefix(None)


@dataclass(frozen=True, slots=True)
class _FirstCall(JsonPrefix):
    """A forced call's constraint (``json_constraint.call_start_state``) that, once the call's JSON
    closes, leaves the rest of the answer free (``_FREE``, where the answer may also end), instead of
    ending the answer there: further calls may follow. A token that runs past the closing brace
    (``}\n``) is read up to it."""

    def after(self, piece: bytes) -> JsonPrefix | None:
        state = JsonPrefix.after(self, piece)
        if state is not None:
            return _FREE if state.finished else _FirstCall(state.parser, state.pending, state.lexer)
        for cut in (i + 1 for i, byte in enumerate(piece) if byte == 0x7D):  # up to each "}"
            head = JsonPrefix.after(self, piece[:cut])
            if head is not None and head.finished:
                return _FREE
        return None


def free_after_call(state: JsonPrefix | None) -> JsonPrefix | None:
    """``state``, a forced call's constraint, freed after the call (``_FirstCall``)."""
    return None if state is None else _FirstCall(state.parser, state.pending, state.lexer)
