"""Per-request choices from how well each member fits the prompt: ``weights="auto"`` (the member
weights) and ``drafter="auto"`` (which member drafts).

``drafter="auto"`` (see ``choose_drafter``, below the weights) reads only the prompt's earlier
assistant turns: the answers a few-shot prompt shows as examples. The member that predicts those
best, per byte, each given everything before it, drafts. Why not the whole prompt: measured on the
zoo (8 prompts per benchmark), the whole-content NLL picked Gemma-3-270m base on ARC and SQuAD,
where Qwen answers far better (a base model predicts the questions and passages well), while the
answers' NLL picked the best member on all six benchmarks whose best member is known (Qwen on
GSM8K, ARC, SQuAD; Gemma on TriviaQA and NQ; BBH Qwen). A prompt with no assistant turn keeps the
configured drafter. Fits are cached per member and prompt prefix, so a fixed few-shot block is
scored once, not per request, and a conversation that grows scores only its newest answer; with
``fit_cache=PATH`` they are kept in a file, so the next process does not score the block again.

``weights="auto"``:

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
  step per prompt token instead of one batched prefill (measured on the zoo: see docs/methods.md).
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

import hashlib
import itertools
import logging
import math
import os
import sqlite3
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import InvalidRequestError, MemberError
from .gather import gather_all
from .members import Member, Session
from .members.base import member_fingerprint
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
    pieces = [member.table.pieces[t] for t in prompt_ids]
    spans = content_spans(b"".join(pieces), contents)
    nlls = prefill_nlls(session, prompt_ids)
    return fit_of(nlls, [len(p) for p in pieces], tokens_inside(pieces, spans))


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
        fits = await gather_all(*(member.run(prompt_fit, member, session, ids, contents)
                                      for member, session, ids in zip(members, sessions, prompt_ids)))
    except MemberError as err:  # the round meets the failure again and handles it (on_member_failure)
        reason = f"weights='auto' fell back to the configured weights: {err}"
        log.warning(reason)
        return AutoWeights(None, [], reason)
    per_byte = [f.nll_per_byte for f in fits]
    try:
        losses = reference_losses(fits, reference=0)
    except ValueError as err:
        reason = (f"weights='auto' fell back to the configured weights: {err} (too little of the prompt's "
                  f"content to score: a member's first prompt token is predicted by nothing, so a one-token raw "
                  f"prompt scores no bytes, nor does a prompt without message content)")
        log.warning(reason)
        return AutoWeights(None, per_byte, reason)
    try:
        weights = packllm_weights(losses, temperature)
    except ValueError as err:  # a NaN fit (a member's NaN logits)
        reason = f"weights='auto' fell back to the configured weights: {err}"
        log.warning(reason)
        return AutoWeights(None, per_byte, reason)
    return AutoWeights(torch.tensor(weights, dtype=torch.float32), per_byte)


# --------------------------------------------------------------------------- drafter="auto"

ANSWER_TOKENS = 512
"""drafter='auto' scores at most this many of a member's example-answer tokens (the first ones, so a
conversation that grows keeps the same scored prefix and finds it cached)."""


def example_answers(messages: Sequence[Message]) -> list[str]:
    """The prompt's assistant turns: answers it shows as examples (few-shot) or gave before."""
    return [str(m["content"]) for m in messages if m.get("role") == "assistant" and str(m.get("content") or "").strip()]


def answer_tokens(member: Member, prompt_ids: Sequence[int], answers: Sequence[str],
                  budget: int = ANSWER_TOKENS) -> list[int]:
    """Indices of ``member``'s prompt tokens lying wholly inside the example answers (at most ``budget``)."""
    pieces = [member.table.pieces[t] for t in prompt_ids]
    spans = content_spans(b"".join(pieces), answers)
    # Wholly inside, as measured in Results: where a template writes " France" after "Answer:", an
    # example answer's first word is left out. Scoring it too (as weights='auto' does) flips SQuAD's
    # choice from Qwen (alone 51%) to Gemma-3-270m (alone 21%): not measured as SAFE, so not the default.
    return tokens_inside(pieces, spans, whole=True)[:budget]


