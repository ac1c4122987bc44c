"""Mutation gaps (round h): the KV-cache helpers, the prefix session's bounds, top-K rows, word spans and
turn markers, each checked where a changed constant, comparison or branch went unnoticed."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from transformers import DynamicCache, cache_utils

from shared_engine.alignment import TokenizedText, TokenTable
from shared_engine.members import cache as kv
from shared_engine.members.session import PrefixSession
from shared_engine.members.topk import TopK, topk_logits
from shared_engine.turn_markers import PROMPT_END, marker_ids, read_turn_markers, without_ending
from shared_engine.words import SharedEnds, is_mark, span_end, word_cut, word_ends

# -- the KV-cache helpers -------------------------------------------------------------------------


def recording_layer(window: int, length: int) -> Any:
    """A real transformers sliding-window layer that records its past and holds ``length`` positions."""
    layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=window)
    layer.activate_past_recording()
    states = torch.arange(float(length)).reshape(1, 1, length, 1)
    layer.update(states, states.clone())
    return layer


def bound(layer: Any, depth: int) -> tuple[int, int]:
    """(what bound_sliding returns, positions the layer holds afterwards)."""
    held = kv.bound_sliding(SimpleNamespace(layers=[layer]), depth)
    return held, int(layer.keys.shape[-2])


def test_a_recording_layer_keeps_window_minus_one_plus_depth_positions() -> None:
    # mutant: keep = window + depth (one position too many kept on every forward)
    layer = recording_layer(window=4, length=10)
    assert bound(layer, 2) == (5, 5)
    assert layer.keys[0, 0, :, 0].tolist() == [5.0, 6.0, 7.0, 8.0, 9.0]  # the latest ones


def test_a_negative_depth_keeps_just_the_window() -> None:
    # mutant: keep = window - 1 + depth without max(depth, 0) (a negative keep slices away the wrong end)
    assert bound(recording_layer(window=4, length=10), -3) == (3, 3)


def test_a_layer_that_just_filled_its_window_is_bounded_at_depth_zero() -> None:
    """cumulative_length == window is the first length at which the window's oldest position serves no one."""
    # mutant: cumulative_length > window (the layer kept a position no rollback of depth 0 needs)
    assert bound(recording_layer(window=4, length=4), 0) == (3, 3)
    assert bound(recording_layer(window=4, length=3), 0) == (3, 3)  # below the window nothing is dropped


def test_bound_sliding_reports_what_the_layers_hold_after_bounding() -> None:
    # mutant: held = the length before bounding
    assert bound(recording_layer(window=4, length=12), 1)[0] == 4


def test_an_empty_recording_layer_is_skipped() -> None:
    # mutant: the is_initialized check dropped (an empty layer has no keys to read)
    layer = cache_utils.DynamicSlidingWindowLayer(sliding_window=4)
    layer.activate_past_recording()
    assert kv.bound_sliding(SimpleNamespace(layers=[layer]), 2) == 0


def test_a_layer_holding_more_than_it_was_fed_fails_loudly() -> None:
    # mutant: length > cumulative_length + 1 (one position of unknown origin passed silently)
    layer = recording_layer(window=4, length=10)
    layer.cumulative_length = 9
    with pytest.raises(RuntimeError, match="bound_sliding must be updated"):
        kv.bound_sliding(SimpleNamespace(layers=[layer]), 2)


def test_a_look_alike_sliding_layer_of_another_class_fails_loudly() -> None:
    """Every field present is not enough: the private fields' meaning is known only for transformers' class."""
    # mutant: `if not known or missing` -> `if missing`
    class LookAlike:
        is_sliding, record_past, is_initialized = True, True, True
        sliding_window, cumulative_length = 4, 10
        keys = values = torch.zeros(1, 1, 10, 1)

    with pytest.raises(RuntimeError, match="bound_sliding must be updated"):
        kv.bound_sliding(SimpleNamespace(layers=[LookAlike()]), 2)


def test_no_cache_holds_nothing_and_truncating_it_is_a_no_op() -> None:
    # mutant: cache_length(None) == 1
    assert kv.cache_length(None) == 0


