"""The streaming cookbook against a running server on tiny random members: the base_url `serve`
prints (``.../v1``) and a server of another method than safe both work (a 404 traceback before)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.test_server import toy_engine

COOKBOOK = Path(__file__).resolve().parents[1] / "cookbooks" / "streaming_app.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cookbook_streaming_app", COOKBOOK)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_server_root_drops_the_v1_that_serve_prints() -> None:
    cookbook = load()
    for url in ("http://h:8000", "http://h:8000/", "http://h:8000/v1", "http://h:8000/v1/"):
        assert cookbook.server_root(url) == "http://h:8000"


def test_the_cookbook_runs_against_serves_printed_url_and_model(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    cookbook = load()
    with serve_in_background(create_app(toy_engine())) as url:  # every-token: not the default safe-ensemble
        assert cookbook.served_model(url) == "every-token-ensemble"
        monkeypatch.setattr(sys, "argv", ["streaming_app.py", "--base-url", f"{url}/v1", "--max-tokens", "4"])
        cookbook.main()
    out = capsys.readouterr().out
    assert "[openai] finish=" in out and "[langchain] " in out
