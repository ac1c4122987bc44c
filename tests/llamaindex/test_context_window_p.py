"""LlamaIndex packs RAG prompts up to ``metadata.context_window``; the members' chat templates add
tokens it does not count, so the window the adapter reports leaves room for them."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from typing import Any

from llama_index.core import Settings, get_response_synthesizer
from llama_index.core.memory import ChatMemoryBuffer
from llama_index.core.response_synthesizers import ResponseMode

from llamaindex_ensemble import EnsembleLLM
from shared_engine.errors import InvalidRequestError
from shared_engine.events import FinishEvent, Stats
from shared_engine.members.chat import template_overhead

WORDS = "Tom walked to the park Sofia Maria bridge river old quiet north".split()


def test_tree_summarize_packs_prompts_that_fit_every_member(toy_members: list, monkeypatch: Any) -> None:
    """With the smallest member's exact window, every prompt ``tree_summarize`` packed came to 509
    toy-sp tokens + 4 to answer in 512 (``ContextLengthError`` from the engine), even counted with
    ``tokenizer_fn``."""
    llm = EnsembleLLM(models=toy_members, method="every-token", max_tokens=4)
    monkeypatch.setattr(Settings, "_tokenizer", None)
    Settings.tokenizer = llm.tokenizer_fn
    engine, prompts = llm.engine, []

    async def counted(messages: Any, **params: Any) -> AsyncIterator[FinishEvent]:
        """Counts the prompt as the engine's start does (each member's own template) and answers without
        a forward pass: the count, not the toy models' text, is under test."""
        prompts.append(engine.prompt_tokens(messages))
        yield FinishEvent(reason="eos", text="Tom.", stats=Stats(prompt_tokens=prompts[-1], tokens=1))

    monkeypatch.setattr(engine, "astream", counted)
    rng = random.Random(0)
    text = ". ".join(" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14))) for _ in range(300)) + "."
    synth = get_response_synthesizer(llm=llm, response_mode=ResponseMode.TREE_SUMMARIZE)
    assert synth.get_response("Who walked to the park?", text_chunks=[text]) is not None
    assert len(prompts) > 1 and max(prompts) + 4 <= engine.context_window
    assert max(prompts) > engine.context_window - 4 - 23  # packed near the window: the room was needed


def test_the_reported_window_leaves_the_measured_template_room(toy_members: list) -> None:
    llm = EnsembleLLM(models=toy_members, method="every-token", max_tokens=8)
    room = max(template_overhead(m.prompt_ids) for m in toy_members)
    assert llm.template_room() == room == 23  # toy-bpe's ChatML around a system and a user message
    assert llm.metadata.context_window == 512 - room
    memory = ChatMemoryBuffer.from_defaults(llm=llm)  # its default limit is read from the window
    assert 0 < memory.token_limit < llm.metadata.context_window
    assert EnsembleLLM(models=toy_members, context_window=300).metadata.context_window == 300  # given: as is


def test_template_overhead_takes_the_longest_shape_and_skips_refused_ones(toy_members: list) -> None:
    bpe, sp = toy_members
    empty = [[{"role": role, "content": ""} for role in roles] for roles in (("user",), ("system", "user"))]
    assert template_overhead(bpe.prompt_ids) == max(len(bpe.prompt_ids(m)) for m in empty)
    assert template_overhead(sp.prompt_ids) == max(len(sp.prompt_ids(m)) for m in empty)  # the plain format

    def no_system(messages: list[dict[str, Any]]) -> list[int]:
        if messages[0]["role"] == "system":
            raise InvalidRequestError("the member's chat template refuses these messages")
        return bpe.prompt_ids(messages)

    assert template_overhead(no_system) == len(bpe.prompt_ids(empty[0]))
