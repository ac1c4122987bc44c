"""What every server-backed member shares: tokenizer, token table, top-K sessions, self-checks.

A server-backed member (llama.cpp, vLLM, SGLang) tokenizes on the client side of the wire:
prompts are rendered with the model's own chat template and sent as **token ids**, so the server
never re-tokenizes text (a BPE merge across the answer/draft boundary would otherwise shift every
alignment). The ``MemberTokenizer`` is either a ``LocalTokenizer`` (a zoo name, a local HF folder, a
.gguf file or a cached hub id; when none is given, the model path the server reports, if that path
exists here), checked once at start against the server's ``/tokenize`` on a probe text, or, for a
llama.cpp server whose model file is not here, one read from the server itself
(members/server_tokenizer.py).

Each backend only implements ``score(ids, first_row)`` (top-K at every position from
``first_row - 1`` to the end, i.e. the distributions predicting ``ids[first_row:]`` plus the next
one) and ``server_tokenize(text)``; ``RemoteSession`` turns that into the ``Session`` contract
(members/session.py).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from ..alignment import TokenTable, common_prefix_len
from ..errors import MemberError
from .base import Capabilities, R
from .chat import PLAIN_TEMPLATE_STOPS, Message, render_prompt_ids, render_text_ids
from .http import Call, HttpSettings, JsonClient, in_call
from .session import PrefixSession
from .spec import BACKENDS, did_you_mean
from .topk import TopK, topk_rows

PROBE_TEXT = "Hello, world! Grüße aus Köln, 東京 🙂.\n    def f(x):\n        return x**2  # 42"
"""Text whose local and server tokenizations must agree: ASCII, accents, CJK, emoji, code, spaces."""

DEFAULT_TOP_K = 20
"""Top-K asked of servers: vLLM's default --max-logprobs cap; >= UniTE's top-10."""

CALLS_IN_FLIGHT = 64
"""Blocking calls one server member runs at once, each in a thread of the member's own pool (started
as needed). Generous: a call mostly waits for its server, which batches what it is sent; asyncio's
shared default pool (``min(32, cores + 4)`` threads: 6 on a 2-core machine) capped every server
member of the process together at that many calls."""


class MemberTokenizer(Protocol):
    """What a server-backed member needs of its model's tokenizer, wherever it comes from."""

    @property
    def context_window(self) -> int | None: ...

    @property
    def has_chat_template(self) -> bool: ...

    @property
    def from_server(self) -> bool:
        """The server's own tokenizer: nothing to check against the server."""

    def token_table(self) -> TokenTable: ...

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]: ...

    def text_prompt_ids(self, text: str) -> list[int]:
        """``text`` with the tokenizer's usual special tokens (``Member.text_prompt_ids``)."""

    def encode(self, text: str) -> list[int]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class LocalTokenizer:
    """A tokenizer loaded on the client, with what its folder says about the model."""

    tokenizer: PreTrainedTokenizerBase
    vocab_size: int  # logits width (config.json's vocab_size may exceed len(tokenizer))
    eos_ids: frozenset[int]
    context_window: int | None
    from_server = False

    @property
    def has_chat_template(self) -> bool:
        return bool(self.tokenizer.chat_template)

    def token_table(self) -> TokenTable:
        return TokenTable(self.tokenizer, vocab_size=self.vocab_size, eos_ids=set(self.eos_ids))

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]:
        return render_prompt_ids(self.tokenizer, messages, tools)

    def text_prompt_ids(self, text: str) -> list[int]:
        return render_text_ids(self.tokenizer, text)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def close(self) -> None:
        """Nothing to release: the tokenizer lives in this process."""


def load_tokenizer(spec: str | Path) -> LocalTokenizer:
    """Tokenizer from a zoo name, an HF folder, a .gguf file or a hub id already in the local cache."""
    from ..zoo import ZOO, hub_snapshot, is_hub_id, readable_gguf, tokenizer_info, zoo_name_of_gguf

    spec = str(spec)
    if spec.lower().endswith(".gguf") and (zoo_name := zoo_name_of_gguf(Path(spec).expanduser())):
        spec = zoo_name  # a llama.cpp server serving a zoo GGUF: its converted tokenizer, not 16 s of GGUF reading
    if spec in ZOO:  # the tokenizer and the GGUF header's numbers: converting the weights took 15-45 s
        info = tokenizer_info(spec, progress=False)
        tokenizer = AutoTokenizer.from_pretrained(str(info.path))
        return LocalTokenizer(tokenizer, max(len(tokenizer), info.vocab_size or 0), info.eos_token_ids,
                              info.context_length)
    path = Path(spec).expanduser()
    if not path.exists() and is_hub_id(spec):
        path = hub_snapshot(spec)
    if path.is_file() and path.suffix.lower() == ".gguf":
        with readable_gguf(path):
            tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        return LocalTokenizer(tokenizer, len(tokenizer), frozenset(), None)
    tokenizer = AutoTokenizer.from_pretrained(str(path) if path.is_dir() else spec)
    config = _json(path / "config.json") if path.is_dir() else {}
    generation = _json(path / "generation_config.json") if path.is_dir() else {}
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    eos_ids = frozenset(int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None)
    vocab = max(len(tokenizer), int(config.get("vocab_size") or 0))
    window = config.get("max_position_embeddings")
    return LocalTokenizer(tokenizer, vocab, eos_ids, int(window) if window else None)


