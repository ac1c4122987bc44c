"""AdaFuse behaviour the mutation hunt found unpinned (shared_engine/decoding/adafuse.py): each test fails
on one mutant of the code it names and passes on the code as it is. Toy members that memorised an answer."""

from __future__ import annotations

import copy
from functools import cache

import torch

from shared_engine import EnsembleEngine
from shared_engine.members import HFMember
from tests.toy import byte_level_tokenizer, memorise, metaspace_tokenizer, tiny_llama

QUESTION = [{"role": "user", "content": "Laugh."}]
LAUGH = "He laughed:" + " " + "ha" * 20 + "! Then he stopped."
"""One word (" hahaha...ha!") that loops far past a guard of 16 bytes inside itself: at a word end
alone the answer shows no loop (its last bytes are "a!")."""


@cache
def answering(kind: str, answer: str, seed: int = 0) -> HFMember:
    """A tiny Llama that memorised ``answer`` (in its own tokenization, then EOS) after QUESTION: it is
    sure of every token of it."""
    tokenizer = byte_level_tokenizer() if kind == "byte_level" else metaspace_tokenizer()
    torch.manual_seed(seed)
    model = copy.deepcopy(tiny_llama(tokenizer, seed))
    member = HFMember(f"{kind}-answers-{len(answer)}", model, tokenizer)
    memorise(model, member.prompt_ids(QUESTION), member.table.encode_fragment(answer) + [tokenizer.eos_token_id])
    return member


def test_an_answer_that_ends_in_an_eos_only_span_counts_that_position_as_ensembled() -> None:
    """adafuse.py (2151d7c): the position where the answer ends is one ensemble_rate counts, as SAFE's
    rounds do; a voted span of EOS alone (every member sure to end here) counted 0 positions, so an
    answer whose every span was voted had a rate below 1 (here 0 of 1)."""
    members = [answering("byte_level", ""), answering("metaspace", "")]
    result = EnsembleEngine(members, method="adafuse").generate(QUESTION, max_new_tokens=8)
    stats = result.stats
    assert result.text == "" and result.finish_reason == "eos"
    assert stats.spans == stats.fused_spans == 1 and stats.tokens == 0
    assert stats.ensembled_tokens == 1 and stats.ensemble_rate == 1.0


def test_a_sure_leader_looping_inside_one_word_goes_to_the_guarded_vote() -> None:
    """adafuse.py (cd1db65), vote="uncertain": a sure leader writes alone unless its span loops; checked
    at its word ends only, " hahaha...ha!" passed and was committed whole, past the guard. Its own
    token ends show the loop: the round votes, and the vote's guard rules the span out."""
    members = [answering("byte_level", LAUGH), answering("metaspace", LAUGH)]
    engine = EnsembleEngine(members, method="adafuse", vote="uncertain", max_new_tokens=96)
    free = engine.generate(QUESTION)
    assert "ha" * 20 + "!" in free.text and free.stats.loop_breaks == 0  # without the guard: the whole laugh
    guarded = engine.generate(QUESTION, loop_guard=16)
    assert "ha" * 10 not in guarded.text and guarded.stats.loop_breaks > 0, guarded.text
