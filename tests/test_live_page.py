"""The live page (shared_engine/server/static/index.html) in headless Chromium over a scripted event
stream (fast): how it links the answer's text to the decision cards, and what it reports. The
real-model page tests are in test_server_zoo.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import httpx

from shared_engine.events import Candidate, EnsembleEvent, Event, FinishEvent, Stats, TokenEvent
from shared_engine.server import create_app
from shared_engine.server.background import serve_in_background
from shared_engine.tools import OutputPlan
from tests.test_server_tools import ScriptedDecoding
from tests.test_server_zoo import browser

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from shared_engine.options import GenerationParams

MODEL = "every-token-ensemble"


def fusion(position: int, offset: int, chosen: str, drafted: str, rows: list[tuple[str, float]],
           chosen_index: int = 0) -> EnsembleEvent:
    """As the engine sends it (report.fusion_event): a "\ufffd" row (part of a character) with its
    bytes in hex (made up here: they only tell the rows apart), the chosen row by index."""
    candidates = [Candidate(text=text, member_probs={"a": p, "b": p}, fused=p,
                            hex=f"f0 9f {i:02x}" if text == "\ufffd" else None) for i, (text, p) in enumerate(rows)]
    return EnsembleEvent(position=position, offset=offset, candidates=candidates, sharpened=False,
                         chosen=chosen, chosen_index=chosen_index, drafted=drafted,
                         changed=chosen != drafted or position == 2)


# "Hi " (0), then 😀 written by four byte tokens (1-4) of which 1-3 were fused (2 changed): the
# engine sends the whole character with token 4, the one completing it; then the fused choice
# " made" (5), which the drafter writes as three tokens (5-7); "." (8, fused, kept); and token 9's
# text sent in two chunks (its "?" held back as a possible stop's start).
SCRIPT: list[Event] = [
    TokenEvent(text="Hi ", source="draft", position=0),
    fusion(1, 3, "\ufffd", "\ufffd", [("\ufffd", 0.6), ("\ufffd", 0.3), ("x", 0.1)]),
    fusion(2, 4, "\ufffd", "\ufffd", [("\ufffd", 0.7), ("y", 0.3)]),
    fusion(3, 5, "\ufffd", "\ufffd", [("\ufffd", 0.9)]),
    TokenEvent(text="\U0001f600", source="draft", position=4),
    fusion(5, 7, " made", " said", [(" made", 0.6), (" said", 0.4)]),
    TokenEvent(text=" ", source="ensemble", position=5),
    TokenEvent(text="m", source="ensemble", position=6),
    TokenEvent(text="ade", source="ensemble", position=7),
    fusion(8, 12, ".", ".", [(".", 0.8), ("!", 0.2)]),
    TokenEvent(text=".", source="draft", position=8),
    fusion(9, 13, "!?", "!?", [("!?", 0.9)]),
    TokenEvent(text="!", source="draft", position=9),
    TokenEvent(text="?", source="draft", position=9),
]
ANSWER = "Hi \U0001f600 made.!?"


class ScriptedEvents(ScriptedDecoding):
    """Every request streams ``events`` as the engine would, then finishes."""

    def __init__(self, events: list[Event], failed_members: dict[str, str] | None = None) -> None:
        super().__init__(["unused"])
        self.events, self.failed_members = events, failed_members or {}

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncIterator[Event]:
        for event in self.events:
            yield event
        text = "".join(e.text for e in self.events if isinstance(e, TokenEvent))
        yield FinishEvent(reason="eos", text=text, stats=Stats(prompt_tokens=5, tokens=10),
                          failed_members=self.failed_members)


@contextmanager
def live_page(engine: ScriptedDecoding) -> Iterator[tuple[Page, list[str]]]:
    """The page over ``engine``'s server, loaded; the list collects its console errors."""
    with browser(create_app(engine)) as (url, page):
        errors: list[str] = []
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}/")
        page.wait_for_function("document.getElementById('model').textContent.includes('every-token')")
        yield page, errors


def answer(page: Page) -> None:
    page.click("#send")
    page.wait_for_selector("#stats[data-done]", timeout=30_000)
    page.wait_for_function("!document.getElementById('send').disabled")


