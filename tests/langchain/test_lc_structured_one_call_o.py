"""with_structured_output (function_calling) binds one call, as ChatOpenAI does: since abe0399 a forced answer
may go on to further calls where parallel calls are not refused, which for a schema only costs tokens (and a
retry where an extra call fails its check)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from tests.langchain.test_invalid_calls_o import MODELS, ScriptedCall


class Person(BaseModel):
    name: str
    age: int


def test_structured_output_asks_for_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[dict[str, Any]] = []

    class Recording(ScriptedCall):
        async def astream(self, messages: list[dict], **params: object):  # type: ignore[no-untyped-def]
            seen.append(dict(params))
            async for event in super().astream(messages, **params):
                yield event

    monkeypatch.setattr(chat_models, "_shared_engine", lambda *args: Recording(' {"name": "Bob", "age": 31}}'))
    assert ChatEnsemble(models=MODELS).with_structured_output(Person).invoke("Bob is 31") == Person(name="Bob", age=31)
    assert seen[0]["parallel_tool_calls"] is False and seen[0]["tool_choice"] == "any"
