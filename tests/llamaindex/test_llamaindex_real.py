"""EnsembleLLM on the real zoo (Qwen2.5-Coder-0.5B drafts, SmolLM2-135M verifies), greedy and short.

Covers what only real models show: streamed deltas on a real answer, instrumentation next to
LlamaIndex's own events, ``Settings.llm`` in a RAG query engine over real MiniLM embeddings, and
agents that really call a tool.
"""

from __future__ import annotations

import pytest
from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.agent.react import ReActChatFormatter
from llama_index.core.agent.workflow import FunctionAgent, ReActAgent, ToolCallResult
from llama_index.core.base.llms.types import ChatMessage, MessageRole

from llamaindex_ensemble import EnsembleLLM
from shared_engine import ContextLengthError

from .conftest import REAL_PAIR

pytestmark = pytest.mark.zoo

DOCS = [
    "The Vellmoor Lantern Festival is held every March in the harbour town of Vellmoor.",
    "Mount Kestrel, at 3,412 metres, is the highest peak of the Ardent Range.",
    "The Brightwater Library holds 80,000 books and opens at 9 am on weekdays.",
    "Copperleaf tea is grown on the slopes around Lake Oru and tastes smoky.",
]


async def test_stream_deltas_concatenate_and_events_share_the_call_span(real_llm: EnsembleLLM, collector) -> None:
    messages = [ChatMessage(role=MessageRole.USER, content="Name the three primary colors.")]
    chunks = [c async for c in await real_llm.astream_chat(messages)]
    final = chunks[-1]
    assert len(chunks) > 3 and "".join(c.delta for c in chunks) == final.message.content
    assert "red" in final.message.content.lower()
    usage, stats = final.raw["usage"], final.raw["ensemble"]
    assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] == stats["tokens"]

    (start,) = collector.named("LLMChatStartEvent")
    assert start.span_id.startswith("EnsembleLLM.astream_chat-")
    assert len(collector.named("LLMChatInProgressEvent")) == len(chunks)
    (finish,) = collector.named("EnsembleFinishEvent")
    decisions = collector.named("EnsembleDecisionEvent")
    assert finish.stats.tokens == stats["tokens"] and len(decisions) == stats["ensembled_tokens"]
    assert {e.span_id for e in [finish, *decisions]} == {start.span_id}
    for decision in decisions:
        assert set(decision.candidates[0].member_probs) == set(REAL_PAIR)


def test_sync_complete_inside_the_sync_bridge(real_llm: EnsembleLLM) -> None:
    response = real_llm.complete("What is 17 + 25? Reply with the number only.", max_tokens=8)
    assert "42" in response.text and response.raw["finish_reason"] in {"stop", "length"}


async def test_context_length_error_is_a_clear_value_error(real_llm: EnsembleLLM) -> None:
    # the smallest window among the members: llama.cpp's n_ctx per slot (4096) for the zoo's default
    with pytest.raises(ContextLengthError,
                       match=r"max_new_tokens \(9000\) alone fills .* context window of 4096 tokens"):
        await real_llm.achat([ChatMessage(role=MessageRole.USER, content="hi")], max_tokens=9000)


def test_settings_llm_in_a_streaming_query_engine(real_llm: EnsembleLLM, minilm, monkeypatch) -> None:
    monkeypatch.setattr(Settings, "_llm", None)  # restored after the test
    monkeypatch.setattr(Settings, "_embed_model", None)
    Settings.llm, Settings.embed_model = real_llm, minilm
    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCS])
    engine = index.as_query_engine(streaming=True, similarity_top_k=1)
    response = engine.query("In which month is the Vellmoor Lantern Festival held?")
    answer = "".join(response.response_gen)
    assert "Vellmoor" in response.source_nodes[0].node.get_content()
    assert "March" in answer


async def test_function_agent_calls_the_tool() -> None:
    calls: list[tuple[int, int]] = []

    def multiply(a: int, b: int) -> int:
        """Multiply two integers and return the product."""
        calls.append((a, b))
        return a * b

    llm = EnsembleLLM(models=REAL_PAIR, max_tokens=40)
    agent = FunctionAgent(tools=[multiply], llm=llm, system_prompt="You are a calculator. Use the tools.")
    handler = agent.run("What is 1234 times 5678?")
    results = [e async for e in handler.stream_events() if isinstance(e, ToolCallResult)]
    answer = str(await handler)
    assert calls == [(1234, 5678)] and results[0].tool_output.content == "7006652"
    assert "7006652" in answer.replace(",", "")


# The default ReAct header is ~40 lines; a 0.5B model copies its placeholders ("Action: tool name",
# {"input": ..., "num_beams": 5}) instead of following it. A compact header whose example uses the
# tool's own argument name works; a different city than the example's shows it reads the question.
REACT_HEADER = """You answer the user's question with the help of tools.

## Tools
{tool_desc}

## Format
To use a tool, reply with three lines like these:
Thought: I need to use a tool.
Action: {tool_names}
Action Input: {{"city": "Paris"}}

After the Observation with the tool result, reply with two lines:
Thought: I can answer now.
Answer: <the answer, using the observation>
"""


async def test_react_agent_calls_the_tool() -> None:
    cities: list[str] = []

    def get_weather(city: str) -> str:
        """Get the current weather in a city."""
        cities.append(city)
        return f"It is sunny and 23 degrees in {city}."

    llm = EnsembleLLM(models=REAL_PAIR, max_tokens=40, stop=["\nObservation:"])
    agent = ReActAgent(tools=[get_weather], llm=llm,
                       formatter=ReActChatFormatter.from_defaults(system_header=REACT_HEADER))
    answer = str(await agent.run("What is the weather in Tokyo?", max_iterations=3))
    assert cities == ["Tokyo"]
    assert "sunny" in answer.lower() and "23" in answer
