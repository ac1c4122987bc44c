"""Validating a JSON value against a JSON schema, as the engine checks a structured answer and a
forced call's arguments (``tools.py``): ``jsonschema`` with its format checker, read where its Python
reading of a schema differs from JSON Schema's own (``$ref`` cycles, ECMA-262 patterns)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import referencing.exceptions

from .json_regex import _atoms


def schema_error(value: Any, schema: Mapping[str, Any]) -> str | None:
    """Why ``value`` does not match ``schema`` (None: it does), as "where: what"."""
    # formats too ("checked and retried"): without a format_checker jsonschema only annotates them;
    # date-time and time need rfc3339-validator (a base dependency), the rest the standard library
    cls = _validator_class(jsonschema.validators.validator_for(schema))
    validator = cls(schema, format_checker=cls.FORMAT_CHECKER)
    try:
        problem = jsonschema.exceptions.best_match(validator.iter_errors(value))
    except referencing.exceptions.Unresolvable:  # a $ref leading nowhere (a tool's schema is checked, not
        return None  # resolved): no verdict, the value stands (a forced call crashed the request: a 500)
    if problem is None:
        return None
    where = "/".join(map(str, problem.absolute_path)) or "the object"
    return f"{where}: {problem.message}"


@functools.lru_cache(maxsize=256)
def _ecma_anchors(pattern: str) -> str:
    """``pattern`` for Python's ``re`` with ``$`` read as ECMA-262 reads it (JSON Schema's patterns are
    ECMA-262): the end of the string only. ``re`` also matches ``$`` before a trailing line break, so
    ``"a\\n"`` passed ``^a$`` (the constraint does not let it be written; an unconstrained answer or a
    dropped constraint's got through, and a strict reader, pydantic's, refuses it)."""
    return "".join("\\Z" if atom == "$" else atom for atom in _atoms(pattern))


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Iterator[Any]:
    if validator.is_type(instance, "string") and not re.search(_ecma_anchors(pattern), instance):
        yield jsonschema.exceptions.ValidationError(f"{instance!r} does not match {pattern!r}")


def _validator_class(cls: Any) -> Any:
    """``cls`` with ECMA-262 ``pattern`` anchors (``_ecma_anchors``) and a ``$ref`` that fails where it
    would read the same value through the same reference again.

    Definitions that are each other's union options (``A: anyOf ["a", B]``, ``B: anyOf [A, 1]``) sent
    jsonschema round them without end, on a valid value too where the cycle's branch comes first: a
    RecursionError instead of the answer (the constraint writes such schemas). A value matches a
    definition only through a finite path of branches, so a path that comes back to the same value and
    reference adds nothing: failing it leaves the verdict that of the schema. The same value is the same
    object (a child value is another object; a parent's frames are never a child's)."""
    resolve = cls.VALIDATORS["$ref"]
    reading: set[tuple[int, str]] = set()

    def ref(validator: Any, ref: str, instance: Any, schema: Any) -> Any:
        key = (id(instance), ref)
        if key in reading:
            yield jsonschema.exceptions.ValidationError(f"{ref} leads back to itself here")
            return
        reading.add(key)
        try:
            yield from resolve(validator, ref, instance, schema)
        finally:
            reading.discard(key)

    return jsonschema.validators.extend(cls, {"$ref": ref, "pattern": _pattern})