def test_chunks_name_every_position_their_text_comes_from() -> None:
    """A character split over several byte tokens went out under the last token's position only, so
    the fusions of its first bytes matched no chunk; the later tokens of a fused choice named no
    fusion at all."""
    with serve_in_background(create_app(ScriptedEvents(SCRIPT))) as url, httpx.stream(
            "POST", f"{url}/v1/chat/completions", timeout=30,
            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": True}) as response:
        chunks = [json.loads(line[6:]) for line in response.iter_lines()
                  if line.startswith("data: {") and '"content":"' in line and '"content":""' not in line]
    got = [(c["choices"][0]["delta"]["content"], c["ensemble"]["position"], c["ensemble"]["positions"]) for c in chunks]
    assert got == [("Hi ", 0, [0]), ("\U0001f600", 4, [1, 2, 3, 4]), (" ", 5, [5]), ("m", 6, [5, 6]),
                   ("ade", 7, [5, 7]), (".", 8, [8]), ("!", 9, [9]), ("?", 9, [9])]


CARDS = """() => [...document.querySelectorAll('#decisions .decision')].map((card) => [card.dataset.decision,
    [...document.querySelectorAll(`#answer [data-decision~="${card.dataset.decision}"]`)]
        .map((e) => e.textContent).join('')])"""
FOCUSED = "[...document.querySelectorAll('#decisions .decision.focus')].map((card) => card.dataset.decision)"


def test_page_links_every_card_to_the_text_it_made() -> None:
    """The fusions of an emoji's first bytes linked to no text (the emoji showed unmarked); a fused
    " made" written as three tokens linked its card to " " only ("m", "ade" yellow, but a click found
    no card); a token's text sent in two chunks linked only the first."""
    with live_page(ScriptedEvents(SCRIPT)) as (page, errors):
        answer(page)
        assert page.inner_text("#answer") == ANSWER
        assert page.evaluate(CARDS) == [["t1", "\U0001f600"], ["t2", "\U0001f600"], ["t3", "\U0001f600"],
                                        ["t5", " made"], ["t8", "."], ["t9", "!?"]]
        emoji = page.locator("#answer .tok", has_text="\U0001f600")
        assert emoji.get_attribute("class") == "tok changed"  # token 2's fusion changed it
        emoji.click()
        assert page.evaluate(FOCUSED) == ["t1", "t2", "t3"]
        page.locator("#answer .tok", has_text="ade").click()
        assert page.evaluate(FOCUSED) == ["t5"]
        assert page.locator("#answer .tok.focus").all_inner_texts() == [" ", "m", "ade"]
        assert page.locator("#answer .tok.kept").all_inner_texts() == [".", "!", "?"]
        assert not errors, errors


def test_a_card_bolds_one_chosen_row_and_names_a_partial_characters_text() -> None:
    """Candidates holding some bytes of a character all read "\ufffd": a card bolded every such row
    as chosen, and its "chose \ufffd" said nothing of the character it was part of."""
    with live_page(ScriptedEvents(SCRIPT)) as (page, errors):
        answer(page)
        first = page.locator('#decisions [data-decision="t1"]')
        assert first.locator("tr.chosen").count() == 1
        assert first.locator("tr").nth(1).get_attribute("class") == "chosen"  # the highest, the fused choice
        assert "chose \ufffd f0 9f 00 (part of \U0001f600)" in first.inner_text()
        assert first.locator("tr.chosen code.t").get_attribute("title").startswith("bytes of a character")
        assert all(page.locator(f'#decisions [data-decision="{key}"] tr.chosen').count() == 1
                   for key in ("t2", "t3", "t5", "t8", "t9"))
        assert not errors, errors


def test_a_card_bolds_the_row_the_engine_chose_among_rows_that_read_alike() -> None:
    """When sampling picked the second of two "\ufffd" rows, the page bolded the first (it matched rows
    by text) and showed both rows alike; the event's chosen_index and each row's bytes tell them apart."""
    script = [TokenEvent(text="Hi ", source="draft", position=0),
              fusion(1, 3, "\ufffd", "\ufffd", [("\ufffd", 0.6), ("\ufffd", 0.3), ("x", 0.1)], chosen_index=1),
              TokenEvent(text="\U0001f600", source="draft", position=1)]
    with live_page(ScriptedEvents(script)) as (page, errors):
        answer(page)
        card = page.locator('#decisions [data-decision="t1"]')
        assert card.locator("tr.chosen").count() == 1
        assert card.locator("tr").nth(2).get_attribute("class") == "chosen"
        assert card.locator("tr.chosen code.t").inner_text() == "\ufffd f0 9f 01"
        assert "chose \ufffd f0 9f 01" in card.inner_text()
        assert not errors, errors


def test_page_says_which_member_was_dropped_mid_answer() -> None:
    """A member dropped mid-answer (on_member_failure="degrade") was never shown: the page ignored
    the final chunk's failed_members, and the answer looked like the whole ensemble's."""
    with live_page(ScriptedEvents(SCRIPT[:1], failed_members={"b": "server down"})) as (page, errors):
        answer(page)
        assert page.inner_text("#answer") == "Hi "
        assert page.inner_text("#error") == "member b dropped mid-answer: server down"
        assert not errors, errors


def test_page_leaves_the_length_to_the_server_unless_set() -> None:
    """The page always asked for max_tokens 128, whatever `serve --max-new-tokens` said."""
    with live_page(ScriptedEvents(SCRIPT[:1])) as (page, errors):
        bodies: list[dict[str, Any]] = []
        page.on("request", lambda r: bodies.append(json.loads(r.post_data or "{}"))
                if "chat/completions" in r.url else None)
        answer(page)
        page.fill("#max-tokens", "5")
        answer(page)
        assert ["max_tokens" in body for body in bodies] == [False, True] and bodies[1]["max_tokens"] == 5
        assert not errors, errors


class SlowEvents(ScriptedEvents):
    """An answer that takes seconds, a token at a time, unless stopped."""

    async def _decode(self, messages: list[dict[str, Any]], plan: OutputPlan,
                      gen: GenerationParams) -> AsyncIterator[Event]:
        for position in range(40):
            await asyncio.sleep(0.1)
            yield TokenEvent(text="la ", source="draft", position=position)
        yield FinishEvent(reason="length", text="la " * 40, stats=Stats(prompt_tokens=5, tokens=40))


def test_the_load_line_lets_go_of_a_stopped_answer() -> None:
    """After Stop the load line stayed "active 1/4": the page asked /health once, before the server
    had noticed the stop."""
    with live_page(SlowEvents([])) as (page, errors):
        page.click("#send")
        page.wait_for_selector("#answer .tok")
        page.click("#stop")
        page.wait_for_function("!document.getElementById('send').disabled")
        page.wait_for_function("document.getElementById('load').textContent.startsWith('active 0/')", timeout=5_000)
        assert page.inner_text("#error") == "stopped (the server cancelled the generation)"
        assert not errors, errors


def test_a_401_says_how_to_give_the_page_the_key() -> None:
    """On a server with an API key the page said "send 'Authorization: Bearer <key>'", which a
    browser user cannot do; the page takes the key from its address (/#api_key=KEY)."""
    with browser(create_app(ScriptedEvents(SCRIPT[:1]), api_key="s3cret")) as (url, page):
        for fragment, expected in [("", f"401: no API key given. The server wants an API key: open this page as "
                                        f"{url}/#api_key=KEY"),
                                   ("#api_key=wrong", "401: Incorrect API key provided. (the key given as "
                                                      "#api_key=… in this page's address)"),
                                   ("#api_key=s3cret", "")]:
            page.goto(f"{url}/{fragment}")
            page.reload()  # a fragment alone does not load the page again
            page.wait_for_function("document.getElementById('model').textContent.includes('every-token')")
            page.click("#send")
            page.wait_for_function("!document.getElementById('send').disabled")
            assert page.inner_text("#error") == expected


def test_a_card_says_its_character_was_never_finished() -> None:
    """The answer's last fusion chose the first byte of a character the answer ended before
    completing (the engine drops such bytes): its card linked to nothing and did not say why."""
    with live_page(ScriptedEvents([*SCRIPT, fusion(10, 15, "\ufffd", "\ufffd", [("\ufffd", 0.9)])])) as (page, errors):
        answer(page)
        assert page.inner_text("#answer") == ANSWER
        assert "(a character the answer ended before finishing: not shown)" in \
            page.locator('#decisions [data-decision="t10"] .head').inner_text()
        assert "part of" in page.locator('#decisions [data-decision="t1"] .head').inner_text()
        assert not errors, errors
