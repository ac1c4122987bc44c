"""AdaFuse behaviour the mutation hunt found unpinned (shared_engine/decoding/adafuse.py): each test fails
on one mutant of the code it names and passes on the code as it is. Toy members that memorised an answer."""

from __future__ import annotations

from shared_engine import EnsembleEngine
from tests.test_engine import answering

ASKED = "Laugh."
QUESTION = [{"role": "user", "content": ASKED}]
LAUGH = "He laughed:" + " " + "ha" * 20 + "! Then he stopped."
"""One word (" hahaha...ha!") that loops far past a guard of 16 bytes inside itself: at a word end
alone the answer shows no loop (its last bytes are "a!")."""


def test_the_position_where_the_answer_ends_counts_as_ensembled() -> None:
    """adafuse.py (2151d7c): the position where the answer ends is one ensemble_rate counts, as SAFE's
    rounds do; a voted span of EOS alone (every member sure to end at the answer's start) counted 0
    positions, so an answer whose every span was voted had a rate below 1 (there 0 of 1). Since
    2026-12-07c members sure of ending at once write something instead (an ensemble's answer is never
    empty: turn_markers.without_ending), and the ending EOS is still one position of its own."""
    members = [answering("byte_level", "", ASKED), answering("metaspace", "", ASKED)]
    result = EnsembleEngine(members, method="adafuse").generate(QUESTION, max_new_tokens=8)
    stats = result.stats
    assert result.text.strip() and stats.tokens > 0
    assert stats.spans == stats.fused_spans >= 1
    if result.finish_reason == "eos":
        assert stats.ensembled_tokens == stats.tokens + 1 and stats.ensemble_rate == 1.0
    else:
        assert stats.ensembled_tokens == stats.tokens and stats.ensemble_rate == 1.0


def test_a_sure_leader_looping_inside_one_word_goes_to_the_guarded_vote() -> None:
    """adafuse.py (cd1db65), vote="uncertain": a sure leader writes alone unless its span loops; checked
    at its word ends only, " hahaha...ha!" passed and was committed whole, past the guard. Its own
    token ends show the loop: the round votes, and the vote's guard rules the span out."""
    members = [answering("byte_level", LAUGH, ASKED), answering("metaspace", LAUGH, ASKED)]
    engine = EnsembleEngine(members, method="adafuse", vote="uncertain", max_new_tokens=96)
    free = engine.generate(QUESTION)
    assert "ha" * 20 + "!" in free.text and free.stats.loop_breaks == 0  # without the guard: the whole laugh
    guarded = engine.generate(QUESTION, loop_guard=16)
    assert "ha" * 10 not in guarded.text and guarded.stats.loop_breaks > 0, guarded.text
