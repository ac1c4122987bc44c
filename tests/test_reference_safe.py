"""The engine's SAFE decisions, one by one, against the simple reference (tests/reference_safe.py).

Every checked position (offset, boundary, consensus), every fusion (position, offset, candidates
with each member's and the fused probability, sharpening, the choice, the drafted token) and the
final answer must agree, on toy members with different tokenizers, greedy and seeded sampling,
non-uniform weights, with and without the drafter-confidence gate; several hundred rounds in all.
A regression that fused the wrong token, broke a gate or mis-committed after a divergence shows up
here as the first decision that differs.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from shared_engine import EnsembleEngine
from tests.reference_safe import Answer, ReferenceSafe
from tests.test_engine import trained_member
from tests.test_loop_guard import LOOPY
from tests.toy import fitted_member, toy_member

PROMPTS = ["Tom wrote about numbers 12 and 7", "Sofia visited Berlin", "def add(a, b):",
           "Hello Maria. So many apples", "Greet her twice."]


@dataclass(frozen=True)
class Case:
    name: str
    members: tuple[tuple[str, str, str, int], ...]  # (name, tokenizer, arch, seed); the first drafts
    weights: tuple[float, ...]
    temperature: float = 0.0
    top_p: float = 1.0
    drafter_confidence: float | None = None
    draft_length: int = 5
    trained_drafter: bool = False
    sharpen: str = "heur"
    plausibility: float | None = None
    loop_guard: int | None = None  # with it, the members are toys fitted to answer in a loop (test_loop_guard.py)
    mirror_decides: bool = False  # the case's answers differ without heur's mirror case (fusion.mirror_mass)


CASES = [
    Case("byte-level drafts, greedy", (("a", "byte_level", "llama", 1), ("b", "metaspace", "gpt2", 2)), (0.3, 0.7)),
    Case("metaspace drafts, greedy", (("c", "metaspace", "llama", 3), ("d", "byte_level", "gpt2", 4)), (0.7, 0.3),
         draft_length=4),
    Case("metaspace drafts, the released pooling", (("c", "metaspace", "llama", 3), ("d", "byte_level", "gpt2", 4)),
         (0.7, 0.3), draft_length=4, sharpen="heur-bytes"),
    Case("byte-level drafts, a verifier's first piece backs the drafter's word",
         (("m", "byte_level", "llama", 3), ("v", "metaspace", "gpt2", 4)), (0.7, 0.3), mirror_decides=True),
    Case("three members, one sharing the drafter's vocabulary",
         (("a", "byte_level", "llama", 1), ("b", "metaspace", "gpt2", 2), ("e", "byte_level", "gpt2", 5)),
         (0.5, 0.3, 0.2)),
    Case("drafter-confidence gate", (("a", "byte_level", "llama", 1), ("b", "metaspace", "gpt2", 2)), (0.6, 0.4),
         drafter_confidence=0.3),
    Case("sampling", (("a", "byte_level", "llama", 1), ("b", "metaspace", "gpt2", 2)), (0.4, 0.6),
         temperature=0.8, top_p=0.95),
    Case("sampling, metaspace drafts", (("c", "metaspace", "llama", 3), ("d", "byte_level", "gpt2", 4)), (0.5, 0.5),
         temperature=1.2),
    Case("memorised drafter (consensus skips)", (("t", "metaspace", "llama", 0), ("b", "byte_level", "gpt2", 2)),
         (0.6, 0.4), trained_drafter=True),
    Case("memorised drafter, sampling", (("t", "metaspace", "llama", 0), ("b", "byte_level", "gpt2", 2)),
         (0.6, 0.4), temperature=0.7, trained_drafter=True),
    Case("plausibility constraint", (("a", "byte_level", "llama", 1), ("b", "metaspace", "gpt2", 2)), (0.3, 0.7),
         plausibility=0.3),
    Case("plausibility constraint, sampling", (("c", "metaspace", "llama", 3), ("d", "byte_level", "gpt2", 4)),
         (0.4, 0.6), temperature=0.9, plausibility=0.3),
    Case("loop guard, members that loop", (("loopy-bpe", "byte_level", "", 0), ("loopy-sp", "metaspace", "", 0)),
         (0.6, 0.4), loop_guard=24),
    Case("loop guard, metaspace drafts, sampling", (("loopy-sp", "metaspace", "", 0),
                                                    ("loopy-bpe", "byte_level", "", 0)),
         (0.5, 0.5), temperature=0.6, loop_guard=24),
]


def _members(case: Case) -> list:
    if case.loop_guard is not None:
        return [fitted_member(name, kind, LOOPY) for name, kind, _, _ in case.members]
    members = [toy_member(name, kind, arch, seed) for name, kind, arch, seed in case.members]
    if case.trained_drafter:
        members[0] = trained_member(case.members[0][1])
    return members


def _compare(engine_result, reference: Answer, where: str) -> None:  # noqa: ANN001
    events = engine_result.events
    positions = [p for e in events if e.type == "verify" for p in e.positions]
    fusions = [e for e in events if e.type == "ensemble"]
    for i, (mine, ref) in enumerate(zip(positions, reference.positions)):
        assert (mine.offset, mine.boundary_ok, mine.consensus) == (ref.offset, ref.boundary_ok, ref.consensus), \
            f"{where}: checked position {i}"
    assert len(positions) == len(reference.positions), where
    for i, (mine, ref) in enumerate(zip(fusions, reference.fusions)):
        at = f"{where}: fusion {i} (answer position {ref.position})"
        assert (mine.position, mine.offset) == (ref.position, ref.offset), at
        # Invalid UTF-8 candidates all display as U+FFFD: their texts do not identify them.
        listed = {c.text: c for c in mine.candidates if "\ufffd" not in c.text}
        floor = min(c.fused for c in mine.candidates) if len(mine.candidates) == 10 else 0.0
        for text, fused in ref.fused.items():
            if fused > floor + 1e-3 and "\ufffd" not in text:
                assert text in listed, f"{at}: candidate {text!r} ({fused:.4f}) missing"
        for text, c in listed.items():
            assert c.fused == pytest.approx(ref.fused[text], abs=2e-4), f"{at}: fused probability of {text!r}"
            for member, prob in c.member_probs.items():
                assert prob == pytest.approx(ref.member_probs[text][member], abs=2e-4), \
                    f"{at}: {member}'s probability of {text!r}"
        assert (mine.sharpened, mine.chosen, mine.drafted) == (ref.sharpened, ref.chosen, ref.drafted), at
    assert len(fusions) == len(reference.fusions), where
    assert engine_result.text == reference.text, where
    assert engine_result.stats.rounds == reference.rounds, where


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_engine_decisions_equal_the_reference(case: Case) -> None:
    members = _members(case)
    # the reference drafts SAFE's fixed gamma every round (the adaptive schedule: test_draft_schedule.py)
    engine = EnsembleEngine(members, method="safe", weights=list(case.weights), draft_length=case.draft_length,
                            draft_schedule="fixed", drafter_confidence=case.drafter_confidence,
                            loop_guard=case.loop_guard, sharpen=case.sharpen, plausibility=case.plausibility)
    reference = ReferenceSafe(members, case.weights, draft_length=case.draft_length, sharpen=case.sharpen,
                              drafter_confidence=case.drafter_confidence, loop_guard=case.loop_guard,
                              plausibility=case.plausibility)
    unconstrained = ReferenceSafe(members, case.weights, draft_length=case.draft_length, sharpen=case.sharpen,
                                  drafter_confidence=case.drafter_confidence) if case.plausibility else None
    unmirrored = ReferenceSafe(members, case.weights, draft_length=case.draft_length, sharpen=case.sharpen,
                               drafter_confidence=case.drafter_confidence, mirror=False) \
        if case.mirror_decides else None
    rounds = fusions = skips = breaks = constrained = mirrored = 0
    prompts = [LOOPY[0]["content"], *PROMPTS] if case.loop_guard else PROMPTS
    for i, prompt in enumerate(prompts):
        messages = [{"role": "user", "content": prompt}]
        seed = 1000 + i if case.temperature else None
        params = dict(max_new_tokens=48, temperature=case.temperature, top_p=case.top_p, seed=seed)
        result = engine.generate(messages, keep_events=True, **params)
        expected = reference.answer(messages, **params)
        _compare(result, expected, f"{case.name}, prompt {prompt!r}")
        rounds += expected.rounds
        fusions += len(expected.fusions)
        skips += sum(bool(p.consensus) for p in expected.positions)
        breaks += result.stats.loop_breaks
        if unconstrained is not None:
            constrained += unconstrained.answer(messages, **params).text != expected.text
        if unmirrored is not None:
            mirrored += unmirrored.answer(messages, **params).text != expected.text
    assert rounds >= 15 and fusions >= 5, (rounds, fusions)  # the case exercised the round
    if case.loop_guard:
        assert breaks > 0  # ... and the guard
    if case.plausibility:
        assert constrained > 0  # ... and the constraint changed an answer
    if case.mirror_decides:
        assert mirrored > 0  # ... and the mirror case decided one
    if case.trained_drafter and not case.temperature:
        assert skips >= 5  # ... and the consensus skip
