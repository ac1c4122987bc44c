"""llama.cpp members: a GGUF served in-process by the prebuilt ``xllamacpp`` wheel, or any
``llama-server`` URL. Both speak llama.cpp's native ``POST /completion``.

- Prompts are token ids (``prompt: [int, ...]``), never text.
- Distributions: ``n_probs = k`` with ``temperature: 0`` returns the top-k of a softmax of the RAW
  logits (unaffected by the sampler chain), see members/topk.py for the mass outside the top-k.
- Scoring a draft block: llama.cpp has no prompt logprobs, so ONE request carries the prompts
  ``ids[:first_row] .. ids`` (multi-prompt), each with ``n_predict: 1``. With ``cache_prompt``
  (default) every prompt extends the previous one in the same slot, so each costs one decode step
  (``block_scoring=False``, ``prefix_cache=True``).
- Incomplete UTF-8: when the most likely next token is a partial UTF-8 sequence (the first byte
  of an emoji or CJK character), the server holds the text back and returns NO probabilities for
  that prompt. Those prompts are re-sent with every partial-UTF-8 id banned through
  ``logit_bias``; the returned probabilities stay raw (measured: the banned argmax is still
  reported with its true log-probability), only the (unused) sampled token changes.
- Slots, one per active request, on a server this process started (``from_gguf``): each session
  leases a slot of the server (``SlotPool``) and sends it as ``id_slot`` in every ``/completion``,
  so its prefix cache stays its own and the server batches the requests' slots in one decode. The
  lease returns when the session closes (the engine closes a request's sessions however it ends)
  or, failing that, when it is garbage collected; a session closed while a call of it still runs (a
  cancelled request: its worker thread goes on) keeps the slot until that call ends, and starts no
  other call.
  More requests than slots: the extra sessions lease nothing and send no ``id_slot``, so the server
  runs each of their calls in whichever slot is idle. They are answered, but each such call may
  land in a leased slot and evict that request's prefix cache (recomputed on its next call), so the
  default sizes are chosen for this not to happen: an in-process server has as many slots as the
  HTTP server admits active requests (``DEFAULT_MAX_ACTIVE``).
- Slots on a server at a URL: it may have other clients (another engine, a second ``safe-ensemble
  serve``, a benchmark) whose pools lease the same lowest slots, and two processes that both pinned
  slot 0 were queued one behind the other, each evicting the other's prefix (measured, zoo's Qwen
  GGUF, two clients of one 4-slot server, 8 tokens each: 7.4 s and 132-140 prompt tokens computed
  per request, against 2.7 s and 41-42 unpinned). So a member at a URL pins nothing by default
  (``pin_slots``): every call goes to the idle slot llama.cpp picks, the one whose cached prompt
  shares the longest prefix with it (``--slot-prompt-similarity``), which is the request's own
  slot, the one its previous call extended. (A new request whose prompt shares enough with an idle
  slot, e.g. the same chat template, takes it; the request that held it recomputes its prefix or
  llama-server restores it from its RAM prompt cache.) The prompts of one call would each go to
  another idle slot and compute their prefix anew (measured: 103 tokens for a one-token step), so a
  call of several prompts without a slot sends the first alone and the others to the slot it was
  answered from (``id_slot`` in the answer). ``pin_slots=True`` leases ``total_slots`` (``/props``)
  as above, for a server no other process uses (one pool per server in this process, which every
  member pinning its slots shares: ``server_slot_pool``).
- Greedy answers and the load. llama.cpp's logits for a token depend on how it was computed (in a
  batch of several rows or alone; measured on the zoo's Qwen GGUF: the top-1 log-probability moved
  by up to about 0.05, enough to flip a greedy near-tie). A session's first call would find
  whatever its slot (or the server's RAM prompt cache) held before, and a prompt seen there already
  was resumed from one re-computed token instead of one batch, so the same request run twice in a
  row could differ; the first call therefore sends ``cache_prompt: false`` for the prompt alone
  (one batch from position 0, whatever the slot held), and later calls only extend the session's
  own sequence. Run one after the other, requests now repeat bitwise (measured: 4 prompts, 3 runs;
  unpinned at a URL: 2 prompts, single and SAFE).
  ``reuse_prompt_cache=True`` trades that for speed: the first call also extends whatever prefix the
  slot holds (a shared system or few-shot prompt is computed once, not per request).
  Run together, the server batches their rows into shared decodes (and may split a prompt across
  decodes), so a request's rows can still differ slightly from the same request alone; neither
  turning off repacked weights (``no_extra_bufts``), flash attention, nor a unified KV cache
  removed that in our tests. See docs/speed.md, "Load".
"""

