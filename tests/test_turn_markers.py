"""A plain-format member's turn marker ("User" of its stop string "\\nUser:") read as its end of turn."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from shared_engine.alignment import EOS_KEY, TokenTable
from shared_engine.decoding.round import FusionSettings, _fuse
from shared_engine.decoding.state import RequestState, request_members
from shared_engine.fusion import MemberDist, make_fuser
from shared_engine.members.chat import PLAIN_TEMPLATE_STOPS
from shared_engine.sampling import Sampler
from shared_engine.turn_markers import PROMPT_END, at_answer_start, marker_ids, read_turn_markers

PIECES = [b"User", b"User:", b"Users", b"\n", b"U", b"ser", b"er", b"The", b" User", b"\nUser", b"Hallo", b"",
          b"User:\n"]
EOS = 11


def _table() -> TokenTable:
    ids = {p: i for i, p in enumerate(PIECES)}
    return TokenTable.from_bytes(PIECES, special_ids={EOS}, eos_ids={EOS},
                                 encode=lambda text: [ids.get(text.encode(), 0)], name="toy")


def _names(ids: frozenset[int]) -> set[bytes]:
    return {PIECES[i] for i in ids}


def test_the_role_word_at_a_line_start_is_the_marker() -> None:
    table = _table()
    at_start = _names(marker_ids(table, PLAIN_TEMPLATE_STOPS, PROMPT_END))
    assert at_start == {b"User", b"User:", b"\nUser", b"User:\n"}  # "User:\n" ends the turn within itself
    # completing the role word begun earlier on the line
    assert _names(marker_ids(table, PLAIN_TEMPLATE_STOPS, PROMPT_END + b"Hallo\nUs")) == {b"er", b"\nUser"}
    assert _names(marker_ids(table, PLAIN_TEMPLATE_STOPS, PROMPT_END + b"Hallo\nU")) == {b"ser", b"\nUser"}
    # inside a line only a piece that brings its own new line is one
    assert _names(marker_ids(table, PLAIN_TEMPLATE_STOPS, PROMPT_END + b"Hallo")) == {b"\nUser"}
    assert marker_ids(table, (), PROMPT_END) == frozenset()
    # the answer up to ``end`` only, read without copying it
    assert _names(marker_ids(table, PLAIN_TEMPLATE_STOPS, b"Hallo\nUs and more", 8)) == {b"er", b"\nUser"}
    assert _names(marker_ids(table, PLAIN_TEMPLATE_STOPS, b" \nThe", 2)) == _names(
        marker_ids(table, PLAIN_TEMPLATE_STOPS, PROMPT_END))  # "\n" ends the answer so far, as the prompt does
    assert at_answer_start(b" \n\tThe", 3) and not at_answer_start(b" \n\tThe") and at_answer_start(bytearray())


def test_a_member_writing_the_answers_start_drops_the_marker_and_renormalises() -> None:
    table = _table()
    logits = torch.log(torch.tensor([0.5, 0.1, 0.02, 0.02, 0.02, 0.02, 0.02, 0.2, 0.02, 0.02, 0.02, 0.02, 0.02]))
    out, mass = read_turn_markers(logits, table, PLAIN_TEMPLATE_STOPS, b"", writing=True)
    probs = torch.softmax(out, 0)
    assert abs(mass - (0.5 + 0.1 + 0.02 + 0.02)) < 1e-5
    for marker in (b"User", b"User:", b"\nUser", b"User:\n"):
        assert float(probs[PIECES.index(marker)]) == 0.0
    # EOS is not where the marker's mass goes here: the member must write the answer's first word
    assert abs(float(probs[EOS]) - 0.02 / 0.36) < 1e-5
    assert abs(float(probs[PIECES.index(b"The")]) - 0.2 / 0.36) < 1e-5
    # whitespace alone is still the answer's start
    again, _ = read_turn_markers(logits, table, PLAIN_TEMPLATE_STOPS, b" \n", writing=True)
    assert float(torch.softmax(again, 0)[EOS]) < 0.1


def test_a_vote_at_the_answers_start_abstains_with_the_markers_mass() -> None:
    """Fusion reads the marker as the member's EOS, and never chooses to end at the answer's start:
    the verifier's 0.9 on "User" neither writes "User" nor ends the answer, nor inflates its second
    choice (renormalising it would give "Hallo" 0.5 of this member's vote and let it win)."""
    table = _table()
    # pieces: User, User:, Users, \n, U, ser, er, The, " User", \nUser, Hallo, EOS, User:\n
    drafter = torch.log(torch.tensor([1e-4, 1e-4, 0.4, 1e-4, 1e-4, 1e-4, 1e-4, 0.3, 1e-4, 1e-4, 0.25, 0.04, 1e-4]))
    verifier = torch.log(torch.tensor([0.9, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 1e-4, 0.09, 0.01, 1e-4]))
    voted, mass = read_turn_markers(verifier, table, PLAIN_TEMPLATE_STOPS, b"")
    assert mass > 0.89
    dists = [MemberDist("drafter", table, drafter), MemberDist("base", table, voted)]
    settings = FusionSettings(make_fuser("unite"), "heur")
    weights = torch.tensor([2 / 3, 1 / 3])
    at_start = _fuse(dists, weights, settings, Sampler(), 0, PIECES.index(b"Users"), 0, may_end=False)
    assert at_start.chosen == b"Users"
    later = _fuse(dists, weights, settings, Sampler(), 0, PIECES.index(b"Users"), 0)
    assert later.chosen == EOS_KEY  # after the first word the same vote ends the answer


def test_after_a_line_break_the_marker_is_the_members_end_of_turn() -> None:
    table = _table()
    logits = torch.log(torch.tensor([0.5, 0.1, 0.02, 0.02, 0.02, 0.02, 0.02, 0.2, 0.02, 0.02, 0.02, 0.02, 0.02]))
    out, mass = read_turn_markers(logits, table, PLAIN_TEMPLATE_STOPS, b"Hallo\n")
    probs = torch.softmax(out, 0)
    assert abs(mass - 0.64) < 1e-5
    assert abs(float(probs[EOS]) - (0.02 + 0.64)) < 1e-5  # the distribution still sums to 1
    assert abs(float(probs.sum()) - 1.0) < 1e-5
    assert float(probs[PIECES.index(b"User")]) == 0.0
    assert abs(float(probs[PIECES.index(b"Users")]) - 0.02) < 1e-6  # a word, not the marker


def test_a_member_without_the_plain_format_is_read_as_it_is() -> None:
    table = _table()
    logits = torch.randn(len(PIECES))
    out, mass = read_turn_markers(logits, table, (), b"")
    assert out is logits and mass == 0.0
    mid_line, mass = read_turn_markers(logits, table, PLAIN_TEMPLATE_STOPS, b"Hallo ")
    assert torch.allclose(torch.softmax(mid_line, 0)[:9], torch.softmax(logits, 0)[:9])  # only "\nUser" moved


@dataclass
class _Writer:
    """What ``RequestState`` reads of a member when committing: its table, EOS ids and stop strings."""

    name: str
    table: TokenTable
    stop_strings: tuple[str, ...]

    @property
    def eos_ids(self) -> frozenset[int]:
        return self.table.eos_ids


def _answer_then_eos(*stops: tuple[str, ...], user_stop: tuple[str, ...] = ()) -> tuple[str, str, str | None]:
    """ "Hallo", a line break, then EOS, committed by the first of members with these stop strings:
    (the streamed text, the final text, the finish reason)."""
    table = _table()
    members = [_Writer(f"m{i}", table, s) for i, s in enumerate(stops)]
    state = RequestState(request_members(members, [m.name for m in members], [object()] * len(members),
                                         [[] for _ in members]), max_new_tokens=10,
                         stop=user_stop + tuple(s for m in members for s in m.stop_strings))
    ids = [PIECES.index(b"Hallo"), PIECES.index(b"\n"), EOS]
    streamed = "".join(e.text for e in state.commit(ids, "draft") + state.flush())
    return streamed, state.text, state.finish_reason


def test_an_answer_ended_at_a_turn_markers_line_break_drops_that_line_break() -> None:
    """Fusion ends an answer at a plain-format member's turn marker by choosing EOS after the "\\n" that
    began it; the member's stop string "\\nUser:" would have trimmed that "\\n" with the rest, so the
    answer does not end in it (it used to: "```plaintext\\n" where the stop string gave "```plaintext")."""
    assert _answer_then_eos((), PLAIN_TEMPLATE_STOPS) == ("Hallo", "Hallo", "eos")
    assert _answer_then_eos(PLAIN_TEMPLATE_STOPS) == ("Hallo", "Hallo", "eos")
    # members without the plain format keep what they wrote, and so does a user's own stop string
    assert _answer_then_eos((), ()) == ("Hallo\n", "Hallo\n", "eos")
    assert _answer_then_eos((), (), user_stop=("\n\n",)) == ("Hallo\n", "Hallo\n", "eos")


# One FLORES-200 devtest sentence (CC BY-SA 4.0, the FLORES data AdaFuse evaluates on), written out here
# so the test needs no data folder, with the benchmark's zero-shot prompt: SAFE (Qwen + Gemma-3-270m,
# llama.cpp) began its answer "User: Several large television screens ..." (the source copied) before
# this rule.
FLORES_EN_DE = [
    {"role": "system", "content": (
        "Translate the following English sentences into German.\n\nPlease translate **only** the content of "
        "each sentence without adding any explanations, annotations, or comments. Your translation should be "
        "faithful to the original meaning and written in natural, fluent German.\n\nNow, translate the "
        "following sentences into German:")},
    {"role": "user", "content": ("Several large television screens were installed in various places in Rome to "
                                 "let the people watch the ceremony.")},
]


@pytest.mark.zoo
def test_a_base_member_no_longer_opens_an_answer_with_its_turn_marker() -> None:
    from shared_engine import EnsembleEngine

    gemma = EnsembleEngine(["llamacpp:gemma-3-270m"], method="single")
    alone = gemma.generate(FLORES_EN_DE, max_new_tokens=6)
    assert not alone.text.lstrip().startswith("User") and alone.stats.turn_markers >= 1
    pair = EnsembleEngine(["llamacpp:qwen2.5-coder-0.5b-instruct", "llamacpp:gemma-3-270m"], method="safe")
    fused = pair.generate(FLORES_EN_DE, max_new_tokens=6)
    assert not fused.text.lstrip().startswith("User") and fused.stats.turn_markers >= 1


def test_a_member_writing_after_the_answers_start_ends_its_turn_at_the_marker() -> None:
    """Catches a writing member's marker being dropped everywhere instead of only at the answer's
    start: after "Hallo\\n" its marker is its EOS, as for a voting member."""
    table = _table()
    logits = torch.log(torch.tensor([0.5, 0.1, 0.02, 0.02, 0.02, 0.02, 0.02, 0.2, 0.02, 0.02, 0.02, 0.02, 0.02]))
    out, mass = read_turn_markers(logits, table, PLAIN_TEMPLATE_STOPS, b"Hallo\n", writing=True)
    assert abs(mass - 0.64) < 1e-5
    assert abs(float(torch.softmax(out, 0)[EOS]) - (0.02 + 0.64)) < 1e-5


def test_the_markers_mass_goes_to_the_strongest_eos() -> None:
    """Catches the marker's mass going to the weakest of several EOS ids."""
    pieces = [*PIECES, b""]
    ids = {p: i for i, p in enumerate(pieces)}
    table = TokenTable.from_bytes(pieces, special_ids={EOS, 13}, eos_ids={EOS, 13},
                                  encode=lambda text: [ids.get(text.encode(), 0)], name="toy")
    logits = torch.log(torch.tensor([0.5, 0.1, 0.02, 0.02, 0.02, 0.02, 0.02, 0.18, 0.02, 0.02, 0.02, 0.01, 0.02,
                                     0.03]))
    out, mass = read_turn_markers(logits, table, PLAIN_TEMPLATE_STOPS, b"Hallo\n")
    probs = torch.softmax(out, 0)
    assert abs(mass - 0.64) < 1e-5
    assert abs(float(probs[13]) - (0.03 + 0.64)) < 1e-5  # the stronger EOS takes the mass
    assert abs(float(probs[EOS]) - 0.01) < 1e-6
