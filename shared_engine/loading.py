"""The notice every command prints while an engine's members load (run, serve, eval, bench): starting
llama.cpp servers, installing the zoo or reading weights takes seconds to minutes in which nothing
else would be printed."""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from .members import MemberConfig

if TYPE_CHECKING:
    from .engine import EnsembleEngine


def load_with_notice(engine: EnsembleEngine, notice: bool = True) -> None:
    """Load the members before the first request, saying so on stderr (``notice``; nothing where they
    are loaded). A member that cannot load raises here. Blocking: an async caller runs it in a thread."""
    if engine.loaded:
        return
    if notice:
        names = [m.name or m.model if isinstance(m, MemberConfig) else m.name for m in engine.decoding_specs]
        print(f"loading {len(names)} member{'s' if len(names) > 1 else ''} ({', '.join(names)}) ...",
              file=sys.stderr, flush=True)
    started = time.perf_counter()
    engine.members  # noqa: B018 - loads them
    if notice:
        print(f"loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
