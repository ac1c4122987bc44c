"""The small interface every member backend implements (transformers today; servers later)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from ..alignment import TokenTable
from .chat import Message


class Session(Protocol):
    """One request's state inside one member (its KV cache and the ids it holds)."""

    ids: list[int]
    num_forwards: int
    last_sync: tuple[int, int]

    def sync(self, target: list[int], first_row: int) -> torch.Tensor:
        """Hold ``target``; return logits predicting ``target[first_row:]`` and the next token."""

    def step(self, token: int) -> torch.Tensor:
        """Append one token; return the logits after it."""


class Member(Protocol):
    """A model the ensemble can draft with, verify with and fuse."""

    name: str
    table: TokenTable
    context_window: int
    stop_strings: tuple[str, ...]

    @property
    def eos_ids(self) -> frozenset[int]: ...

    def prompt_ids(self, messages: Sequence[Message]) -> list[int]: ...

    def new_session(self) -> Session: ...

    async def run(self, fn: Any, *args: Any) -> Any:
        """Run blocking compute for this member off the event loop."""
