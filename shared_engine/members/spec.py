"""Member spec strings, ``[BACKEND:]TARGET[#TOKENIZER]`` (see the package docstring)."""

from __future__ import annotations

import difflib
import re
from pathlib import Path
from typing import Literal, get_args

import httpx
from pydantic import BaseModel, ConfigDict

from ..errors import InvalidRequestError
from ..zoo import ZOO

Backend = Literal["transformers", "llamacpp", "vllm", "sglang"]
BACKENDS: tuple[str, ...] = get_args(Backend)
LOCAL_BACKENDS = ("transformers", "llamacpp")
"""Backends that can run a zoo name on this machine (``--backend`` of the CLI)."""


def default_backend(target: str) -> Backend:
    """The backend of a model named without a prefix: llama.cpp for a zoo name, transformers for the
    rest (HF folders, hub ids, .gguf paths). The zoo ships GGUF weights; llama.cpp runs them about 2x
    faster on this CPU (SAFE 1.8x) than transformers runs their dequantized float32 copy, with close
    arithmetic (README, "Which backend runs a zoo name"). A zoo member that asks for placement options
    (device, dtype, ...) runs on transformers instead (``MemberConfig``)."""
    return "llamacpp" if target in ZOO else "transformers"


class MemberSpec(BaseModel):
    """A parsed member spec string (see the ``members`` package docstring)."""

    model_config = ConfigDict(frozen=True)

    backend: Backend
    target: str
    tokenizer: str | None = None

    @property
    def is_url(self) -> bool:
        """An http(s) URL; a scheme is case-insensitive (``HTTP://host`` is one too)."""
        return self.target.lower().startswith(("http://", "https://"))

    def __str__(self) -> str:
        return f"{self.backend}:{self.target}" + (f"#{self.tokenizer}" if self.tokenizer else "")


def split_prefix(spec: str) -> tuple[str | None, str]:
    """``llamacpp:NAME`` -> ("llamacpp", "NAME"); a spec without a backend prefix -> (None, spec)."""
    head, sep, rest = spec.partition(":")
    return (head, rest) if sep and head in BACKENDS else (None, spec)


_PREFIX_LIKE = re.compile(r"[A-Za-z][A-Za-z0-9_.+-]+")
"""What a backend prefix looks like (``vlm`` of ``vlm:http://...``): a word, not a drive letter (``C:``),
a path or a hub id (neither has a colon after a word alone)."""


_ALIASES = {"hf": "transformers", "huggingface": "transformers", "torch": "transformers",
            "gguf": "llamacpp", "llama-server": "llamacpp", "llama_cpp": "llamacpp"}
"""Other names users give a backend, for the hint."""


def did_you_mean(backend: str, target: str = "") -> str:
    """The hint an error about a spec's backend prefix ends with: `` (did you mean 'vllm:...'?)``."""
    return f" (did you mean '{backend}:{target}'?)"


def _unknown_prefix(spec: str) -> InvalidRequestError | None:
    """``unknown backend`` for ``vlm:http://...`` or ``llama.cpp:NAME``: read as a model name, the
    typo got "unknown model" with a list of zoo names that says nothing of the prefix."""
    head, sep, _ = spec.partition(":")
    if not sep or head in BACKENDS or not _PREFIX_LIKE.fullmatch(head) or head.lower() in ("http", "https"):
        return None
    if Path(spec).expanduser().exists():  # a file whose name holds a colon
        return None
    meant = _ALIASES.get(head.lower()) or next(
        iter(difflib.get_close_matches(head.lower().replace(".", ""), BACKENDS, n=1, cutoff=0.5)), None)
    hint = did_you_mean(meant) if meant else ""
    return InvalidRequestError(f"unknown backend {head!r} in member spec {spec!r}{hint}; a spec is "
                               f"[BACKEND:]MODEL_OR_URL with BACKEND one of {', '.join(BACKENDS)}")


def parse_member_spec(spec: str, backend: str | None = None) -> MemberSpec:
    """``[BACKEND:]TARGET[#TOKENIZER]`` -> MemberSpec; ``backend`` is the default for bare targets
    (else ``default_backend``)."""
    if (unknown := _unknown_prefix(spec)) is not None:
        raise unknown
    prefix, rest = split_prefix(spec)
    target, _, tokenizer = rest.partition("#")
    target = target.strip()
    chosen = prefix or backend or default_backend(target)
    if chosen not in BACKENDS:
        raise InvalidRequestError(f"unknown backend {chosen!r}; use one of {BACKENDS}")
    parsed = MemberSpec(backend=chosen, target=target, tokenizer=tokenizer.strip() or None)
    if not parsed.target:
        raise InvalidRequestError(f"member spec {spec!r} names no model or URL")
    if parsed.backend in ("vllm", "sglang") and not parsed.is_url:
        raise InvalidRequestError(f"{parsed.backend} members are servers: give a URL, e.g. "
                                  f"'{parsed.backend}:http://127.0.0.1:8000' (got {spec!r})")
    if parsed.backend == "transformers" and parsed.is_url:
        raise InvalidRequestError(f"a URL needs a server backend prefix (llamacpp:, vllm:, sglang:), got {spec!r}")
    if parsed.is_url:
        check_url(parsed.target, spec)
        # 'URL/' is the same server as 'URL': one member, not two that each lease its slots
        parsed = parsed.model_copy(update={"target": parsed.target.rstrip("/")})
    return parsed


def check_url(url: str, spec: str | None = None) -> None:
    """Refuse a server URL that no request could reach (a typo in the port, a space in the host), with
    a readable error, before anything connects."""
    where = f" in member spec {spec!r}" if spec is not None and spec != url else ""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as err:
        raise InvalidRequestError(f"{url!r}{where} is not a valid URL: {err}") from None
    if not parsed.host or any(c.isspace() for c in url):
        raise InvalidRequestError(f"{url!r}{where} is not a valid URL: give http(s)://HOST:PORT")
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        raise InvalidRequestError(f"{url!r}{where} is not a valid URL: port {parsed.port} is outside 1..65535")


def with_backend(spec: str, backend: str | None) -> str:
    """``spec`` with ``backend`` applied when it has no prefix of its own (for CLI model lists)."""
    return str(parse_member_spec(spec, backend)) if backend else spec
