"""A tool-calling agent on an ensemble: LangChain's ``create_agent`` with ChatEnsemble.

The model decides to call a real tool (exact integer arithmetic, which a 0.5B model cannot do in
its head), the agent runs it, and the model answers from the result. The trace of every step is
printed, with the ensemble's stats for each model turn.

Three choices make this reliable with tiny models, and are worth copying:
- ``drafter=0`` and ``weights=[2, 1]``: Qwen2.5-Coder, the member trained for tool use, drafts and
  counts double in fusion. With SmolLM2 (no tool training) drafting or weighed equally it sometimes
  talks the ensemble out of calling. Naming the drafter also skips SAFE's per-request choice
  (``drafter="auto"``), which would score the conversation's earlier assistant turns (the tool
  call) as example answers on every turn: ~11 s before the answer's first token on this CPU.
- ``tool_result_hint``: after a tool result the engine adds a user turn asking for a plain-text
  answer; without it a 0.5B model tends to repeat the same call until the recursion limit.

    python cookbooks/langchain_agent.py "What is 1234 times 5678?"
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

from langchain.agents import create_agent
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.tools import tool

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout too
from langchain_ensemble import ChatEnsemble  # noqa: E402

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
QUESTION = "What is 1234 times 5678?"
ANSWER_FROM_RESULT = "Using the function result above, answer my original question in plain text."


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers exactly and return the product."""
    return a * b


@tool
def days_between(start: str, end: str) -> int:
    """Number of days from the start date to the end date (dates as YYYY-MM-DD)."""
    return (datetime.date.fromisoformat(end) - datetime.date.fromisoformat(start)).days


def show(message: BaseMessage) -> str:
    if isinstance(message, AIMessage) and message.tool_calls:
        calls = ", ".join(f"{c['name']}({c['args']})" for c in message.tool_calls)
        line = f"model -> tool call: {calls}"
    elif isinstance(message, AIMessage):
        line = f"model -> answer: {message.content}"
    elif isinstance(message, ToolMessage):
        line = f"tool {message.name} -> {message.content}"
    else:
        line = f"{message.type}: {message.content}"
    stats = message.response_metadata.get("ensemble") if isinstance(message, AIMessage) else None
    if stats:
        line += (f"   [{stats['tokens']} tokens, {stats['ensembled_tokens']} ensembled, "
                 f"{stats['elapsed_s']:.1f}s]")
    return line


def main(question: str = QUESTION, max_tokens: int = 48) -> list[BaseMessage]:
    """Run the agent, print each step as it happens; returns the final message list."""
    llm = ChatEnsemble(models=MODELS, max_tokens=max_tokens, drafter=0, weights=[2, 1],
                       tool_result_hint=ANSWER_FROM_RESULT)
    agent = create_agent(llm, [multiply, days_between])
    print(f"user: {question}")
    messages: list[BaseMessage] = []
    for update in agent.stream({"messages": [{"role": "user", "content": question}]}, {"recursion_limit": 8},
                               stream_mode="updates"):
        for step in update.values():
            for message in (step or {}).get("messages", []):
                messages.append(message)
                print(show(message), flush=True)
    return messages


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=48)
    args = parser.parse_args()
    main(args.question, args.max_tokens)
