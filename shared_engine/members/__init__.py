"""Model backends ("members") and the process-wide registry that loads each model once.

A member is named by a **spec string**, ``[BACKEND:]TARGET[#TOKENIZER]``:

- ``qwen2.5-coder-0.5b-instruct`` (a zoo name): its GGUF on in-process llama.cpp by default, on
  transformers with ``transformers:`` or any placement option (``spec.default_backend``);
- ``./my-hf-folder`` / ``org/name`` / ``model.gguf``: transformers;
- ``llamacpp:qwen2.5-coder-0.5b-instruct`` or ``llamacpp:model.gguf``: the GGUF served in-process
  by llama.cpp (xllamacpp); ``llamacpp:http://host:8080``: a running ``llama-server``;
- ``vllm:http://host:8000`` and ``sglang:http://host:30000``: a running vLLM / SGLang server.

``#TOKENIZER`` (a zoo name, HF folder, .gguf file or cached hub id) names the tokenizer of a remote
model; without it the tokenizer is loaded from the model path the server reports (it must exist on
this machine). ``load_member(spec, backend=...)`` applies ``backend`` to specs without a prefix.

A ``MemberConfig`` (members/config.py) is a spec plus how it runs (device, dtype, server options);
the registry key is the spec plus those options. Hub ids (``org/name``) load from the local hub cache.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import deque
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..lazy import exports, lazy_attributes
from . import devices
from .config import MemberConfig, MemberDefaults, member_config
from .spec import BACKENDS, LOCAL_BACKENDS, Backend, MemberSpec, parse_member_spec, with_backend

if TYPE_CHECKING:
    from .base import Capabilities, Member, Session
    from .hf import HFMember, HFSession

# torch and transformers load with the first member, not with the package: reading a MemberConfig
# (the command line's flags, a profile) needs neither
__getattr__, __dir__ = lazy_attributes(__name__, exports(base=("Capabilities", "Member", "Session"),
                                                         hf=("HFMember", "HFSession")))

_LOADED: dict[str, Member] = {}
_HOLDERS: dict[str, int] = {}  # engines holding each registry member (acquire_member/release_member)
_LOAD_LOCK = threading.Lock()
_PENDING_RELEASES: deque[str] = deque()
"""Registry keys let go while ``_LOAD_LOCK`` was taken, applied by whoever lets go of the lock."""


def _after_fork_in_child() -> None:
    """A forked child starts with only the members that carry on in it (transformers weights, copied on
    write, with a compute thread per process): the others' worker threads, HTTP connections and
    in-process llama.cpp servers stayed in the parent, and a call on one waited forever (a worker
    thread that the child lacks). Engines load them again on first use (``EnsembleEngine``); a lock
    some thread of the parent held is a new one. The registry forgets them without closing them: their
    resources are the parent's (an in-process server is never stopped here: ``LocalLlamaServer.close``)."""
    global _LOAD_LOCK
    _LOAD_LOCK = threading.Lock()
    _PENDING_RELEASES.clear()
    for key, member in list(_LOADED.items()):
        if getattr(member, "process_bound", False):
            del _LOADED[key]
            _HOLDERS.pop(key, None)


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextmanager
def _registry() -> Iterator[None]:
    """``_LOAD_LOCK``, and on leaving, the releases queued meanwhile (see ``release_member``)."""
    with _LOAD_LOCK:
        yield
    _apply_pending_releases()


def load_member(name_or_spec: str | MemberConfig, progress: bool = True, backend: str | None = None,
                **options: Any) -> Member:
    """Load a member once per process: a zoo name, HF folder, .gguf path, hub id, spec string or
    ``MemberConfig``.

    ``options`` are ``MemberConfig`` fields (e.g. ``dtype=``, ``device=``, ``top_k=``,
    ``http=HttpSettings(...)``, ``n_ctx=``). Members are shared per configuration: the same
    model with other options (a bfloat16 copy) is another member. The devices asked for are
    checked before anything is read.
    """
    config = _config(name_or_spec, backend, options)
    with _registry():
        return _loaded(config, progress)


def _loaded(config: MemberConfig, progress: bool = True) -> Member:
    """The registry's member for ``config``, built if need be; the caller holds ``_LOAD_LOCK``."""
    member = _LOADED.get(config.key)
    if member is None:
        config.check_placement()
        member = _LOADED[config.key] = _build(config, progress)
    return member


def _config(name_or_spec: str | MemberConfig, backend: str | None = None,
            options: dict[str, Any] | None = None) -> MemberConfig:
    if isinstance(name_or_spec, MemberConfig):
        if options:
            return member_config({**name_or_spec.model_dump(exclude_none=True), **options}, backend=backend)
        return name_or_spec.with_defaults(None, backend)
    return member_config({"model": name_or_spec, **(options or {})}, backend=backend)


