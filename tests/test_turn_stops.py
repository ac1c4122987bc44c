"""A plain-format member's turn stop ("\\nUser:") ends only text that member writes: its own draft in
SAFE (a chat drafter's example chat "User: hi" stays, whoever verifies it), any span in AdaFuse."""

from __future__ import annotations

import copy
from functools import cache

import pytest

from shared_engine import EnsembleEngine
from shared_engine.decoding import RequestState, request_members
from shared_engine.members import HFMember
from shared_engine.members.chat import PLAIN_TEMPLATE_STOPS
from tests.toy import TOKENIZERS, memorise, tiny_llama, toy_member

QUESTION = [{"role": "user", "content": "Show a short example chat."}]
CHAT = "Sample chat:\nUser: hi\nAssistant: hello!"
"""An answer that quotes a dialogue: its second line starts with a plain member's role word."""


@cache
def memorised(tokenizer: str) -> HFMember:
    """A tiny Llama that writes CHAT (then EOS) after QUESTION, in its own format: ChatML for
    "byte_level", the plain ``User:/Assistant:`` format for "metaspace" (no chat template)."""
    tok = TOKENIZERS[tokenizer]()
    model = copy.deepcopy(tiny_llama(tok, 5))
    member = HFMember(f"says-chat-{tokenizer}", model, tok)
    memorise(model, member.prompt_ids(QUESTION), member.table.encode_fragment(CHAT) + [tok.eos_token_id])
    return member


def _plain() -> HFMember:
    member = toy_member("plain", "metaspace", "gpt2", seed=2)
    assert member.stop_strings == PLAIN_TEMPLATE_STOPS
    return member


def _chat() -> HFMember:
    member = toy_member("chat", "byte_level", "llama", seed=2)
    assert member.stop_strings == ()
    return member


def test_a_chat_drafters_example_chat_is_not_cut_where_a_plain_member_verifies() -> None:
    """It was: Qwen drafting, Gemma-3-270m (base) verifying, an example chat asked for ended at its
    first "User:" line, finish_reason "stop"."""
    drafter = memorised("byte_level")
    alone = EnsembleEngine([drafter], method="single").generate(QUESTION, max_new_tokens=40)
    assert alone.text == CHAT  # the drafter writes the example chat
    for method in ("safe", "every-token"):
        result = EnsembleEngine([drafter, _plain()], method=method, weights=[1, 0]).generate(
            QUESTION, max_new_tokens=40)
        assert (result.text, result.finish_reason) == (CHAT, "eos"), method


def test_a_plain_drafters_turn_stop_still_ends_the_answer() -> None:
    """drafter="auto" picks the plain member after the request's start: its stop string follows it."""
    plain = memorised("metaspace")
    alone = EnsembleEngine([plain], method="single").generate(QUESTION, max_new_tokens=40)
    assert alone.text == "Sample chat:"
    result = EnsembleEngine([_chat(), plain], drafter="auto", weights=[0, 1]).generate(QUESTION, max_new_tokens=40)
    assert result.stats.drafter == plain.name
    assert result.text == "Sample chat:" and result.finish_reason in ("stop", "eos")


def test_adafuse_keeps_every_plain_members_turn_stop() -> None:
    """Any member may write an AdaFuse span (several may propose the same one), so a plain member's
    stop string ends the answer whoever wrote it."""
    result = EnsembleEngine([memorised("byte_level"), _plain()], method="adafuse", weights=[1, 0]).generate(
        QUESTION, max_new_tokens=40)
    assert (result.text, result.finish_reason) == ("Sample chat:", "stop")


def _committed(drafter: int, every_member_writes: bool = False, stop: tuple[str, ...] = ()) -> tuple[str, str | None]:
    """CHAT committed by member ``drafter`` of (chat, plain), made the drafter after the start."""
    members = [_chat(), _plain()]
    state = RequestState(request_members(members, ["chat", "plain"], [object()] * 2, [[1], [1]]), max_new_tokens=100,
                         stop=stop, every_member_writes=every_member_writes)
    if drafter:
        state.make_drafter(drafter)
    events = state.commit(state.drafter.table.encode_fragment(CHAT), "draft") + state.flush()
    streamed = "".join(e.text for e in events)
    assert streamed == state.text
    return streamed, state.finish_reason


@pytest.mark.parametrize(("drafter", "every_member_writes", "stop", "expected"), [
    (0, False, (), (CHAT, None)),  # the chat member writes: the plain verifier's stop is no stop
    (1, False, (), ("Sample chat:", "stop")),  # the plain member drafts (chosen after the start)
    (0, True, (), ("Sample chat:", "stop")),  # AdaFuse: any member writes
    (0, False, ("hi",), ("Sample chat:\nUser: ", "stop")),  # a user's stop string cuts, as ever
    (0, False, ("\nUser:",), ("Sample chat:", "stop")),  # ... even where it is a plain member's too
])
def test_turn_stops_follow_the_writer(drafter: int, every_member_writes: bool, stop: tuple[str, ...],
                                      expected: tuple[str, str | None]) -> None:
    assert _committed(drafter, every_member_writes, stop) == expected