class FitCache:
    """Fits of runs of example-answer tokens, by (member, where the run starts, the prompt up to its
    end): what a run's tokens cost depends on nothing else, so a fixed few-shot block is scored once
    per member, and a conversation that grows scores only its newest answer.

    ``path``: also keep them in that SQLite file, so another process (an eval resumed in tiers, a
    restarted server, the next CLI call) finds a block scored before instead of paying for it again: on
    llama.cpp one decode step per example-answer token per member, ~25 s for a BBH block of three.
    A fit is kept on disk only for a member with a fingerprint (``member_fingerprint``: the weights,
    vocabulary and numerics), so a changed model never reads an old fit; a server at a URL keeps its
    fits in memory only. Several processes may share the file (SQLite locks it)."""

    def __init__(self, size: int = 1024, path: str | Path | None = None) -> None:
        self.size = size
        self._fits: OrderedDict[tuple[int, int, tuple[int, ...]], TextFit] = OrderedDict()
        self._lock = threading.Lock()  # members score in their own threads
        self._fingerprints: dict[int, str | None] = {}
        self.path = Path(path) if path is not None else None
        self._db: sqlite3.Connection | None = None
        self._inherited: list[sqlite3.Connection] = []  # a forked parent's, never used or closed here
        self._closed = False
        # an unusable path fails now, not at the first few-shot prompt: an existing file is opened now, a
        # new one only by the first fit (a zero-shot run leaves none), its folder checked now
        if self.path is not None and self._connection(create=False) is None:
            _check_folder(self.path)

    def get(self, member: Member, first: int, prefix: Sequence[int]) -> TextFit | None:
        key = (id(member), first, tuple(prefix))
        with self._lock:
            fit = self._fits.get(key)
            if fit is not None:
                self._fits.move_to_end(key)
                return fit
        stored = self._disk_key(member, first, prefix)
        if stored is None:
            return None
        with self._lock:
            db = self._connection(create=False)
            if db is None:  # closed meanwhile (the engine closed), or no file yet
                return None
            row = db.execute("SELECT nll, num_bytes, num_tokens FROM fits WHERE key = ?", (stored,)).fetchone()
        if row is None:
            return None
        fit = TextFit(float(row[0]), int(row[1]), int(row[2]))
        self._remember(key, fit)
        return fit

    def put(self, member: Member, first: int, prefix: Sequence[int], fit: TextFit) -> None:
        self._remember((id(member), first, tuple(prefix)), fit)
        stored = self._disk_key(member, first, prefix)
        if stored is not None:
            with self._lock:
                db = self._connection(create=True)
                if db is None:  # closed meanwhile (the engine closed)
                    return
                with db:  # one transaction: committed, or rolled back on an error
                    db.execute("INSERT OR REPLACE INTO fits VALUES (?, ?, ?, ?)",
                               (stored, fit.nll, fit.num_bytes, fit.num_tokens))

    def close(self) -> None:
        """Close the file (idempotent); fits stay readable from memory, new ones stay in memory."""
        with self._lock:
            self._closed = True
            if self._db is not None:
                self._db.close()
                self._db = None

    def forget_parent_process(self) -> None:
        """In a forked child: a fresh lock (another thread of the parent may have held it at the fork),
        no fits by member ``id`` (the child loads its members again, and a new member may take a freed
        one's id, reading its fits), and the file opened anew on first use: SQLite forbids using a
        connection across a fork, and closing the parent's copy here could roll back a transaction the
        parent has open, so it is kept, unused."""
        self._lock = threading.Lock()
        self._fits.clear()
        self._fingerprints.clear()
        if self._db is not None:
            self._inherited.append(self._db)
            self._db = None

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        """The open file (under the lock), opened on first use: for a read only where it exists (another
        process may have written it since), for a write created."""
        if self._db is None and self.path is not None and not self._closed and (create or self.path.exists()):
            self._db = _open_fits(self.path)
        return self._db

    def _remember(self, key: tuple[int, int, tuple[int, ...]], fit: TextFit) -> None:
        with self._lock:
            self._fits[key] = fit
            self._fits.move_to_end(key)
            while len(self._fits) > self.size:
                self._fits.popitem(last=False)

    def _disk_key(self, member: Member, first: int, prefix: Sequence[int]) -> str | None:
        """The row's key in the file (None: not kept on disk): the member's fingerprint, the run's start
        and the prompt up to its end, hashed."""
        if self.path is None or self._closed:
            return None
        if id(member) not in self._fingerprints:  # computed once per member (HF: a sampled pass over its tensors)
            self._fingerprints[id(member)] = member_fingerprint(member)
        fingerprint = self._fingerprints[id(member)]
        if fingerprint is None:
            return None
        digest = hashlib.sha256(f"{fingerprint}|{first}|".encode())
        digest.update(array("q", prefix).tobytes())
        return digest.hexdigest()


