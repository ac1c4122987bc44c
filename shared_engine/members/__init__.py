"""Model backends ("members") and the process-wide registry that loads each model once."""

from __future__ import annotations

import threading

from .base import Member, Session
from .hf import HFMember, HFSession

_LOADED: dict[str, HFMember] = {}
_LOAD_LOCK = threading.Lock()


def load_member(name_or_path: str, progress: bool = True) -> HFMember:
    """Load a zoo name, a local Hugging Face folder or a .gguf path, once per process."""
    from ..zoo import resolve

    with _LOAD_LOCK:
        member = _LOADED.get(name_or_path)
        if member is None:
            resolved = resolve(name_or_path, progress=progress)
            member = HFMember.from_pretrained(resolved.name, resolved.path)
            _LOADED[name_or_path] = member
        return member


__all__ = ["HFMember", "HFSession", "Member", "Session", "load_member"]
