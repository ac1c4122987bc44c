"""A message written in parts reads the same through every surface: the server joined OpenAI text
parts with nothing ("Hello" + "world" = "Helloworld"), LangChain its text blocks with nothing,
LlamaIndex its TextBlocks with a newline; one rule now (``join_text_parts``: a newline, as vLLM)."""

from __future__ import annotations

import pytest

from shared_engine.members.chat import join_text_parts
from shared_engine.server.openai_schema import ChatMessage as OpenAIMessage

PARTS = ["Sofia walked to the park.", "Then she went home."]
EXPECTED = "Sofia walked to the park.\nThen she went home."


def test_join_text_parts_is_a_newline_apart_and_skips_empty_parts() -> None:
    assert join_text_parts(PARTS) == EXPECTED
    assert join_text_parts(["", PARTS[0], ""]) == PARTS[0]


def test_the_server_reads_text_parts_by_the_rule() -> None:
    message = OpenAIMessage.model_validate({"role": "user", "content": [{"type": "text", "text": t} for t in PARTS]})
    assert message.as_engine_message()["content"] == EXPECTED


def test_langchain_reads_text_blocks_by_the_rule() -> None:
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from langchain_ensemble.chat_models import to_engine_messages

    (message,) = to_engine_messages([HumanMessage(content=[{"type": "text", "text": t} for t in PARTS])])
    assert message["content"] == EXPECTED


def test_llamaindex_reads_text_blocks_by_the_rule() -> None:
    pytest.importorskip("llama_index.core")
    from llama_index.core.base.llms.types import ChatMessage, TextBlock

    from llamaindex_ensemble.base import to_engine_messages

    (message,) = to_engine_messages([ChatMessage(role="user", blocks=[TextBlock(text=t) for t in PARTS])])
    assert message["content"] == EXPECTED


def test_the_engine_reads_text_parts_by_the_rule() -> None:
    """The engine refused OpenAI text parts ("content must be a string, got list") that the server and
    both adapters read: messages from an OpenAI-format store could not be passed to it as they are."""
    from shared_engine import InvalidRequestError
    from shared_engine.members.chat import normalize_messages

    (message,) = normalize_messages([{"role": "user", "content": [{"type": "text", "text": t} for t in PARTS]}])
    assert message["content"] == EXPECTED
    with pytest.raises(InvalidRequestError, match="content part 1 is 'image_url': only text parts are read"):
        normalize_messages([{"role": "user", "content": [{"type": "text", "text": "Look:"},
                                                          {"type": "image_url", "image_url": {"url": "x"}}]}])