def _json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


class RemoteMember(ABC):
    """A model behind a server; subclasses map ``score`` and ``server_tokenize`` onto its API."""

    capabilities: Capabilities
    backend: ClassVar[str] = "remote"
    """The spec prefix that names this server type (``vllm``), for errors."""
    process_bound: ClassVar[bool] = True
    """Its worker threads and HTTP connections (and an in-process llama.cpp server) belong to the process
    that built it: a process forked from that one loads its own (the registry forgets this one there)."""

    def __init__(self, name: str, url: str, tokenizer: MemberTokenizer, *, top_k: int = DEFAULT_TOP_K,
                 context_window: int | None = None, http: HttpSettings | None = None,
                 check_tokenizer: bool = True) -> None:
        self.name = name
        self.url = url.rstrip("/")
        self.top_k = top_k
        self.tokenizer = tokenizer  # the member's own: closed with it
        self.pid = os.getpid()  # the process whose threads serve it (``forked_away``)
        self.client = JsonClient(name, self.url, http)  # fails only on a URL no request could reach
        self.executor = member_executor(name, CALLS_IN_FLIGHT)
        try:
            if top_k < 1:
                raise ValueError("top_k must be >= 1")
            self.table = tokenizer.token_table()
            self.context_window = int(context_window or tokenizer.context_window or 2048)
            self.stop_strings: tuple[str, ...] = () if tokenizer.has_chat_template else PLAIN_TEMPLATE_STOPS
            self.capabilities = Capabilities(distribution="top_k", k=top_k, computes_apart=True,
                                             **self.wire_capabilities())
            if check_tokenizer and not tokenizer.from_server:
                self.check_tokenizer()
        except BaseException:
            self.close()  # a member that fails to start (its server's /tokenize) keeps no connection open
            raise

    # ----------------------------------------------------------------- backend-specific
    @abstractmethod
    def wire_capabilities(self) -> dict[str, bool]:
        """block_scoring / prefix_cache / token_id_prompts of this server type."""

    @abstractmethod
    def score(self, ids: list[int], first_row: int) -> list[TopK]:
        """Top-K after ``ids[:i]`` for i = first_row .. len(ids): ``len(ids) - first_row + 1`` entries."""

    def score_at(self, ids: list[int], positions: list[int]) -> list[TopK]:
        """Top-K after ``ids[:p]`` for each ``p`` in ``positions`` (sorted, the last ``len(ids)``).
        By default the block from the first (``score``); a server that pays per row overrides it."""
        block = self.score(ids, positions[0])
        return [block[p - positions[0]] for p in positions]

    @abstractmethod
    def server_tokenize(self, text: str) -> list[int]:
        """The server's tokenization of ``text`` without special tokens."""

    # ----------------------------------------------------------------- shared
    def check_tokenizer(self) -> None:
        local = self.tokenizer.encode(PROBE_TEXT)
        remote = self.server_tokenize(PROBE_TEXT)
        if local and not remote:  # a server of another type: llama.cpp reads no prompt from vLLM's request
            raise self.client.error(f"the server tokenized a probe text to no tokens: it is not a {self.backend} "
                                    f"server{wrong_server_hint(self.client, self.backend)}")
        if local != remote:
            at = common_prefix_len(local, remote)
            raise self.client.error(
                f"the local tokenizer and the server's disagree on a probe text from token {at} on "
                f"(local {local[at:at + 5]}..., server {remote[at:at + 5]}...): pass the tokenizer the "
                "server's model uses")

    def malformed(self, what: str, detail: Any) -> MemberError:
        return self.client.error(f"answered an unexpected shape ({what}): {str(detail)[:200]}")

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.table.eos_ids

    def prompt_ids(self, messages: Sequence[Message], tools: Sequence[Message] | None = None) -> list[int]:
        return self.tokenizer.prompt_ids(messages, tools) if tools else self.tokenizer.prompt_ids(messages)

    def text_prompt_ids(self, text: str) -> list[int]:
        return self.tokenizer.text_prompt_ids(text)

    def new_session(self) -> RemoteSession:
        return RemoteSession(self)

    async def run(self, fn: Callable[..., R], *args: Any) -> R:
        """Blocking HTTP in a thread of this member's own pool (as ``asyncio.to_thread`` would, with
        its context); the server serialises or batches the work itself. Cancelling the await ends the
        call's request (its socket shut, no retry: ``http.Call``; see ``cancel_ends_call``): left to
        run, it held the thread, the server and the process's exit until its deadline."""
        if self.forked_away():
            raise self.client.error(
                f"this member was loaded in process {self.pid}, which this process was forked from: its worker "
                "threads (and an in-process llama.cpp server) stayed there, and a call waited for them forever. "
                "Build the engine from member names or configs (a forked process then loads its own members on "
                "first use), or start worker processes with the 'spawn' start method")
        handle = Call()
        call = functools.partial(contextvars.copy_context().run, in_call, handle, fn, *args)
        try:
            future = asyncio.get_running_loop().run_in_executor(self.executor, call)
        except RuntimeError as exc:  # the pool is shut down
            raise self.client.error("the member is closed") from exc
        try:
            return await future
        except asyncio.CancelledError:
            if self.cancel_ends_call:
                handle.abort()  # its request ends now (its socket shut), not at its deadline, retries and all
            else:
                handle.orphaned = True  # given up at the process's exit (http._abort_at_exit)
            raise

    @property
    def cancel_ends_call(self) -> bool:
        """Whether a cancelled ``run`` ends its call's request (``http.Call``). Not for llama.cpp: its
        server computes an abandoned ``/completion`` on in the slot the request leased, and the slot is
        given back when the call ends (members/llamacpp.py): ended early, the next request got a slot
        still busy. vLLM and SGLang abort a request whose client went away."""
        return self.backend != "llamacpp"

    def forked_away(self) -> bool:
        """Whether this process is a fork of the one that built the member (whose threads serve it)."""
        return os.getpid() != self.pid

    def close(self) -> None:
        """Let go of the pool (calls still running end at once, their sockets shut by closing the
        client: "the member is closed"), the HTTP client and the tokenizer."""
        self.executor.shutdown(wait=False)
        self.client.close()
        self.tokenizer.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.url!r}, top_k={self.top_k})"


