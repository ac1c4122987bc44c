"""Member weights from likelihoods: pure math, no models (the engine and ``calibrate`` feed it).

Two uses:

- ``weights="auto"`` (per request): Pack of LLMs' *PackLLM-sim* (Mavromatis et al., arXiv
  2404.11531; released code ``downstream_tasks/modeling_llm_fusion.py``, ``fusion == 'sim'``):
  ``w = softmax(-loss_m / tau)`` with ``loss_m`` the member's mean token cross-entropy of the
  prompt (log-perplexity) and ``tau = 1``. PackLLM maps every model onto ONE reference tokenizer
  before taking the mean; members here keep their own vocabularies, so a per-token mean would
  favour whichever tokenizer cuts the text into more, easier pieces. We therefore take each
  member's total NLL of the same bytes (the messages' contents, not the template markup, which
  differs per member) and express it per *reference* token: ``loss_m = nll_per_byte_m *
  bytes_per_token_ref`` with the drafter as reference (PackLLM's reference is also a member's
  tokenizer). For a single tokenizer this is exactly PackLLM's loss.
- ``calibrate`` (once, on labelled dev data): the weights that maximise the likelihood of the
  reference answers under the weighted *mixture of probabilities* (what UniTE/GaC fusion computes),
  evaluated span by span between token boundaries that every member shares (where SAFE fuses).
  The problem is concave in the weights; EM (``mixture_weights``) reaches its maximum.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PACKLLM_TEMPERATURE = 1.0
"""PackLLM-sim's released temperature (``tau = 1``)."""


@dataclass(frozen=True, slots=True)
class TextFit:
    """How well one member predicts a text: total NLL (nats) of the tokens scored, and what they spell."""

    nll: float
    num_bytes: int
    num_tokens: int

    @property
    def nll_per_byte(self) -> float:
        return self.nll / self.num_bytes if self.num_bytes else math.nan


def token_nlls(rows: torch.Tensor, ids: Sequence[int]) -> torch.Tensor:
    """NLL (nats) of ``ids[i]`` under logits ``rows[i]``, for every i."""
    if rows.shape[0] != len(ids):
        raise ValueError(f"{rows.shape[0]} logits rows for {len(ids)} tokens")
    if not ids:
        return torch.zeros(0)
    logp = torch.log_softmax(rows.float(), dim=-1)
    return -logp.gather(1, torch.tensor(list(ids), dtype=torch.long).unsqueeze(1)).squeeze(1)


def content_spans(rendered: bytes, contents: Sequence[str]) -> list[tuple[int, int]]:
    """Byte spans of the messages' contents inside a rendered prompt, searched in order (a chat
    template copies each content once, in order; one it rewrote is not found and left out)."""
    spans, at = [], 0
    for text in contents:
        piece = text.strip().encode("utf-8")
        if not piece:
            continue
        found = rendered.find(piece, at)
        if found < 0:
            continue
        spans.append((found, found + len(piece)))
        at = found + len(piece)
    return spans


def tokens_inside(pieces: Sequence[bytes], spans: Sequence[tuple[int, int]], whole: bool = False) -> list[int]:
    """Indices of the tokens (never the first: nothing predicts it) whose bytes lie inside a span,
    the whitespace a token starts with aside: the first word of a message is " Hello" in a plain
    "User: Hello" prompt and "▁Hello" in SentencePiece, and every member must score every word.
    ``whole``: only tokens wholly inside, their leading whitespace too (drafter='auto''s measured rule)."""
    inside, start = [], 0
    for i, piece in enumerate(pieces):
        end = start + len(piece)
        first = start if whole else start + len(piece) - len(piece.lstrip(_WHITESPACE))
        if i > 0 and first < end and any(a <= first and end <= b for a, b in spans):
            inside.append(i)
        start = end
    return inside


_WHITESPACE = b" \t\n\r"


def fit_of(nlls: torch.Tensor, piece_lengths: Sequence[int], scored: Sequence[int]) -> TextFit:
    """The fit over the ``scored`` token indices; ``nlls[i - 1]`` is token i's NLL (rows start at 1)."""
    if not scored:
        return TextFit(0.0, 0, 0)
    index = torch.tensor([i - 1 for i in scored], dtype=torch.long)
    return TextFit(float(nlls[index].sum()), sum(piece_lengths[i] for i in scored), len(scored))


def reference_losses(fits: Sequence[TextFit], reference: int = 0) -> list[float]:
    """Each member's NLL of the text per token of the ``reference`` member's tokenization
    (PackLLM's loss with the reference tokenizer, without re-mapping any vocabulary)."""
    ref = fits[reference]
    if any(f.num_bytes == 0 for f in fits) or ref.num_tokens == 0:
        raise ValueError("a member scored no bytes of the text")
    bytes_per_token = ref.num_bytes / ref.num_tokens
    return [f.nll_per_byte * bytes_per_token for f in fits]


