"""Behaviour the suite left unpinned (mutation testing of fusion.py, policies.py, repetition.py and the
decoding round): each test fails on one mutant of the code it names and passes on the code as it is.
Pure functions on hand-made distributions and the toy tokenizers only, so the file stays fast."""

from __future__ import annotations

import torch

from shared_engine.alignment import EOS_KEY, TokenTable
from shared_engine.decoding.round import _draft_mass
from shared_engine.fusion import SHARPEN_BELOW, Fused, MemberDist, drafter_extends, sharpen, top_keys
from shared_engine.policies import DraftSchedule, make_policy
from shared_engine.sampling import Sampler
from tests.toy import byte_level_tokenizer


def test_top_keys_looks_past_special_tokens_for_k_candidates() -> None:
    """fusion.top_keys: the non-EOS specials ('<s>', '<pad>', '<|im_start|>') are no candidates, so a
    member whose highest logits are specials still offers k real candidates to UniTE's union (and to
    the drafter's top-10 that sharpening pools onto); taking only the top k ids gave k minus the
    specials among them."""
    table = TokenTable(byte_level_tokenizer())
    specials = sorted(table.special_ids - table.eos_ids)
    assert len(specials) >= 3
    logits = torch.zeros(table.vocab_size)
    logits[specials] = 100.0  # the member's most likely ids are all specials
    words = [t for t in range(table.vocab_size) if t not in table.special_ids and table.pieces[t]][:12]
    for rank, token in enumerate(words):
        logits[token] = 50.0 - rank
    top = top_keys(MemberDist("m", table, logits), 10)
    assert list(top) == [table.pieces[t] for t in words[:10]]


def test_sharpening_does_not_fire_at_a_fused_max_of_exactly_one_half() -> None:
    """fusion.sharpen: SAFE sharpens only where the fused max is *below* 0.5; a candidate with half the
    fused mass already holds a majority no pooling may overturn (here " So" would gain " Sofia"'s 0.3
    and beat " Paris", the fused best at exactly 0.5)."""
    keys = [b" Paris", b" So", b" Sofia"]
    member_probs = torch.tensor([[0.5, 0.2, 0.3], [0.5, 0.2, 0.3]])
    weights = torch.tensor([0.5, 0.5])
    fused = Fused(keys, member_probs, weights @ member_probs)
    assert float(fused.fused.max()) == SHARPEN_BELOW
    for mode in ("heur", "heur-bytes", "geom"):
        scores, fired = sharpen(fused, weights, mode, drafter_top=set(keys))
        assert not fired and torch.equal(scores, fused.fused), mode
    under = torch.tensor([[0.45, 0.25, 0.3], [0.45, 0.25, 0.3]])  # under one half: it fires
    scores, fired = sharpen(Fused(keys, under, weights @ under), weights, "heur-bytes", drafter_top=set(keys))
    assert fired and keys[int(torch.argmax(scores))] == b" So"


def test_a_draft_exactly_at_drafter_confidence_is_committed_without_the_verifiers() -> None:
    """policies.Policy.drafter_decides_alone: the round treats a position whose drafter probability is
    >= ``drafter_confidence`` as agreed (SAFE's GaC variant), so a draft at the bar everywhere cannot be
    changed by fusion and skips the verifiers' forward; a strict > paid that forward for nothing
    (at drafter_confidence 1.0 a saturated softmax's 1.0 never skipped it)."""
    policy = make_policy("safe", DraftSchedule.fixed(3), None, drafter_confidence=0.5)
    assert policy.drafter_decides_alone([0.5, 0.5, 0.9])
    assert not policy.drafter_decides_alone([0.5, 0.49, 0.9])
    assert make_policy("safe", DraftSchedule.fixed(3), None, drafter_confidence=1.0).drafter_decides_alone([1.0])
    assert not make_policy("safe", DraftSchedule.fixed(3), None).drafter_decides_alone([1.0])  # no gate


def test_heur_pools_nothing_onto_a_whitespace_only_candidate() -> None:
    """fusion.sharpen: every word after a space starts with " ", so pooling onto a whitespace-only
    candidate would hand it the mass of every word (the answer got a stray space and lost its word);
    the released code skips " ", both heur modes skip any whitespace-only shorter candidate."""
    keys = [b" Paris", b" ", b" London", b"\n", b"\n\n"]
    member_probs = torch.tensor([[0.35, 0.2, 0.25, 0.1, 0.1], [0.35, 0.2, 0.25, 0.1, 0.1]])
    weights = torch.tensor([0.5, 0.5])
    fused = Fused(keys, member_probs, weights @ member_probs)
    byte_level = TokenTable(byte_level_tokenizer())
    for mode in ("heur", "heur-bytes"):
        scores, fired = sharpen(fused, weights, mode, drafter_top=set(keys), extends=drafter_extends(byte_level))
        assert fired and torch.equal(scores, fused.fused), mode
        assert keys[int(torch.argmax(scores))] == b" Paris"


def test_a_sampled_fusion_reads_the_drafters_eos_mass_over_every_eos_id() -> None:
    """decoding/round._draft_mass: speculative acceptance divides the fused probability of the drafted
    candidate by the drafter's; the drafter ends the answer through any of its EOS ids (Qwen has two,
    so does the toy vocabulary), so the drafter's mass on 'end' is all of them. Reading one id halved
    it here, and a drafted EOS was accepted (and drawn from the residual) more often than the fused
    distribution says."""
    table = TokenTable(byte_level_tokenizer())
    eos = sorted(table.eos_ids)
    assert len(eos) == 2
    word = next(t for t in range(table.vocab_size) if t not in table.special_ids and table.pieces[t])
    logits = torch.full((table.vocab_size,), -1e9)
    logits[eos] = 0.0
    logits[word] = 0.0  # a third each
    mass = _draft_mass(MemberDist("d", table, logits), Sampler(temperature=1.0), [EOS_KEY, table.pieces[word]])
    assert torch.allclose(mass, torch.tensor([2 / 3, 1 / 3]))
