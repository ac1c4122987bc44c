"""Picking a token (or a fused candidate) from scores: greedy, or temperature / top-p sampling."""

from __future__ import annotations

import hashlib

import torch


def generator_seed(seed: int) -> int:
    """The seed torch's CPU generator is given for a request's ``seed``. That generator (mt19937) keeps
    only the low 32 bits, so -1, 2**32 - 1 and 2**64 - 1 gave one answer, as did 0 and 2**32: a seed
    within 0..2**32-1 is used as it is (the answers of such seeds stay), any other is hashed to 32 bits
    from all its bits, so seeds that differ beyond the low 32 bits draw differently."""
    if 0 <= seed < 2**32:
        return seed
    digest = hashlib.blake2b(seed.to_bytes(9, "little", signed=True), digest_size=4).digest()
    return int.from_bytes(digest, "little")


class Sampler:
    """Greedy when temperature is 0; otherwise temperature + nucleus sampling with its own RNG
    (seeded per request, so a seeded request is reproducible whatever else runs concurrently with
    transformers members; llama.cpp batches are not batch-invariant, so its logits, and a draw, may vary).
    Below float32's tiny a temperature is greedy."""

    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, seed: int | None = None) -> None:
        self.temperature = temperature
        self.top_p = top_p
        self.generator = torch.Generator()
        if seed is None:
            self.generator.seed()  # non-deterministic, and leaves torch's global RNG alone
        else:
            self.generator.manual_seed(generator_seed(seed))

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
            return int(top.indices[self._sample(self._softmax(top.values))])
        return self._sample(self._softmax(logits))

    def distribution(self, logits: torch.Tensor, support: int | None = None) -> torch.Tensor:
        """The distribution ``from_logits`` draws from, over the whole vocabulary (sampling only)."""
        if support is not None and support < logits.shape[-1]:
            top = torch.topk(logits, support)
            probs = torch.zeros_like(logits, dtype=torch.float32)
            return probs.scatter_(-1, top.indices, self._nucleus(self._softmax(top.values)))
        return self._nucleus(self._softmax(logits.float()))

    def from_probs(self, probs: torch.Tensor) -> int:
        """Pick from (possibly unnormalised) probabilities, e.g. a fused distribution."""
        if self.greedy:
            return int(torch.argmax(probs))
        return self._sample(self._tempered(probs))

    def tempered(self, scores: torch.Tensor, among: torch.Tensor | None = None) -> torch.Tensor:
        """The distribution ``from_probs`` draws from: scores ** (1/T), normalised, nucleus. ``among``: a
        mask of the candidates that may be drawn, applied before the nucleus (the floor tempering gives
        a zero score, 1e-12 ** (1/T), adds up over many masked candidates at a high T and kept the
        nucleus from cutting the allowed ones)."""
        probs = self._tempered(scores)
        if among is not None:
            probs = probs * among
            probs = probs / probs.sum()
        return self._nucleus(probs)

    def _tempered(self, scores: torch.Tensor) -> torch.Tensor:
        return self._softmax(torch.log(scores.clamp_min(1e-12)))

    def _softmax(self, logits: torch.Tensor) -> torch.Tensor:
        """softmax(logits / T), shifted first: with a tiny T (1e-40) the quotient overflowed to inf
        and the softmax to NaN; shifted, it tends to the argmax as it should."""
        shifted = logits - logits.max(dim=-1, keepdim=True).values
        # A T below float32's tiny (1e-300) became 0.0 in the division, 0/0 NaN: clamped, it stays greedy.
        # One above float32's max (1e39) became inf, and a masked logit's -inf / inf NaN: clamped, uniform.
        f32 = torch.finfo(torch.float32)
        return torch.softmax(shifted / min(max(self.temperature, f32.tiny), f32.max), dim=-1)

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator))

    def pick(self, probs: torch.Tensor) -> int:
        """Draw an index from ``probs`` as given (no temperature, no nucleus)."""
        return int(torch.multinomial(probs / probs.sum(), 1, generator=self.generator))

    def _nucleus(self, probs: torch.Tensor) -> torch.Tensor:
        """``probs`` restricted to the top-p nucleus, renormalised."""
        if self.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            cumulative = torch.cumsum(sorted_probs, dim=-1)
            # the nucleus is the smallest set holding top_p of the mass (Holtzman et al.; HF, vLLM): a token
            # after which the mass already reaches top_p is outside it, also at exact equality
            cut = cumulative - sorted_probs >= self.top_p
            sorted_probs[cut] = 0.0
            probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
        return probs / probs.sum()

    def _sample(self, probs: torch.Tensor) -> int:
        return self.pick(self._nucleus(probs))


def speculative_choice(sampler: Sampler, target: torch.Tensor, proposal: torch.Tensor,
                       drafted: int | None) -> int:
    """Which of K candidates to commit where a drafted token meets a target distribution.

    Greedy: the target's argmax. Sampling: speculative sampling (Leviathan et al. 2023, Chen et al.
    2023): ``drafted`` (the candidate the draft spells, None if it spells none) was drawn from a
    distribution giving candidate k the probability ``proposal[k]`` (the rest of its mass lies on
    tokens that are no candidate); it is kept with probability min(1, target/proposal), otherwise
    the choice is drawn from the normalised residual max(0, target - proposal). The result is
    distributed exactly as ``target`` (which sums to 1), however the draft was drawn.

    A drafted candidate the proposal gives nothing (the draft came from a distribution other than
    ``proposal``) is no draft the rule can keep: it is rejected like a draft of no candidate. Where
    the residual is empty (target == proposal up to rounding, so a rejection had no probability),
    the choice is drawn from ``target`` itself: keeping the drafted candidate there committed one the
    target may give nothing."""
    if sampler.greedy:
        return int(torch.argmax(target))
    if drafted is not None and float(proposal[drafted]) > 0.0:
        ratio = float(target[drafted]) / float(proposal[drafted])
        if ratio >= 1.0 or sampler.uniform() < ratio:
            return drafted
    residual = (target - proposal).clamp_min(0.0)
    if float(residual.sum()) <= 0.0:
        return sampler.pick(target)
    return sampler.pick(residual)
