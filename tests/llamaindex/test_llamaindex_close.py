"""EnsembleLLM lets go of its members: close(), aclose(), garbage collection, copies (tiny toy members, seconds)."""

from __future__ import annotations

import copy
import gc
from collections.abc import Iterator

import pytest

from llamaindex_ensemble import EnsembleLLM
from shared_engine import EngineClosedError
from shared_engine.members import _HOLDERS
from tests.toy import registered_members, toy_member


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    """Two toy members under registry names, so each EnsembleLLM's engine holds them in the registry."""
    toys = [toy_member("toy-li-close-a", "byte_level"), toy_member("toy-li-close-b", "metaspace", seed=1)]
    with registered_members(toys) as registered:
        yield registered


def holders(names: list[str]) -> list[int]:
    return [_HOLDERS.get(f"transformers:{name}", 0) for name in names]


def test_dropped_llms_release_their_members(names: list[str]) -> None:
    """60 dropped EnsembleLLMs left 60 holds on each member before (loaded for good)."""
    before = holders(names)
    for _ in range(5):
        llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
        llm.complete("Hi")
        assert holders(names) == [n + 1 for n in before]
        del llm
        gc.collect()
    assert holders(names) == before


def test_close_releases_and_a_closed_llm_says_so(names: list[str]) -> None:
    before = holders(names)
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
    llm.complete("Hi")
    llm.close()
    assert holders(names) == before
    llm.close()  # twice is fine
    with pytest.raises(EngineClosedError, match="EnsembleLLM is closed"):
        llm.complete("Hi")
    with pytest.raises(EngineClosedError, match="EnsembleLLM is closed"):
        llm.stream_complete("Hi")


async def test_aclose_releases(names: list[str]) -> None:
    before = holders(names)
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
    await llm.acomplete("Hi")
    await llm.aclose()
    assert holders(names) == before
    await llm.aclose()
    with pytest.raises(EngineClosedError):
        await llm.acomplete("Hi")


def test_copies_hold_the_engine_until_the_last_goes(names: list[str]) -> None:
    before = holders(names)
    llm = EnsembleLLM(models=names, method="every-token", max_tokens=2)
    shallow, deep = llm.model_copy(), copy.deepcopy(llm)
    llm.complete("Hi")
    llm.close()
    assert shallow.complete("Hi").text == deep.complete("Hi").text  # still working
    del shallow
    gc.collect()
    assert holders(names) == [n + 1 for n in before]
    deep.close()
    assert holders(names) == before
    assert copy.copy(deep)._closed  # a copy of a closed LLM is closed
