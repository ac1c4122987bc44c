"""The decoding round shared by every method, and the per-request state it advances."""

from .round import FusionSettings, decode_round
from .state import RequestState

__all__ = ["FusionSettings", "RequestState", "decode_round"]
