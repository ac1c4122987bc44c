"""A closed ChatEnsemble / EnsembleLLM stays closed through pickling as through copying; an open one
comes back usable, loading its members on first use; LlamaIndex JSON is a recipe (tiny toy members, seconds)."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM
from shared_engine import EngineClosedError
from shared_engine.members import _HOLDERS
from tests.toy import registered_members, toy_member

COPIES: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda model: pickle.loads(pickle.dumps(model)),
    "pickle-twice": lambda model: pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(model)))),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
    "model_copy": lambda model: model.model_copy(),
    "model_copy-deep": lambda model: model.model_copy(deep=True),
}


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    """Two toy members under registry names of this module's own (ChatEnsemble shares engines per
    configuration: another module's models must not have loaded them)."""
    toys = [toy_member("toy-pickle-a", "byte_level"), toy_member("toy-pickle-b", "metaspace", seed=1)]
    with registered_members(toys) as registered:
        yield registered


def holders(names: list[str]) -> list[int]:
    return [_HOLDERS.get(f"transformers:{name}", 0) for name in names]


def chat(names: list[str]) -> ChatEnsemble:
    return ChatEnsemble(models=names, method="every-token", max_tokens=2)


def llm(names: list[str]) -> EnsembleLLM:
    return EnsembleLLM(models=names, method="every-token", max_tokens=2)


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_of_a_closed_chat_model_is_closed(names: list[str], how: str) -> None:
    """A pickled closed ChatEnsemble came back open: it held the engine again, loaded the members and
    answered, where its copies raised."""
    before = holders(names)
    model = chat(names)
    model.invoke("Hi")
    model.close()
    assert holders(names) == before
    again = COPIES[how](model)
    with pytest.raises(EngineClosedError, match="ChatEnsemble is closed"):
        again.invoke("Hi")
    again.close()  # closing it again does nothing
    assert copy.deepcopy(again)._closed and pickle.loads(pickle.dumps(again))._closed
    assert _chat_engine_key(again) not in chat_models._ENGINES  # held by no one: not built again
    assert holders(names) == before


@pytest.mark.parametrize("how", list(COPIES))
def test_a_copy_of_a_closed_llm_is_closed(names: list[str], how: str) -> None:
    """A pickled closed EnsembleLLM came back open, loading its members again."""
    before = holders(names)
    model = llm(names)
    model.complete("Hi")
    model.close()
    again = COPIES[how](model)
    with pytest.raises(EngineClosedError, match="EnsembleLLM is closed"):
        again.complete("Hi")
    with pytest.raises(EngineClosedError, match="EnsembleLLM is closed"):
        again.engine  # noqa: B018
    again.close()
    assert copy.deepcopy(again)._closed and pickle.loads(pickle.dumps(again))._closed
    assert holders(names) == before


async def test_a_restored_closed_llm_acloses_quietly(names: list[str]) -> None:
    model = llm(names)
    model.close()
    again = pickle.loads(pickle.dumps(model))
    await again.aclose()
    with pytest.raises(EngineClosedError):
        await again.acomplete("Hi")


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])  # the other copies: tests/llamaindex, tests/langchain
def test_an_open_model_pickled_or_copied_is_open_and_loads_on_first_use(names: list[str], how: str) -> None:
    """As before: a copy or a restored model is one more user with a hold of its own, loading nothing
    until it is called, and answering as the original does."""
    before = holders(names)
    for build, ask in ((chat, lambda m: m.invoke("Hi").content), (llm, lambda m: m.complete("Hi").text)):
        model = build(names)
        again = COPIES[how](model)
        assert not again._closed
        assert holders(names) == before  # nothing loaded by construction or unpickling
        answer = ask(again)
        model.close()
        assert ask(again) == answer  # closing the original leaves the copy working
        again.close()
        assert holders(names) == before  # its own hold only: closing both let go of the members


def test_llm_json_is_a_recipe_that_builds_an_open_llm(names: list[str]) -> None:
    """to_json / to_dict say which ensemble to build, not whether one was closed: from_json of a closed
    LLM's JSON is a new, open LLM (a storage context read by a later process must work)."""
    model = llm(names)
    answer = model.complete("Hi").text
    model.close()
    assert "closed" not in model.to_dict()
    for built in (EnsembleLLM.from_json(model.to_json()), EnsembleLLM.from_dict(model.to_dict())):
        assert not built._closed
        assert built.complete("Hi").text == answer
        built.close()


def _chat_engine_key(model: ChatEnsemble) -> tuple[Any, ...]:
    return chat_models._engine_key(*model._engine_config())
