"""Integer bounds of a JSON schema as the decoding constraint writes them (``json_constraint``): the
parser reads no ``minimum``/``maximum``, so a small bounded range is given to it as the enum of its values."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

_RANGE_AS_ENUM = 256
"""The most integers a bounded ``integer`` schema is written as an enum of (``_integer_range``)."""


def _integer_range(schema: Mapping[str, Any]) -> list[int] | None:
    """The integers a bounded ``integer`` schema allows, where they are few: the parser does not read
    ``minimum``/``maximum`` (or the exclusive ones, ``multipleOf``), so ``{"minimum": 1, "maximum": 8}``
    let 99 be written, refused after (retries wasted on the same value). None: unbounded, too many
    (left to the validation), or none at all."""
    bounds = {k: v for k, v in schema.items() if k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
              and isinstance(v, (int, float)) and not isinstance(v, bool)}
    lows = [math.ceil(bounds["minimum"])] if "minimum" in bounds else []
    lows += [math.floor(bounds["exclusiveMinimum"]) + 1] if "exclusiveMinimum" in bounds else []
    highs = [math.floor(bounds["maximum"])] if "maximum" in bounds else []
    highs += [math.ceil(bounds["exclusiveMaximum"]) - 1] if "exclusiveMaximum" in bounds else []
    if not lows or not highs or not 0 <= min(highs) - max(lows) < _RANGE_AS_ENUM:
        return None
    low, high, step = max(lows), min(highs), schema.get("multipleOf")
    if any(isinstance(schema.get(k), bool) for k in ("exclusiveMinimum", "exclusiveMaximum")):
        return None  # draft 4's exclusive flags: left to the validation
    exact = isinstance(step, int) and not isinstance(step, bool)  # v / step is inexact past 2**53 (10**18 + 1 passed 7)
    values = [v for v in range(low, high + 1)
              if not isinstance(step, (int, float)) or isinstance(step, bool) or step <= 0
              or (v % step == 0 if exact else (v / step).is_integer())]
    return values or None
