"""SAFE's consensus check at its edges: a member with several EOS ids, a verifier whose argmax is the
drafted token's own bytes rather than its canonical next token, and the verifier's vote at a drafted EOS.

Each test here kills a mutant of shared_engine/decoding/round.py that the rest of the suite let live
(the toy members put their whole end on one EOS id, and none prefers a non-canonical split where a
position is checked).
"""

from __future__ import annotations

import copy
from functools import cache

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.alignment import TokenizedText, TokenTable
from shared_engine.decoding.round import _own_prob
from shared_engine.events import VerifiedPosition
from shared_engine.fusion import MemberDist
from shared_engine.members import HFMember
from tests.test_engine import ANSWER, QUESTION, trained_member
from tests.toy import byte_level_tokenizer, memorise, metaspace_tokenizer, tiny_llama

# ids of the small table below: two EOS ids (Qwen's <|im_end|> and <|endoftext|>, Gemma's <eos> and
# <end_of_turn>), then three ordinary tokens
EOS_A, EOS_B, A, AB, B = range(5)


def _table() -> TokenTable:
    return TokenTable.from_bytes([b"<eos>", b"<end_of_turn>", b"a", b"ab", b"b"], special_ids={EOS_A, EOS_B},
                                 eos_ids={EOS_A, EOS_B}, encode=lambda text: [], name="two-eos")


def _dist(probs: list[float]) -> MemberDist:
    return MemberDist("m", _table(), torch.tensor(probs).log())


@pytest.mark.parametrize("drafted", [EOS_A, EOS_B])
def test_a_drafted_eos_counts_every_eos_id(drafted: int) -> None:
    """Ending is one choice however many EOS ids a vocabulary has: its probability is their sum (the
    max over them halves a model that splits its end between <|im_end|> and <|endoftext|>)."""
    prob, is_top = _own_prob(_dist([0.3, 0.3, 0.4, 0.0, 0.0]), (drafted,))
    assert prob == pytest.approx(0.6, abs=1e-5)
    assert not is_top  # 'a' (0.4) is the argmax token, though ending (0.6) is the likelier choice...
    prob, is_top = _own_prob(_dist([0.35, 0.25, 0.4, 0.0, 0.0]), (drafted,))
    assert prob == pytest.approx(0.6, abs=1e-5) and not is_top
    assert _own_prob(_dist([0.45, 0.3, 0.25, 0.0, 0.0]), (drafted,)) == (pytest.approx(0.75, abs=1e-5), True)


def test_the_drafted_bytes_as_argmax_is_agreement() -> None:
    """A verifier whose canonical next token is 'ab' but whose argmax is 'a', exactly the drafted bytes
    (a non-canonical drafter split), agrees with the draft: both ids continue it."""
    prob, is_top = _own_prob(_dist([0.0, 0.0, 0.5, 0.3, 0.2]), (AB, A))
    assert (prob, is_top) == (pytest.approx(0.5, abs=1e-5), True)
    assert _own_prob(_dist([0.0, 0.0, 0.3, 0.5, 0.2]), (AB, A)) == (pytest.approx(0.5, abs=1e-5), True)
    assert _own_prob(_dist([0.0, 0.0, 0.3, 0.2, 0.5]), (AB, A)) == (pytest.approx(0.3, abs=1e-5), False)


@cache
def _two_eos_drafter() -> HFMember:
    """The byte-level member that memorised ANSWER, with <|im_end|>'s output row a copy of </s>'s: it
    ends exactly as before but splits that mass evenly over its two EOS ids (as Qwen may over
    <|im_end|> and <|endoftext|>)."""
    member = trained_member("byte_level")
    model = copy.deepcopy(member.model)
    eos, im_end = member.tokenizer.eos_token_id, member.tokenizer.convert_tokens_to_ids("<|im_end|>")
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[im_end] = head[eos]
    drafter = HFMember("two-eos", model, member.tokenizer)
    assert {eos, im_end} <= drafter.eos_ids
    return drafter


def _positions(result) -> list[VerifiedPosition]:  # noqa: ANN001
    return [p for e in result.events if e.type == "verify" for p in e.positions]


SPLIT = "Hi Sofia. Some Sofia."
"""The byte-level drafter writes " Some" as " " + "S" + "om" + "e"; the metaspace verifier's canonical
tokenization has one " Some" token at byte 9, and it also has " " on its own."""
SPLIT_AT = 9


