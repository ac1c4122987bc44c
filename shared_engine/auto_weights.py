"""``weights="auto"``: each request's member weights from how well each member fits its prompt.

The prompt is prefilled anyway; here that prefill goes through the member's session with
``first_row=1`` (``Session.sync(prompt, 1)``), which returns the logits over the whole prompt
instead of only the last row. The round that follows finds the prompt in the session and
starts from its last row, so no prompt token is read twice (a verifier reads its prompt in a
forward of its own instead of together with the first draft block: one more forward call per
verifier and request, over the same tokens). All members score concurrently. What it costs, per
backend:

- transformers (``distribution="full"``): the same prefill forward, plus the output layer over
  every prompt position (``prompt_tokens x vocab x hidden`` multiply-adds) and a log-softmax.
  Prompts longer than ``PREFILL_CHUNK`` tokens are prefilled in chunks of that many tokens (the
  same total compute in a few forwards) so the logits never need more than ``PREFILL_CHUNK x vocab``
  floats. Exact.
- llama.cpp (``block_scoring=False``): llama-server returns no prompt log-probabilities, so the
  prompt is scored like a draft block: ONE request carrying the prompts ``ids[:1] .. ids`` with
  ``n_predict: 1``; with ``cache_prompt`` each extends the previous in the slot, i.e. one decode
  step per prompt token instead of one batched prefill (measured on the zoo: see README).
- vLLM / SGLang: one scoring request (their prompt log-probabilities).
- Every top-K backend: a prompt token outside the member's top-K gets the even share of the
  remaining mass that members/topk.py gives it (an estimate, not its true probability).

Which text is scored: the messages' contents as they appear in each member's rendered prompt
(tokens wholly inside them), so chat-template markup, which differs per member, does not count.
If a member's prompt shows none of the content (a template that rewrites it), or a member's server
fails while scoring (the round then meets that failure and handles it as ``on_member_failure``
says), the request falls back to the configured weights and says so in a warning.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .errors import MemberError
from .members import Member, Session
from .members.chat import Message
from .weighting import (
    TextFit,
    content_spans,
    fit_of,
    packllm_weights,
    reference_losses,
    token_nlls,
    tokens_inside,
)

PREFILL_CHUNK = 256
"""Prompt positions scored per forward pass (bounds the logits held at once)."""

log = logging.getLogger(__name__)


def prefill_nlls(session: Session, prompt_ids: Sequence[int], chunk: int = PREFILL_CHUNK) -> torch.Tensor:
    """Prefill ``prompt_ids`` into ``session``; return the NLL of every prompt token but the first
    (entry ``i - 1`` is token i's). Leaves the session holding the prompt and its next-token row."""
    ids = list(prompt_ids)
    nlls = []
    start = 1
    while start < len(ids):
        end = min(len(ids), start + chunk)
        rows = session.sync(ids[:end], start)  # rows predicting ids[start:end], then the next token
        nlls.append(token_nlls(rows[:-1], ids[start:end]))
        start = end
    return torch.cat(nlls) if nlls else torch.zeros(0)


def prompt_fit(member: Member, session: Session, prompt_ids: Sequence[int], contents: Sequence[str]) -> TextFit:
    """Blocking: prefill and measure how well ``member`` predicts the messages' contents."""
    lengths = [len(member.table.pieces[t]) for t in prompt_ids]
    spans = content_spans(member.table.to_bytes(list(prompt_ids)), contents)
    nlls = prefill_nlls(session, prompt_ids)
    return fit_of(nlls, lengths, tokens_inside(lengths, spans))


@dataclass(frozen=True, slots=True)
class AutoWeights:
    weights: torch.Tensor | None  # in decoding order, sums to 1; None: fall back to the configured weights
    nll_per_byte: list[float]  # each member's NLL of the prompt's content, nats per byte
    reason: str = ""


async def auto_weights(members: Sequence[Member], sessions: Sequence[Session], prompt_ids: Sequence[list[int]],
                       messages: Sequence[Message], temperature: float) -> AutoWeights:
    """PackLLM-sim weights for one request (see weighting.py), the drafter's tokens as reference."""
    contents = [str(m["content"]) for m in messages]
    try:
        fits = await asyncio.gather(*(member.run(prompt_fit, member, session, ids, contents)
                                      for member, session, ids in zip(members, sessions, prompt_ids)))
    except MemberError as err:  # the round meets the failure again and handles it (on_member_failure)
        reason = f"weights='auto' fell back to the configured weights: {err}"
        log.warning(reason)
        return AutoWeights(None, [], reason)
    per_byte = [f.nll_per_byte for f in fits]
    try:
        losses = reference_losses(fits, reference=0)
    except ValueError as err:
        reason = f"weights='auto' fell back to the configured weights: {err} (its prompt shows no message content)"
        log.warning(reason)
        return AutoWeights(None, per_byte, reason)
    return AutoWeights(torch.tensor(packllm_weights(losses, temperature), dtype=torch.float32), per_byte)