def _check_folder(path: Path) -> None:
    """The fits file's folder, created where missing and writable; an unusable path is the caller's error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise InvalidRequestError(f"fit_cache: cannot keep fits in {path}: {err}") from None
    if not os.access(path.parent, os.W_OK | os.X_OK):
        raise InvalidRequestError(f"fit_cache: cannot keep fits in {path}: its folder is not writable")


def _open_fits(path: Path) -> sqlite3.Connection:
    """The fits file, created with its folder where missing; an unusable path is the caller's error."""
    _check_folder(path)
    try:
        db = sqlite3.connect(path, timeout=30, check_same_thread=False)  # used under FitCache's lock
        with db:
            db.execute("CREATE TABLE IF NOT EXISTS fits "
                       "(key TEXT PRIMARY KEY, nll REAL, num_bytes INTEGER, num_tokens INTEGER)")
    except (OSError, sqlite3.Error) as err:
        raise InvalidRequestError(f"fit_cache: cannot keep fits in {path}: {err}") from None
    return db


def answers_fit(member: Member, session: Session, prompt_ids: Sequence[int], scored: Sequence[int],
                cache: FitCache | None = None) -> TextFit:
    """Blocking: ``member``'s NLL of its prompt tokens ``scored``, each given everything before it.
    Each run of consecutive tokens not in ``cache`` is one ``sync`` (the text before it is
    prefilled, not scored: on llama.cpp a prefill is one batch, a scored token one decode step)."""
    ids = list(prompt_ids)
    nll, num_bytes = 0.0, 0
    for _, run in itertools.groupby(enumerate(scored), key=lambda pair: pair[1] - pair[0]):
        positions = [index for _, index in run]
        first, end = positions[0], positions[-1] + 1
        fit = cache.get(member, first, ids[:end]) if cache is not None else None
        if fit is None:
            rows = session.sync(ids[:end], first)
            fit = TextFit(float(token_nlls(rows[:-1], ids[first:end]).sum()),
                          sum(len(member.table.pieces[t]) for t in ids[first:end]), end - first)
            if cache is not None:
                cache.put(member, first, ids[:end], fit)
        nll, num_bytes = nll + fit.nll, num_bytes + fit.num_bytes
    return TextFit(nll, num_bytes, len(scored))


@dataclass(frozen=True, slots=True)
class DrafterChoice:
    index: int | None  # the member that drafts, in decoding order; None: keep the configured drafter
    nll_per_byte: list[float]  # each member's NLL of the example answers, nats per byte ([] if not scored)
    reason: str = ""


async def choose_drafter(members: Sequence[Member], sessions: Sequence[Session], prompt_ids: Sequence[list[int]],
                         messages: Sequence[Message], cache: FitCache) -> DrafterChoice:
    """``drafter="auto"``: the member with the lowest NLL per byte of the prompt's example answers
    (ties keep the configured order)."""
    answers = example_answers(messages)
    if not answers:
        return DrafterChoice(None, [], "the prompt shows no example answers")
    scored = [answer_tokens(m, ids, answers) for m, ids in zip(members, prompt_ids)]
    if any(not s for s in scored):
        return DrafterChoice(None, [], "a member's prompt shows none of the example answers")

    try:
        fits = await gather_all(*(member.run(answers_fit, member, session, ids, tokens, cache)
                                      for member, session, ids, tokens in zip(members, sessions, prompt_ids, scored)))
    except MemberError as err:  # the round meets the failure again and handles it (on_member_failure)
        reason = f"drafter='auto' kept the configured drafter: {err}"
        log.warning(reason)
        return DrafterChoice(None, [], reason)
    per_byte = [f.nll_per_byte for f in fits]
    if not all(math.isfinite(v) for v in per_byte):
        return DrafterChoice(None, per_byte, "a member's example-answer NLL is not finite")
    return DrafterChoice(min(range(len(per_byte)), key=per_byte.__getitem__), per_byte)