@cache
def _split_member(kind: str) -> HFMember:
    """A tiny Llama that memorised SPLIT after QUESTION, spelling " Some" as " " then "Some" (the
    byte-level tokenizer's own split; the metaspace one's is one " Some" token). The metaspace one's output rows are
    scaled by 0.3: the same argmax everywhere, but its probability of " " at byte 9 drops to ~0.06, so
    only its argmax, not the weighted mean, can make the members agree there."""
    tokenizer = byte_level_tokenizer() if kind == "byte_level" else metaspace_tokenizer()
    model = copy.deepcopy(tiny_llama(tokenizer, 0))
    member = HFMember(f"split-{kind}", model, tokenizer)
    table = member.table
    ids = table.encode_fragment(SPLIT) if kind == "byte_level" else \
        table.encode_fragment(SPLIT[:SPLIT_AT]) + [table.token_id(b" ")] + table.encode_fragment(SPLIT[SPLIT_AT + 1:])
    assert table.to_bytes(ids) == SPLIT.encode()
    torch.manual_seed(0)
    memorise(model, member.prompt_ids(QUESTION), ids + [tokenizer.eos_token_id])
    if kind == "metaspace":
        with torch.no_grad():
            model.get_output_embeddings().weight.mul_(0.3)
    return member


def test_a_verifier_whose_argmax_is_the_drafted_bytes_agrees() -> None:
    """The drafter drafts " " at byte 9; the verifier's own next token there is " Some" (its canonical
    reading of the draft), but its argmax is " ", exactly the drafted bytes: the members agree and
    nothing is fused, though the weighted mean of their probabilities (~0.34) is under 0.5."""
    drafter, verifier = _split_member("byte_level"), _split_member("metaspace")
    canonical = TokenizedText(verifier.table)
    canonical.set_text(SPLIT.encode())
    assert b" Some" in [verifier.table.pieces[t] for t in canonical.ids] and verifier.table.token_id(b" ")
    # drafts of 4: the second, " " + "S" + "om" + "e", holds " Some" whole, so the verifier reads it as one token
    engine = EnsembleEngine([drafter, verifier], method="safe", weights=[0.3, 0.7], draft_length=4,
                            draft_schedule="fixed", drafter_confidence=None)
    result = engine.generate(QUESTION, keep_events=True, max_new_tokens=48)
    assert result.text.startswith(SPLIT[:SPLIT_AT + 1])
    [split] = [p for p in _positions(result) if p.offset == SPLIT_AT]
    assert split.boundary_ok and split.consensus
    assert 0.3 * split.probs[drafter.name] + 0.7 * split.probs[verifier.name] < 0.5, split.probs
    assert not [e for e in result.events if e.type == "ensemble" and e.offset == SPLIT_AT]


def _two_eos_answer(drafter_confidence: float | None):  # noqa: ANN202
    members = [_two_eos_drafter(), trained_member("metaspace")]
    engine = EnsembleEngine(members, method="safe", weights=[0.5, 0.5], draft_length=5, draft_schedule="fixed",
                            drafter_confidence=drafter_confidence)
    result = engine.generate(QUESTION, keep_events=True, max_new_tokens=48)
    assert (result.text, result.finish_reason) == (ANSWER, "eos")
    return result


def test_consensus_reads_a_drafter_splitting_its_end_over_two_eos_ids_as_sure_to_end() -> None:
    """The drafter's probability of the EOS it drafted is the sum over its EOS ids (~1 here), not one
    id's half."""
    end = _positions(_two_eos_answer(None))[-1]
    assert end.offset == len(ANSWER.encode()) and end.consensus
    assert end.probs["two-eos"] > 0.9  # 0.5 under the max over EOS ids


def test_the_confidence_gate_reads_a_drafter_splitting_its_end_as_sure_to_end() -> None:
    """Sure of every token, the end included (the sum over its EOS ids): no round needs the verifiers
    (under the max over EOS ids, the last round, ending at 0.5 < 0.9, was verified)."""
    result = _two_eos_answer(0.9)
    assert result.stats.unverified_rounds == result.stats.rounds and not _positions(result)


@pytest.mark.parametrize("drafter, verifier", [("byte_level", "metaspace"), ("metaspace", "byte_level")])
def test_a_verifier_that_ends_too_agrees_with_a_drafted_eos(drafter: str, verifier: str) -> None:
    """At a drafted EOS the verifier's own next token is its EOS, so its probability of ending counts:
    two members that both end the answer agree there (the drafter's weight 0.3 alone could not carry
    the weighted mean over 0.5) and nothing is fused."""
    members = [trained_member(drafter), trained_member(verifier)]
    engine = EnsembleEngine(members, method="safe", weights=[0.3, 0.7], draft_length=5, draft_schedule="fixed",
                            drafter_confidence=None)
    result = engine.generate(QUESTION, keep_events=True, max_new_tokens=48)
    assert (result.text, result.finish_reason) == (ANSWER, "eos")
    end = _positions(result)[-1]
    assert end.offset == len(ANSWER.encode()) and end.boundary_ok and end.consensus
    assert all(p > 0.9 for p in end.probs.values()), end.probs
    assert not [e for e in result.events if e.type == "ensemble" and e.offset == end.offset]
