"""A transformers model as an ensemble member.

``HFMember`` holds what is shared by every request (weights, tokenizer, token table);
``HFSession`` holds one request's KV cache and the ids it was built from. Sessions are per
request, so concurrent requests never share a cache; forwards of one member are serialised
because two forwards on a 2-core CPU only slow each other down.

Members on one device compute on **one thread per device** (``HFMember.run``, ``compute_thread``).
torch's CPU kernels run on an OpenMP team that belongs to the calling thread, and every thread that
has run one keeps its team: forwards handed to whichever worker of a pool was free
(``asyncio.to_thread``) built a team per worker, and the teams took the cores from each other.
SmolLM2 decoded at 17-18 tok/s that way and 30 on one thread; Qwen alone at 11.0 tok/s, and at 9.1
once another thread had run SmolLM2's forward (docs/speed.md). Members on different GPUs keep
threads of their own, so their forwards can overlap.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from ..alignment import TokenTable
from ..errors import InvalidRequestError
from . import cache as kv
from . import devices
from .base import FULL_LOCAL, Capabilities, R
from .chat import PLAIN_TEMPLATE_STOPS, Message, render_prompt_ids, render_text_ids
from .session import PrefixSession

ROLLBACK_DEPTH = 256
"""How far back a sliding-window layer keeps what a rollback needs (positions), besides the latest
forward's feed: the engine rolls a session back over what it has not committed, a draft and the
overlapped draft after it (``max_draft_length`` <= 64 each), a verifier's reading of them in its own
tokens, an AdaFuse span (8 tokens a word, ``max_words`` <= 16); a scorer back to the row before its
latest forward (calibration, auto weights) whatever its length. A deeper rollback re-prefills, exact
as always."""

_COMPUTE_THREADS: dict[tuple[int, str], ThreadPoolExecutor] = {}
_COMPUTE_THREADS_LOCK = threading.Lock()


def compute_thread(device: str) -> ThreadPoolExecutor:
    """The one thread that runs every in-process forward on ``device`` (the module docstring says why).
    Per process: a forked child inherits the executor but not its thread, and would wait forever."""
    key = (os.getpid(), device)
    with _COMPUTE_THREADS_LOCK:
        if key not in _COMPUTE_THREADS:
            _COMPUTE_THREADS[key] = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"compute-{device}")
        return _COMPUTE_THREADS[key]


_MEMBERS: weakref.WeakSet[HFMember] = weakref.WeakSet()
"""Every transformers member of this process, for ``_after_fork_in_child``."""


def _after_fork_in_child() -> None:
    """A forked child keeps the transformers members (``members._after_fork_in_child``), but not the
    threads of the parent: a lock one of them held at the fork (a forward running in another thread,
    ``HFMember.lock``; a compute thread being made) stays held in the child, and its first forward
    waited for it forever. Every such lock is a new one; the parent's compute threads are forgotten
    (the child starts its own: ``compute_thread``)."""
    global _COMPUTE_THREADS_LOCK
    _COMPUTE_THREADS_LOCK = threading.Lock()
    _COMPUTE_THREADS.clear()
    for member in list(_MEMBERS):
        member.lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class HFMember:
    """One model, its tokenizer and the operations every decoder needs."""

    capabilities: Capabilities = FULL_LOCAL

    def __init__(self, name: str, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> None:
        self.name = name
        self.model = model.eval()
        self.tokenizer = tokenizer
        eos = set()
        gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        for value in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
            if value is not None:
                eos.add(int(value))
        vocab = int(getattr(model.config, "vocab_size", 0) or 0)
        self.table = TokenTable(tokenizer, vocab_size=vocab, eos_ids=eos)
        self.cache_kwarg = kv.cache_kwarg_name(model)
        self.sliding_window = kv.sliding_window(model)
        self.context_window = int(getattr(model.config, "max_position_embeddings", 2048) or 2048)
        self.rollback_depth = ROLLBACK_DEPTH  # sliding-window layers keep what a rollback this deep needs
        self.stop_strings: tuple[str, ...] = () if tokenizer.chat_template else PLAIN_TEMPLATE_STOPS
        self.lock = threading.Lock()  # held during each forward: whoever must wait for the one in flight
        self.devices = "+".join(sorted({str(p.device) for p in model.parameters()}))
        """The devices holding the weights, e.g. ``cpu`` or ``cuda:0+cuda:1`` (one compute thread each)."""
        self._fingerprint: str | None = None
        _MEMBERS.add(self)

    @classmethod
    def from_pretrained(cls, name: str, path: str | Path, *, device: str | None = None,
                        device_map: str | dict[str, int | str] | None = None, dtype: str | None = None,
                        attn_implementation: str | None = None, compile: bool = False) -> HFMember:
        """Load a local HF folder in ``dtype`` (default float32) on ``device`` (default cpu) or spread
        by ``device_map``; logits leave the device only as float32 CPU rows (members/devices.py).
        ``compile``: the forward runs through ``torch.compile`` with dynamic shapes, so the engine's
        varying feeds (prefill, draft blocks, one token) and growing dynamic cache reuse one graph
        instead of recompiling per length."""
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        extra: dict[str, object] = {"attn_implementation": attn_implementation} if attn_implementation else {}
        if device_map is not None or (device is not None and devices.check_device(device).type != "cpu"):
            extra["device_map"] = device_map if device_map is not None else device  # straight onto it
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=devices.torch_dtype(dtype or "float32"),
                                                         **extra)
        except (ValueError, ImportError) as err:  # a kernel this model or machine lacks: one line, not a traceback
            if attn_implementation and (isinstance(err, ImportError)
                                        or any(word in str(err).lower() for word in ("attn", "attention"))):
                reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
                raise InvalidRequestError(
                    f"member {name!r}: attn_implementation={attn_implementation!r} cannot be used: {reason}") from None
            raise
        member = cls(name, model, tokenizer)  # reads forward's signature (the cache keyword) unwrapped
        if compile:
            model.forward = torch.compile(model.forward, dynamic=True)
        return member

    @property
    def placement(self) -> str:
        """Where the weights live and in which dtype, e.g. ``cuda:0 bfloat16`` (for reports)."""
        return f"{self.devices} {str(self.model.dtype).removeprefix('torch.')}"

    def fingerprint(self) -> str:
        """The model's config, placement and dtype, its vocabulary's pieces, and each weight tensor's
        name, shape and first and last values (computed once): two processes that load the same weights
        the same way agree, a retrained or re-quantised model does not. Sampled, not a hash of every
        weight, so it costs milliseconds, not a pass over the whole model."""
        if self._fingerprint is None:
            digest = hashlib.sha256(f"hf|{self.placement}|{self.model.config.to_json_string()}".encode())
            digest.update(b"\0".join(piece or b"" for piece in self.table.pieces))
            with torch.no_grad():
                for name, tensor in self.model.state_dict().items():
                    flat = tensor.detach().reshape(-1)
                    sample = torch.cat([flat[:32], flat[-32:]]).float().cpu()
                    digest.update(f"{name}|{tuple(tensor.shape)}|{tensor.dtype}".encode())
                    digest.update(sample.numpy().tobytes())
            self._fingerprint = digest.hexdigest()
        return self._fingerprint

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.table.eos_ids

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]:
        return render_prompt_ids(self.tokenizer, messages, tools)

    def text_prompt_ids(self, text: str) -> list[int]:
        return render_text_ids(self.tokenizer, text)

    def new_session(self) -> HFSession:
        return HFSession(self)

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """Run blocking model compute on this member's own thread, one forward at a time (the
        module docstring says why one thread, not a pool)."""
        def locked() -> R:
            with self.lock:
                return fn(*args)
        return await asyncio.get_running_loop().run_in_executor(compute_thread(self.devices), locked)



class HFSession(PrefixSession):
    """One request's view of a member: the ids its KV cache was built from, and the cache.

    Invariant: the cache holds exactly ``ids``; ``next_logits`` (if set) is the distribution
    after the last of them. All updates go through ``sync`` so that cropping is one mechanism.
    """

    def __init__(self, member: HFMember) -> None:
        super().__init__()
        self.member = member
        self.cache: DynamicCache | None = kv.new_cache(member.model)  # None once closed
        self._fresh = True  # no forward since the cache was (re)created
        self._rollback_floor = 0  # sliding-window layers cannot roll back before this position

    def _compute(self, target: list[int], first_row: int, common: int) -> torch.Tensor:
        """Keep the cache for the common prefix (up to the row before ``first_row``) and feed the
        rest in ONE forward pass (that is how a verifier scores a whole draft block)."""
        keep = self._truncate(min(common, first_row - 1))
        window = self.member.sliding_window
        if self._fresh and window and len(target) >= window and first_row - 1 > keep:
            # Prefill the part that is never rolled back on its own: sliding-window layers keep
            # only their window of a forward run before rollback is enabled.
            self._forward(target[keep:first_row - 1], 1)
            keep = first_row - 1
        return self._forward(target[keep:], max(1, len(target) - first_row + 1))

    def _forward(self, feed: list[int], rows: int) -> torch.Tensor:
        """Feed ``feed`` after ``self.ids``; returns the last ``rows`` logits rows."""
        logits, self.cache = kv.forward_logits(self.member.model, self.member.cache_kwarg,
                                               self.cache, feed, rows)
        self.num_forwards += 1
        start, self.ids = len(self.ids), self.ids + list(feed)
        window = self.member.sliding_window
        if self._fresh:
            self._fresh = False
            kv.enable_rollback(self.cache)
            self._rollback_floor = len(self.ids) if window and len(self.ids) >= window else 0
        elif window:
            # Recording keeps every position of a sliding layer until a crop: keep only what a rollback
            # to the row before this feed (a scorer's next text), or ``rollback_depth`` back, needs;
            # deeper ones re-prefill.
            floor = max(self._rollback_floor, min(start - 1, len(self.ids) - self.member.rollback_depth))
            if len(self.ids) >= window:
                self._rollback_floor = floor
            kv.bound_sliding(self.cache, len(self.ids) - floor)
        return logits

    def _truncate(self, keep: int) -> int:
        """Crop the cache to ``keep`` positions; returns the positions really kept."""
        dropped = len(self.ids) - keep
        self.last_sync = (keep, max(dropped, 0))
        if dropped <= 0:
            return len(self.ids)
        window = self.member.sliding_window
        if (window and len(self.ids) >= window and keep < self._rollback_floor) \
                or not kv.is_croppable(self.cache):
            # Cannot roll back that far: start over (correct, rare, and costs one prefill).
            self.cache = kv.new_cache(self.member.model)
            self._fresh = True
            self.ids, self._rollback_floor = [], 0
            self.last_sync = (0, dropped + keep)
            return 0
        kv.truncate(self.cache, keep)
        if window and len(self.ids) >= window:  # sliding layers now hold only the last window
            self._rollback_floor = keep
        self.ids = self.ids[:keep]
        self.next_logits = None
        return keep

    def close(self) -> None:
        """Drop the KV cache now (the request has ended); the session must not be used again."""
        self.cache, self.next_logits, self.ids = None, None, []
