"""The LangChain cookbooks run as smoke tests (imported, so the zoo members load once per process)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
from langchain_core.messages import AIMessage, ToolMessage

pytestmark = pytest.mark.zoo

COOKBOOKS = Path(__file__).resolve().parents[1] / "cookbooks"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"cookbook_{name}", COOKBOOKS / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


async def test_langchain_rag_cookbook(capsys: pytest.CaptureFixture[str]) -> None:
    rag = load("langchain_rag")
    out = await rag.main()
    assert "47 minutes" in out["docs"][0]  # the embedding model retrieved the right document
    assert "47" in out["answer"]
    names = [name for name, _ in out["events"]]
    assert names[-1] == "ensemble.finish" and set(names) <= {"ensemble.ensemble", "ensemble.finish"}
    printed = capsys.readouterr().out
    assert out["answer"] in printed and "[finish:" in printed


def test_langchain_agent_cookbook(capsys: pytest.CaptureFixture[str]) -> None:
    agent = load("langchain_agent")
    messages = agent.main()
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert calls and calls[0]["name"] == "multiply" and calls[0]["args"] == {"a": 1234, "b": 5678}
    assert any(isinstance(m, ToolMessage) and m.content == "7006652" for m in messages)
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls and "7006652" in final.content.replace(",", "")
    assert "model -> tool call: multiply" in capsys.readouterr().out
