"""Constrained decoding for ``response_format`` json_object / json_schema and for forced tool
calls, across tokenizers.

The members tokenize differently, so the constraint lives at the level every member shares: the
**characters** of the answer. ``JsonPrefix`` is an immutable state of lm-format-enforcer's
incremental character-level ``JsonSchemaParser`` over the answer so far; ``after(piece)`` says
whether the answer can still become schema-valid JSON once ``piece`` (any member's token bytes, or
a fused candidate string) is appended. A state holds back an incomplete UTF-8 character at its end
(a byte-level token may end mid-character) until the next piece completes it. A forced call's state
(``call_start_state``) is the same parser in a sequence: the tool's name, its arguments' JSON, ``}``.

The decoding round uses it in two places (``decoding/round.py``):
- the drafter drafts only tokens that keep the answer valid (``constrained_token``: the best valid
  token when greedy; sampling draws exactly from the drafter's distribution restricted to the
  valid tokens);
- fusion picks among the fused candidates that keep the answer valid only; where none does, the
  drafted token (valid by construction) stands.
So the committed text is always a valid prefix, and the answer ends (reason ``stop``) as soon as
the JSON value is complete. Verifiers are not constrained: they score the drafted text as usual.

Where the lm-format-enforcer parser is stricter than JSON Schema (its defaults: arrays of at most
20 items unless the schema says more, at most 12 whitespace characters in a row), this project's
settings relax it (``_CONFIG``); the validation with ``jsonschema`` after the answer stays, so a
schema keyword the parser does not enforce (``minimum``, ``format``, ...) is still checked and
retried (``tools.py``). So are ``minItems``/``maxItems`` of an array whose items the parser may count
twice (booleans, nulls, arrays, number enums: ``_Rewrite._counted_twice``), which it is not given.

The parser takes only part of JSON Schema, and much of what it does not take it accepts when built
and then raises when decoding reaches it (an untyped value, ``allOf``, ``not``, a ``const`` number, an
``enum`` holding ``true``, ``additionalProperties: true``, ...); ``oneOf`` it reads as a union of
objects only, and it compares a fixed string (an enum or const value, a property name) with the
text as written, escapes and all. So a schema is first rewritten into the part it takes
(``_parser_schema``): ``oneOf`` becomes ``anyOf`` (exclusivity is left to the validation), ``const``
and ``enum`` a union per JSON type, a fixed string its JSON spelling (``_as_parsed``), a
``pattern`` (searched for, the parser matches the whole string; its ``\\w``, ``\\d``, ``\\s``
Unicode, the parser's ASCII) a whole-string regex (``_whole_match``), whose string's escapes are
matched as the characters they stand for (``_PatternEscape``: the parser offers none there), a
definition that is one of its own ``anyOf`` options the options it leads to (``_union_cycles_read``:
the parser went round it forever), and what it cannot enforce is left free (an untyped value,
``not``, ``if``: any JSON value; an unsupported ``pattern``: any string); a schema it cannot
approximate that way (several typed ``allOf`` parts, a ``$ref`` outside ``$defs``) is not
constrained at all. Should the parser still raise mid-answer, the
constraint is dropped for the rest of that answer (``JsonPrefix.parser`` None), which is then
validated as usual.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from interegular.fsm import anything_else
from lmformatenforcer import (
    CharacterLevelParser,
    CharacterLevelParserConfig,
    JsonSchemaParser,
    RegexParser,
    SequenceParser,
    StringParser,
    UnionParser,
)
from lmformatenforcer.jsonschemaparser import NumberParsingState, StringParsingState

from .alignment import TokenTable
from .json_numbers import _integer_range
from .json_regex import whole_regex
from .sampling import Sampler

_ALPHABET = "".join(c for c in string.printable if c not in "\\\t\n\r\x0b\x0c")
"""What a JSON string may hold literally (ASCII part): every printable character but the
backslash (the parser adds it, as the start of an escape). The parser's default alphabet lacks a
few (``|``, ``~``); non-ASCII characters are handled by ``_feed``."""

_CONFIG = CharacterLevelParserConfig(alphabet=_ALPHABET, max_consecutive_whitespaces=16,
                                     max_json_array_length=10_000)
"""16 whitespace characters in a row between tokens (indented JSON nests deeper than the default 12
allows; a small model's whitespace loop is still cut short; a string's spaces are not counted, see
``_STAND_IN``); arrays as long as the schema or max_new_tokens allow."""

_STAND_IN = "a"
"""What the parser is fed for a non-ASCII character or a space inside a free-text string: one
ordinary character, so lengths (minLength/maxLength) still count right, and a space is not counted
among the whitespace the parser caps (``max_consecutive_whitespaces``, meant for the whitespace
between tokens: a string could hold no more than 16 spaces in a row)."""

_SAMPLE_TRIES = 32
"""Rejection draws before a sampled constrained token is drawn from the checked valid set."""

_GREEDY_FIRST = 64
"""Greedy: the drafter's top tokens checked first, before the whole vocabulary in order."""


_ANY: dict[str, Any] = {"anyOf": [{"type": t} for t in ("object", "array", "string", "number", "boolean", "null")]}
"""Any JSON value, as the parser takes it (its own reading of no schema)."""


class _NoValue(Exception):
    """An enum or const with no value of its schema's type: no value at all (an optional key: left out)."""


class _Unsupported(Exception):
    """A schema the parser cannot be given even approximately."""


