"""An answer length nobody set stays unset through the adapters' ways of remaking a model.

Unset, the engine caps the answer at the room the prompt leaves (tests/test_default_answer_length.py);
set (even to the default 256), it must fit. LangChain's ``configurable_fields`` and
``ChatEnsemble(**llm.model_dump())`` rebuilt the model with max_tokens=256 passed, so it was asked for
and the narrow ensemble's prompt refused; ``max_tokens = None`` assigned or in ``model_copy(update=)``
sent None to the engine (refused every call), where the constructor reads None as unset. Also the
structured-output wording both adapters share (``shared_engine.tools``)."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest
from langchain_core.runnables import ConfigurableField
from pydantic import BaseModel

from shared_engine import ContextLengthError
from shared_engine.tools import ResponseFormat, format_error
from tests.test_default_answer_length import PROMPT, ROOM, narrow_names
from tests.toy import registered_members, toy_member


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    with narrow_names("alu") as registered:
        yield registered


def _answers_to_the_window(llm: Any, **call: Any) -> None:
    message = llm.invoke(PROMPT, **call)
    assert message.response_metadata["engine_finish_reason"] == "length"
    assert 0 < message.usage_metadata["output_tokens"] <= ROOM


# -- 1. configurable_fields and model_dump keep an unset length unset -----------------------------

def test_configurable_fields_keeps_an_unset_length_unset(names: list[str]) -> None:
    from langchain_ensemble import ChatEnsemble

    llm = ChatEnsemble(models=names, method="every-token")
    configurable = llm.configurable_fields(temperature=ConfigurableField(id="temp"),
                                           max_tokens=ConfigurableField(id="length"))
    _answers_to_the_window(configurable, config={"configurable": {"temp": 0.0}})
    # chained (langchain-core hands the fields back to the model's own configurable_fields)
    chained = configurable.configurable_fields(seed=ConfigurableField(id="seed"))
    _answers_to_the_window(chained, config={"configurable": {"seed": 1}})
    for length in (ROOM + 1, 256):  # a length the config sets is asked for, the default's value too
        with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({length}\)"):
            configurable.invoke(PROMPT, config={"configurable": {"length": length}})


def test_configurable_fields_keeps_a_length_set_to_256(names: list[str]) -> None:
    from langchain_ensemble import ChatEnsemble

    configurable = ChatEnsemble(models=names, method="every-token", max_tokens=256).configurable_fields(
        temperature=ConfigurableField(id="temp"))
    with pytest.raises(ContextLengthError, match=r"max_new_tokens \(256\)"):
        configurable.invoke(PROMPT, config={"configurable": {"temp": 0.0}})


def test_model_dump_round_trip_keeps_the_length_as_set(names: list[str]) -> None:
    from langchain_ensemble import ChatEnsemble

    unset = ChatEnsemble(models=names, method="every-token")
    assert unset.max_tokens == 256 and unset.model_dump()["max_tokens"] is None
    _answers_to_the_window(ChatEnsemble(**unset.model_dump()))
    for length in (ROOM + 1, 256):
        dumped = ChatEnsemble(models=names, method="every-token", max_tokens=length).model_dump()
        with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({length}\)"):
            ChatEnsemble(**dumped).invoke(PROMPT)


# -- 2. None assigned or in model_copy(update=) is unset, as in the constructor --------------------

def test_langchain_none_after_construction_is_unset(names: list[str]) -> None:
    from langchain_ensemble import ChatEnsemble

    assigned = ChatEnsemble(models=names, method="every-token", max_tokens=5)
    assigned.max_tokens = None  # type: ignore[assignment]
    copied = ChatEnsemble(models=names, method="every-token", max_tokens=5).model_copy(update={"max_tokens": None})
    for llm in (assigned, copied):
        assert llm.max_tokens == 256 and "max_tokens" not in llm.model_fields_set
        _answers_to_the_window(llm)
    assigned.max_tokens = ROOM + 1  # set again: asked for
    with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({ROOM + 1}\)"):
        assigned.invoke(PROMPT)


def test_llamaindex_none_after_construction_is_unset(names: list[str]) -> None:
    from llamaindex_ensemble import EnsembleLLM

    assigned = EnsembleLLM(models=names, method="every-token", max_tokens=5)
    assigned.max_tokens = None  # type: ignore[assignment]
    copied = EnsembleLLM(models=names, method="every-token", max_tokens=5).model_copy(update={"max_tokens": None})
    for llm in (assigned, copied):
        assert llm.max_tokens == 256 and llm.metadata.num_output == 256
        response = llm.complete(PROMPT)
        assert response.raw["engine_finish_reason"] == "length"
        assert 0 < response.raw["usage"]["completion_tokens"] <= ROOM


# -- 3., 4. structured output's errors ------------------------------------------------------------

def test_invalid_json_names_the_character_once() -> None:
    error = format_error('{"a": "bc', ResponseFormat(type="json_object"))
    assert error == "not valid JSON (Unterminated string starting at character 6)"
    assert format_error('{"a" 1', ResponseFormat(type="json_object")) == \
        "not valid JSON (Expecting ':' delimiter at character 5)"


class _Record(BaseModel):
    name: str
    note: str


def test_llamaindex_structured_answer_cut_by_max_tokens_says_so() -> None:
    """It said only "not valid JSON", where ChatEnsemble's names max_tokens (the user's remedy)."""
    from llama_index.core.prompts import PromptTemplate

    from llamaindex_ensemble import EnsembleLLM

    wide = [copy.copy(toy_member("a", "byte_level", "llama", 1)), copy.copy(toy_member("b", "metaspace", "gpt2", 2))]
    wide[0].name, wide[1].name = "alu-wide-a", "alu-wide-b"  # room for the schema's prompt
    with registered_members(wide) as wide_names:
        llm = EnsembleLLM(models=wide_names, method="every-token", max_tokens=3)
        with pytest.raises(ValueError, match="not a valid _Record: the answer was cut by max_tokens before its "
                                             "JSON ended: not valid JSON"):
            llm.structured_predict(_Record, PromptTemplate("Hi"))
