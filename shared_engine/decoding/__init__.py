"""The decoding rounds (SAFE's token round, AdaFuse's span round), the per-request state they advance
(one record per member), and the report that turns their decisions into stats and events."""

from .adafuse import AdaFuseSettings, adafuse_round
from .round import FusionSettings, decode_round
from .state import RequestMember, RequestState, request_members

__all__ = ["AdaFuseSettings", "FusionSettings", "RequestMember", "RequestState", "adafuse_round", "decode_round",
           "request_members"]