class _Rewrite:
    """A JSON schema rewritten into what the parser takes (see the module's doc): every subschema
    is rebuilt from the keywords the parser reads, so what it would ignore is dropped, and what it
    would raise on becomes a form it takes or a looser one. Looser only where that keeps a valid
    answer writable; the validation after the answer checks the rest."""

    def __init__(self, root: Mapping[str, Any]) -> None:
        # The parser looks a $ref's last segment up in "definitions" if the root has it, else "$defs".
        self.defs_key = "definitions" if "definitions" in root else "$defs"
        defs = root.get(self.defs_key)
        self.defs: Mapping[str, Any] = defs if isinstance(defs, Mapping) else {}
        self.merging: set[str] = set()  # the $ref branches being merged with a schema's own part (_branch)
        self.reading: set[str] = set()  # the $refs whose types are being read (_kinds)
        self.counting: set[str] = set()  # the definitions met in the reading under way (_definition_counted_twice)
        self.twice: dict[str, bool] = {}  # each definition's _counted_twice, once known

    def root(self, schema: Mapping[str, Any]) -> dict[str, Any]:
        out = self.schema(schema)
        if self.defs:
            out[self.defs_key] = _union_cycles_read({name: self.schema(sub) for name, sub in self.defs.items()})
        return out

    def schema(self, schema: Any) -> dict[str, Any]:
        if schema is True:
            return dict(_ANY)
        if not isinstance(schema, Mapping):  # false (no value at all) or no schema
            raise _Unsupported(schema)
        if "$ref" in schema:
            return self._ref(schema["$ref"])
        own = self._own(schema)
        branches = schema.get("anyOf") or schema.get("oneOf")  # oneOf: one branch only is the validation's
        if isinstance(branches, list) and branches:
            if own is None:
                return {"anyOf": [self.schema(branch) for branch in branches]}
            return self._within(schema, own, [self._branch(schema, branch) for branch in branches])
        parts = schema.get("allOf")
        if isinstance(parts, list) and parts:
            typed = [part for part in (self.schema(p) for p in parts) if part != _ANY]
            typed += [own] if own is not None else []
            if len(typed) > 1:  # the parser's merge (the last part, with every part's properties) is no approximation
                raise _Unsupported(schema)
            return typed[0] if typed else dict(_ANY)
        return own if own is not None else dict(_ANY)  # untyped ({}, {"title": ...}, "not", "if"): any value

    def _within(self, schema: Mapping[str, Any], own: dict[str, Any], options: list[dict[str, Any]]) -> dict[str, Any]:
        """A schema with both its own type and ``anyOf`` (or ``oneOf``) branches: a value is both, which
        the parser cannot be told, so one of the two stands for it. The branches where each is of a type
        ``own`` allows (branches of no type ``own`` allows dropped: no value is both); else ``own``. The
        branches given whatever they said, ``{"type": "integer", "anyOf": [{"minimum": 5}, ...]}`` let a
        string be written (an untyped branch is any value), which the validation then refused. An
        ``enum`` or ``const`` of its own (tighter than a branch) stands as it is."""
        if "const" in schema or "enum" in schema:
            return own
        allowed = self._kinds(own)
        if allowed is None:
            return own
        kinds = [self._kinds(option) for option in options]
        kept = [(option, k) for option, k in zip(options, kinds) if k is None or _overlap(k, allowed)]
        if not kept or any(k is None or not _inside(k, allowed) for _, k in kept):
            return own  # e.g. {"type": "object", ..., "anyOf": [{"required": ["a"]}, ...]}
        return kept[0][0] if len(kept) == 1 else {"anyOf": [option for option, _ in kept]}

    def _branch(self, schema: Mapping[str, Any], branch: Any) -> dict[str, Any]:
        """One ``anyOf``/``oneOf`` branch of a schema with its own type, rewritten as the two together
        (``_merged``): a value is both. Taken alone, ``{"required": ["lat", "lon"]}`` under ``{"type":
        "object", "properties": {"city": ...}}`` read as untyped, so the schema's own part stood and
        the branch's keys were unwritable; a branch listing properties lost the schema's own optional
        ones. A ``$ref`` branch is merged with its definition, unless that definition is being merged
        already (a recursive one: the ``$ref`` stands as it is)."""
        if "const" in schema or "enum" in schema:  # the own part stands as it is (_within)
            return self.schema(branch)
        ref = branch.get("$ref") if isinstance(branch, Mapping) else None
        if ref is None:
            return self.schema(_merged(schema, branch))
        self._ref(ref)  # a $ref the parser cannot resolve: unsupported
        if ref in self.merging:
            return self.schema(branch)
        self.merging.add(ref)
        try:
            return self.schema(_merged(schema, self.defs[ref.split("/")[-1]]))
        finally:
            self.merging.discard(ref)

    def _kinds(self, schema: Mapping[str, Any]) -> frozenset[str] | None:
        """The JSON types a rewritten schema allows ("number" takes "integer" in), None if not known
        (a $ref that leads round to itself: the refs being read are kept on the instance, as the
        definition's rewriting comes back here through ``_within``; a ``seen`` passed along was lost
        there, and a recursive definition with typed branches ran into a RecursionError)."""
        if "type" in schema:
            return frozenset([schema["type"]])
        if "anyOf" in schema:
            kinds = [self._kinds(option) for option in schema["anyOf"]]
            known = [k for k in kinds if k is not None]
            return frozenset().union(*known) if len(known) == len(kinds) else None
        if "enum" in schema:  # an enum of numbers (_enum_schema)
            return frozenset(["number"])
        if "const" in schema:  # a boolean or an array const (_enum_schema)
            return frozenset(["array" if schema["const"].startswith("[") else "boolean"])
        ref = schema.get("$ref")
        if not isinstance(ref, str) or ref in self.reading:
            return None
        self.reading.add(ref)
        try:
            return self._kinds(self.schema(self.defs[ref.split("/")[-1]]))
        finally:
            self.reading.discard(ref)

    def _ref(self, ref: Any) -> dict[str, Any]:
        parts = ref.split("/") if isinstance(ref, str) else []
        if len(parts) != 3 or parts[0] != "#" or parts[1] != self.defs_key or parts[2] not in self.defs:
            raise _Unsupported(ref)  # the parser resolves "#/<defs>/<name>" only
        return {"$ref": ref}

    def _own(self, schema: Mapping[str, Any]) -> dict[str, Any] | None:
        """What ``schema`` itself says (its combinators aside), or None if nothing the parser reads."""
        if "const" in schema:
            return _enum_schema(_of_type([schema["const"]], schema.get("type")))
        if "enum" in schema:
            return _enum_schema(_of_type(list(schema["enum"]), schema.get("type")))
        kind = schema.get("type", "object" if "properties" in schema else None)
        if kind is None:
            return None
        if isinstance(kind, list):
            options = [self._typed(schema, k) for k in kind]
            return options[0] if len(options) == 1 else {"anyOf": options}
        return self._typed(schema, kind)

    def _typed(self, schema: Mapping[str, Any], kind: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"type": kind}
        if kind == "integer" and (values := _integer_range(schema)) is not None:
            return {"enum": values}
        if kind in ("integer", "number", "boolean", "null"):
            return out
        if kind == "string":
            pattern = schema.get("pattern")
            if isinstance(pattern, str) and (whole := _whole_match(pattern)) is not None:
                out["pattern"] = whole  # the parser takes a pattern or lengths, not both
                return out
            low, high = schema.get("minLength"), schema.get("maxLength")
            if isinstance(low, int) and isinstance(high, int) and low > high:
                raise _Unsupported(schema)  # no string at all (and the parser asserts)
            out.update({k: v for k, v in (("minLength", low), ("maxLength", high)) if isinstance(v, int)})
            return out
        if kind == "array":
            items = schema.get("items")
            if isinstance(items, Mapping) and any(isinstance(schema.get(k), int) for k in ("minItems", "maxItems")):
                # the count over the items' range: the parser counts a number enum twice (_counted_twice),
                # so a range as an enum dropped minItems/maxItems ([r, g, b] of 0..255 took 2 or 4 values)
                items = {k: v for k, v in items.items() if k not in ("minimum", "maximum", "exclusiveMinimum",
                                                                    "exclusiveMaximum", "multipleOf")}
            item = self.schema(items) if isinstance(items, Mapping) else dict(_ANY)  # a list (tuples), prefixItems: any
            if item != _ANY:
                out["items"] = item
            if not self.counting and not self._counted_twice(item):  # in a reading, see _definition_counted_twice
                out.update({k: schema[k] for k in ("minItems", "maxItems") if isinstance(schema.get(k), int)})
            return out
        if kind != "object":
            raise _Unsupported(schema)
        required = [key for key in schema.get("required", []) if isinstance(key, str)]
        properties, extra = schema.get("properties"), schema.get("additionalProperties")
        if (isinstance(properties, Mapping) and (properties or not isinstance(extra, Mapping))) or extra is False:
            # Given properties, the parser takes no other key (it takes listed keys or free keys, not
            # both); a required key not among them stays writable, its value additionalProperties'.
            # No properties ({}) but an additionalProperties schema: free keys (below), not "{}" alone.
            props = properties if isinstance(properties, Mapping) else {}
            out["properties"] = {}
            for key, sub in props.items():
                if sub is False:
                    continue
                try:
                    name, value = _as_parsed(key), self.schema(sub)
                except _NoValue:
                    if key in required:
                        raise _Unsupported(sub) from None  # no valid answer at all: left to the validation
                    continue  # never writable, as a false schema (the whole constraint was dropped)
                seen = out["properties"].get(name)  # two keys the parser reads alike: either one's value
                out["properties"][name] = value if seen is None else {"anyOf": [seen, value]}
            beyond = [name for name in map(_as_parsed, required) if name not in out["properties"]]
            if beyond:
                value = self.schema(extra) if isinstance(extra, Mapping) else dict(_ANY)
                out["properties"].update({name: value for name in beyond})
        elif isinstance(extra, Mapping) and (value := self.schema(extra)) != _ANY:
            out["additionalProperties"] = value
        if required:
            out["required"] = [_as_parsed(key) for key in required]
        return out

    def _counted_twice(self, item: Mapping[str, Any]) -> bool:
        """Whether the parser may count an array's item (rewritten) twice: lm-format-enforcer 0.11.3
        counts a boolean, a null, an array or a number enum once when complete and again at the
        ``,``, so minItems = maxItems = 3 closed a list of booleans after 2 (every try too short).
        Such an array's bounds are left to the validation."""
        ref = item.get("$ref")
        if isinstance(ref, str):
            return self._definition_counted_twice(ref.split("/")[-1])
        if isinstance(item.get("anyOf"), list):
            return any(self._counted_twice(option) for option in item["anyOf"])
        return (item.get("type") in ("boolean", "null", "array") or "const" in item  # a _Bare boolean
                or ("enum" in item and item.get("type") != "string"))

    def _definition_counted_twice(self, name: str) -> bool:
        """``_counted_twice`` of a definition, read from its rewriting. The definitions being read are
        kept on the instance and one met again counts as not twice (the rest of the union decides):
        rewriting a tree's definition reaches its own array items' ``$ref`` (``_typed``), and a
        ``seen`` passed along was lost there, so ``children: list[Tree]`` recursed without end and the
        answer was not constrained at all. Only the top of the rewriting is read, so a definition
        met again deeper (an item's item) changes nothing; the answer of a reading begun with none
        under way is kept, as one begun inside another may stand on that one's "not twice".

        As only the top is read, a rewriting under way inside a reading leaves its arrays' bounds
        out (``_typed``) rather than reading their items' definitions too, and a definition read
        once stays in ``counting`` until the outermost reading ends (met again: not twice, as one
        that was twice ended the reading there): otherwise each reading rewrote again every
        definition it reached through array items, along every path, and 30 definitions linked by
        three lists took minutes, on the event loop of every request. Each reading now rewrites
        every definition at most once."""
        if name in self.twice:
            return self.twice[name]
        if name in self.counting:
            return False
        outermost = not self.counting
        self.counting.add(name)
        try:
            twice = self._counted_twice(self.schema(self.defs[name]))
        finally:
            if outermost:
                self.counting.clear()
        if outermost:
            self.twice[name] = twice
        return twice


