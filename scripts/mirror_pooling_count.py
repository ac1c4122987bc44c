"""How often would "mirror pooling" decide a SAFE fusion (README Results, the TriviaQA bullet)?

``heur`` sharpening pools a longer candidate onto a shorter one only where the *drafter* writes the longer
word through the shorter piece. The mirror case is not pooled: the drafter has the longer word as one token
(Gemma's " Kilim") and a verifier writes it through a shorter piece (Qwen's " Kil" + "im"), so the verifier's
mass stays on a piece the drafter never writes. This script answers an eval run's questions again with events
and, at every fused position, adds each such verifier's weighted probability of the piece to the drafter's
longer word, then counts where that changes the choice. Approximate: it works on the event's fused (pre-
sharpening) scores; a count, not a measured effect on the score.

    python scripts/mirror_pooling_count.py RUN_DIR MEMBERS.yaml [--limit N] [--max-new-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path

from shared_engine.alignment import TokenTable
from shared_engine.engine import EnsembleEngine
from shared_engine.events import EnsembleEvent, FinishEvent
from shared_engine.fusion import drafter_extends
from shared_engine.member_flags import read_members_file

DRAFTER_MIN = 0.05  # the drafter's longer word must be a real candidate of its own
VERIFIER_MIN = 0.01


def mirror_bonus(event: EnsembleEvent, tables: dict[str, TokenTable], weights: dict[str, float],
                 drafter: str) -> dict[str, float]:
    """What mirror pooling would add to each of the drafter's longer candidates at this position."""
    bonus: dict[str, float] = {}
    extends = {label: drafter_extends(table) for label, table in tables.items()}  # heur's own rule, per member
    for longer in event.candidates:
        whole = longer.text.encode()
        if longer.member_probs.get(drafter, 0.0) <= DRAFTER_MIN:
            continue
        for piece in event.candidates:
            short = piece.text.encode()
            if short == whole or not whole.startswith(short) or not short.strip() or extends[drafter](whole, short):
                continue  # heur pools it already (no cut inside a word, or the drafter writes it through the piece)
            for verifier, p in piece.member_probs.items():
                if verifier != drafter and p > VERIFIER_MIN and extends[verifier](whole, short):
                    bonus[longer.text] = bonus.get(longer.text, 0.0) + weights.get(verifier, 0.0) * p
    return bonus


async def count(run: Path, members: str, limit: int, max_new_tokens: int) -> None:
    samples = [json.loads(line) for line in (run / "samples.jsonl").open()][:limit]
    engine = EnsembleEngine(read_members_file(members), method="safe")
    tables = {label: member.table for label, member in zip(engine.labels, engine.members)}  # as events name them
    totals = {"fused": 0, "applies": 0, "changes": 0}
    for sample in samples:
        events = [e async for e in engine.astream(sample["prompt"], max_new_tokens=max_new_tokens)]
        finish = events[-1]
        assert isinstance(finish, FinishEvent)
        stats = finish.stats
        for event in events:
            if not isinstance(event, EnsembleEvent):
                continue
            totals["fused"] += 1
            bonus = mirror_bonus(event, tables, stats.member_weights, stats.drafter)
            if not bonus:
                continue
            totals["applies"] += 1
            scores = {c.text: c.fused + bonus.get(c.text, 0.0) for c in event.candidates}
            best = max(scores, key=scores.__getitem__)
            if best != event.chosen and scores[best] > scores.get(event.chosen, 0.0):
                totals["changes"] += 1
                print(json.dumps({"id": sample["id"], "chosen": event.chosen, "with_mirror": best}), flush=True)
    print(json.dumps(totals))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="an eval run directory (its samples.jsonl)")
    parser.add_argument("members", help="the run's members file (YAML or JSON)")
    parser.add_argument("--limit", type=int, default=300)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    asyncio.run(count(args.run, args.members, args.limit, args.max_new_tokens))


if __name__ == "__main__":
    main()