def acquire_member(name_or_spec: str | MemberConfig, backend: str | None = None) -> Member:
    """``load_member`` for a holder that will ``release_member`` it (an engine): the registry
    counts holders, so the last one to let go frees the member."""
    config = _config(name_or_spec, backend)
    with _registry():  # found (or built) and counted at once: a release in between would close it
        member = _loaded(config)
        _HOLDERS[config.key] = _HOLDERS.get(config.key, 0) + 1
    return member


def release_member(name_or_spec: str | MemberConfig, backend: str | None = None) -> bool:
    """One holder lets go; when none is left the member leaves the registry and its resources are
    closed (HTTP clients, an in-process llama.cpp server; transformers weights are freed once no
    Python object refers to them). Returns True if it was freed now.

    Engines close from ``weakref.finalize`` too (an adapter's chat model collected), i.e. inside
    any garbage collection, also one that a thread triggers while it holds ``_LOAD_LOCK`` to build
    a member: waiting for the lock there would wait for itself forever. So the release is queued,
    applied now if the lock is free, else by the holder when it lets go."""
    key = _config(name_or_spec, backend).key
    _PENDING_RELEASES.append(key)
    return key in _apply_pending_releases()


def _apply_pending_releases() -> set[str]:
    """Count off the queued releases (never waiting for ``_LOAD_LOCK``); the keys freed."""
    freed: set[str] = set()
    while _PENDING_RELEASES:
        if not _LOAD_LOCK.acquire(blocking=False):
            return freed  # its holder applies the queue when it lets go
        closing: list[Member] = []
        try:
            while _PENDING_RELEASES:
                key = _PENDING_RELEASES.popleft()
                if key not in _HOLDERS:
                    continue
                _HOLDERS[key] -= 1
                if _HOLDERS[key] > 0:
                    continue
                del _HOLDERS[key]
                if _outlives_holders(_LOADED.get(key)):
                    continue  # kept loaded: the next acquire_member takes it again
                member = _LOADED.pop(key, None)
                if member is not None:
                    closing.append(member)
                    freed.add(key)
        finally:
            _LOAD_LOCK.release()
        for member in closing:  # outside the lock: closing may take a while (a llama.cpp server)
            close = getattr(member, "close", None)
            if close is not None:
                close()
        if closing:
            return_freed_memory()
    return freed


def _outlives_holders(member: Member | None) -> bool:
    """Whether the registry keeps ``member`` loaded when its last holder lets go: an in-process llama.cpp
    server that this process cannot stop (it was forked while servers ran), so closing the member freed
    nothing, and every engine built after it started one more server (480 MiB and 12 threads each with
    SmolLM2, in LlamaIndex's ``arun(num_workers=...)`` workers). Kept, it serves the next engine."""
    outlives = getattr(member, "outlives_holders", None)
    return bool(outlives is not None and outlives())


def return_freed_memory() -> bool:
    """Hand the heap memory freed by closed members back to the OS (glibc's ``malloc_trim``; whether
    it ran: False where the C library is not glibc). Members are built in a new worker thread per
    engine (``asyncio.to_thread``), whose allocations land in another malloc arena each time, and
    glibc keeps freed arena memory: a process that built and closed an engine of one llama.cpp member
    10 times grew 500 -> 823 MB (RSS) with 147 MB in use; trimmed after each close, near 495 MB."""
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):  # not glibc (macOS, musl, Windows)
        return False


def check_members_fit(configs: Sequence[MemberConfig], progress: bool = True) -> None:
    """Refuse, before loading any of them, transformers members whose weights cannot fit together
    on their device (estimated from the weight files and the dtype; members already loaded are
    already counted in what the device has free)."""
    from ..zoo import resolve

    planned = []
    for config in configs:
        device = devices.placement_device(config.device, config.device_map)
        if config.spec.backend != "transformers" or device is None or config.key in _LOADED:
            continue
        folder = resolve(config.spec.target, progress=progress).path
        planned.append((config.model, device, devices.estimated_weight_bytes(folder, config.dtype or "float32")))
    devices.check_fits(planned)


def register_member(member: Member, name: str | None = None) -> None:
    """Make ``load_member(name)`` (default: the member's own name) return this already built member,
    so string-only surfaces (LangChain's ``models`` list, the CLI) can use it. The registration
    holds the member (engines closing never free it) until ``unregister_member``."""
    key = str(parse_member_spec(name or member.name))
    with _registry():
        _LOADED[key] = member
        _HOLDERS[key] = _HOLDERS.get(key, 0) + 1


