"""Picking a token (or a fused candidate) from scores: greedy, or temperature / top-p sampling."""

from __future__ import annotations

import torch


class Sampler:
    """Greedy when temperature is 0; otherwise temperature + nucleus sampling with its own RNG
    (seeded per request, so a seeded request is reproducible whatever else runs concurrently)."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()  # non-deterministic, and leaves torch's global RNG alone
        else:
            self.generator.manual_seed(seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def from_logits(self, logits: torch.Tensor, support: int | None = None) -> int:
        """``support``: only the ``support`` most likely ids are real (a top-K backend); sampling
        never picks from the evenly spread rest."""
        if self.greedy:
            return int(torch.argmax(logits))
        if support is not None and support < logits.shape[-1]:
            top = torch.topk(logits, support)
            return int(top.indices[self._sample(torch.softmax(top.values / self.temperature, dim=-1))])
        return self._sample(torch.softmax(logits / self.temperature, dim=-1))

    def from_probs(self, probs: torch.Tensor) -> int:
        """Pick from (possibly unnormalised) probabilities, e.g. a fused distribution."""
        if self.greedy:
            return int(torch.argmax(probs))
        logp = torch.log(probs.clamp_min(1e-12)) / self.temperature
        return self._sample(torch.softmax(logp, dim=-1))

    def _sample(self, probs: torch.Tensor) -> int:
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            cut = cumulative - sorted_probs > self.top_p  # drop tokens outside the nucleus
            sorted_probs[cut] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator))
