"""with_structured_output(dict schema) (function_calling): a call the engine found invalid after its retries
(``format_error``: age -1 under minimum 0) was returned as the parsed result in every mode, where a JSON answer
raises (and a pydantic schema's model refuses it): it is an OutputParserException, in ``parsing_error`` with
include_raw=True."""

from __future__ import annotations

from typing import Any

import pytest
from langchain_core.exceptions import OutputParserException

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from tests.langchain.test_invalid_calls_o import MODELS, Person, ScriptedCall, every_way


def _structured(monkeypatch: pytest.MonkeyPatch, text: str, **kwargs: Any) -> Any:
    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: ScriptedCall(text))
    return ChatEnsemble(models=MODELS, max_tokens=64).with_structured_output(Person.model_json_schema(), **kwargs)


def test_a_dict_schema_call_out_of_its_schema_is_a_parsing_error(monkeypatch: pytest.MonkeyPatch) -> None:
    so = _structured(monkeypatch, ' {"name": "Al", "age": -1}}\n</tool_call>')
    for mode, result in every_way(so).items():
        assert isinstance(result, OutputParserException), (mode, result)
        assert "does not match the schema" in str(result) and "-1" in str(result), mode
    raw = _structured(monkeypatch, ' {"name": "Al", "age": -1}}\n</tool_call>', include_raw=True).invoke("x")
    assert raw["parsed"] is None and isinstance(raw["parsing_error"], OutputParserException)


def test_a_valid_dict_schema_call_still_parses(monkeypatch: pytest.MonkeyPatch) -> None:
    results = every_way(_structured(monkeypatch, ' {"name": "Al", "age": 3}}\n</tool_call>'))
    assert results["invoke"] == {"name": "Al", "age": 3}
    assert results["stream"][-1] == results["astream"][-1] == {"name": "Al", "age": 3}
