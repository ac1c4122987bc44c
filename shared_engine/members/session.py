"""What every member's per-request session shares: longest-common-prefix sync, and ``step``.

A session holds the ids its member last saw and the distribution after them. ``sync`` to a new
target keeps the longest common prefix, reuses that distribution when the target only extends the
held ids from exactly there, and asks the backend (``_compute``) for the rest: the transformers
session feeds its KV cache (members/hf.py), a remote session asks its server (members/remote.py).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from ..alignment import common_prefix_len


class PrefixSession(ABC):
    """One request's view of a member: the ids it holds and the distribution after them.

    Implements the ``Session`` protocol of members/base.py; a backend implements ``_compute``.
    """

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.num_forwards = 0  # forward passes (or scoring requests) run for this request; never reset
        self.last_sync: tuple[int, int] = (0, 0)  # (kept, dropped) by the latest sync
        self.next_logits: torch.Tensor | None = None  # the distribution after ``ids``, when known

    def sync(self, target: list[int], first_row: int) -> torch.Tensor:
        """Hold ``target`` and return logits rows predicting ``target[first_row:]`` plus the one
        after the end: shape ``[len(target) - first_row + 1, vocab]``."""
        if not 1 <= first_row <= len(target):
            raise ValueError(f"first_row {first_row} outside 1..{len(target)}")
        lcp = common_prefix_len(self.ids, target)
        known = self.next_logits if lcp == len(self.ids) == first_row else None
        if known is not None and lcp == len(target):  # nothing new: the row is already here
            self.last_sync = (lcp, 0)
            return known.unsqueeze(0)
        # the row after ``ids`` is known: ask only for the rows after it
        rows = self._compute(target, first_row + 1 if known is not None else first_row, lcp)
        if known is not None:
            rows = torch.cat([known.unsqueeze(0), rows])
        self.next_logits = rows[-1]
        return rows

    def step(self, token: int) -> torch.Tensor:
        """Append one token; return the distribution after it."""
        return self.sync(self.ids + [token], len(self.ids) + 1)[-1]

    def rows_at(self, target: list[int], positions: Sequence[int]) -> dict[int, torch.Tensor]:
        """The distributions after ``target[:p]`` for each ``p`` in ``positions`` (1..len(target));
        the session then holds ``target[:max(positions)]``. Where a backend scores a block in one
        pass the rows between come with it (``sync``); where each row costs a decode step
        (llama.cpp), ``_compute_at`` computes only these and feeds the tokens between in batches."""
        wanted = sorted(set(positions))
        if not wanted:
            return {}
        if wanted[0] < 1 or wanted[-1] > len(target):
            raise ValueError(f"positions {wanted[0]}..{wanted[-1]} outside 1..{len(target)}")
        prefix = target[:wanted[-1]]
        lcp = common_prefix_len(self.ids, prefix)
        known = self.next_logits if lcp == len(self.ids) == wanted[0] else None
        rows = {wanted[0]: known} if known is not None else {}
        rest = wanted[1:] if known is not None else wanted
        if rest:
            rows.update(self._compute_at(prefix, rest, lcp))
            self.next_logits = rows[wanted[-1]]
        else:
            self.last_sync = (lcp, 0)
        return rows

    def _compute_at(self, target: list[int], positions: list[int], common: int) -> dict[int, torch.Tensor]:
        """``rows_at``'s backend part (``positions`` sorted, the last one ``len(target)``): by
        default one block from the first position, as ``sync`` computes it."""
        block = self._compute(target, positions[0], common)
        return {p: block[p - positions[0]] for p in positions}

    @abstractmethod
    def _compute(self, target: list[int], first_row: int, common: int) -> torch.Tensor:
        """Hold ``target`` (it shares ``common`` leading ids with ``self.ids``); return the rows
        predicting ``target[first_row:]`` plus the next one, and set ``ids``, ``last_sync`` and
        ``num_forwards``. ``first_row`` may be ``common + 1`` (the row after ``ids`` is known)."""
