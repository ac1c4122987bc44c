"""The decoding rounds (SAFE's token round, AdaFuse's span round), the per-request state they advance
(one record per member), and the report that turns their decisions into stats and events.

The names load on first use (``shared_engine/lazy.py``): ``decoding.report`` alone needs no torch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..lazy import exports, lazy_attributes

if TYPE_CHECKING:
    from .adafuse import AdaFuseSettings, adafuse_round
    from .round import FusionSettings, decode_round
    from .state import RequestMember, RequestState, request_members

_EXPORTS = exports(adafuse=("AdaFuseSettings", "adafuse_round"), round=("FusionSettings", "decode_round"),
                   state=("RequestMember", "RequestState", "request_members"))
__all__ = ["AdaFuseSettings", "FusionSettings", "RequestMember", "RequestState", "adafuse_round", "decode_round",
           "request_members"]
__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)
