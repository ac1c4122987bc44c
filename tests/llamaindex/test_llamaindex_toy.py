"""EnsembleLLM over the real engine with two tiny random members (different tokenizers): seconds, no zoo."""

from __future__ import annotations

import asyncio
from typing import Literal

import pytest
from llama_index.core.base.llms.types import ChatMessage, MessageRole
from llama_index.core.prompts import PromptTemplate
from pydantic import BaseModel

from llamaindex_ensemble import EnsembleLLM
from shared_engine import ContextLengthError

USER = [ChatMessage(role=MessageRole.USER, content="Tell me about Sofia.")]


class Check(BaseModel):
    ok: bool
    size: Literal["S", "M", "L"]


@pytest.fixture
def toy_llm(toy_members: list) -> EnsembleLLM:
    return EnsembleLLM(models=toy_members, method="every-token", max_tokens=8)


def test_metadata_uses_the_smallest_context_window(toy_llm: EnsembleLLM) -> None:
    assert toy_llm.metadata.context_window == 512 - toy_llm.template_room()  # room for the chat templates
    assert toy_llm.metadata.model_name == "every-token(toy-bpe+toy-sp)"


async def test_sync_and_async_give_the_same_greedy_answer(toy_llm: EnsembleLLM, collector) -> None:
    sync_text = toy_llm.chat(USER).message.content
    chunks = [c async for c in await toy_llm.astream_chat(USER)]
    assert "".join(c.delta for c in chunks) == chunks[-1].message.content == sync_text
    stats = chunks[-1].raw["ensemble"]
    assert chunks[-1].raw["usage"]["completion_tokens"] == stats["tokens"] > 0
    # every-token fuses at every position: one decision event per fused token, on the call's span
    spans = [e.span_id for e in collector.named("LLMChatStartEvent")]
    decisions = collector.named("EnsembleDecisionEvent")
    assert len(spans) == 2 and len(decisions) == 2 * stats["ensembled_tokens"]
    assert {e.span_id for e in decisions} == set(spans)


async def test_concurrent_async_calls_match_sequential(toy_llm: EnsembleLLM) -> None:
    prompts = ["Tell me about Sofia.", "Where is the park?"]
    sequential = [(await toy_llm.acomplete(p)).text for p in prompts]
    concurrent = await asyncio.gather(*(toy_llm.acomplete(p) for p in prompts))
    assert [r.text for r in concurrent] == sequential


async def test_context_length_error_surfaces_from_every_path(toy_llm: EnsembleLLM) -> None:
    with pytest.raises(ContextLengthError, match="context window"):
        toy_llm.complete("hi", max_tokens=600)
    with pytest.raises(ContextLengthError):
        await toy_llm.achat(USER, max_tokens=600)
    stream = await toy_llm.astream_complete("hi", max_tokens=600)
    with pytest.raises(ContextLengthError):
        async for _ in stream:
            pass
    assert isinstance(ContextLengthError("x"), ValueError)


def test_step_events_are_opt_in(toy_members: list, collector) -> None:
    # fixed drafts of 5: the adaptive schedule ends a random toy's drafts at its first unsure token,
    # and a one-token draft sends no draft event
    llm = EnsembleLLM(models=toy_members, method="safe", max_tokens=4, step_events=True, draft_schedule="fixed")
    llm.complete("Tell me about Sofia.")
    steps = collector.named("EnsembleStepEvent")
    assert steps and {e.name for e in steps} <= {"draft", "verify", "cache_sync"}
    assert "draft" in {e.name for e in steps}


def test_breaking_out_of_a_sync_stream_stops_the_request(toy_llm: EnsembleLLM) -> None:
    expected = toy_llm.complete("Tell me about Sofia.").text
    for first in toy_llm.stream_complete("Tell me about Sofia."):
        break
    assert expected.startswith(first.text)
    assert toy_llm.complete("Tell me about Sofia.").text == expected


def test_adafuse_span_decisions_reach_instrumentation(toy_members: list, collector) -> None:
    llm = EnsembleLLM(models=toy_members, method="adafuse", threshold=1.0, max_tokens=8)
    response = llm.complete("Tell me about Sofia.")
    spans = collector.named("EnsembleSpanEvent")
    stats = response.raw["ensemble"]
    assert spans and len(spans) == stats["fused_spans"] == stats["spans"]
    assert all(s.fused and s.candidates and s.chosen == s.candidates[0].text for s in spans)
    assert {s.span_id for s in spans} == {e.span_id for e in collector.named("LLMCompletionStartEvent")}


def test_structured_predict_decodes_under_the_schema(toy_members: list) -> None:
    # Random toys write no JSON unconstrained (tests/test_json_constraint.py); here the schema
    # constrains every token, so even they produce a valid object.
    llm = EnsembleLLM(models=toy_members, method="safe", max_tokens=96)
    check = llm.structured_predict(Check, PromptTemplate("Check."))
    assert isinstance(check, Check)


def test_memory_trimmed_with_the_llms_tokenizer_fits_every_member(toy_members: list) -> None:
    """LlamaIndex's memory counts with a ``text -> tokens`` callable and reads only the context window
    from an LLM; counted with the drafter's tokenizer, a kept history overflowed the verifier, whose
    tokenizer spells the same text in more tokens. ``llm.tokenizer_fn`` counts the most any member needs."""
    from llama_index.core.memory import ChatMemoryBuffer

    llm = EnsembleLLM(models=toy_members, method="every-token", max_tokens=8)
    text = "Tom walked to the park. " * 5
    drafter, verifier = (m.table.encode_fragment(text) for m in toy_members)
    assert len(drafter) < len(verifier) and llm.tokenizer_fn(text) == verifier
    history = [ChatMessage(role=role, content=text) for _ in range(10)
               for role in (MessageRole.USER, MessageRole.ASSISTANT)]
    budget = llm.metadata.context_window - 8 - 96  # room for the answer and the chat template's markup

    def drafters_count(text: str) -> list[int]:
        return toy_members[0].table.encode_fragment(text)

    for counter, fits in ((drafters_count, False), (llm.tokenizer_fn, True)):
        memory = ChatMemoryBuffer.from_defaults(chat_history=history, token_limit=budget, tokenizer_fn=counter)
        kept = memory.get()
        assert 0 < len(kept) < len(history)
        if fits:
            assert llm.chat(kept).message.content is not None
        else:  # the drafter's count keeps more than the verifier can read
            with pytest.raises(ContextLengthError):
                llm.chat(kept)