def wrong_server_hint(client: JsonClient, expected: str) -> str:
    """`` (did you mean 'llamacpp:URL'?)`` when the server at ``client``'s URL says it is another type
    than ``expected`` (``owned_by`` in its OpenAI-compatible ``/v1/models``: llamacpp, vllm, sglang),
    else a hint to check the prefix. Asked only once a member has failed."""
    try:
        owner = client.get("/v1/models")["data"][0]["owned_by"]
    except (MemberError, KeyError, TypeError, IndexError):
        owner = None
    if isinstance(owner, str) and owner.lower() in BACKENDS and owner.lower() != expected:
        return f": it says it is {owner}{did_you_mean(owner.lower(), client.base_url)}"
    return f" (check the backend prefix: {', '.join(b for b in BACKENDS if b != 'transformers')})"


def member_executor(name: str, threads: int) -> ThreadPoolExecutor:
    """The pool a server member runs its blocking calls in (``RemoteMember.run``)."""
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix=f"member-{name}")


class RemoteSession(PrefixSession):
    """One request's view of a remote member: the ids it last scored and the distribution after them.

    The server owns the KV cache (prefix caching); ``last_sync`` reports how much of the previous
    sequence a prefix cache can keep, the same bookkeeping the transformers session does.
    """

    def __init__(self, member: RemoteMember) -> None:
        super().__init__()
        self.member = member

    def _compute(self, target: list[int], first_row: int, common: int) -> torch.Tensor:
        """One scoring request; full-vocabulary rows made from the server's top-K."""
        return self._rows(target, list(range(first_row, len(target) + 1)), common)

    def _compute_at(self, target: list[int], positions: list[int], common: int) -> dict[int, torch.Tensor]:
        """The rows asked for, in one request: the member's ``score_at`` knows whether its server
        scores a block (and slices it) or pays per row (and asks for these only)."""
        return dict(zip(positions, self._rows(target, positions, common)))

    def _rows(self, target: list[int], positions: list[int], common: int) -> torch.Tensor:
        self.last_sync = (common, len(self.ids) - common)
        entries = self._score_at(target, positions)
        expected = len(positions)
        if len(entries) != expected:
            raise self.member.malformed("number of distributions", f"{len(entries)} instead of {expected}")
        self.num_forwards += 1
        try:
            rows = topk_rows([_within(e, self.member.table.vocab_size) for e in entries],
                             self.member.table.vocab_size)
        except ValueError as exc:
            raise self.member.malformed("token ids", exc) from exc
        self.ids = list(target)
        return rows

    def _score_at(self, ids: list[int], positions: list[int]) -> list[TopK]:
        """The member's ``score_at``; a backend's session adds what its server needs (a slot)."""
        return self.member.score_at(ids, positions)


def _within(entry: TopK, vocab_size: int) -> TopK:
    """Drop ids at or past the client's vocabulary: padding rows of a model's output layer that a
    tokenizer loaded from a bare GGUF does not count (they have no bytes, so never are candidates)."""
    if max(entry.ids) < vocab_size:
        return entry
    kept = [(t, lp) for t, lp in zip(entry.ids, entry.logprobs) if t < vocab_size]
    if not kept:
        raise ValueError(f"every id of a top-K entry is outside the vocabulary of {vocab_size}")
    return TopK([t for t, _ in kept], [lp for _, lp in kept])
