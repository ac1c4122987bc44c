"""A deep ``model_copy`` with an update, in both adapters (``shared_engine.options.copy_unsetting``).

pydantic's ``model_copy(update=..., deep=True)`` deep-copies the private attributes itself instead of
calling the model's ``__deepcopy__``: EnsembleLLM's engine (its locks) reached ``deepcopy`` and
``model_copy(update={"temperature": 0.7}, deep=True)`` raised "cannot pickle '_thread.lock' object"
(``{"max_tokens": None}`` alone worked: it leaves no update for pydantic)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from langchain_ensemble import ChatEnsemble
from llamaindex_ensemble import EnsembleLLM
from tests.test_default_answer_length import PROMPT, narrow_names


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    with narrow_names("ldc") as registered:
        yield registered


@pytest.mark.parametrize("update", [{"temperature": 0.7}, {"max_tokens": None, "temperature": 0.7},
                                    {"max_tokens": 3}])
def test_a_deep_copy_of_an_ensemble_llm_takes_an_update(names: list[str], update: dict[str, Any]) -> None:
    llm = EnsembleLLM(models=names, method="safe", max_tokens=5, engine_options={"draft_length": 2})
    clone = llm.model_copy(update=update, deep=True)
    assert clone.engine is llm.engine  # shared through __deepcopy__, not copied
    assert clone.engine_options == {"draft_length": 2} and clone.engine_options is not llm.engine_options
    for key, value in update.items():
        assert getattr(clone, key) == (value if value is not None else 256)
        assert (key in clone.model_fields_set) == (value is not None)
    assert (llm.temperature, llm.max_tokens) == (0.0, 5)  # the original keeps its fields
    llm.close()  # the copy holds the engine with a hold of its own
    assert clone.complete(PROMPT).text is not None
    clone.close()


def test_a_deep_copy_of_a_chat_ensemble_takes_an_update(names: list[str]) -> None:
    model = ChatEnsemble(models=names, method="safe", max_tokens=5, engine_options={"draft_length": 2})
    clone = model.model_copy(update={"temperature": 0.7}, deep=True)
    assert clone.temperature == 0.7 and model.temperature is None and "temperature" in clone.model_fields_set
    assert clone.engine_options == {"draft_length": 2} and clone.engine_options is not model.engine_options
    model.close()
    # sampled (temperature 0.7, no seed): any end of a whole answer; the point is that the copy still answers
    assert clone.invoke(PROMPT).response_metadata["engine_finish_reason"] in {"length", "stop", "eos"}
    clone.close()
