"""The loop guard (shared_engine/repetition.py and its use in the decoding rounds): exact loop
detection on bytes, the drafter's and fusion's choices that never repeat a loop past the limit,
and whole requests on toy members trained to loop, which loop to the length cap without it."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from shared_engine import EnsembleEngine
from shared_engine.alignment import EOS_KEY
from shared_engine.decoding.round import FusionSettings, _fuse, _guarded_token
from shared_engine.decoding.state import RequestState, request_members
from shared_engine.errors import InvalidRequestError
from shared_engine.fusion import MemberDist, make_fuser
from shared_engine.repetition import MAX_PERIOD, continues_loop, loop_unit
from shared_engine.sampling import Sampler
from tests.toy import fitted_member, registered_members, toy_member

CATS = b"A cat is a cat, a cat is a cat, a cat is a cat,"
LOOPY = [{"role": "user", "content": "Tell me about cats."},
         {"role": "assistant", "content": "A cat is a cat, " * 12}]
"""A conversation the toys are fitted to: they then answer it with the same loop until the cap."""
GUARD = 24


def longest_runs(text: bytes) -> dict[int, int]:
    """For each period p, the longest stretch of ``text`` that is p-periodic (text[i] == text[i-p])
    and holds at least two periods; plain loops, no cleverness."""
    best: dict[int, int] = {}
    for period in range(1, min(MAX_PERIOD, len(text) // 2) + 1):
        run = 0
        for i in range(period, len(text)):
            run = run + 1 if text[i] == text[i - period] else 0
            if run + period >= 2 * period:
                best[period] = max(best.get(period, 0), run + period)
    return best


# -- detection ------------------------------------------------------------------------------------

def test_a_loop_is_two_periods_and_the_limit_and_its_unit_is_the_shortest() -> None:
    assert loop_unit(CATS, 32) == b" a cat is a cat,"  # 16 bytes, three copies: 47 bytes >= 32
    assert loop_unit(CATS, 48) is None  # 47 periodic bytes (the first "A" breaks the period)
    assert loop_unit(b"ab" * 40, 16) == b"ab"  # ab and abab are both periods: the shortest
    assert loop_unit(b"5 + 5 + 5 + 5 = 20", 8) is None  # the end is no repetition
    assert loop_unit(b"x = 5 + 5 + 5", 64) is None  # arithmetic repeats, far below the limit
    assert loop_unit(b"one line\nanother\n", 4) is None  # nothing repeats twice
    assert loop_unit(b"", 8) is None


def test_a_piece_continues_a_loop_only_if_it_repeats_the_unit_for_its_whole_length() -> None:
    unit = loop_unit(CATS, 32)
    assert continues_loop(unit, b" a") and continues_loop(unit, b" a cat is a cat, a cat")  # past one unit
    assert not continues_loop(unit, b" an") and not continues_loop(unit, b"\n")
    assert not continues_loop(unit, b"") and not continues_loop(None, b" a")


# -- the drafter's choice and fusion --------------------------------------------------------------

def _state(member, guard: int | None, answer: bytes) -> RequestState:
    state = RequestState(request_members([member], [member.name], [member.new_session()], [[]]), 64,
                         loop_guard=guard)
    state.answer.extend(answer)
    return state


def _logits(table, favour: dict[bytes, float]) -> torch.Tensor:
    logits = torch.full((table.vocab_size,), -20.0)
    for piece, value in favour.items():
        token = table.token_id(piece)
        assert token is not None, piece
        logits[token] = value
    return logits


def test_the_drafter_takes_its_best_token_that_does_not_continue_the_loop() -> None:
    member = toy_member("toy-bpe", "byte_level")
    logits = _logits(member.table, {b" a": 9.0, b" and": 6.0, b".": 5.0})
    state = _state(member, 32, CATS)
    chosen, broke = _guarded_token(state, Sampler(), logits, None, None, state.loop_at(state.loop_tail()))
    assert chosen is not None and member.table.pieces[chosen[0]] == b" and" and broke
    unguarded = _state(member, None, CATS)
    chosen, broke = _guarded_token(unguarded, Sampler(), logits, None, None, unguarded.loop_at(unguarded.loop_tail()))
    assert chosen is not None and member.table.pieces[chosen[0]] == b" a" and not broke
    for seed in range(20):  # sampled: drawn from the rest of the distribution, never the loop's token
        chosen, _ = _guarded_token(state, Sampler(temperature=1.0, seed=seed), logits, None, None,
                                   state.loop_at(state.loop_tail()))
        assert chosen is not None and member.table.pieces[chosen[0]] != b" a"


def test_fusion_never_chooses_a_candidate_that_continues_the_loop() -> None:
    bpe, sp = toy_member("toy-bpe", "byte_level").table, toy_member("toy-sp", "metaspace", seed=1).table
    favour = {b" a": 9.0, b" and": 6.0}
    dists = [MemberDist("bpe", bpe, _logits(bpe, favour)), MemberDist("sp", sp, _logits(sp, favour))]
    settings, weights = FusionSettings(make_fuser("unite", 10), None), torch.tensor([0.5, 0.5])
    drafted = bpe.token_id(b" and")
    free = _fuse(dists, weights, settings, Sampler(), len(CATS), drafted, 0)
    assert free.chosen == b" a" and not free.loop_blocked  # unguarded, the fused favourite repeats the loop
    guarded = _fuse(dists, weights, settings, Sampler(), len(CATS), drafted, 0, loop=loop_unit(CATS, 32))
    assert guarded.chosen == b" and" and guarded.loop_blocked and not guarded.changed


def test_an_adafuse_span_that_loops_inside_and_ends_on_other_text_is_ruled_out() -> None:
    """AdaFuse checked the answer's end only after a whole span: with loop_guard=16 a span repeating
    " na" to 36 bytes and then ending " Batman" passed; the same span ending " na" was ruled out."""
    from shared_engine.decoding.adafuse import _ends_in_loop

    member = toy_member("toy-bpe", "byte_level")
    state = RequestState(request_members([member], ["a"], [member.new_session()], [[1]]), 100, loop_guard=16)
    state.answer += b"Count:"
    assert _ends_in_loop(state, b" na" * 12)
    assert _ends_in_loop(state, b" na" * 12 + b" Batman")
    assert not _ends_in_loop(state, b" na na Batman and Robin")  # under the limit: not a loop
    assert not _ends_in_loop(state, b" na" * 12 + EOS_KEY)  # ending the answer ends any loop


def test_an_adafuse_span_that_loops_inside_one_word_is_ruled_out_at_its_writers_tokens() -> None:
    """Checked at word ends only, a span looping inside one word (" hahaha...ha!", a run of "=")
    passed, where SAFE's guard, token by token, stops it: the writer's token ends are checked too."""
    from shared_engine.decoding.adafuse import Span, _candidate_keys, _ends_in_loop, _token_ends

    member = toy_member("toy-bpe", "byte_level")
    table = member.table
    state = RequestState(request_members([member], ["a"], [member.new_session()], [[1]]), 100, loop_guard=16)
    state.answer += b"He laughed:"
    laugh = b" " + b"ha" * 20 + b"!"
    ids = [table.token_id(b" ")] + [table.token_id(b"h"), table.token_id(b"a")] * 20 + [table.token_id(b"!")]
    span = Span(key=laugh, ids=ids, nll=0.1, words=1)
    assert not _ends_in_loop(state, laugh)  # one word: its end alone shows no loop (the last bytes are "a!")
    assert _ends_in_loop(state, laugh, token_ends=_token_ends(state, 0, span))
    assert _token_ends(state, 0, span)[-1] == len(laugh)
    quiet = b" " + b"ha" * 3 + b"!"
    calm = Span(key=quiet, ids=[table.token_id(b" ")] + [table.token_id(b"h"), table.token_id(b"a")] * 3
                + [table.token_id(b"!")], nll=0.2, words=1)
    outlook = SimpleNamespace(firsts=[torch.zeros(len(table.pieces))])
    keys, ruled_out = _candidate_keys(state, outlook, [[span, calm]])  # type: ignore[arg-type]
    assert keys == [quiet] and ruled_out == 1


# -- whole requests -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def loopy() -> dict[str, object]:
    return {"bpe": fitted_member("loopy-bpe", "byte_level", LOOPY), "sp": fitted_member("loopy-sp", "metaspace", LOOPY)}


CASES = [(("bpe",), "single"), (("sp",), "single"), (("bpe", "sp"), "safe"), (("sp", "bpe"), "safe"),
         (("bpe", "sp"), "every-token"), (("sp", "bpe"), "adafuse"), (("sp", "bpe"), "adafuse:uncertain")]
"""``adafuse:uncertain``: vote='uncertain', where a sure member wrote alone and the guard never reached it."""


@pytest.mark.parametrize("names, method", CASES)
def test_toys_that_loop_to_the_cap_stop_repeating_at_the_guard(loopy: dict, names: tuple[str, ...],
                                                               method: str) -> None:
    members = [loopy[n] for n in names]
    longest_piece = max(len(p) for m in members for p in m.table.pieces)

    def too_long(text: str) -> dict[int, int]:
        """The loops longer than the guard allows: it lets a loop reach the limit (or two periods),
        then never takes the token that repeats it further; only a token under way when the limit
        was crossed can carry it on, by less than one token."""
        return {p: run for p, run in longest_runs(text.encode()).items()
                if run >= max(2 * p, GUARD) + longest_piece}

    method, _, vote = method.partition(":")
    options = {"vote": vote} if vote else {}
    free = EnsembleEngine(members, method=method, max_new_tokens=64, **options).generate("Tell me about cats.")
    assert free.finish_reason == "length" and too_long(free.text)  # without the guard: the loop to the cap
    guarded = EnsembleEngine(members, method=method, max_new_tokens=64, loop_guard=GUARD, **options)
    result = guarded.generate("Tell me about cats.")
    assert not too_long(result.text) and result.stats.loop_breaks > 0, result.text
    for seed in range(3):  # sampled answers (which may also end early) obey the same bound
        assert not too_long(guarded.generate("Tell me about cats.", temperature=0.7, seed=seed).text)
    assert guarded.generate("Tell me about cats.", loop_guard=None).text == free.text  # per request: off


def test_the_guard_changes_nothing_where_the_answer_does_not_loop() -> None:
    member = toy_member("toy-bpe", "byte_level")
    free = EnsembleEngine([member], method="single", max_new_tokens=48).generate("Check.")
    guarded = EnsembleEngine([member], method="single", max_new_tokens=48, loop_guard=GUARD).generate("Check.")
    assert guarded.text == free.text and guarded.stats.loop_breaks == 0


def test_a_guard_below_eight_bytes_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="loop_guard"):
        EnsembleEngine([toy_member("toy-bpe", "byte_level")], method="single").generate("Check.", loop_guard=2)


def test_the_effect_script_finds_the_answers_the_guard_can_change() -> None:
    """scripts/loop_guard_effect.py answers again only stored answers with a loop at the limit."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "loop_guard_effect.py"
    spec = importlib.util.spec_from_file_location("loop_guard_effect", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.has_guarded_loop("So x = 5.\n" + "x = 5 + 5 + 5.\n" * 6 + "The answer is 15.", 64)
    assert not module.has_guarded_loop("x = 5 + 5 + 5.\n" * 3 + "The answer is 15.", 64)  # 3 copies: 45 bytes
    assert not module.has_guarded_loop("Natalia sold 48/2 = 24 clips in May. The answer is 72.", 64)
    assert module.benchmark_of_run("flores-en-ro", "en-de") == ("flores", "en-ro")  # the run's own pair
    assert module.benchmark_of_run("gsm8k", "en-de") == ("gsm8k", "en-de")
    done = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and "--loop-guard" in done.stdout


def test_both_adapters_pass_the_guard_to_the_engine(loopy: dict) -> None:
    """One option, every surface: a ChatEnsemble / EnsembleLLM keyword sets the engine's default,
    a call's keyword sets it per request."""
    from langchain_ensemble import ChatEnsemble
    from llamaindex_ensemble import EnsembleLLM

    with registered_members([loopy["bpe"], loopy["sp"]]) as names:
        chat = ChatEnsemble(models=names, max_tokens=64, loop_guard=GUARD)
        guarded = chat.invoke("Tell me about cats.")
        free = chat.invoke("Tell me about cats.", loop_guard=None)
        assert guarded.response_metadata["ensemble"]["loop_breaks"] > 0
        assert free.response_metadata["ensemble"]["loop_breaks"] == 0 and len(free.content) > len(guarded.content)
        chat.close()
        llm = EnsembleLLM(models=names, max_tokens=64)
        assert llm.complete("Tell me about cats.", loop_guard=GUARD).raw["ensemble"]["loop_breaks"] > 0
        assert llm.complete("Tell me about cats.").raw["ensemble"]["loop_breaks"] == 0


def test_a_text_of_exactly_two_periods_is_a_loop() -> None:
    """Catches the longest period (half the text) never being tried."""
    assert loop_unit(b"abcdabcd", 8) == b"abcd"
    assert loop_unit(b"x = 1;\nx = 1;\n", 14) == b"x = 1;\n"