def test_an_empty_cache_in_the_output_is_that_cache() -> None:
    """An empty DynamicCache is falsy: the output's ``cache`` field must be taken by ``is not None``."""
    # mutant: `cache if cache else past_key_values`
    empty = DynamicCache()
    assert kv.output_cache(SimpleNamespace(cache=empty, past_key_values=None)) is empty
    assert kv.output_cache(SimpleNamespace(past_key_values=empty)) is empty


def test_a_cache_without_the_flag_is_croppable() -> None:
    # mutant: is_croppable defaults to False (every member without the flag would re-prefill on rollback)
    assert kv.is_croppable(object())
    assert not kv.is_croppable(SimpleNamespace(is_croppable=False))


def test_sliding_window_only_where_a_layer_slides() -> None:
    def model(**config: Any) -> Any:
        return SimpleNamespace(config=SimpleNamespace(**config))

    # mutant: `not layer_types or any(...)` -> `layer_types or any(...)`
    assert kv.sliding_window(model(sliding_window=512)) == 512  # no per-layer types: every layer slides
    assert kv.sliding_window(model(sliding_window=512, layer_types=["full_attention"])) is None
    assert kv.sliding_window(model(sliding_window=512, layer_types=["full_attention", "sliding_attention"])) == 512
    assert kv.sliding_window(model(sliding_window=None)) is None


# -- the prefix session ---------------------------------------------------------------------------


class _RowSession(PrefixSession):
    """A backend whose row after ``target[:p]`` is ``[p]``: which row came back is visible."""

    def _compute(self, target: list[int], first_row: int, common: int) -> torch.Tensor:
        self.last_sync = (common, len(self.ids) - common)
        self.ids = list(target)
        self.num_forwards += 1
        return torch.tensor([[float(p)] for p in range(first_row, len(target) + 1)])


def test_sync_refuses_a_first_row_of_zero() -> None:
    """Row 0 would predict the first prompt token from nothing: no backend has that row."""
    # mutant: `1 <= first_row` -> `0 <= first_row`
    with pytest.raises(ValueError, match="first_row 0 outside"):
        _RowSession().sync([1, 2], 0)


def test_rows_at_refuses_position_zero() -> None:
    # mutant: `wanted[0] < 1` -> `wanted[0] < 0`
    with pytest.raises(ValueError, match="outside 1..2"):
        _RowSession().rows_at([1, 2], [0, 2])


def test_rows_at_takes_positions_in_any_order_and_repeated() -> None:
    # mutant: wanted = list(positions) (unsorted positions read the wrong rows and hold the wrong prefix)
    session = _RowSession()
    rows = session.rows_at([1, 2, 3, 4], [3, 1, 3])
    assert {p: float(row[0]) for p, row in rows.items()} == {1: 1.0, 3: 3.0}
    assert session.ids == [1, 2, 3]


def test_sync_from_an_earlier_row_recomputes_the_held_ends_row_in_its_place() -> None:
    # mutant: the known row reused whenever the target extends the held ids, whatever first_row asks
    session = _RowSession()
    session.sync([1, 2, 3], 3)
    rows = session.sync([1, 2, 3, 4, 5], 2)
    assert [float(r[0]) for r in rows] == [2.0, 3.0, 4.0, 5.0]


def test_rows_at_leaves_the_row_after_what_it_holds_for_the_next_sync() -> None:
    # mutant: rows_at not updating next_logits (the next sync reused the row after an older prefix)
    session = _RowSession()
    session.sync([1, 2], 2)
    session.rows_at([1, 2, 3], [3])
    assert [float(r[0]) for r in session.sync([1, 2, 3, 4], 3)] == [3.0, 4.0]


# -- top-K rows -----------------------------------------------------------------------------------


def test_an_empty_top_k_is_refused() -> None:
    # mutant: the `not self.ids` check dropped
    with pytest.raises(ValueError, match="at least one"):
        TopK([], [])


