"""The small interface every member backend implements (transformers, llama.cpp, vLLM, SGLang).

Decoders only ever call what is declared here. ``Capabilities`` says what a backend can deliver so
that callers (and, later, decoders) can adapt instead of branching on the member's type.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol, TypeVar

import torch
from pydantic import BaseModel, ConfigDict, model_validator

from ..alignment import TokenTable
from .chat import Message

R = TypeVar("R")


class Capabilities(BaseModel):
    """What a member backend can deliver.

    ``distribution``: ``"full"`` = exact logits over the whole vocabulary; ``"top_k"`` = only the
    ``k`` most likely ids are exact (the rest of the mass is spread evenly, see members/topk.py).
    ``block_scoring``: a draft block is scored in one forward pass (False: one decode step per
    position, as llama.cpp's multi-prompt trick does). ``prefix_cache``: a growing sequence only
    pays for its new tokens. ``token_id_prompts``: prompts go in as token ids, never re-tokenized.
    ``computes_apart``: the forwards run on compute this process does not use (a server reached at
    a URL), so they proceed at full speed while another member computes. In-process members share
    this machine's cores: transformers members one compute thread per device (members/hf.py), an
    in-process llama.cpp server threads of its own on the same cores.
    """

    model_config = ConfigDict(frozen=True)

    distribution: Literal["full", "top_k"] = "full"
    k: int | None = None
    block_scoring: bool = True
    prefix_cache: bool = True
    token_id_prompts: bool = True
    computes_apart: bool = False

    @model_validator(mode="after")
    def _k_matches(self) -> Capabilities:
        if (self.distribution == "top_k") != (self.k is not None):
            raise ValueError("k is required for (and only for) distribution='top_k'")
        if self.k is not None and self.k < 1:
            raise ValueError("k must be >= 1")
        return self


FULL_LOCAL = Capabilities()
"""An in-process model with exact logits and a rollback-able KV cache (transformers)."""


class Session(Protocol):
    """One request's state inside one member (its KV cache and the ids it holds)."""

    ids: list[int]
    num_forwards: int
    last_sync: tuple[int, int]

    def sync(self, target: list[int], first_row: int) -> torch.Tensor:
        """Hold ``target``; return logits predicting ``target[first_row:]`` and the next token."""

    def step(self, token: int) -> torch.Tensor:
        """Append one token; return the logits after it."""

    def rows_at(self, target: list[int], positions: Sequence[int]) -> dict[int, torch.Tensor]:
        """Hold (a prefix of) ``target``; return the logits after ``target[:p]`` for each ``p`` in
        ``positions`` only (a backend that pays per row computes no others)."""


class Member(Protocol):
    """A model the ensemble can draft with, verify with and fuse."""

    name: str
    table: TokenTable
    context_window: int
    stop_strings: tuple[str, ...]
    capabilities: Capabilities

    @property
    def eos_ids(self) -> frozenset[int]: ...

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]:
        """Prompt ids in the member's own chat format; ``tools`` (OpenAI format) rendered by its
        template where it can, else by ``shared_engine.tools``' documented fallback."""

    def text_prompt_ids(self, text: str) -> list[int]:
        """Prompt ids for plain text the answer continues, in no chat format (``raw_prompt``):
        the tokenizer's encoding with its usual special tokens (a BOS once, where it adds one)."""

    def new_session(self) -> Session: ...

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """Run blocking compute for this member off the event loop."""


def member_fingerprint(member: Member) -> str | None:
    """What identifies a member's numbers across processes (its weights, vocabulary and numerics), so a
    score computed in one process can be reused in another: the member's ``fingerprint()`` where it has
    one. None where this process cannot know (a server at a URL, whose model may change behind it): then
    nothing of that member is kept across processes."""
    fingerprint = getattr(member, "fingerprint", None)
    return fingerprint() if callable(fingerprint) else None


def exact_support(member: Member) -> int | None:
    """How many of a member's most likely ids are exact (None: all of them), from its declared
    capabilities: decoders adapt to top-K backends instead of branching on the member type."""
    caps = getattr(member, "capabilities", None)
    return caps.k if caps is not None and caps.distribution == "top_k" else None
