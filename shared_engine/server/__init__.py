"""An OpenAI-compatible HTTP server and a live web page over one shared ``EnsembleEngine``.

``create_app`` is imported lazily so that ``safe-ensemble --help`` works without the ``server``
extra (starlette, uvicorn) installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .app import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from .app import create_app

        return create_app
    raise AttributeError(name)
