"""The decoding rounds (SAFE's token round, AdaFuse's span round) and the per-request state they advance."""

from .adafuse import AdaFuseSettings, adafuse_round
from .round import FusionSettings, decode_round
from .state import RequestState

__all__ = ["AdaFuseSettings", "FusionSettings", "RequestState", "adafuse_round", "decode_round"]