class _Bare(str):
    """A ``const`` the parser writes without quotes: lm-format-enforcer 0.11.3 quotes a const whose
    type is exactly ``str`` and writes any other as it is, so ``_Bare("true")`` lets ``true`` only."""


_BRANCHING = ("anyOf", "oneOf", "allOf", "$defs", "definitions")
"""A schema's keywords that are not its own part (``_merged`` leaves them out)."""


def _merged(schema: Mapping[str, Any], branch: Any) -> Any:
    """``branch`` with what ``schema`` itself says (its ``anyOf``/``oneOf``/``allOf`` aside) merged in,
    as JSON Schema reads a schema beside its branches (both hold): the branch's keywords, the schema's
    where the branch has none (its type, for an untyped branch), the properties of both (the branch's
    where both list one: a value meets both, so either is a looser stand-in, the branch's the tighter
    as a rule) and the required keys of both. A branch that is no object (``true``) or holds an
    ``allOf`` of its own (two typed parts: unsupported) stands as it is."""
    if not isinstance(branch, Mapping) or "allOf" in branch:
        return branch
    out = {key: value for key, value in schema.items() if key not in _BRANCHING}
    out.update(branch)
    own, more = schema.get("properties"), branch.get("properties")
    if isinstance(own, Mapping) and isinstance(more, Mapping):
        out["properties"] = {**own, **more}
    own_required, more_required = schema.get("required"), branch.get("required")
    if isinstance(own_required, list) and isinstance(more_required, list):
        out["required"] = list(dict.fromkeys(own_required + more_required))
    return out


