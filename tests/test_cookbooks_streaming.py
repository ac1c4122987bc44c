"""The streaming cookbook against a running server on tiny random members: the base_url `serve`
prints (``.../v1``) and a server of another method than safe both work (a 404 traceback before)."""

from __future__ import annotations

import importlib.util
import shutil
import sys
import threading
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from shared_engine import EnsembleEngine
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from tests.test_server import MODEL, USER, gated_members, toy_engine, toy_members

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


def test_a_busy_server_is_a_readable_line_from_every_client(monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """With every place taken, curl's 429 body (no `data:` lines) was an IndexError and the openai
    client's RateLimitError (after its retries) an uncaught traceback."""
    cookbook = load()
    gate = threading.Event()
    app = create_app(EnsembleEngine(gated_members(monkeypatch, gate), method="every-token"),
                     max_active=1, max_waiting=0)
    with serve_in_background(app) as url:
        body = {"model": MODEL, "messages": USER, "max_tokens": 2}
        hog = threading.Thread(target=lambda: httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60))
        hog.start()
        try:
            deadline = time.monotonic() + 60
            while app.state.admission.load().active == 0:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            monkeypatch.setattr(sys, "argv", ["streaming_app.py", "--base-url", url, "--max-tokens", "4"])
            cookbook.main()
        finally:
            gate.set()
            hog.join()
    out = capsys.readouterr().out
    for client in ("openai", "langchain") + (("curl",) if shutil.which("curl") else ()):
        assert f"[{client}] HTTP 429: the server is busy" in out, out


@pytest.mark.skipif(shutil.which("curl") is None, reason="needs curl")
def test_an_error_in_the_stream_is_a_readable_line_from_curl(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A generation that fails after the 200 ends the stream with an ``{"error": ...}`` chunk (no
    [DONE]); curl's reader skipped the last event as [DONE] and printed the cut answer as the answer."""
    cookbook = load()
    members, calls = toy_members(), [0]
    for member in members:
        original = member.run

        async def failing(fn: Any, *args: Any, _original: Any = original) -> Any:
            calls[0] += 1
            if calls[0] > 6:
                raise RuntimeError("the member's process died")
            return await _original(fn, *args)

        monkeypatch.setattr(member, "run", failing)
    with serve_in_background(create_app(EnsembleEngine(members, method="every-token"))) as url:
        cookbook.with_curl(url, MODEL, 20)
    out = capsys.readouterr().out
    assert "[curl] the stream ended with an error: generation failed: the member's process died" in out, out


def test_no_server_at_the_base_url_is_one_readable_line(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Asking a dead URL for its model ended in a 40-line httpx/openai traceback (APIConnectionError)."""
    cookbook = load()
    with serve_in_background(create_app(toy_engine())) as url:
        pass  # the port was just served and is now closed: nothing answers there
    monkeypatch.setattr(sys, "argv", ["streaming_app.py", "--base-url", f"{url}/v1"])
    with pytest.raises(SystemExit) as exit_:
        cookbook.main()
    assert exit_.value.code == f"no server answers at {url}: start one with 'safe-ensemble serve ...' " \
                               "or leave out --base-url"


@pytest.mark.parametrize("page", [b'{"object": "list", "data": []}', b"<html><body>a web page</body></html>"])
def test_a_server_that_lists_no_model_is_one_readable_line(monkeypatch: pytest.MonkeyPatch, page: bytes) -> None:
    """A 200 from GET /v1/models with no model (an empty list, a web page) ended in an IndexError or
    AttributeError traceback."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    async def models(_: Any) -> Response:
        return Response(page, media_type="application/json" if page.startswith(b"{") else "text/html")

    cookbook = load()
    with serve_in_background(Starlette(routes=[Route("/v1/models", models)])) as url:
        monkeypatch.setattr(sys, "argv", ["streaming_app.py", "--base-url", url])
        with pytest.raises(SystemExit) as exit_:
            cookbook.main()
    assert str(exit_.value.code).startswith(f"GET {url}/v1/models names no model")