def unregister_member(name: str) -> None:
    """The registration lets go of its hold. Engines that still hold the member keep it registered
    until they let go too: dropping every hold here let such an engine's later release count off a
    new registration under the same name (and unload it under the engine that uses it)."""
    key = str(parse_member_spec(name))
    with _registry():
        holders = _HOLDERS.get(key, 0) - 1
        if holders > 0:
            _HOLDERS[key] = holders
        else:
            _LOADED.pop(key, None)
            _HOLDERS.pop(key, None)


def _build(config: MemberConfig, progress: bool) -> Member:
    from ..zoo import gguf_path, resolve, transformers_bars

    spec, options = config.spec, config.backend_options()
    if spec.backend == "transformers":
        from .hf import HFMember

        resolved = resolve(spec.target, progress=progress)
        with transformers_bars(progress):  # its "Loading weights" bar too ('--no-progress')
            return HFMember.from_pretrained(resolved.name, resolved.path, **options)
    from .remote import load_tokenizer

    if spec.backend == "llamacpp" and not spec.is_url:
        from .llamacpp import LlamaCppMember

        gguf = gguf_path(spec.target, progress=progress)
        tokenizer = load_tokenizer(spec.tokenizer or spec.target)
        name = spec.target if "/" not in spec.target else gguf.stem
        return LlamaCppMember.from_gguf(name, gguf, tokenizer, **options)
    return _connect(spec, options)


def _connect(spec: MemberSpec, options: dict[str, Any]) -> Member:
    """A member for a running server. Its tokenizer comes from the spec, else from the model path the
    server reports; a llama.cpp server whose model file is not on this machine provides it itself."""
    from ..errors import MemberError
    from .http import HttpSettings, JsonClient
    from .remote import load_tokenizer, wrong_server_hint

    probe = JsonClient(str(spec), spec.target, options.get("http") or HttpSettings())
    try:
        if spec.backend == "vllm":
            from .vllm import VLLMMember, served_model

            try:
                served, root, window = served_model(probe.get("/v1/models"))
            except (KeyError, TypeError, IndexError) as exc:
                raise probe.error("GET /v1/models did not name a model") from exc
            tokenizer = load_tokenizer(spec.tokenizer or root or served)
            options = {"context_window": window, **options}
            return VLLMMember(spec.tokenizer or served, spec.target, tokenizer, model=served, **options)
        if spec.backend == "sglang":
            from .sglang import SGLangMember, served_context_window

            try:
                info = probe.get("/get_model_info")
            except MemberError as exc:  # a llama-server or vLLM has no such route: say which prefix it needs
                if exc.status != 404:
                    raise
                raise probe.error(f"{exc.reason}: not a sglang server{wrong_server_hint(probe, 'sglang')}") from exc
            path = spec.tokenizer or (info.get("tokenizer_path") or info.get("model_path")
                                      if isinstance(info, dict) else None)
            if not path:
                raise probe.error("GET /get_model_info did not name a model path; add '#TOKENIZER' to the spec")
            options = {"context_window": served_context_window(probe), **options}
            return SGLangMember(spec.tokenizer or str(path), spec.target, load_tokenizer(path), **options)
        from .llamacpp import LlamaCppMember

        props = probe.get("/props")
        path = spec.tokenizer or (props.get("model_path") if isinstance(props, dict) else None)
        name = spec.tokenizer or Path(str(path or spec.target)).stem  # the GGUF's name, not its path
        if spec.tokenizer or (path and Path(str(path)).expanduser().exists()):
            return LlamaCppMember(name, spec.target, load_tokenizer(str(path)), **options)
        # The model file is not on this machine: read the tokenizer from the server itself.
        from .server_tokenizer import LlamaCppServerTokenizer

        # named as the member is: an error of its calls names the member, and degrade finds it by that name
        own_tokenizer = LlamaCppServerTokenizer(spec.target, options.get("http"), name=name)
        return LlamaCppMember(name, spec.target, own_tokenizer, **options)
    except (OSError, ValueError) as exc:  # the tokenizer the server reported is not loadable here
        raise probe.error(f"cannot load its tokenizer here ({exc}); add '#TOKENIZER' to the spec") from exc
    finally:
        probe.close()


__all__ = ["BACKENDS", "LOCAL_BACKENDS", "Backend", "Capabilities", "HFMember", "HFSession", "Member",
           "MemberConfig", "MemberDefaults", "MemberSpec", "Session", "acquire_member", "check_members_fit",
           "load_member", "member_config", "parse_member_spec", "register_member", "release_member",
           "unregister_member", "with_backend"]
