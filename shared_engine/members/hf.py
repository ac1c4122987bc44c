"""A transformers model as an ensemble member.

``HFMember`` holds what is shared by every request (weights, tokenizer, token table);
``HFSession`` holds one request's KV cache and the ids it was built from. Sessions are per
request, so concurrent requests never share a cache; forwards of one member are serialised by a
lock because two forwards on a 2-core CPU only slow each other down.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from ..alignment import TokenTable, common_prefix_len
from . import cache as kv
from .base import FULL_LOCAL, Capabilities
from .chat import PLAIN_TEMPLATE_STOPS, Message, render_prompt_ids


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
        self.stop_strings: tuple[str, ...] = () if tokenizer.chat_template else PLAIN_TEMPLATE_STOPS
        self.lock = threading.Lock()

    @classmethod
    def from_pretrained(cls, name: str, path: str | Path) -> HFMember:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        return cls(name, model, tokenizer)

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.table.eos_ids

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]:
        return render_prompt_ids(self.tokenizer, messages, tools)

    def new_session(self) -> HFSession:
        return HFSession(self)

    async def run(self, fn, *args):  # noqa: ANN001, ANN202 - thin off-loop helper
        """Run blocking model compute in a worker thread, one forward of this member at a time."""
        def locked():  # noqa: ANN202
            with self.lock:
                return fn(*args)
        return await asyncio.to_thread(locked)


class HFSession:
    """One request's view of a member: the ids its KV cache was built from, and the cache.

    Invariant: the cache holds exactly ``ids``; ``next_logits`` (if set) is the distribution
    after the last of them. All updates go through ``sync`` so that cropping is one mechanism.
    """

    def __init__(self, member: HFMember) -> None:
        self.member = member
        self.ids: list[int] = []
        self.cache = kv.new_cache(member.model)
        self.next_logits: torch.Tensor | None = None
        self.num_forwards = 0  # forward passes run for this request (never reset)
        self._fresh = True  # no forward since the cache was (re)created
        self.last_sync: tuple[int, int] = (0, 0)  # (kept, dropped) by the latest sync
        self._rollback_floor = 0  # sliding-window layers cannot roll back before this position

    def sync(self, target: list[int], first_row: int) -> torch.Tensor:
        """Make the cache hold ``target`` and return logits rows predicting ``target[first_row:]``
        plus the one after the end: shape ``[len(target) - first_row + 1, vocab]``.

        Keeps the cache for the longest common prefix with the ids it holds and feeds only the
        rest, in ONE forward pass (that is how a verifier scores a whole draft block).
        """
        if not 1 <= first_row <= len(target):
            raise ValueError(f"first_row {first_row} outside 1..{len(target)}")
        lcp = common_prefix_len(self.ids, target)
        reuse_last = lcp == len(self.ids) and self.next_logits is not None and first_row == lcp
        keep = lcp if reuse_last else min(lcp, first_row - 1)
        if lcp == len(target) == len(self.ids) and reuse_last:
            return self.next_logits.unsqueeze(0)
        keep = self._truncate(keep)
        window = self.member.sliding_window
        if self._fresh and window and len(target) >= window and first_row - 1 > keep:
            # Prefill the part that is never rolled back on its own: sliding-window layers keep
            # only their window of a forward run before rollback is enabled.
            self._forward(target[keep:first_row - 1], 1)
            keep = first_row - 1
        feed = target[keep:]
        rows_needed = len(target) - first_row + (0 if reuse_last else 1)
        logits = self._forward(feed, max(1, rows_needed))
        rows = torch.cat([self.next_logits.unsqueeze(0), logits]) if reuse_last else logits
        self.next_logits = rows[-1]
        return rows

    def _forward(self, feed: list[int], rows: int) -> torch.Tensor:
        """Feed ``feed`` after ``self.ids``; returns the last ``rows`` logits rows."""
        logits, self.cache = kv.forward_logits(self.member.model, self.member.cache_kwarg,
                                               self.cache, feed, rows)
        self.num_forwards += 1
        self.ids = self.ids + list(feed)
        if self._fresh:
            self._fresh = False
            kv.enable_rollback(self.cache)
            window = self.member.sliding_window
            self._rollback_floor = len(self.ids) if window and len(self.ids) >= window else 0
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

    def step(self, token: int) -> torch.Tensor:
        """Append one token; return the distribution after it."""
        return self.sync(self.ids + [token], len(self.ids) + 1)[-1]
