"""Decisions into stats and display events (decoding/report.py), the one place both rounds report through."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import torch

from shared_engine.alignment import EOS_KEY
from shared_engine.decoding.decisions import FusionDecision, ScoredSpan, SpanDecision
from shared_engine.decoding.report import (
    CANDIDATES_SHOWN,
    count_draft,
    count_fusion,
    count_span,
    count_span_round,
    fusion_event,
    span_event,
)
from shared_engine.events import Stats, mean_draft_length
from shared_engine.fusion import Fused

DECODING = Path(__file__).resolve().parents[1] / "shared_engine" / "decoding"


def _fusion(chosen: bytes, drafted: bytes | None, size: int = 3) -> FusionDecision:
    keys = [EOS_KEY] + [f" w{i}".encode() for i in range(1, size)]
    member_probs = torch.stack([torch.linspace(0.1, 1.0, size), torch.linspace(1.0, 0.1, size)])
    member_probs = member_probs / member_probs.sum(1, keepdim=True)
    fused = torch.tensor([0.7, 0.3]) @ member_probs  # "a" rules: the last key is the most probable
    return FusionDecision(position=7, offset=30, members=("a", "b"), fused=Fused(keys, member_probs, fused),
                          sharpened=False, chosen=chosen, drafted=drafted)


def test_a_fusion_counts_once_and_as_changed_only_when_it_left_the_draft() -> None:
    stats = Stats()
    count_fusion(stats, _fusion(b" w1", b" w1"))
    assert (stats.ensembled_tokens, stats.changed_tokens) == (1, 0)
    count_fusion(stats, _fusion(b" w2", b" w1"))
    count_fusion(stats, _fusion(EOS_KEY, None))  # the drafter drafted a special token: any choice changes it
    assert (stats.ensembled_tokens, stats.changed_tokens) == (3, 2)
    count_draft(stats, 4, 5)  # the draft reached EOS after 4 of the 5 tokens the schedule chose
    count_draft(stats, 1, 1)
    count_draft(stats, 5, 5)
    assert (stats.rounds, stats.drafted_tokens) == (3, 10)
    assert stats.draft_lengths == {5: 2, 1: 1}  # by the chosen length
    assert mean_draft_length(stats.draft_lengths) == mean_draft_length({"5": 2, "1": 1}) == 3.67  # JSON keys too
    assert mean_draft_length({}) == 0.0


def test_a_fusion_event_shows_the_most_probable_candidates_rounded() -> None:
    decision = _fusion(EOS_KEY, b" w3", size=CANDIDATES_SHOWN + 5)
    event = fusion_event(decision)
    assert len(event.candidates) == CANDIDATES_SHOWN
    shown = [c.fused for c in event.candidates]
    assert shown == sorted(shown, reverse=True)
    assert event.candidates[0].text == f" w{CANDIDATES_SHOWN + 4}"
    assert event.candidates[0].fused == round(float(decision.fused.fused[-1]), 5)
    assert event.candidates[0].member_probs["b"] == round(float(decision.fused.member_probs[1, -1]), 5)
    assert set(event.candidates[0].member_probs) == {"a", "b"}
    assert (event.chosen, event.drafted, event.changed) == ("<eos>", " w3", True)
    assert (event.position, event.offset) == (7, 30)
    assert fusion_event(_fusion(b" w1", None)).drafted is None
    assert event.chosen_index is None  # <eos> is the least probable of the 15: not listed


def test_the_event_says_which_row_was_chosen_and_the_bytes_of_partial_characters() -> None:
    """Two candidates holding different first bytes of a character both read "\ufffd": the row chosen
    is given by index, and each such row by its bytes, so a reader (the live page) can tell them apart."""
    keys = [b" a", "\u00e9".encode()[:1], "\u4e2d".encode()[:1], "\u4e2d".encode()[:2] + EOS_KEY]
    member_probs = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.4, 0.3, 0.2, 0.1]])
    fused = Fused(keys, member_probs, member_probs[0])
    event = fusion_event(FusionDecision(position=0, offset=0, members=("a", "b"), fused=fused, sharpened=False,
                                        chosen=keys[2], drafted=keys[1]))
    assert [c.text for c in event.candidates] == [" a", "\ufffd", "\ufffd", "\ufffd<eos>"]
    assert [c.hex for c in event.candidates] == [None, "c3", "e4", "e4 b8"]
    assert (event.chosen, event.chosen_index) == ("\ufffd", 2)
    span = span_event(_span(True, b" one", None))
    assert span.chosen_index == 0 and span.candidates[0].text == span.chosen == " one"
    leader = replace(_span(False, b" one", None), chosen=b" two words")  # vote="uncertain": a sure leader's
    assert span_event(leader).chosen_index == 1  # span is committed whatever it scores


def _span(voted: bool, chosen: bytes, drafter_proposal: bytes | None) -> SpanDecision:
    candidates = [ScoredSpan(b" two words", ["a"], {"a": 1.23456, "b": 2.0}, 1.61728),
                  ScoredSpan(chosen, ["a", "b"], {"a": 0.5, "b": 0.70004}, 0.60002)]
    return SpanDecision(position=3, offset=12, uncertainty="margin", member_uncertainty={"a": 0.912345, "b": 0.1},
                        leader="a", voted=voted, candidates=candidates, chosen=chosen, words=1,
                        drafter_proposal=drafter_proposal)


def test_a_voted_span_counts_its_tokens_as_ensembled_and_changed_where_the_drafter_wrote_another() -> None:
    stats = Stats()
    count_span_round(stats)
    count_span(stats, _span(False, b" one", b" one"), committed=2)  # the sure leader wrote alone
    assert (stats.rounds, stats.spans, stats.fused_spans, stats.ensembled_tokens) == (1, 1, 0, 0)
    count_span(stats, _span(True, b" one", b" one"), committed=2)
    assert (stats.fused_spans, stats.ensembled_tokens, stats.changed_tokens) == (1, 2, 0)
    count_span(stats, _span(True, b" one", b" other"), committed=3)
    assert (stats.fused_spans, stats.ensembled_tokens, stats.changed_tokens) == (2, 5, 3)
    count_span(stats, _span(True, b" one", b""), committed=1)  # an empty proposal is no alternative
    count_span(stats, _span(True, b" one", None), committed=1)
    assert (stats.fused_spans, stats.ensembled_tokens, stats.changed_tokens) == (4, 7, 3)


def test_a_span_event_lists_candidates_best_first_rounded() -> None:
    event = span_event(_span(True, b" one", b" other"))
    assert [c.text for c in event.candidates] == [" one", " two words"]
    assert event.candidates[1].member_nll == {"a": 1.2346, "b": 2.0}
    assert event.candidates[1].score == 1.6173
    assert event.member_uncertainty == {"a": 0.9123, "b": 0.1}
    assert (event.fused, event.leader, event.chosen, event.words) == (True, "a", " one", 1)


def test_the_rounds_count_and_display_only_through_the_report_module() -> None:
    """No ``stats.x += ...`` and no display event built inside the decoding algorithms."""
    display = {"EnsembleEvent", "AdaFuseEvent", "Candidate", "SpanCandidate", "DraftEvent"}
    for name in ("round.py", "adafuse.py"):
        tree = ast.parse((DECODING / name).read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Attribute):
                assert "stats" not in ast.unparse(node.target), f"{name}: {ast.unparse(node)}"
            if isinstance(node, ast.Name):
                assert node.id not in display, f"{name} builds {node.id}"
