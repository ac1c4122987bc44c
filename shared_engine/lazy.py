"""Package names that load on first use (PEP 562), so a light entry point stays light.

``safe-ensemble --help`` or a usage error should not wait for torch and transformers (seconds): the
packages that re-export heavy classes (``shared_engine``, ``members``, ``decoding``, ``evaluation``)
name them here and import the module that defines one only when it is first read. Each package also
imports them under ``TYPE_CHECKING``, so type checkers and the import-graph test see the real edges.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable
from typing import Any


def exports(**modules: Iterable[str]) -> dict[str, str]:
    """``exports(engine=("EnsembleEngine",), ...)`` -> ``{"EnsembleEngine": "engine", ...}``."""
    return {name: module for module, names in modules.items() for name in names}


def lazy_attributes(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package``: ``names`` maps each exported name to the
    submodule (relative to ``package``) that defines it."""

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f".{module}", package), name)
        setattr(sys.modules[package], name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
