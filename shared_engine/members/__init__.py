"""Model backends ("members") and the process-wide registry that loads each model once.

A member is named by a **spec string**, ``[BACKEND:]TARGET[#TOKENIZER]``:

- ``qwen2.5-coder-0.5b-instruct`` / ``./my-hf-folder`` / ``model.gguf``: transformers (the default);
- ``llamacpp:qwen2.5-coder-0.5b-instruct`` or ``llamacpp:model.gguf``: the GGUF served in-process
  by llama.cpp (xllamacpp); ``llamacpp:http://host:8080``: a running ``llama-server``;
- ``vllm:http://host:8000`` and ``sglang:http://host:30000``: a running vLLM / SGLang server.

``#TOKENIZER`` (a zoo name, HF folder, .gguf file or cached hub id) names the tokenizer of a remote
model; without it the tokenizer is loaded from the model path the server reports (it must exist on
this machine). ``load_member(spec, backend=...)`` applies ``backend`` to specs without a prefix.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict

from ..errors import InvalidRequestError
from .base import Capabilities, Member, Session
from .hf import HFMember, HFSession

Backend = Literal["transformers", "llamacpp", "vllm", "sglang"]
BACKENDS: tuple[str, ...] = get_args(Backend)
LOCAL_BACKENDS = ("transformers", "llamacpp")
"""Backends that can run a zoo name on this machine (``--backend`` of the CLI)."""

_LOADED: dict[str, Member] = {}
_HOLDERS: dict[str, int] = {}  # engines holding each registry member (acquire_member/release_member)
_LOAD_LOCK = threading.Lock()


class MemberSpec(BaseModel):
    """A parsed member spec string (see the module docstring)."""

    model_config = ConfigDict(frozen=True)

    backend: Backend
    target: str
    tokenizer: str | None = None

    @property
    def is_url(self) -> bool:
        return self.target.startswith(("http://", "https://"))

    def __str__(self) -> str:
        return f"{self.backend}:{self.target}" + (f"#{self.tokenizer}" if self.tokenizer else "")


def parse_member_spec(spec: str, backend: str | None = None) -> MemberSpec:
    """``[BACKEND:]TARGET[#TOKENIZER]`` -> MemberSpec; ``backend`` is the default for bare targets."""
    head, sep, rest = spec.partition(":")
    if sep and head in BACKENDS:
        chosen, target = head, rest
    else:
        chosen, target = backend or "transformers", spec
    if chosen not in BACKENDS:
        raise InvalidRequestError(f"unknown backend {chosen!r}; use one of {BACKENDS}")
    target, _, tokenizer = target.partition("#")
    parsed = MemberSpec(backend=chosen, target=target.strip(), tokenizer=tokenizer.strip() or None)
    if not parsed.target:
        raise InvalidRequestError(f"member spec {spec!r} names no model or URL")
    if parsed.backend in ("vllm", "sglang") and not parsed.is_url:
        raise InvalidRequestError(f"{parsed.backend} members are servers: give a URL, e.g. "
                                  f"'{parsed.backend}:http://127.0.0.1:8000' (got {spec!r})")
    if parsed.backend == "transformers" and parsed.is_url:
        raise InvalidRequestError(f"a URL needs a server backend prefix (llamacpp:, vllm:, sglang:), got {spec!r}")
    return parsed


def with_backend(spec: str, backend: str | None) -> str:
    """``spec`` with ``backend`` applied when it has no prefix of its own (for CLI model lists)."""
    return str(parse_member_spec(spec, backend)) if backend else spec


def load_member(name_or_spec: str, progress: bool = True, backend: str | None = None,
                **options: Any) -> Member:
    """Load a member once per process: a zoo name, HF folder, .gguf path or spec string.

    ``options`` go to the backend (e.g. ``top_k=``, ``http=HttpSettings(...)``, ``n_ctx=`` for
    llama.cpp); members loaded with options are not shared through the registry.
    """
    spec = parse_member_spec(name_or_spec, backend)
    key = str(spec)
    with _LOAD_LOCK:
        member = None if options else _LOADED.get(key)
        if member is None:
            member = _build(spec, progress, options)
            if not options:
                _LOADED[key] = member
        return member


def acquire_member(name_or_spec: str, backend: str | None = None) -> Member:
    """``load_member`` for a holder that will ``release_member`` it (an engine): the registry
    counts holders, so the last one to let go frees the member."""
    member = load_member(name_or_spec, backend=backend)
    with _LOAD_LOCK:
        key = str(parse_member_spec(name_or_spec, backend))
        _HOLDERS[key] = _HOLDERS.get(key, 0) + 1
    return member


def release_member(name_or_spec: str, backend: str | None = None) -> bool:
    """One holder lets go; when none is left the member leaves the registry and its resources are
    closed (HTTP clients, an in-process llama.cpp server; transformers weights are freed once no
    Python object refers to them). Returns True if it was freed."""
    key = str(parse_member_spec(name_or_spec, backend))
    with _LOAD_LOCK:
        if key not in _HOLDERS:
            return False
        _HOLDERS[key] -= 1
        if _HOLDERS[key] > 0:
            return False
        del _HOLDERS[key]
        member = _LOADED.pop(key, None)
    close = getattr(member, "close", None)
    if close is not None:
        close()
    return member is not None


def register_member(member: Member, name: str | None = None) -> None:
    """Make ``load_member(name)`` (default: the member's own name) return this already built member,
    so string-only surfaces (LangChain's ``models`` list, the CLI) can use it. The registration
    holds the member (engines closing never free it) until ``unregister_member``."""
    key = str(parse_member_spec(name or member.name))
    with _LOAD_LOCK:
        _LOADED[key] = member
        _HOLDERS[key] = _HOLDERS.get(key, 0) + 1


def unregister_member(name: str) -> None:
    key = str(parse_member_spec(name))
    with _LOAD_LOCK:
        _LOADED.pop(key, None)
        _HOLDERS.pop(key, None)


def _build(spec: MemberSpec, progress: bool, options: dict[str, Any]) -> Member:
    from ..zoo import gguf_path, resolve

    if spec.backend == "transformers":
        resolved = resolve(spec.target, progress=progress)
        return HFMember.from_pretrained(resolved.name, resolved.path)
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
    from .http import HttpSettings, JsonClient
    from .remote import load_tokenizer

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
            from .sglang import SGLangMember

            info = probe.get("/get_model_info")
            path = spec.tokenizer or (info.get("tokenizer_path") or info.get("model_path")
                                      if isinstance(info, dict) else None)
            if not path:
                raise probe.error("GET /get_model_info did not name a model path; add '#TOKENIZER' to the spec")
            return SGLangMember(spec.tokenizer or str(path), spec.target, load_tokenizer(path), **options)
        from .llamacpp import LlamaCppMember

        props = probe.get("/props")
        path = spec.tokenizer or (props.get("model_path") if isinstance(props, dict) else None)
        name = spec.tokenizer or Path(str(path or spec.target)).stem  # the GGUF's name, not its path
        if spec.tokenizer or (path and Path(str(path)).expanduser().exists()):
            return LlamaCppMember(name, spec.target, load_tokenizer(str(path)), **options)
        # The model file is not on this machine: read the tokenizer from the server itself.
        from .server_tokenizer import LlamaCppServerTokenizer

        own_tokenizer = LlamaCppServerTokenizer(spec.target, options.get("http"), name=str(spec))
        return LlamaCppMember(name, spec.target, own_tokenizer, **options)
    except (OSError, ValueError) as exc:  # the tokenizer the server reported is not loadable here
        raise probe.error(f"cannot load its tokenizer here ({exc}); add '#TOKENIZER' to the spec") from exc
    finally:
        probe.close()


__all__ = ["BACKENDS", "Capabilities", "HFMember", "HFSession", "Member", "MemberSpec", "Session",
           "acquire_member", "load_member", "parse_member_spec", "register_member", "release_member",
           "unregister_member", "with_backend"]