def _union_refs(schema: Mapping[str, Any]) -> set[str]:
    """The definitions a rewritten schema is a union of (a ``$ref``, or one among its ``anyOf`` options):
    the ones the parser reads as soon as it starts a value of ``schema``."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        return {ref.split("/")[-1]}
    options = schema.get("anyOf")
    return set().union(*map(_union_refs, options)) if isinstance(options, list) else set()


def _union_options(schema: Mapping[str, Any], defs: Mapping[str, Any], seen: frozenset[str]) -> list[Mapping[str, Any]]:
    """The options of the union ``schema`` is, its ``$ref`` options read through (a definition in
    ``seen`` adds none: it is being read already, and adds nothing its other options do not)."""
    ref = schema.get("$ref")
    if isinstance(ref, str):
        name = ref.split("/")[-1]
        return [] if name in seen else _union_options(defs[name], defs, seen | {name})
    options = schema.get("anyOf")
    if isinstance(options, list):
        return [leaf for option in options for leaf in _union_options(option, defs, seen)]
    return [schema]


def _union_cycles_read(defs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Rewritten definitions without a cycle of union options: a definition that is, through ``$ref``
    and ``anyOf`` options alone, one of its own options (``Expr: oneOf [Lit, Group]``, ``Group: anyOf
    [Expr]``) sent the parser round it forever when a value started (a RecursionError: no constraint
    at all). Such a definition is the union of the options it leads to that are no ``$ref``, which
    are the values it takes (a recursion through an object's property or an array's items is read
    a value at a time and stays as it is)."""
    def cyclic(name: str) -> bool:
        seen: set[str] = set()
        todo = list(_union_refs(defs[name]))
        while todo:
            ref = todo.pop()
            if ref == name:
                return True
            if ref not in seen and ref in defs:
                seen.add(ref)
                todo.extend(_union_refs(defs[ref]))
        return False

    read = dict(defs)
    for name in [name for name in defs if cyclic(name)]:
        leaves = _union_options(defs[name], defs, frozenset([name]))
        options = list({json.dumps(leaf, sort_keys=True): leaf for leaf in leaves}.values())  # each once
        if not options:
            raise _Unsupported(name)  # a union of itself alone: no value
        read[name] = dict(options[0]) if len(options) == 1 else {"anyOf": options}
    return read


def _overlap(kinds: frozenset[str], allowed: frozenset[str]) -> bool:
    """Whether a value can be of one of ``kinds`` and one of ``allowed`` (an integer is a number)."""
    return any(_inside(frozenset([kind]), allowed) or (kind == "number" and "integer" in allowed) for kind in kinds)


def _inside(kinds: frozenset[str], allowed: frozenset[str]) -> bool:
    """Whether every value of one of ``kinds`` is of one of ``allowed``."""
    return all(kind in allowed or (kind == "integer" and "number" in allowed) for kind in kinds)


def _enum_schema(values: list[Any]) -> dict[str, Any]:
    """``enum`` (or ``const``) as the parser takes it: its strings, its numbers, its booleans (one
    of them: that one alone; ``const: true`` let ``false`` through, a retry wasted), null, each
    object key by key (its keys all required, their values fixed the same way) and each array as it
    is spelled (``_fixed_array``)."""
    strings = [_as_parsed(v) for v in values if isinstance(v, str)]
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    options: list[dict[str, Any]] = [{"type": "string", "enum": strings}] if strings else []
    options += [{"enum": numbers}] if numbers else []
    booleans = {v for v in values if isinstance(v, bool)}
    if booleans:
        options.append({"type": "boolean"} if len(booleans) == 2 else {"const": _Bare(json.dumps(booleans.pop()))})
    options += [{"type": "null"}] if None in values else []
    for value in values:
        if isinstance(value, dict):
            names = [_as_parsed(key) for key in value]
            fixed = {"type": "object", "properties": dict(zip(names, map(_enum_schema, ([v] for v in value.values())))),
                     "required": names}
            options.append(fixed if len(set(names)) == len(names) else {"type": "object"})  # two keys read alike
    options += [_fixed_array(v) for v in values if isinstance(v, list)]
    if not options:
        raise _NoValue(values) if not values else _Unsupported(values)
    return options[0] if len(options) == 1 else {"anyOf": options}


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "number": (int, float), "integer": (int, float), "boolean": (bool,), "null": (type(None),),
    "array": (list,), "object": (dict,)}


def _of_type(values: list[Any], kind: Any) -> list[Any]:
    """The ``enum`` (or ``const``) values a value may be beside the schema's ``type`` (all where it has
    none): ``{"type": "integer", "enum": [1, 2.5]}`` let 2.5 be written, which the validation refused
    (a retry wasted; a forced call's arguments wrong). An integral float under "integer" is written as
    the integer (``1.0`` is one to ``jsonschema``, a float to ``json.loads`` and a strict ``int``)."""
    kinds = [kind] if isinstance(kind, str) else kind if isinstance(kind, list) else None
    if kinds is None:
        return values

    def fits(value: Any, kind: str) -> bool:
        if kind == "integer" and isinstance(value, float):
            return value.is_integer()
        return isinstance(value, bool) == (kind == "boolean") and isinstance(value, _JSON_TYPES.get(kind, ()))
    kept = [v for v in values if any(fits(v, k) for k in kinds)]
    return [int(v) if isinstance(v, float) and "number" not in kinds else v for v in kept]


