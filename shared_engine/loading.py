"""The notice every command prints while an engine's members load (run, serve, eval, bench, calibrate): starting
llama.cpp servers, installing the zoo or reading weights takes seconds to minutes in which nothing
else would be printed."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .members import MemberConfig

if TYPE_CHECKING:
    from .engine import EnsembleEngine


def load_with_notice(engine: EnsembleEngine, notice: bool = True) -> None:
    """Load the members before the first request, saying so on stderr (``notice``; nothing where they
    are loaded). A member that cannot load raises here. Blocking: an async caller runs it in a thread."""
    if engine.loaded:
        return
    names = [m.name or m.model if isinstance(m, MemberConfig) else m.name for m in engine.decoding_specs]
    with loading_notice(names, notice):
        engine.members  # noqa: B018 - loads them


@contextmanager
def loading_notice(names: Sequence[str], notice: bool = True) -> Iterator[None]:
    """"loading N members (names) ..." on stderr, then "loaded in X s" once the block is done (``notice``;
    nothing when False): what every command says while members load (calibrate loads its own)."""
    if notice:
        print(f"loading {len(names)} member{'s' if len(names) > 1 else ''} ({', '.join(names)}) ...",
              file=sys.stderr, flush=True)
    started = time.perf_counter()
    yield
    if notice:
        print(f"loaded in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