def test_a_float16_rounded_zero_log_probability_is_accepted() -> None:
    """A server in float16 reports a certain token's log-probability a little above 0."""
    # mutant: MAX_LOGPROB = 0.0
    assert TopK([3], [0.005]).logprobs == [0.005]
    with pytest.raises(ValueError, match="not a probability"):
        TopK([3], [0.02])


@pytest.mark.parametrize("bad_id", [4, -1])
def test_a_top_k_id_outside_the_vocabulary_is_refused(bad_id: int) -> None:
    # mutants: `ids.max() >= vocab_size` -> `>` (an IndexError, not the readable error) and the
    # `ids.min() < 0` check dropped (-1 silently wrote the last id's logit)
    with pytest.raises(ValueError, match="outside the vocabulary of 4"):
        topk_logits(TopK([0, bad_id], [math.log(0.5), math.log(0.25)]), 4)


def test_the_rest_mass_is_spread_over_the_ids_not_in_the_top_k() -> None:
    # mutant: others = vocab_size - len(entry.ids) (a repeated id counted twice)
    row = topk_logits(TopK([1, 1], [math.log(0.2), math.log(0.2)]), 4)
    assert float(row[0]) == pytest.approx(math.log(0.6 / 3), abs=1e-6)


def test_a_nearly_certain_top_k_leaves_its_own_small_rest() -> None:
    """The floor only guards a rest rounding made 0 or negative; a real small rest is kept."""
    # mutant: MIN_REST_MASS = 1e-3
    row = topk_logits(TopK([0], [math.log(1 - 1e-6)]), 2)
    assert float(row[1]) == pytest.approx(math.log(1e-6), abs=1e-3)


# -- word spans -----------------------------------------------------------------------------------


def test_the_last_code_point_of_a_cjk_range_is_cjk() -> None:
    # mutant: `lo <= code < hi` (U+9FFF and U+30FF, assigned letters, joined one word)
    assert word_ends("\u9fff\u9fff") == [1, 2]
    assert word_ends("\u30ff\u30ff") == [1, 2]


def test_the_darkest_skin_tone_modifier_is_a_mark() -> None:
    # mutant: `0x1F3FB <= ord(char) < 0x1F3FF`
    assert is_mark("\U0001f3ff") and is_mark("\U0001f3fb") and not is_mark("\U0001f3fa")


def test_a_cjk_numeral_is_a_word_of_its_own() -> None:
    # mutant: category in "L" only (full-width digits and 〇 joined the next word)
    assert word_ends("\uff11\uff12") == [1, 2]
    assert word_ends("\u3007x") == [1, 2]


def test_a_symbol_after_a_cjk_letter_attaches_to_it() -> None:
    # mutant: category in "P" only (￥ after 京 became a word of its own)
    assert word_ends("\u4eac\uffe5 a") == [2, 4]


def test_a_combining_mark_after_a_kana_stays_with_it() -> None:
    # mutant: is_mark dropped from the CJK branch (the decomposed voiced mark became its own word)
    assert word_ends("\u304b\u3099\u304b") == [2, 3]


def test_without_a_word_cut_a_span_ends_at_the_last_shared_boundary() -> None:
    # mutant: max(shared) -> min(shared) (the span stopped at its first shared boundary)
    assert span_end(b"abc", 1, {1, 2}, finished=False) == 2


def test_a_finished_continuation_with_a_broken_character_ends_before_it() -> None:
    """EOS after a partial UTF-8 character: the span ends where the valid text does, not inside the character."""
    # mutant: ends.append(len(continuation)) instead of valid_prefix_length(continuation)
    assert span_end(b"ab \xe4", 5, set(), finished=True) == 3


def test_a_word_cut_crosses_tabs_and_other_ascii_whitespace() -> None:
    # mutant: _ASCII_SPACE reduced to space and newline
    assert word_cut(b"a:\t\tb", 2, {4}) == 4
    assert word_cut(b"a:\r\nb", 2, {4}) == 4