def _fixed_array(value: list[Any]) -> dict[str, Any]:
    """An array ``enum`` or ``const`` value as the parser takes it: its JSON spelling, written as it is
    (``_Bare``; given "any array", ``{"const": [1, 2]}`` let ``[2, 1]`` be written, and ``["a", 1]``
    let ``["b", 1]``, which the validation refused). Its quotes and backslashes: ``_bare_consts``."""
    return {"const": _Bare(json.dumps(value, ensure_ascii=False))}


_ESCAPE = re.compile(r"\\(?:u[0-9a-fA-F]{4}|.)")


def _as_parsed(value: str) -> str:
    """A fixed string (an enum or const value, a property name) as the parser compares it with what
    is written: JSON-escaped (given raw, a ``"`` in it closed the string early and a line break was
    written raw: invalid JSON), each escape sequence then read as its backslash alone (the parser
    reads what follows a backslash apart, as any valid escape). So ``"a\\"b"`` is writable for
    ``a"b`` and ``"a"`` is not; the escape after the backslash may be any valid one (``"a\\nb"``
    is another value: the validation refuses it, of a JSON answer or of a forced call's arguments)."""
    return _ESCAPE.sub(lambda _: "\\", json.dumps(value, ensure_ascii=False)[1:-1])


def _whole_match(pattern: str) -> str | None:
    """A JSON Schema ``pattern`` as the regex the parser matches the *whole* string against
    (``json_regex.whole_regex``: given as is, ``^https?://`` let the string be ``https://`` only), or
    None if the parser cannot follow it (then any string, left to the validation)."""
    whole = whole_regex(pattern)
    try:
        RegexParser(whole, _CONFIG)
    except Exception:  # noqa: BLE001 - interegular rejects what it does not support
        return None
    return whole


def _parser_schema(schema: Mapping[str, Any], *, object_only: bool = False) -> dict[str, Any] | None:
    """``schema`` rewritten into what the parser takes (``_Rewrite``), None if it cannot be.
    ``object_only``: a tool's arguments, an object whatever the schema leaves open."""
    try:
        out = _Rewrite(schema).root(schema)
    except (_Unsupported, _NoValue, TypeError, ValueError, AttributeError):
        return None
    if object_only and out.get("anyOf") == _ANY["anyOf"]:
        out = {"type": "object", **{k: v for k, v in out.items() if k != "anyOf"}}
    return out


def _free_text(parser: CharacterLevelParser) -> bool:
    """Whether ``parser`` is inside a JSON string that takes any character (no enum, no pattern)."""
    if isinstance(parser, UnionParser):
        return any(_free_text(p) for p in parser.parsers)
    if isinstance(parser, SequenceParser):  # a tool call: the arguments' JSON comes first
        return _free_text(parser.parsers[0])
    key = parser.shortcut_key()
    return isinstance(key, tuple) and bool(key) and key[0] == "json_freetext"


def _feed(parser: CharacterLevelParser, char: str) -> CharacterLevelParser | None:
    """``parser`` after ``char``, or None if ``char`` cannot come next."""
    if isinstance(parser, UnionParser):  # each option on its own: one may be in a free-text string, another not
        options = [fed for option in parser.parsers if (fed := _feed(option, char)) is not None]
        return None if not options else options[0] if len(options) == 1 else UnionParser(options)
    if isinstance(parser, SequenceParser) and len(parser.parsers) > 1 and not parser.parsers[0].can_end():
        first = _feed(parser.parsers[0], char)  # what SequenceParser.add_character does here
        return None if first is None else SequenceParser([first, *parser.parsers[1:]])
    if (char == " " or ord(char) > 127) and _free_text(parser):  # JSON strings take any non-ASCII character
        char = _STAND_IN
    if char == " " and isinstance(parser, JsonSchemaParser) and (states := _strings(parser)):
        return _into_string(parser, states, char)  # an enum's, a key's or a pattern's space: see _string_add
    if char in '"\\ ' and isinstance(parser, JsonSchemaParser) and (consts := _bare_consts(parser, char)):
        return _into_const(parser, consts, char)  # a quote, backslash or space of a fixed array's spelling
    if char == "\\" and isinstance(parser, JsonSchemaParser) and (states := _strings(parser)) \
            and any(state.regex_parser is not None for state in states):
        return _escape_into(parser, states)  # a pattern's string: see _PatternEscape
    allowed = parser.get_allowed_characters()
    if char in allowed:
        return _no_integer_exponent(parser.add_character(char)) if char in "eE" else parser.add_character(char)
    if ord(char) > 127 and isinstance(parser, JsonSchemaParser) and (states := _strings(parser)):
        return _into_string(parser, states, char)
    return None


def _no_integer_exponent(parser: CharacterLevelParser) -> CharacterLevelParser | None:
    """``parser`` without the integers that just took an exponent, None if nothing is left. The
    parser writes an integer with one (``1e-3``, ``1e400``: no integer; ``1e3``: one to
    ``jsonschema``, but a float to ``json.loads`` and to a strict pydantic ``int``), so an integer
    is written in digits alone, which every reader takes as one."""
    def dropped(option: CharacterLevelParser) -> CharacterLevelParser | None:
        if isinstance(option, NumberParsingState):
            return None if option.seen_exponent and not option.allow_floating_point else option
        if isinstance(option, UnionParser):
            kept = [k for k in (dropped(o) for o in option.parsers) if k is not None]
            return None if not kept else option if len(kept) == len(option.parsers) else UnionParser(kept)
        return option

    if isinstance(parser, UnionParser):  # JsonSchemaParser splits on a union of objects or arrays
        options = [k for k in (_no_integer_exponent(p) for p in parser.parsers) if k is not None]
        return None if not options else options[0] if len(options) == 1 else UnionParser(options)
    if not isinstance(parser, JsonSchemaParser) or not parser.object_stack:
        return parser
    top = dropped(parser.object_stack[-1])  # what took the character
    if top is parser.object_stack[-1] or top is None:
        return parser if top is not None else None
    return _on_top(parser, top, parser.last_non_whitespace_character)