def packllm_weights(losses: Sequence[float], temperature: float = PACKLLM_TEMPERATURE) -> list[float]:
    """PackLLM-sim: ``softmax(-loss / temperature)``; a lower loss (better fit) weighs more."""
    if temperature <= 0:
        raise ValueError("temperature must be > 0")
    values = torch.tensor(list(losses), dtype=torch.float64)
    # +inf: a member that gave a prompt token no probability at all (a top-K backend) weighs nothing
    if values.isnan().any() or (values == -math.inf).any() or not torch.isfinite(values).any():
        raise ValueError(f"losses must be finite (or +inf for some), got {list(losses)}")
    return torch.softmax(-values / temperature, dim=0).tolist()


# --------------------------------------------------------------------------- calibration


def segment_logprobs(ends: Sequence[Sequence[int]], logprobs: Sequence[Sequence[float]],
                     common: Sequence[int]) -> torch.Tensor:
    """Each member's log-probability of every span between consecutive ``common`` boundaries:
    shape ``[spans, members]``. ``ends[m][i]`` is the byte end of member m's token i and
    ``logprobs[m][i]`` its log-probability; ``common`` holds ascending offsets every member has
    a token boundary at (0 and the text's end included)."""
    columns = []
    for member_ends, member_logprobs in zip(ends, logprobs):
        if len(member_ends) != len(member_logprobs):
            raise ValueError("one log-probability per token")
        boundaries = {0, *member_ends}
        missing = next((o for o in common if o not in boundaries), None)
        if missing is not None:
            raise ValueError(f"offset {missing} is not a token boundary of every member")
        # each span's tokens summed directly, not running sums differenced: after a token given no
        # probability (-inf) every later difference was -inf - -inf = NaN
        sums = [0.0] * max(len(common) - 1, 0)
        span = 0
        for end, lp in zip(member_ends, member_logprobs):
            while span < len(sums) and end > common[span + 1]:
                span += 1
            if span < len(sums) and end > common[span]:
                sums[span] += lp
        columns.append(sums)
    return torch.tensor(columns, dtype=torch.float64).T.reshape(-1, len(columns))


@dataclass(frozen=True, slots=True)
class MixtureFit:
    weights: list[float]
    log_likelihood: float  # of all spans under the fitted mixture, nats
    iterations: int


def mixture_weights(span_logprobs: torch.Tensor, max_iterations: int = 500, tol: float = 1e-7) -> MixtureFit:
    """Weights maximising ``sum_s log sum_m w_m p_m(span_s)`` (EM for mixture proportions with
    fixed components: each step cannot lower the likelihood, and the maximum is global)."""
    if span_logprobs.ndim != 2 or span_logprobs.shape[0] == 0:
        raise ValueError("need a [spans, members] matrix with at least one span")
    spans = span_logprobs.to(torch.float64)
    spans = spans.masked_fill(spans.isnan(), -math.inf)  # a NaN (a broken forward) is no probability, not a vote
    spans = spans[torch.isfinite(spans).any(dim=1)]  # a span no member can produce says nothing about weights
    if spans.shape[0] == 0:
        raise ValueError("no span has a finite log-probability under any member")
    members = spans.shape[1]
    weights = torch.full((members,), 1.0 / members, dtype=torch.float64)
    iterations = 0
    for iterations in range(1, max_iterations + 1):  # noqa: B007 - read after the loop
        responsibility = torch.softmax(spans + weights.clamp_min(1e-300).log(), dim=1)
        updated = responsibility.mean(0)
        converged = float((updated - weights).abs().max()) < tol
        weights = updated
        if converged:
            break
    log_likelihood = float(torch.logsumexp(spans + weights.clamp_min(1e-300).log(), dim=1).sum())
    return MixtureFit(weights.tolist(), log_likelihood, iterations)


def best_threshold(drafter_top_prob: Sequence[float], drafter_right: Sequence[bool], fused_right: Sequence[bool],
                   grid: Sequence[float]) -> tuple[float | None, dict[str, float]]:
    """The ``drafter_confidence`` that makes the most choices right on labelled positions: where the
    drafter's top probability is >= c its own token is kept, elsewhere the fused choice is taken.
    Returns the best c (None: always fuse, the paper's rule; ties go to None, then to higher c,
    i.e. to fusing more) and the accuracy of every candidate."""
    n = len(drafter_top_prob)
    if not n or not (len(drafter_right) == len(fused_right) == n):
        raise ValueError("need the same, non-zero number of positions in every list")
    accuracy: dict[str, float] = {"none": sum(fused_right) / n}
    best, best_accuracy = None, accuracy["none"]
    for c in sorted(grid, reverse=True):
        right = sum(d if p >= c else f for p, d, f in zip(drafter_top_prob, drafter_right, fused_right))
        accuracy[f"{c:g}"] = right / n
        if right / n > best_accuracy + 1e-12:
            best, best_accuracy = c, right / n
    return best, accuracy
