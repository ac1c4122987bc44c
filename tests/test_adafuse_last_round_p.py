"""AdaFuse's last rounds (issue #18): a round's members wrote and scored whole spans (up to 32
tokens each) for the token or two max_new_tokens still allowed; at max_new_tokens=1 on toy members
each member made 21-36 forward passes. ``_write`` now stops a span at the tokens left (on a whole
character, so the decision's text is the text its chunk carries). Rounds the cap does not reach
decide as before. Forward passes are counted with a hook on each toy model (never timed)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from shared_engine import EnsembleEngine
from shared_engine.decoding import adafuse
from shared_engine.events import AdaFuseEvent, Event, TokenEvent
from tests.toy import toy_member

USER = [{"role": "user", "content": "Sofia walked to the park"}]
ROUND_LIMIT = adafuse.TOKENS_PER_WORD * (adafuse.AdaFuseSettings().max_words + 1)


@pytest.fixture(scope="module")
def members() -> list:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


@pytest.fixture
def forwards(members: list) -> Iterator[dict[str, int]]:
    """Forward passes per member name, counted from here on."""
    counts = {m.name: 0 for m in members}
    hooks = [m.model.register_forward_hook(lambda *_, name=m.name: counts.__setitem__(name, counts[name] + 1))
             for m in members]
    yield counts
    for hook in hooks:
        hook.remove()


def _events(members: list, max_new_tokens: int) -> list[Event]:
    async def run() -> list[Event]:
        with EnsembleEngine(members, method="adafuse", max_new_tokens=max_new_tokens) as engine:
            return [event async for event in engine.astream(USER)]
    return asyncio.run(run())


def test_one_token_costs_no_whole_round_of_spans(members: list, forwards: dict[str, int]) -> None:
    _events(members, 1)
    # a look, proposals cut at one token (a character), a score each: a handful, not 21-36
    assert max(forwards.values()) <= 8, forwards


@pytest.mark.parametrize("max_new_tokens", [1, 2, 3, 4, 6])
def test_every_decision_describes_the_text_sent_for_it(members: list, max_new_tokens: int) -> None:
    """Each span decision is followed by text chunks at its span's positions (the server's check),
    and the text sent from there to the next decision is its chosen span (a prefix of it in the round
    max_new_tokens ends)."""
    events = _events(members, max_new_tokens)
    decisions = [i for i, e in enumerate(events) if isinstance(e, AdaFuseEvent)]
    assert decisions
    for n, at in enumerate(decisions):
        decision = events[at]
        assert isinstance(decision, AdaFuseEvent)
        until = decisions[n + 1] if n + 1 < len(decisions) else len(events)
        sent = [e for e in events[at + 1:until] if isinstance(e, TokenEvent)]
        end = events[until].position if until < len(events) else max_new_tokens  # type: ignore[attr-defined]
        # a character split across tokens is sent with the token that completes it, in the span
        assert sent and all(decision.position <= e.position < end for e in sent), (decision.position, sent)
        text = "".join(e.text for e in sent)
        chosen = decision.chosen
        assert (text == chosen) if n + 1 < len(decisions) else chosen.startswith(text), (text, chosen)


def test_rounds_the_cap_does_not_reach_decide_as_before(members: list, monkeypatch: pytest.MonkeyPatch) -> None:
    """A large max_new_tokens, with and without the cap: every round that starts with at least a
    round's token limit left decides the same spans, so the answer up to there is the same text."""
    max_new_tokens = 2 * ROUND_LIMIT
    capped = _events(members, max_new_tokens)
    monkeypatch.setattr(adafuse, "_tokens_left", lambda state: 10**9, raising=False)  # no cap
    free = _events(members, max_new_tokens)

    def early(events: list[Event]) -> list[tuple[int, str, list[str]]]:
        return [(e.position, e.chosen, [c.text for c in e.candidates]) for e in events
                if isinstance(e, AdaFuseEvent) and max_new_tokens - e.position >= ROUND_LIMIT]

    assert early(capped) == early(free) and len(early(free)) > 1

    def text_before(events: list[Event], position: int) -> str:
        return "".join(e.text for e in events if isinstance(e, TokenEvent) and e.position < position)

    last_free = max(position for position, _, _ in early(free))
    assert text_before(capped, last_free) == text_before(free, last_free)