def _on_top(parser: JsonSchemaParser, top: CharacterLevelParser, last: str) -> JsonSchemaParser:
    """``parser`` with ``top`` in place of its top state, ``last`` its last non-whitespace character."""
    after = JsonSchemaParser(parser.context, parser.config, [*parser.object_stack[:-1], top],
                             parser.num_consecutive_whitespaces)
    after.last_parsed_string = parser.last_parsed_string
    after.last_non_whitespace_character = last
    return after


def _strings(parser: CharacterLevelParser) -> list[StringParsingState]:
    """The JSON string states ``parser`` is inside (several: a union of string schemas), or none."""
    if not isinstance(parser, JsonSchemaParser) or not parser.object_stack:
        return []
    top = parser.object_stack[-1]
    states = top.parsers if isinstance(top, UnionParser) else [top]
    inside = all(isinstance(s, StringParsingState) and s.require_opening_quote  # not true, null, an enum's 5
                 and s.seen_opening_quote and not s.seen_closing_quote for s in states)
    return [s for s in states if isinstance(s, StringParsingState)] if inside else []


def _bare_consts(parser: JsonSchemaParser, char: str) -> list[StringParsingState]:
    """The bare consts (``_Bare``: a fixed array's spelling) at the top of ``parser`` that take ``char``
    next, after their first character: the parser reads a quote there as the const's end and a
    backslash as an escape's start, so an array const holding a string could not be written."""
    top = parser.object_stack[-1] if parser.object_stack else None
    states = top.parsers if isinstance(top, UnionParser) else [top]
    return [s for s in states if isinstance(s, StringParsingState) and not s.require_closing_quote
            and s.parsed_string and any(a.startswith(s.parsed_string + char) for a in s.allowed_strings)]


def _into_const(parser: JsonSchemaParser, states: list[StringParsingState], char: str) -> JsonSchemaParser:
    """``parser`` after ``char`` given as it is to the bare consts ``states`` (``_bare_consts``)."""
    fed = [_string_add(state, char) for state in states]
    last = parser.last_non_whitespace_character if char == " " else char
    after = _on_top(parser, fed[0] if len(fed) == 1 else UnionParser(list(fed)), last)
    after.num_consecutive_whitespaces = 0  # a const's own spaces are no whitespace between tokens
    return after


def _string_takes(state: StringParsingState, char: str) -> bool:
    """Whether the string ``state`` takes the non-ASCII ``char`` (or a space) next (the parser offers the ASCII
    alphabet only: a ``pattern`` string's regex, ``[^0-9]`` or ``\\w``, takes "é" all the same)."""
    if state.regex_parser is not None:
        return state.regex_parser.add_character(char).current_state != RegexParser.INVALID_STATE
    if state.allowed_strings:
        return any(s.startswith(state.parsed_string + char) for s in state.allowed_strings)
    return state.max_length is None or len(state.parsed_string) < state.max_length


def _string_add(state: StringParsingState, char: str) -> StringParsingState:
    """The string ``state`` after the ordinary ``char`` (no quote, no backslash): what
    ``StringParsingState.add_character`` does, but a space is kept. The parser drops whitespace at
    a string's start (read as the whitespace before a value) and ``JsonSchemaParser`` caps a run of
    spaces at ``max_consecutive_whitespaces``: an enum value, a const or a key starting with a
    space, or holding more than 16 in a row, could not be written, and a pattern's regex never saw
    a leading space (``"   ab"`` passed for ``^[ a]b$``)."""
    after = state._clone()
    after.parsed_string += char
    if after.regex_parser is not None:
        after.regex_parser = after.regex_parser.add_character(char)
    return after


def _into_string(parser: JsonSchemaParser, states: list[StringParsingState], char: str) -> CharacterLevelParser | None:
    """``parser`` after the non-ASCII ``char`` or the space inside its string, given to the string
    states that take it (what ``JsonSchemaParser.add_character`` does for a character they offer;
    a space in a string is not counted among the whitespace between tokens)."""
    fed: list[CharacterLevelParser] = [_string_add(state, char) for state in states if _string_takes(state, char)]
    if not fed:
        return None
    after = _on_top(parser, fed[0] if len(fed) == 1 else UnionParser(fed),
                    parser.last_non_whitespace_character if char == " " else char)
    after.num_consecutive_whitespaces = 0
    return after


_ESCAPED = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}
"""JSON's one-letter escapes and the character each stands for."""

_HEX = "0123456789abcdefABCDEF"


def _is_surrogate(code: int) -> bool:
    return 0xD800 <= code <= 0xDFFF


def _regex_takes_some(regex: RegexParser, low: int, high: int) -> bool:
    """Whether ``regex`` takes next some character from ``low`` to ``high`` (code points, surrogates
    aside): one its FSM names with a way on, or one it does not name where it has a way on for any."""
    def plain(symbol: str) -> bool:
        return low <= ord(symbol) <= high and not _is_surrogate(ord(symbol))

    fsm = regex.context.pattern
    for transition in fsm.map.get(regex.current_state, {}):
        symbols = fsm.alphabet.by_transition[transition]
        if any(symbol is not anything_else and plain(symbol) for symbol in symbols):
            return True
        if anything_else in symbols:
            surrogates = max(0, min(high, 0xDFFF) - max(low, 0xD800) + 1)
            named = sum(plain(symbol) for symbol in fsm.alphabet if symbol is not anything_else)
            if high - low + 1 - surrogates - named > 0:
                return True
    return False


def _escaped_takes(state: StringParsingState, low: int, high: int) -> bool:
    """Whether the string ``state`` takes an escape standing for a character from ``low`` to ``high``.
    A ``pattern`` string matches the character the escape stands for (not a lone surrogate: half of a
    character its regex cannot be asked about; a non-BMP character is written as it is); any other string
    reads an escape as its backslash alone, as the parser does (its lengths count one character, an enum
    value is spelled so: ``_as_parsed``)."""
    if state.regex_parser is not None:
        return _regex_takes_some(state.regex_parser, low, high)
    return _string_takes(state, "\\")


