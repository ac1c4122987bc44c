"""An answer's first token is never EOS where fusion decides it: an empty answer is never the answer
(turn_markers.py; ``_fuse``'s ``may_end``, which ``decode_round`` sets from ``at_answer_start``).

Engine level, on toy members that memorised an empty answer (EOS straight after the prompt), so every
member's top choice at the answer's start is EOS. Fusion (SAFE at a fused position, every-token) must
write something there. Where no fusion ran at the answer's start (SAFE's consensus skip and its
drafter-alone gate, AdaFuse's vote) the drafted or voted EOS was committed and the answer was empty
(found 2026-12-07c); now an ensemble's drafter and AdaFuse's proposers read their distribution without
EOS while the answer is only whitespace (``turn_markers.without_ending``), as a plain member's turn
marker is read where it writes. A member alone (``single``) still ends at once.
"""

from __future__ import annotations

from typing import Any

from shared_engine import EnsembleEngine, GenerationResult
from shared_engine.members import HFMember
from tests.test_engine import answering

QUESTION = "Say nothing."
MESSAGES = [{"role": "user", "content": QUESTION}]


def _silent(kind: str, seed: int) -> HFMember:
    """A toy member sure of EOS right after the prompt: its greedy answer alone is empty."""
    return answering(kind, "", QUESTION, seed, f"silent-{kind}")


def _talker() -> HFMember:
    return answering("metaspace", "Hi Sofia.", QUESTION, 1, "talker-metaspace")


def _generate(members: list[HFMember], method: str, **options: Any) -> GenerationResult:
    return EnsembleEngine(members, method=method, **options).generate(MESSAGES, max_new_tokens=6,
                                                                      keep_events=True)


def test_the_silent_members_really_answer_nothing_alone() -> None:
    """The premise: each member alone (greedy) ends at once."""
    for member in (_silent("byte_level", 0), _silent("metaspace", 1)):
        alone = _generate([member], "single")
        assert (alone.text, alone.finish_reason) == ("", "eos")


def test_every_token_fusion_at_the_answers_start_never_chooses_eos() -> None:
    """every-token fuses at every position: at the answer's start both members' EOS is the fused
    argmax, and fusion must take the best other candidate (catches ``may_end=True`` in decode_round)."""
    result = _generate([_silent("byte_level", 0), _silent("metaspace", 1)], "every-token")
    fusions = [e for e in result.events if e.type == "ensemble"]
    assert fusions and fusions[0].offset == 0 and fusions[0].chosen != "<eos>"
    assert result.text.strip()


def test_safe_at_the_answers_start_never_drafts_or_chooses_eos() -> None:
    """SAFE where the members disagree at the answer's start (the drafter is sure of EOS, the verifier
    of "Hi"; equal weights, no confidence gate): the drafter writes its best other token, and neither it
    nor fusion ends the answer."""
    result = _generate([_silent("byte_level", 0), _talker()], "safe", drafter_confidence=None, weights=[1, 1])
    drafted = [e for e in result.events if e.type in ("draft", "token")]
    assert drafted and result.text.strip()
    fusions = [e for e in result.events if e.type == "ensemble"]
    assert all(f.chosen != "<eos>" and f.drafted != "<eos>" for f in fusions if f.offset == 0)


def test_safe_consensus_at_the_answers_start_does_not_end_the_answer() -> None:
    result = _generate([_silent("byte_level", 0), _silent("metaspace", 1)], "safe", drafter_confidence=None)
    assert result.text.strip()


def test_safe_drafter_alone_gate_at_the_answers_start_does_not_end_the_answer() -> None:
    result = _generate([_silent("byte_level", 0), _talker()], "safe")
    assert result.text.strip()


def test_adafuse_at_the_answers_start_does_not_end_the_answer() -> None:
    result = _generate([_silent("byte_level", 0), _silent("metaspace", 1)], "adafuse")
    assert result.text.strip()


def test_adafuse_takes_a_members_words_over_an_ending_at_the_answers_start() -> None:
    """A drafter sure of EOS and a member that answers: AdaFuse commits the answer, not an empty one."""
    result = _generate([_silent("byte_level", 0), _talker()], "adafuse")
    assert result.text.startswith("Hi")


def test_a_member_weighted_0_has_no_say_at_the_answers_start() -> None:
    """A member weighted 0 has no say (review of the rule above): with it, a silent drafter's answer is
    its own, empty, as alone, under SAFE and AdaFuse."""
    for method in ("safe", "adafuse"):
        result = _generate([_silent("byte_level", 0), _talker()], method, weights=[1, 0])
        assert (result.text, result.finish_reason) == ("", "eos"), (method, result.text)
