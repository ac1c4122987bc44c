"""Reading a JSON Schema ``pattern``'s regex, shared by the decoding constraint
(``json_constraint._whole_match``: the parser's regex library reads ``\\d``, ``\\s``, ``\\w`` as ASCII and
``[]a]`` as an empty class) and the validation (``json_validation``: ECMA-262's ``$``)."""

from __future__ import annotations

import functools
import sys


def _atoms(regex: str) -> list[str]:
    """``regex`` cut into an escape (``\\x``), a whole character class (``[...]``) or one character each."""
    atoms: list[str] = []
    i = 0
    while i < len(regex):
        if regex[i] == "\\":
            end = i + 2
        elif regex[i] == "[":
            end = i + 1 + regex.startswith("^", i + 1)
            end += regex.startswith("]", end)  # a "]" first in a class is one of its characters
            while end < len(regex) and regex[end] != "]":
                end += 2 if regex[end] == "\\" else 1
            end += 1
        else:
            end = i + 1
        atoms.append(regex[i:end])
        i = end
    return atoms


def _bracket_escaped(atom: str) -> str:
    """A character class whose first character is ``]`` (``[]a]``, ``[^]a]``: Python's ``re``, the
    validation's, reads it as one of the class's characters) with that ``]`` escaped: the parser's
    regex library reads ``[]`` as an empty class, and ``^[]a]+$`` made every string unwritable."""
    for opening in ("[]", "[^]"):
        if atom.startswith(opening) and len(atom) > len(opening):
            return opening[:-1] + "\\" + atom[len(opening) - 1:]
    return atom


_NON_ASCII = "[^\\x00-\\x7f]"


@functools.cache
def _unicode_classes() -> dict[str, str]:
    """What Python's ``re`` reads as ``\\d`` and ``\\s`` in a str pattern (Unicode decimal digits,
    Unicode whitespace), spelled for a character class: the validation's reading (jsonschema
    searches with ``re``); the parser's regex library reads both as ASCII."""
    high = [chr(code) for code in range(0x80, sys.maxunicode + 1)]
    return {"\\d": "0-9" + "".join(c for c in high if c.isdecimal()),
            "\\s": "\\s" + "".join(c for c in high if c.isspace())}


def _unicode_escapes(atoms: list[str]) -> str:
    """The regex of ``atoms`` with ``\\w``, ``\\d`` and ``\\s`` read as the validation (Python's
    ``re``, as pydantic's) reads them, not as ASCII as the parser's regex library does ("café" was
    unwritable under ``^\\w+$``, "١٢" under ``^\\d+$``, a no-break space under ``^a\\sb$``; ``^\\D+$`` let
    "١" through). ``\\d``, ``\\s``, ``\\D``, ``\\S`` exactly, also in a class (there ``\\D``
    and ``\\S`` stay loose); ``\\w`` (too many letters to spell) with any non-ASCII character: one that is
    no letter is left to the validation."""
    regex = "".join(atoms)
    escapes = any(escape in regex for escape in ("\\d", "\\s", "\\D", "\\S"))
    classes = _unicode_classes() if escapes else {}  # spelled once per process (0.4 s), where needed only

    def spelled(atom: str) -> str:
        atom = _bracket_escaped(atom)
        if atom in classes:
            return f"[{classes[atom]}]"
        if atom.lower() in classes:  # \D, \S
            return f"[^{classes[atom.lower()]}]"
        if atom.startswith("[") and len(atom) > 2:
            return "[" + "".join(classes.get(inner, inner) for inner in _atoms(atom[1:-1])) + "]"
        return atom

    def word(atom: str) -> bool:
        if atom == "\\w":
            return True
        return atom.startswith("[") and not atom.startswith("[^") and "\\w" in _atoms(atom[1:-1])
    return "".join(f"(?:{spelled(atom)}|{_NON_ASCII})" if word(atom) else spelled(atom) for atom in atoms)


_ANY_TEXT = "[\\s\\S]*"
"""Any characters, line breaks too: what an unanchored side of a searched ``pattern`` allows (ECMA-262
searches, and a JSON string may hold an escaped line break; ``.*`` let none be written: ``"x\\ny a"``
was unwritable under ``a``)."""

_MOST_BRANCHES = 64
"""The most alternatives a pattern is spread into (``_spread``); more: left as it is."""


def _split(atoms: list[str]) -> list[list[str]]:
    """``atoms`` cut at their top-level ``|`` (one in a group or a class is no alternative here)."""
    branches: list[list[str]] = [[]]
    depth = 0
    for atom in atoms:
        depth += (atom == "(") - (atom == ")")
        if atom == "|" and depth == 0:
            branches.append([])
        else:
            branches[-1].append(atom)
    return branches


def _group_end(atoms: list[str], start: int) -> int:
    """The index of the ``)`` closing the group opened at ``start`` (``len(atoms)``: none)."""
    depth = 0
    for index in range(start, len(atoms)):
        depth += (atoms[index] == "(") - (atoms[index] == ")")
        if depth == 0:
            return index
    return len(atoms)


def _spread(branch: list[str], most: int = _MOST_BRANCHES) -> list[list[str]] | None:
    """``branch`` as alternatives without a group holding an anchor: an unquantified plain group with
    ``^`` or ``$`` inside becomes one alternative per option of the group (``^(?:x|b$)``: ``^x``, ``^b$``),
    so each anchor lands at an alternative's start or end, where ``whole_regex`` reads it (the parser's
    regex library takes no anchor: such a pattern constrained nothing). A group it cannot spread (a
    quantified one, a lookaround) stays as it is. None: more than ``most`` alternatives, found as soon
    as they are counted (spread whole first, ``(a$|b)`` 22 times took a minute: 4**22 lists)."""
    for start, atom in enumerate(branch):
        if atom != "(":
            continue
        end = _group_end(branch, start)
        inner = branch[start + 1:end]
        if not {"^", "$"} & set(inner) or branch[end + 1:end + 2] in (["*"], ["+"], ["?"], ["{"]):
            continue
        if inner[:1] == ["?"]:
            if inner[1:2] != [":"]:
                continue
            inner = inner[2:]
        before, after = branch[:start], branch[end + 1:]
        spread: list[list[str]] = []
        for option in _split(inner):
            more = _spread(before + option + after, most - len(spread))
            if more is None or len(spread) + len(more) > most:
                return None
            spread += more
        return spread
    return [branch]


def whole_regex(pattern: str) -> str:
    """A searched ``pattern`` as a regex for the whole string, ``^`` and ``$`` read as ECMA-262 reads
    them (the start and the end of the string: ``$`` allows no trailing line break): each alternative
    (after ``_spread``) padded with any text on its unanchored sides. An anchor left inside an
    alternative stays, for the parser's regex library to refuse (then any string: the validation's)."""
    whole = []
    for atoms in (out for branch in _split(_atoms(pattern)) for out in _spread(branch) or [branch]):
        heads = next((i for i, atom in enumerate(atoms) if atom != "^"), len(atoms))
        rest = atoms[heads:]
        tails = next((i for i, atom in enumerate(reversed(rest)) if atom != "$"), len(rest))
        body = _unicode_escapes(rest[:len(rest) - tails])
        whole.append(("" if heads else _ANY_TEXT) + f"(?:{body})" + ("" if tails else _ANY_TEXT))
    return "|".join(whole)