class _PatternEscape(CharacterLevelParser):
    """An escape sequence being written inside the string(s) ``states``, one of them with a ``pattern``:
    the parser offers no backslash in a ``pattern`` string (it would match the escape's characters
    against the regex), so a string holding a backslash, a quote or a line break could not be written
    under any pattern, even ``^.+$``. The escape is read here whole and the character it stands for
    given to each string's regex (JSON Schema matches the decoded value); only escapes standing for a
    character some string takes are offered."""

    def __init__(self, states: list[StringParsingState], written: str = "") -> None:
        super().__init__(_CONFIG)
        self.states = states
        self.written = written  # after the backslash: "", or "u" and up to 3 hex digits
        self._allowed: str | None = None

    def _open(self, digits: str) -> bool:
        """Whether a \\u escape starting with the hex ``digits`` can stand for a character a string takes."""
        low, high = int(digits.ljust(4, "0"), 16), int(digits.ljust(4, "f"), 16)
        return any(_escaped_takes(state, low, high) for state in self.states)

    def get_allowed_characters(self) -> str:
        if self._allowed is None:  # asked once per token of the vocabulary: worked out once
            if not self.written:
                simple = "".join(c for c, char in _ESCAPED.items() if self._open(f"{ord(char):04x}"))
                self._allowed = simple + ("u" if self._open("") else "")
            else:
                self._allowed = "".join(digit for digit in _HEX if self._open(self.written[1:] + digit))
        return self._allowed

    def add_character(self, new_character: str) -> CharacterLevelParser:
        written = self.written + new_character
        if written == "u" or (written.startswith("u") and len(written) < 5):
            return _PatternEscape(self.states, written)
        code = ord(_ESCAPED[written]) if len(written) == 1 else int(written[1:], 16)
        fed: list[CharacterLevelParser] = [
            _string_add(state, chr(code) if state.regex_parser is not None else "\\")
            for state in self.states if _escaped_takes(state, code, code)]
        return fed[0] if len(fed) == 1 else UnionParser(fed)

    def can_end(self) -> bool:
        return False


def _escape_into(parser: JsonSchemaParser, states: list[StringParsingState]) -> CharacterLevelParser | None:
    """``parser`` after a backslash inside its ``pattern`` string (``_PatternEscape``), None if no escape
    can follow."""
    escape = _PatternEscape(states)
    if not escape.get_allowed_characters():
        return None
    after = _on_top(parser, escape, "\\")
    after.num_consecutive_whitespaces = 0
    return after


def _regex_may_start(parser: CharacterLevelParser, head: bytes) -> bool:
    """Whether a ``pattern`` string ``parser`` is inside may take a non-ASCII character starting
    with the bytes ``head``: its regex has a way on for such a character (one it names, or any
    character it does not name)."""
    if isinstance(parser, UnionParser):
        return any(_regex_may_start(p, head) for p in parser.parsers)
    if isinstance(parser, SequenceParser):
        return _regex_may_start(parser.parsers[0], head)
    for state in _strings(parser):
        regex = state.regex_parser
        if regex is None:
            continue
        fsm = regex.context.pattern
        for transition in fsm.map.get(regex.current_state, {}):
            if any(symbol is anything_else or (ord(symbol) > 127 and symbol.encode("utf-8").startswith(head))
                   for symbol in fsm.alphabet.by_transition[transition]):
                return True
    return False


def _may_start(parser: CharacterLevelParser, head: bytes) -> bool:
    """Whether a character that can come next starts with the bytes ``head`` (of a character split
    across pieces): inside a free-text string any, inside a ``pattern`` string one its regex takes,
    elsewhere one the parser allows (a key's or an enum's "é", spelled b"\\xc3", b"\\xa9" by a
    byte-level vocabulary)."""
    return _free_text(parser) or _regex_may_start(parser, head) or any(
        ord(c) > 127 and c.encode("utf-8").startswith(head) for c in parser.get_allowed_characters())


def _split_utf8(data: bytes) -> tuple[str, bytes] | None:
    """``data`` as its complete characters and an incomplete character at the end (kept as bytes);
    None if ``data`` is not UTF-8."""
    for cut in range(len(data), max(-1, len(data) - 4), -1):
        try:
            text = data[:cut].decode("utf-8")
        except UnicodeDecodeError:
            continue
        tail = data[cut:]
        if not tail:
            return text, b""
        try:
            tail.decode("utf-8")
        except UnicodeDecodeError as err:
            if err.reason == "unexpected end of data":  # a character started, not yet finished
                return text, tail
        return None
    return None