def test_shared_ends_leave_out_both_ends_of_the_continuation() -> None:
    """Offset 0 (the answer's end) and the continuation's end are trivially boundaries: neither is reported."""
    # mutants: `start <= o` and `o <= len(text)`
    table = TokenTable.from_bytes([bytes([i]) for i in range(256)], special_ids=set(), eos_ids=set(),
                                  encode=lambda text: list(text.encode()), name="bytes")
    tokens = TokenizedText(table)
    tokens.set_text(b"Hi")
    assert SharedEnds(b"Hi", [tokens])(b" ab") == {1, 2}


# -- turn markers ---------------------------------------------------------------------------------

PIECES = [b"User", b"\n", b"r", b"er", b"The", b"", b"\nUser", b"Bot", b"t"]
EOS = 5


def _table(pieces: list[bytes] = PIECES) -> TokenTable:
    return TokenTable.from_bytes(pieces, special_ids={EOS}, eos_ids={EOS}, encode=lambda text: [0], name="toy-h")


def _names(ids: frozenset[int], pieces: list[bytes] = PIECES) -> set[bytes]:
    return {pieces[i] for i in ids}


def test_the_role_words_last_letter_alone_completes_the_marker() -> None:
    # mutant: range(len(core) - 1) (the piece writing only "r" after "\nUse" was no marker)
    assert _names(marker_ids(_table(), ("\nUser:",), b"Hallo\nUse")) == {b"r", b"\nUser"}


def test_a_stop_strings_trailing_punctuation_is_not_part_of_the_role_word() -> None:
    # mutant: core = stop.rstrip(b":") (a stop string ending ";" or " ->" had no role word to find)
    assert b"User" in _names(marker_ids(_table(), ("\nUser;",), PROMPT_END))
    assert b"User" in _names(marker_ids(_table(), ("\nUser ->",), PROMPT_END))


def test_a_long_role_marker_begun_earlier_is_still_read() -> None:
    """The lookback must cover the longest role-marker stop string, here 19 bytes."""
    # mutant: _LOOKBACK = 8
    stop = "\nAssistant Helper Bot:"
    assert b"t" in _names(marker_ids(_table(), (stop,), b"Hi.\nAssistant Helper Bo"))


def test_the_marker_memo_is_bounded() -> None:
    # mutant: `len(known) > _MARKER_STOPS` (the memo grew to 65 stop strings)
    from shared_engine.turn_markers import _MARKER_STOPS

    table = _table()
    for n in range(_MARKER_STOPS + 1):
        marker_ids(table, (f"\nRole{n}:",), PROMPT_END)
    assert len(table.memo["marker_ids"]) == 1


def test_marker_and_eos_ids_beyond_the_logits_row_are_ignored() -> None:
    """A table may be longer than a member's logits row (added tokens past the model's vocabulary)."""
    # mutants: the `i < logits.shape[-1]` filters dropped (an IndexError)
    pieces = [b"The", b"x", b"User", b""]
    table = TokenTable.from_bytes(pieces, special_ids={3}, eos_ids={3}, encode=lambda text: [0], name="short")
    logits = torch.zeros(2)
    out, mass = read_turn_markers(logits, table, ("\nUser:",), b"")
    assert out is logits and mass == 0.0
    assert without_ending(logits, [3]) is logits


def test_a_row_where_only_eos_is_possible_is_left_as_it_is() -> None:
    # mutant: without_ending returning the all -inf row (nothing could be sampled from it)
    logits = torch.tensor([float("-inf"), 0.0])
    assert without_ending(logits, [1]) is logits
    assert torch.equal(without_ending(torch.zeros(2), [1]), torch.tensor([0.0, float("-inf")]))


# -- awaiting a step's jobs -----------------------------------------------------------------------


def test_a_cancelled_job_is_raised_not_returned_as_a_result() -> None:
    """CancelledError is a BaseException, not an Exception: it must end the step, not pass as a member's result."""
    import asyncio

    from shared_engine.gather import gather_all

    async def cancelled() -> int:
        raise asyncio.CancelledError

    async def fine() -> int:
        return 1

    # mutant: isinstance(result, Exception)
    with pytest.raises(asyncio.CancelledError):
        asyncio.run(gather_all(fine(), cancelled()))
