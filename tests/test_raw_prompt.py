"""A raw prompt (OpenAI's completions): plain text the answer continues, in no chat format."""

from __future__ import annotations

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.errors import InvalidRequestError
from shared_engine.members.chat import render_text_ids
from tests.toy import fitted_member, toy_member

TEXT = "Sofia walked to the park and"
# A plain-format (metaspace, no chat template) member fitted on a conversation whose next turn is the user's:
# as a chat answer it stops at its turn marker "\nUser:", as a raw continuation it writes the turn on.
CONVERSATION = [{"role": "user", "content": "Sofia walked to"}, {"role": "assistant", "content": "the park"},
                {"role": "user", "content": "Tom visited Berlin"}]
RENDERED_HEAD = "User: Sofia walked to\nAssistant:\nthe park"


def _greedy(member, ids: list[int], tokens: int) -> str:
    """The member's own greedy continuation of ``ids`` (transformers' generate: no engine in between)."""
    out = member.model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False,
                                pad_token_id=member.tokenizer.pad_token_id)
    return member.table.to_bytes(out[0, len(ids):].tolist()).decode("utf-8", errors="replace")


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
def test_the_prompt_is_the_tokenizers_own_encoding(kind: str) -> None:
    member = toy_member(f"raw-{kind}", kind)
    assert member.text_prompt_ids(TEXT) == member.tokenizer(TEXT)["input_ids"]
    # a BOS the client writes is read as BOS, once (the metaspace tokenizer adds one itself)
    written = render_text_ids(member.tokenizer, member.tokenizer.bos_token + TEXT)
    assert written.count(member.tokenizer.bos_token_id) == 1 and written[0] == member.tokenizer.bos_token_id


def test_a_single_member_continues_the_text_as_its_model_does() -> None:
    member = toy_member("raw-sp", "metaspace")
    result = EnsembleEngine([member], method="single").generate(TEXT, raw_prompt=True, max_new_tokens=12)
    assert result.text == _greedy(member, member.tokenizer(TEXT)["input_ids"], 12)
    assert result.stats.prompt_tokens == len(member.tokenizer(TEXT)["input_ids"])
    chat = EnsembleEngine([member], method="single").generate(TEXT, max_new_tokens=12)
    assert chat.stats.prompt_tokens > result.stats.prompt_tokens  # the chat form wraps it in "User: ..."


def test_a_raw_continuation_is_no_chat_turn() -> None:
    """A plain-format member's turn marker ends a chat answer; a raw continuation writes on past it."""
    member = fitted_member("raw-turns", "metaspace", CONVERSATION, steps=40)
    raw = EnsembleEngine([member], method="single").generate(RENDERED_HEAD, raw_prompt=True, max_new_tokens=8)
    assert raw.text.startswith("\nUser:"), raw.text
    assert raw.finish_reason == "length"
    as_chat = EnsembleEngine([member], method="single").generate(CONVERSATION[:1], max_new_tokens=8)
    assert as_chat.text == "the park" and as_chat.finish_reason == "stop", as_chat.text


@pytest.mark.parametrize("method", ["safe", "every-token", "adafuse"])
def test_an_ensemble_of_two_tokenizers_continues_the_text(method: str) -> None:
    members = [toy_member("raw-a", "byte_level"), toy_member("raw-b", "metaspace", seed=1)]
    engine = EnsembleEngine(members, method=method, max_new_tokens=16)
    result = engine.generate(TEXT, raw_prompt=True)
    assert result.text and result.stats.prompt_tokens == len(members[0].tokenizer(TEXT)["input_ids"])
    again = engine.generate(TEXT, raw_prompt=True)
    assert again.text == result.text


def test_what_a_raw_prompt_cannot_take_is_refused() -> None:
    engine = EnsembleEngine([toy_member("raw-a", "byte_level")], method="single")
    with pytest.raises(InvalidRequestError, match="a raw prompt is a string"):
        engine.generate([{"role": "user", "content": TEXT}], raw_prompt=True)
    with pytest.raises(InvalidRequestError, match="no tools"):
        engine.generate(TEXT, raw_prompt=True, response_format={"type": "json_object"})
    with pytest.raises(InvalidRequestError, match="empty"):
        engine.generate("  ", raw_prompt=True)