@dataclass(frozen=True, slots=True)
class JsonPrefix:
    """The answer so far, as a JSON (schema) parser state: immutable, so drafts can branch off."""

    parser: CharacterLevelParser | None  # None: the parser failed mid-answer, the rest is free
    pending: bytes = b""  # the start of a character the next bytes complete
    lexer: tuple[bool, bool, str] = (False, False, "")
    """Where the answer is, read as JSON text: inside a string, right after a backslash in one, and
    the last character outside strings but whitespace (the parser lets ``}`` or ``]`` follow ``,``
    in an object with keys left to write: ``{"a": 1,}``; this rules it out)."""

    @classmethod
    def start(cls, schema: Mapping[str, Any] | None) -> JsonPrefix | None:
        """Before the first character; ``schema`` None: any JSON value; None if the parser
        cannot take ``schema``."""
        parsed = _parser_schema(schema) if schema else None
        if schema and parsed is None:
            return None
        return cls(JsonSchemaParser(parsed, config=_CONFIG))

    def after(self, piece: bytes) -> JsonPrefix | None:
        """The state once ``piece`` is appended, or None if no valid JSON starts this way."""
        if self.parser is None:
            return self
        split = _split_utf8(self.pending + piece)
        if split is None:
            return None
        text, pending = split
        parser: CharacterLevelParser | None = self.parser
        in_string, escaped, last = self.lexer
        try:
            for char in text:
                if in_string:
                    if ord(char) < 0x20:
                        return None  # raw in a string: invalid JSON (a pattern's \s offered a tab, a line break)
                    in_string = escaped or char != '"'
                    escaped = not escaped and char == "\\"
                elif char in "}]" and last == ",":
                    return None  # a trailing comma
                else:
                    in_string = char == '"'
                if not in_string and not char.isspace():
                    last = char
                parser = _feed(parser, char)
                if parser is None:
                    return None
            if pending and not _may_start(parser, pending):
                return None
        except Exception:  # noqa: BLE001 - the parser raised on a schema it took: the answer goes on unconstrained
            return JsonPrefix(None)
        return JsonPrefix(parser, pending, (in_string, escaped, last))

    @property
    def complete(self) -> bool:
        """The answer may end here: a whole value that satisfies the schema (unconstrained: anywhere)."""
        if self.parser is None:
            return True
        try:
            return not self.pending and self.parser.can_end()
        except Exception:  # noqa: BLE001 - see after()
            return True

    @property
    def finished(self) -> bool:
        """Complete, and nothing but whitespace could follow: the answer is over."""
        if self.parser is None:
            return False
        try:
            return self.complete and not self.parser.get_allowed_characters().strip()
        except Exception:  # noqa: BLE001 - see after()
            return False

    def first_byte_ok(self, first: int) -> bool:
        """A cheap necessary condition for a piece starting with byte ``first`` (no pending bytes)."""
        if self.parser is None:
            return True
        try:
            if first == 0x5C:  # a backslash: a pattern string takes escapes the parser does not offer
                return True
            if first < 0x80:
                return chr(first) in self.parser.get_allowed_characters()
            return _may_start(self.parser, bytes([first]))
        except Exception:  # noqa: BLE001 - after() then drops the constraint
            return True


def start_state(schema: Mapping[str, Any] | None, prefix: str) -> JsonPrefix | None:
    """The constraint for an answer prefilled with ``prefix``; None when the parser cannot take
    this schema (then the request is validate-and-retry only) or the prefix is no JSON start."""
    try:
        state = JsonPrefix.start(schema)
    except Exception:  # noqa: BLE001 - the parser's schema model rejects what it does not support
        return None
    return None if state is None else state.after(prefix.encode("utf-8"))


def call_start_state(tools: Mapping[str, Mapping[str, Any]], forced: str) -> JsonPrefix | None:
    """The constraint of a forced tool call, after its prefill (``tools.call_prefix``): ``forced``
    names the tool (the prefill ends after ``"arguments":``) or is "any" (the prefill ends inside
    ``"name": "``, so the name must be one of ``tools``, each followed by its own arguments). The
    arguments must match the tool's parameter schema, and the call object closes with ``}``, where
    the answer ends. None when the parser cannot take a schema."""
    def arguments_then_close(schema: Mapping[str, Any]) -> list[CharacterLevelParser]:
        # No parameters given: any object (OpenAI's reading of an empty schema).
        parsed = _parser_schema(schema or {"type": "object"}, object_only=True)
        if parsed is None:
            raise _Unsupported(schema)
        return [JsonSchemaParser(parsed, config=_CONFIG), StringParser("}")]

    try:
        if forced != "any":
            return JsonPrefix(SequenceParser(arguments_then_close(tools[forced])))
        return JsonPrefix(UnionParser([SequenceParser([StringParser(f'{json.dumps(name)[1:]}, "arguments":'),
                                                       *arguments_then_close(schema)])
                                       for name, schema in tools.items()]), lexer=(True, False, ""))  # in the name
    except Exception:  # noqa: BLE001 - the parser's schema model rejects what it does not support
        return None


def _next_state(table: TokenTable, token: int, prefix: JsonPrefix) -> JsonPrefix | None:
    """The state after ``token``, or None if it breaks the JSON (EOS: only a complete answer)."""
    if token in table.eos_ids:
        return prefix if prefix.complete else None
    piece = table.pieces[token] if token < len(table.pieces) else b""
    if not piece or token in table.special_ids:
        return None
    if not prefix.pending and not prefix.first_byte_ok(piece[0]):
        return None
    return prefix.after(piece)


def constrained_token(sampler: Sampler, logits: torch.Tensor, support: int | None, table: TokenTable,
                      prefix: JsonPrefix) -> tuple[int, JsonPrefix] | None:
    """The drafter's next token under the constraint, and the state after it; None if no token of
    the vocabulary can continue (the answer cannot be completed).

    Greedy: the most likely valid token. Sampling: a draw from the sampler's distribution
    restricted to valid tokens (rejection draws, then, if those keep failing, the valid tokens
    among the rest checked one by one); where the nucleus holds no valid token, the greedy choice."""
    if not sampler.greedy:
        probs = sampler.distribution(logits, support).clone()
        for _ in range(_SAMPLE_TRIES):
            if float(probs.sum()) <= 0.0:
                break
            token = sampler.pick(probs)
            after = _next_state(table, token, prefix)
            if after is not None:
                return token, after
            probs[token] = 0.0
        left = torch.nonzero(probs > 0).flatten().tolist()
        valid = {t: s for t in left if (s := _next_state(table, t, prefix)) is not None}
        if valid:
            ids = list(valid)
            token = ids[sampler.pick(probs[ids])]
            return token, valid[token]
    return _greedy(logits, table, prefix)


def _greedy(logits: torch.Tensor, table: TokenTable, prefix: JsonPrefix) -> tuple[int, JsonPrefix] | None:
    """The most likely token that keeps the answer valid: the top ``_GREEDY_FIRST`` first, then the
    whole vocabulary in order of likelihood."""
    top = torch.topk(logits, min(_GREEDY_FIRST, logits.shape[-1])).indices.tolist()
    for token in top:
        after = _next_state(table, token, prefix)
        if after is not None:
            return token, after
    seen = set(top)
    for token in torch.argsort(logits, descending=True).tolist():
        if token not in seen and (after := _next_state(table, token, prefix)) is not None:
            return token, after
    return None
