"""The server with the real zoo members: the official `openai` client, the cookbook's clients
(openai, curl, LangChain's ChatOpenAI), and the live page in a real headless Chromium."""

from __future__ import annotations

import importlib.util
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import openai
import pytest

from shared_engine import EnsembleEngine
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background

if TYPE_CHECKING:
    from playwright.sync_api import Page
    from starlette.types import ASGIApp

pytestmark = pytest.mark.zoo
QWEN, SMOL = "qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = "/usr/bin/chromium"
# As this machine needs them: no sandbox as root, and no background connections to Google's hosts.
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
MESSAGES = [{"role": "user", "content": "Name three primary colors."}]


@pytest.fixture(scope="module")
def safe_url() -> Iterator[str]:
    with serve_in_background(create_app(EnsembleEngine([QWEN, SMOL], method="safe"))) as url:
        yield url


def test_official_openai_client_streamed_and_not(safe_url: str) -> None:
    client = openai.OpenAI(base_url=f"{safe_url}/v1", api_key="unused", max_retries=0)
    assert [m.id for m in client.models.list()] == ["safe-ensemble"]

    whole = client.chat.completions.create(model="safe-ensemble", messages=MESSAGES, max_tokens=16)  # type: ignore[arg-type]
    answer = whole.choices[0].message.content
    assert answer and whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage is not None and 0 < whole.usage.completion_tokens <= 16
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    extension = whole.model_extra["ensemble"]  # type: ignore[index]
    assert extension["members"] == [QWEN, SMOL] and extension["stats"]["tokens"] == whole.usage.completion_tokens

    stream = client.chat.completions.create(model="safe-ensemble", messages=MESSAGES, max_tokens=16,  # type: ignore[arg-type]
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == answer  # greedy: the same answer either way
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [whole.choices[0].finish_reason]
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens


def _cookbook() -> ModuleType:
    spec = importlib.util.spec_from_file_location("cookbook_streaming_app", ROOT / "cookbooks" / "streaming_app.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cookbook_clients_openai_curl_langchain(safe_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    cookbook = _cookbook()
    cookbook.with_openai(safe_url, "safe-ensemble", 12)
    cookbook.with_langchain(safe_url, "safe-ensemble", 12)
    if shutil.which("curl"):
        cookbook.with_curl(safe_url, "safe-ensemble", 12)
    out = capsys.readouterr().out
    assert "[openai] finish=" in out and "ensemble decisions" in out
    assert "[langchain] '" in out and "'output_tokens'" in out
    assert "[langchain stream] " in out
    if shutil.which("curl"):
        assert "last '[DONE]'" in out


@contextmanager
def browser(app: ASGIApp, **page_options: Any) -> Iterator[tuple[str, Page]]:
    """``app`` served on a free port and a headless Chromium page (not yet navigated)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing and could not be installed (`make test` runs apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with serve_in_background(app) as url, sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            yield url, chromium.new_page(**page_options)
        finally:
            chromium.close()


@contextmanager
def browser_page(engine: EnsembleEngine, method: str) -> Iterator[tuple[Page, list[str]]]:
    """The live page of a server over ``engine``, loaded in headless Chromium; the list collects
    the page's console errors."""
    ARTIFACTS.mkdir(exist_ok=True)
    with browser(create_app(engine), viewport={"width": 1280, "height": 800}) as (url, page):
        console_errors: list[str] = []
        page.on("console", lambda m: console_errors.append(m.text) if m.type == "error" else None)
        page.goto(f"{url}/")
        page.wait_for_function(f"document.getElementById('model').textContent.includes('{method}')")
        yield page, console_errors


def test_live_page_in_headless_chromium() -> None:
    # every-token fuses at every shared boundary, so decisions are certain to appear.
    with browser_page(EnsembleEngine([QWEN, SMOL], method="every-token"), "every-token") as (page, console_errors):
        page.fill("#prompt", "What is 17 + 25? Answer briefly.")
        page.fill("#max-tokens", "16")
        page.click("#send")
        page.wait_for_selector("#stats[data-done]", timeout=240_000)
        answer = page.inner_text("#answer")
        decisions = page.locator("#decisions .decision")
        assert answer.strip(), "no answer appeared"
        assert decisions.count() >= 1, "no ensemble decision was listed"
        assert page.locator("#answer .tok.kept, #answer .tok.changed").count() >= 1
        first = decisions.first
        assert first.locator("table tr").count() >= 2  # a header row and candidates
        assert QWEN in first.inner_text() and SMOL in first.inner_text()
        assert "ensemble rate" in page.inner_text("#stats") and "tokens/s" in page.inner_text("#stats")
        assert f"drafter: {QWEN}" in page.inner_text("#model") and QWEN in page.inner_text("#stats")
        page.locator("#answer .tok.kept, #answer .tok.changed").first.click()
        assert page.locator("#decisions .decision.focus").count() == 1
        page.screenshot(path=str(ARTIFACTS / "server_page.png"))
        assert not console_errors, console_errors


def test_live_page_shows_adafuse_spans() -> None:
    # A margin threshold of 1.0 is never reached: every span is voted on, so span decisions appear.
    engine = EnsembleEngine([QWEN, SMOL], method="adafuse", threshold=1.0)
    with browser_page(engine, "adafuse") as (page, console_errors):
        page.fill("#prompt", "Name three primary colors.")
        page.fill("#max-tokens", "8")
        page.click("#send")
        page.wait_for_selector("#stats[data-done]", timeout=240_000)
        cards = page.locator("#decisions .decision")
        assert cards.count() >= 1, "no span decision was listed"
        first = cards.first
        text = first.inner_text()
        assert "voted" in text and "(leader)" in text and "margin" in text
        assert QWEN in text and SMOL in text and "proposed by" in text and "score" in text
        assert first.locator("tr.chosen").count() == 1
        voted = page.locator("#answer .tok.voted")
        assert voted.count() >= 1, "no voted span was highlighted in the answer"
        assert "".join(voted.all_inner_texts()) == page.inner_text("#answer")  # every span was voted
        assert "spans / voted" in page.inner_text("#stats")
        voted.last.click()
        assert page.locator("#decisions .decision.focus").count() == 1
        page.screenshot(path=str(ARTIFACTS / "server_page_adafuse.png"))
        assert not console_errors, console_errors
