"""Version-robust KV-cache helpers for transformers 5.x.

transformers changed the cache API inside 5.x (see the project's reference, ensembling.md §5.5):
the forward kwarg became ``cache=`` on 5.24 (``past_key_values=`` before), outputs carry ``.cache``
instead of ``.past_key_values``, and ``Cache.crop`` only accepts a *negative* count (a positive one
raises on 5.24, and meant an absolute length before 5.15). Everything that touches a cache goes
through these functions so that the rest of the engine never sees those differences.

``bound_sliding`` is the one place that reaches into a cache layer's private fields: transformers has
no public way to keep *some* recorded past of a sliding-window layer (``crop(0)`` drops all of it).
It checks those fields first and raises if a transformers version changed them.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import transformers
from transformers import DynamicCache, PreTrainedModel, cache_utils

from .devices import input_device, to_host


def cache_kwarg_name(model: PreTrainedModel) -> str:
    """The forward keyword that takes the cache: ``cache`` on >= 5.24, else ``past_key_values``."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def output_cache(output: Any) -> Any:
    """The cache a forward returned, whatever the output field is called."""
    cache = getattr(output, "cache", None)
    return cache if cache is not None else getattr(output, "past_key_values", None)


def new_cache(model: PreTrainedModel) -> DynamicCache:
    """A fresh dynamic cache with per-layer types (full / sliding window) taken from the config."""
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older 5.x signatures
        return DynamicCache()


def cache_length(cache: Any) -> int:
    """Number of positions the cache holds (cumulative, also for sliding-window layers)."""
    return 0 if cache is None else int(cache.get_seq_length())


def truncate(cache: Any, keep: int) -> None:
    """Keep the first ``keep`` positions. Only ever passes a negative count: ``crop(0)`` and positive
    counts mean different things (or raise) across 5.x versions."""
    remove = cache_length(cache) - keep
    if remove > 0:
        cache.crop(-remove)


def enable_rollback(cache: Any) -> None:
    """Let sliding-window layers roll back past their window (5.15+). Call after the prefill forward."""
    activate = getattr(cache, "activate_past_recording", None)
    if activate is not None:
        activate()


_SLIDING_LAYER: type | None = getattr(cache_utils, "DynamicSlidingWindowLayer", None)
_SLIDING_FIELDS = ("sliding_window", "cumulative_length", "keys", "values", "is_initialized")
"""What ``bound_sliding`` reads of a recording sliding-window layer (transformers 5.24's
``DynamicSlidingWindowLayer``: it attends to the last ``sliding_window - 1`` cached positions and the
new ones, so positions before those serve only a later ``crop``)."""


def bound_sliding(cache: Any, depth: int) -> int:
    """Drop what no rollback of at most ``depth`` positions can need from every sliding-window layer
    that records its past (``enable_rollback``): it keeps ``window - 1 + depth`` positions, enough
    for ``crop`` to rebuild its window ``depth`` back. Recording keeps every position until a crop,
    so a long answer that never rolls back grew these layers to its whole length. Returns the most
    positions a sliding layer holds afterwards (0: none records)."""
    held = 0
    layers: list[Any] = list(getattr(cache, "layers", None) or ())
    for layer in layers:
        if not (getattr(layer, "is_sliding", False) and getattr(layer, "record_past", False)):
            continue
        missing = [f for f in _SLIDING_FIELDS if not hasattr(layer, f)]
        known = _SLIDING_LAYER is not None and isinstance(layer, _SLIDING_LAYER)
        if not known or missing:
            raise RuntimeError(f"transformers {transformers.__version__} changed its sliding-window cache layer "
                               f"({type(layer).__name__}, missing {missing or 'nothing'}): "
                               "shared_engine/members/cache.py bound_sliding must be updated for it")
        if not layer.is_initialized:
            continue
        length, window = int(layer.keys.shape[-2]), int(layer.sliding_window)
        if length > int(layer.cumulative_length):
            raise RuntimeError(f"transformers {transformers.__version__}: a sliding-window layer holds {length} "
                               f"positions of {layer.cumulative_length}; shared_engine/members/cache.py "
                               "bound_sliding must be updated for this version")
        keep = window - 1 + max(depth, 0)
        if layer.cumulative_length >= window and length > keep:  # below the window crop keeps them all
            layer.keys, layer.values = layer.keys[..., -keep:, :], layer.values[..., -keep:, :]
        held = max(held, int(layer.keys.shape[-2]))
    return held


def is_croppable(cache: Any) -> bool:
    """Whether ``truncate`` can restore an earlier state (False for recurrent/linear-attention layers)."""
    return bool(getattr(cache, "is_croppable", True))


def sliding_window(model: PreTrainedModel) -> int | None:
    """The sliding-window size if any layer uses one (such layers can roll back only so far)."""
    config = model.config
    layer_types = getattr(config, "layer_types", None) or []
    window = getattr(config, "sliding_window", None)
    if window and (not layer_types or any("sliding" in t for t in layer_types)):
        return int(window)
    return None


@torch.inference_mode()
def forward_logits(model: PreTrainedModel, cache_kwarg: str, cache: Any, ids: list[int],
                   keep_logits: int) -> tuple[torch.Tensor, Any]:
    """Feed ``ids`` after what ``cache`` holds; return the last ``keep_logits`` rows of logits
    (on the CPU in float32, shape [keep_logits, vocab]: ``devices.to_host``) and the cache, which
    stays on the model's device. Positions come from the cache length."""
    input_ids = torch.tensor([ids], dtype=torch.long, device=input_device(model))
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=keep_logits,
                **{cache_kwarg: cache})
    return to_host(out.logits[0, -keep_logits:]), output_cache(out)