from __future__ import annotations

import ctypes
import math
import os
import threading
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from ..alignment import whole_characters
from ..errors import InvalidRequestError, MemberError
from ..options import DEFAULT_MAX_ACTIVE
from .http import HttpSettings
from .remote import (
    CALLS_IN_FLIGHT,
    DEFAULT_TOP_K,
    LocalTokenizer,
    MemberTokenizer,
    RemoteMember,
    RemoteSession,
    member_executor,
)
from .server_tokenizer import llamacpp_tokenize
from .topk import TopK

HOST_PROMPT_CACHE_MIB = 0
"""llama.cpp's host-RAM prompt cache per server (its default: 8192 MiB, each). Off: every request
keeps its own slot (sticky ``id_slot``), so its prefix lives in that slot's KV cache and the RAM
copies only grow. Measured: an eval process with three in-process servers grew to 11 GB RSS with
the default over 100 FLORES questions and pushed the 24 GB machine into swap."""


SPARE_CALLS = 16
"""Threads a llama.cpp member has beyond one per slot (requests without a slot, orphaned calls)."""


def _llamacpp_build() -> str:
    """The xllamacpp version serving in-process members (its kernels decide the last digits)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("xllamacpp")
    except PackageNotFoundError:  # pragma: no cover - xllamacpp is a dependency
        return "unknown"


def default_threads() -> int:
    """The CPU threads of an in-process server that sets none: every core."""
    return max(1, os.cpu_count() or 1)


def unset_server_options() -> dict[str, int]:
    """What a ``LocalLlamaServer`` option left at None runs with (``threads``: every core; ``poll``:
    llama.cpp's own default, read from its parameters), so the member registry takes a config that
    spells one out for the same server (members/config.py)."""
    import xllamacpp as xlc

    return {"threads": default_threads(), "poll": int(xlc.CommonParams().cpuparams.poll)}


SERVER_START_TIMEOUT_S = 60.0
"""How long a new in-process server may take to start its task loop after loading (milliseconds, usually)."""

_NEVER_STOPPED: list[Any] = []
"""In-process servers never stopped, as stopping one would hang or crash: its task loop never started
(see ``_wait_until_serving``), or this process was forked while servers ran (``close``)."""

_SERVING: Counter[int] = Counter()
"""In-process servers running, by the process that started them. A count of another process's, inherited
through a fork, says that this process was forked while servers ran (``LocalLlamaServer.close``)."""


def _forked_while_serving() -> bool:
    me = os.getpid()
    return any(count > 0 for pid, count in _SERVING.items() if pid != me)


_SERVERS: weakref.WeakSet[LocalLlamaServer] = weakref.WeakSet()
"""Every in-process server of this process, for ``_after_fork_in_child``."""


def _never_destroyed(server: Any) -> None:
    """Hold ``server`` (an ``xllamacpp.Server``) until the process ends, through the interpreter's teardown
    too: destroying it stops it, and in a process forked while servers ran that aborted the process
    (``std::system_error``) or hung it, also when it ended with ``sys.exit``."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(server))


def _after_fork_in_child() -> None:
    """In a process forked while in-process servers ran, llama.cpp can neither stop a server (``close``)
    nor run its own C++ exit handlers: a child that ended through the interpreter's teardown
    (``sys.exit``, returning from its main: gunicorn's workers) aborted (``std::system_error``),
    crashed (SIGSEGV) or hung. So no server is ever destroyed here, and ``exit(status)`` ends the
    process with ``_exit(status)`` once Python has finished (its atexit handlers run, logging and
    ``sys.stdout`` flushed), skipping the C exit handlers registered before the fork (llama.cpp's).
    Without glibc's ``on_exit`` (macOS, musl), end such a process with ``os._exit``. A lock another
    thread held at the fork is a new one (the slot pools of servers at URLs: the child's own)."""
    global _SERVER_POOLS_LOCK
    _SERVER_POOLS_LOCK = threading.Lock()
    _SERVER_POOLS.clear()
    if not _forked_while_serving():
        return
    for server in [*(s._server for s in list(_SERVERS)), *_NEVER_STOPPED]:
        if server is not None:
            _never_destroyed(server)
    try:
        libc = ctypes.CDLL(None)
        libc.on_exit(ctypes.cast(libc._exit, ctypes.c_void_p), None)  # called as _exit(status, NULL)
    except AttributeError:  # not glibc: the README says to end such a process with os._exit
        pass


class LocalLlamaServer:
    """A llama.cpp server for one GGUF inside this process (xllamacpp), on a free loopback port.

    It lives as long as this object; ``close`` (or garbage collection) stops it. ``embeddings``: also
    serve ``/embeddings`` with pooling ``none`` (completions are unchanged; measured: the same ms per
    decoded token), which the engine does not use yet (docs/speed.md, "On few-shot prompts").
    The constructor returns once the server answers through its task loop (``/metrics``, which it
    serves for that).
    """

    def __init__(self, gguf: str | Path, n_ctx: int = 4096, threads: int | None = None,
                 slots: int = DEFAULT_MAX_ACTIVE, poll: int | None = None, embeddings: bool = False,
                 start_timeout_s: float = SERVER_START_TIMEOUT_S) -> None:
        try:
            import xllamacpp as xlc
        except ImportError as exc:  # pragma: no cover - xllamacpp is a dependency
            raise ImportError("the llama.cpp backend needs the xllamacpp wheel: pip install xllamacpp") from exc
        params = xlc.CommonParams()
        params.model.path = str(gguf)
        params.n_ctx = n_ctx * slots  # split evenly over the slots: each gets n_ctx
        params.n_parallel = slots
        params.port = 0  # the OS picks a free port; the server reports it
        threads = threads or default_threads()
        params.cpuparams.n_threads = threads
        params.cpuparams_batch.n_threads = threads
        if poll is not None:  # busy-waiting after a job (llama.cpp's default 50)
            params.cpuparams.poll = params.cpuparams_batch.poll = poll
        params.warmup = False
        params.verbosity = -1
        params.cache_ram_mib = HOST_PROMPT_CACHE_MIB
        params.endpoint_metrics = True  # answered by the task loop: _wait_until_serving asks it
        # one physical batch per turn of the server's loop (the same ubatches of 512 as llama.cpp's logical
        # 2048): a stop (close, the process ending) or a disconnected request's cancel is seen between turns,
        # so it waited for up to 2,048 prompt tokens' prefill (after Ctrl-C on a 3,000-token prompt, 77 s)
        params.n_batch = params.n_ubatch
        if embeddings:  # an embeddings prompt must fit one physical batch: the batch spans a slot's window
            params.embedding = True
            params.pooling_type = xlc.llama_pooling_type.LLAMA_POOLING_TYPE_NONE
            params.n_batch = params.n_ubatch = n_ctx
        self.pid = os.getpid()
        self.gguf = Path(gguf)
        self.n_ctx = n_ctx
        self.slots = slots
        try:
            self._server: Any = xlc.Server(params)
        except RuntimeError as err:  # llama.cpp says only "Failed to init server, please check the input params"
            raise _unloadable(self.gguf, n_ctx * slots) from err
        if _forked_while_serving():  # it can never be stopped here (``close``)
            _never_destroyed(self._server)
        _SERVERS.add(self)
        address = str(self._server.listening_address)
        self.url = address if address.startswith("http") else f"http://{address}"
        self._wait_until_serving(start_timeout_s)
        _SERVING[self.pid] += 1

    def _wait_until_serving(self, timeout_s: float) -> None:
        """Return once the server's task loop runs. xllamacpp's constructor returns when the model is
        loaded, before its init thread enters that loop; a stop sent in between is lost, and the
        server's destructor then joins that thread forever (creating a server and closing it at once
        hung, on a loaded machine every time). ``/metrics`` is answered by the loop, so an answer
        means a stop will be seen. A loop that never starts is an error, and that server is kept,
        never stopped: stopping it would hang as well."""
        try:
            httpx.get(f"{self.url}/metrics", timeout=timeout_s, trust_env=False).raise_for_status()
        except httpx.HTTPError as err:
            _NEVER_STOPPED.append(self._server)
            self._server = None
            raise MemberError(self.gguf.name, self.url, f"the in-process llama.cpp server did not start serving "
                                                        f"within {timeout_s:g} s after loading ({err!r})") from err

    def close(self) -> None:
        """Stop the server, except in a process forked while in-process servers ran: there it is only let
        go of, kept until the process exits. Stopping one the parent started waited forever for its
        threads (they stayed in the parent), and stopping one the child started aborted the child
        (llama.cpp: ``std::system_error: No such process``, measured with xllamacpp 2026.10)."""
        self._let_go()

    def __del__(self) -> None:
        """Collected without ``close``: in such a forked process, not stopped either."""
        if getattr(self, "_server", None) is not None:
            try:
                self._let_go()
            except TypeError:  # collected at interpreter exit, after this module's globals were cleared:
                pass  # "Exception ignored in __del__ ... 'NoneType' object is not callable" ended a test run

    def _let_go(self) -> None:
        if self._server is not None:
            if _forked_while_serving():
                _NEVER_STOPPED.append(self._server)
            else:
                _SERVING[self.pid] -= 1
        self._server = None


def _unloadable(gguf: Path, n_ctx: int) -> InvalidRequestError:
    """Why llama.cpp could not serve ``gguf``, naming the file: its header when that is what fails
    (the check a tokenizer read from the GGUF gets; with ``#TOKENIZER`` nothing else read the file
    before llama.cpp), else what is left."""
    from ..zoo import ZooError, gguf_metadata, readable_gguf

    try:
        with readable_gguf(gguf):
            gguf_metadata(gguf)
    except InvalidRequestError as err:  # a file not there, or empty
        return err
    except ZooError as err:  # not GGUF, or a header cut short
        return InvalidRequestError(f"{gguf} is not a readable GGUF file (a truncated download?): "
                                   f"{str(err).removeprefix(f'{gguf}: ')}")
    return InvalidRequestError(
        f"llama.cpp (xllamacpp {_llamacpp_build()}) could not load {gguf}: its header reads, so the file is cut "
        f"short after it, holds a model this build does not support, or needs more memory than is free "
        f"(a context of {n_ctx} tokens over all slots)")


class SlotPool:
    """The slots of one llama.cpp server, leased one per active request (thread-safe).

    ``lease`` never waits: with every slot taken it returns None and the caller goes on without
    one (see the module docstring), so no request can block another's progress."""

    def __init__(self, size: int) -> None:
        if size < 0:
            raise ValueError("a slot pool cannot have a negative size")
        self.size = size
        self._free = list(range(size))
        self._lock = threading.Lock()

    def lease(self) -> int | None:
        """The lowest free slot (a lone request always runs in the same one), or None."""
        with self._lock:
            return self._free.pop(0) if self._free else None

    def give_back(self, slot: int) -> None:
        with self._lock:
            if not 0 <= slot < self.size or slot in self._free:
                raise ValueError(f"slot {slot} is not leased from this pool")
            self._free.append(slot)
            self._free.sort()

    @property
    def leased(self) -> int:
        """Slots held by requests now."""
        with self._lock:
            return self.size - len(self._free)


_SERVER_POOLS: weakref.WeakValueDictionary[tuple[str, int], SlotPool] = weakref.WeakValueDictionary()
_SERVER_POOLS_LOCK = threading.Lock()


def server_slot_pool(url: str, size: int) -> SlotPool:
    """The one pool of the server at ``url`` in this process, shared by every member that pins its
    slots (another ``top_k``, the URL spelt with a trailing slash or another case): a pool per member
    leased slot 0 to each, so their requests queued on one slot and evicted each other's prefix cache
    while the server's other slots idled (measured: 13.2 s against 3.4 s for two requests). Kept as
    long as a member or a leased slot holds it."""
    key = (str(httpx.URL(url)).rstrip("/"), size)
    with _SERVER_POOLS_LOCK:
        pool = _SERVER_POOLS.get(key)
        if pool is None:
            pool = _SERVER_POOLS[key] = SlotPool(size)
        return pool


os.register_at_fork(after_in_child=_after_fork_in_child)


class LlamaCppSession(RemoteSession):
    """A request's session on a llama.cpp member: on a member that pins slots it holds one server
    slot for its whole life, and that life lasts until it is closed and its last call has ended (no
    two requests in one slot)."""

    member: LlamaCppMember

    def __init__(self, member: LlamaCppMember) -> None:
        super().__init__(member)
        # the next call is the session's first: computed from position 0 unless the member reuses caches
        self.fresh = not member.reuse_prompt_cache
        self.slot = member.slots.lease()
        # returns the slot when closed, or when collected if a caller never closes the session
        self._release = (weakref.finalize(self, member.slots.give_back, self.slot)
                         if self.slot is not None else None)
        self._lock = threading.Lock()
        self._calls = 0  # calls of this session running in its slot now
        self._closed = False

    def _score_at(self, ids: list[int], positions: list[int]) -> list[TopK]:
        with self._lock:
            if self._closed:  # its request ended (cancelled) while its worker thread went on
                raise self.member.client.error("a call of a closed session (its request has ended)")
            self._calls += 1
        try:
            entries = self.member.score_at(ids, positions, slot=self.slot, fresh=self.fresh)
        finally:
            with self._lock:
                self._calls -= 1
                last = self._closed and self._calls == 0
            if last:
                self._give_back()
        self.fresh = False
        return entries

    def close(self) -> None:
        """Give the slot back, now or, with a call still running in it, when that call ends; start
        no other call (idempotent)."""
        with self._lock:
            self._closed = True
            idle = self._calls == 0
        if idle:
            self._give_back()

    def _give_back(self) -> None:
        if self._release is not None:
            self._release()  # a finalizer runs once


class LlamaCppMember(RemoteMember):
    """A llama.cpp model (see the module docstring for the wire protocol)."""

    backend = "llamacpp"

    def __init__(self, name: str, url: str, tokenizer: MemberTokenizer, *, top_k: int = DEFAULT_TOP_K,
                 context_window: int | None = None, http: HttpSettings | None = None,
                 server: LocalLlamaServer | None = None, check_tokenizer: bool = True,
                 reuse_prompt_cache: bool = False, pin_slots: bool | None = None) -> None:
        self.server = server
        self.pin_slots = server is not None if pin_slots is None else pin_slots
        """Lease the server's slots and pin each request to one (default: only on a server this
        process started, whose slots no other client uses; see the module docstring)."""
        self.reuse_prompt_cache = reuse_prompt_cache  # keeps an in-process server alive as long as the member
        self._partial_ids: list[int] | None = None
        self._partial_lock = threading.Lock()
        self._calls = threading.Condition()  # the server calls running (``_server_call``), by thread
        self._calling: dict[int, int] = {}
        self._closing = False
        super().__init__(name, url, tokenizer, top_k=top_k, context_window=context_window, http=http,
                         check_tokenizer=check_tokenizer)  # closes all (the server too) if it fails
        try:
            props = self.client.get("/props") if server is None or context_window is None else {}
        except BaseException:
            self.close()  # the server, the connections and the tokenizer: nothing outlives a failed start
            raise
        if context_window is None:
            self.context_window = _server_context(props, default=self.context_window)
        served = props.get("model_path") if isinstance(props, dict) else None
        self.model_path: str | None = served if isinstance(served, str) and served else None
        """The model the server said it serves at the start: every answer names its model, and one
        restarted on another model behind the same URL would otherwise be read through this vocabulary."""
        self.model_names: frozenset[str] = _served_names(props)
        """Every name the server went by at the start (its model's path and its ``--alias``): an answer
        names the alias when there is one, the path otherwise."""
        alias = props.get("model_alias") if isinstance(props, dict) else None
        self._answer_names = self.model_names | (frozenset() if alias else PLACEHOLDER_NAMES)
        """The names an answer may give: an older server without ``--alias`` names a placeholder; one that
        had an alias and now answers with a placeholder was restarted (without it: on another model?)."""
        total = server.slots if server is not None else _server_slots(props)
        self.slots = (server_slot_pool(self.url, total) if self.pin_slots and server is None
                      else SlotPool(total if self.pin_slots else 0))
        if total + SPARE_CALLS > CALLS_IN_FLIGHT:  # a call per slot, and some without one
            self.executor.shutdown()
            self.executor = member_executor(name, total + SPARE_CALLS)
        if server is not None:  # its threads take the same cores as the other members (Capabilities)
            self.capabilities = self.capabilities.model_copy(update={"computes_apart": False})

    @classmethod
    def from_gguf(cls, name: str, gguf: str | Path, tokenizer: LocalTokenizer, *, n_ctx: int = 4096,
                  threads: int | None = None, slots: int = DEFAULT_MAX_ACTIVE, top_k: int = DEFAULT_TOP_K,
                  http: HttpSettings | None = None, reuse_prompt_cache: bool = False,
                  poll: int | None = None) -> LlamaCppMember:
        """Serve ``gguf`` in this process and connect to it, with one slot per request the HTTP
        server admits at once by default (each slot gets ``n_ctx`` and keeps its own prefix cache;
        the server batches the active slots in one decode)."""
        window = min(n_ctx, tokenizer.context_window or n_ctx)
        server = LocalLlamaServer(gguf, n_ctx=window, threads=threads, slots=slots, poll=poll)
        return cls(name, server.url, tokenizer, top_k=top_k, context_window=window, http=local_http(http),
                   server=server, reuse_prompt_cache=reuse_prompt_cache)

    def wire_capabilities(self) -> dict[str, bool]:
        return {"block_scoring": False, "prefix_cache": True, "token_id_prompts": True}

    def outlives_holders(self) -> bool:
        """Whether the member registry keeps this member when no engine holds it: its in-process server
        can never be stopped here (a process forked while servers ran: ``LocalLlamaServer.close``), so
        closing it would free nothing, and the next engine would start another server beside it."""
        return self.server is not None and not self.forked_away() and _forked_while_serving()

    def fingerprint(self) -> str | None:
        """An in-process server's GGUF (path, size, modification time), the llama.cpp build and the
        top-K it returns; None for a server at a URL (its model may change behind it)."""
        if self.server is None:
            return None
        stat = self.server.gguf.stat()
        return (f"llamacpp|{self.server.gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|"
                f"{_llamacpp_build()}|top_k={self.top_k}")

    def new_session(self) -> LlamaCppSession:
        return LlamaCppSession(self)

    def server_tokenize(self, text: str) -> list[int]:
        with self._server_call():
            return llamacpp_tokenize(self.client, text)

    @contextmanager
    def _server_call(self) -> Iterator[None]:
        """One HTTP call to the server, counted so that ``close`` can wait for it; none starts once
        the member is closing."""
        me = threading.get_ident()
        with self._calls:
            if self._closing:
                raise self.client.error("the member is closed")
            self._calling[me] = self._calling.get(me, 0) + 1
        try:
            yield
        finally:
            with self._calls:
                self._calling[me] -= 1
                if not self._calling[me]:
                    del self._calling[me]
                self._calls.notify_all()

    @property
    def partial_utf8_ids(self) -> list[int]:
        """Ids whose bytes are an incomplete UTF-8 sequence (computed once)."""
        with self._partial_lock:
            if self._partial_ids is None:
                self._partial_ids = [i for i, p in enumerate(self.table.pieces) if p and not whole_characters(p)]
            return self._partial_ids

    def _request(self, prompts: list[list[int]], slot: int | None, ban_partial: bool = False,
                 cache_prompt: bool = True) -> list[dict[str, Any]]:
        body: dict[str, Any] = {"prompt": prompts if len(prompts) > 1 else prompts[0], "n_predict": 1,
                                "n_probs": self.top_k, "temperature": 0, "cache_prompt": cache_prompt}
        if slot is not None:
            body["id_slot"] = slot
        if ban_partial:
            body["logit_bias"] = [[t, False] for t in self.partial_utf8_ids]
        with self._server_call():
            try:
                answer = self.client.post("/completion", body, retry_timeouts=False)  # the server computes on
            except MemberError as exc:
                other = self._refused_by_another_model(exc)
                if other is not None:
                    raise self._restarted(other) from exc
                raise
        results = answer if isinstance(answer, list) else [answer]
        if len(results) != len(prompts) or not all(isinstance(r, dict) for r in results):
            raise self.malformed("/completion results", answer)
        other = next((r["model"] for r in results if self.model_names and isinstance(r.get("model"), str)
                      and r["model"] not in self._answer_names), None)
        if other is not None:
            raise self._restarted(other)
        try:
            return sorted(results, key=lambda r: int(r.get("index", 0)))
        except (TypeError, ValueError) as exc:  # an "index" that is no number: the member's error, not a bare one
            raise self.malformed("/completion results", answer) from exc

    def _refused_by_another_model(self, error: MemberError) -> str | None:
        """The model a server restarted behind this member's URL serves, where that restart is why it
        refused a ``/completion`` (None otherwise): a model with a smaller vocabulary refuses this
        member's ids with HTTP 400 "Prompt contains invalid tokens" before any answer could name it.
        Asked of ``/props`` only on a refusal (HTTP 4xx): a server down or timing out would not answer."""
        if not self.model_names or error.status is None or not 400 <= error.status < 500:
            return None
        try:
            props = self.client.get("/props")
        except MemberError:
            return None  # no better reason to give than the refusal itself
        served = props.get("model_path") if isinstance(props, dict) else None
        return served if isinstance(served, str) and served and served not in self.model_names else None

    def _restarted(self, other: str) -> MemberError:
        """The error for a server now serving ``other``: reading on would read its ids through this
        member's vocabulary, so only a new member (reconnected) can go on."""
        known = " or ".join(sorted(self.model_names))
        return self.client.error(f"the server now serves {other}, not {known} (restarted on another model?): "
                                 "its answers cannot be read with this member's vocabulary; reconnect the member")

    def score(self, ids: list[int], first_row: int, slot: int | None = None, fresh: bool = False) -> list[TopK]:
        """See ``RemoteMember.score`` and ``score_at``."""
        return self.score_at(ids, list(range(first_row, len(ids) + 1)), slot=slot, fresh=fresh)

    def score_at(self, ids: list[int], positions: list[int], slot: int | None = None,
                 fresh: bool = False) -> list[TopK]:
        """See ``RemoteMember.score_at``: one prompt ``ids[:p]`` per position, so a row costs one
        task of the server (the tokens between two asked rows are fed as one batch, not one decode
        step each); ``slot``: the server slot to run in (None: the idle one llama.cpp picks, and
        the other prompts go where the first one ran); ``fresh``: compute the first prompt from
        position 0, whatever the slot holds (a session's first call, see the module docstring), and
        only then extend it."""
        prompts = [ids[:p] for p in positions]
        if fresh or (slot is None and len(prompts) > 1):
            results = self._request(prompts[:1], slot, cache_prompt=not fresh)
            slot = _answered_slot(results[0]) if slot is None else slot
            results += self._request(prompts[1:], slot) if len(prompts) > 1 else []
        else:
            results = self._request(prompts, slot)
        entries: list[TopK | None] = [self._entry(r) for r in results]
        for i, entry in enumerate(entries):
            if entry is None:  # the argmax was a partial UTF-8 token: ask again with those banned
                entries[i] = self._entry(self._request([prompts[i]], slot, ban_partial=True)[0])
                if entries[i] is None:
                    raise self.malformed("no probabilities even with partial UTF-8 ids banned", results[i])
        return [e for e in entries if e is not None]

    def _entry(self, result: dict[str, Any]) -> TopK | None:
        probs = result.get("completion_probabilities")
        if not probs:
            return None
        try:
            top = probs[0]["top_logprobs"]
            return TopK([int(t["id"]) for t in top], [float(t["logprob"]) for t in top])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise self.malformed("completion_probabilities", probs) from exc

    def close(self) -> None:
        """Start no other call; with an in-process server, wait for the calls running in it (a
        cancelled request's call goes on in its thread until the server answers it), then close
        the client and stop the server (dropped under a running ``/completion``, llama.cpp never
        answered it: the call failed, and this close returned, only at the client's timeout). A call
        of the closing thread itself (a garbage collection inside it) is not
        waited for. Slow for an event loop: the engine lets go of its members off the loop."""
        if self.forked_away():  # the parent's calls, threads and server: nothing to wait for or stop here
            self._closing = True
            if self.server is not None:
                self.server.close()
            return
        me = threading.get_ident()
        with self._calls:
            self._closing = True
            if self.server is not None:
                self._calls.wait_for(lambda: not set(self._calling) - {me})
        super().close()
        if self.server is not None:
            self.server.close()


def local_http(http: HttpSettings | None) -> HttpSettings:
    """The settings for a server this process starts: no deadline (``timeout_s=inf``) unless one is
    given. Its answer takes as long as its compute does (a 4k-token prefill of a 7B GGUF on a few
    cores: minutes), and the 60 s a server at a URL gets failed such members' requests ("timed out
    after 60 s"); ``close`` waits for the calls running in it, so none is left unanswered."""
    http = http or HttpSettings()
    return http if http.timeout_s is not None else http.model_copy(update={"timeout_s": math.inf})


def _server_context(props: Any, default: int) -> int:
    """The context per slot a llama.cpp server reports in ``/props``."""
    try:
        return int(props["default_generation_settings"]["n_ctx"])
    except (KeyError, TypeError, ValueError):
        return default


PLACEHOLDER_NAMES = frozenset({"gpt-3.5-turbo", "gpt-3.5-turbo-0613"})
"""What a llama-server built before llama.cpp PR #17668 (2025-12) names in every ``/completion`` answer
when started without ``--alias`` (its ``DEFAULT_OAICOMPAT_MODEL``; ``-0613`` in older builds), whatever model
it serves, while its ``/props`` names the model's path: such an answer names no model, so it is no sign of
a restart (which these servers' answers cannot show)."""


def _served_names(props: Any) -> frozenset[str]:
    """The names a llama.cpp server's ``/props`` says its model goes by (``model_path``, and
    ``model_alias`` when started with ``--alias``, which its answers then name instead)."""
    if not isinstance(props, dict):
        return frozenset()
    return frozenset(v for v in (props.get("model_path"), props.get("model_alias")) if isinstance(v, str) and v)


def _answered_slot(result: dict[str, Any]) -> int | None:
    """The slot a ``/completion`` answer says it ran in (None if it does not say)."""
    slot = result.get("id_slot")
    return slot if isinstance(slot, int) and not isinstance(slot, bool) and slot >= 0 else None


def _server_slots(props: Any) -> int:
    """How many slots a llama.cpp server has (``total_slots`` in ``/props``; 0 if it does not say,
    and then no session pins a slot)."""
    try:
        return max(0, int(props["total_slots"]))
    except (KeyError, TypeError, ValueError):
        return 0
