"""What fusion, decoding and turn-marker matching derive from a member's TokenTable goes with the table.

Global ``lru_cache``s keyed by the table kept every freed member's table (and its tokenizer) alive:
a web app building an ensemble per request grew by a tokenizer per request, and a Gemma-3 engine
created, used and closed six times held six tables (about 258 MB each)."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import pytest

from shared_engine import EnsembleEngine
from shared_engine.alignment import TokenTable
from shared_engine.decoding.round import _ids_by_bytes
from shared_engine.fusion import _first_piece, _union_vocab
from shared_engine.members import HFMember
from shared_engine.turn_markers import _marker_ids
from tests.toy import byte_level_tokenizer, metaspace_tokenizer, tiny_llama


def _table(word: bytes = b" So") -> TokenTable:
    pieces = [b"<eos>", b" ", b"S", b"o", word, b"\nUser", b":"]
    return TokenTable.from_bytes(pieces, special_ids={0}, eos_ids={0}, name="bytes",
                                 encode=lambda text: [4] if text.encode() == word else [1])


def _gone(ref: weakref.ref[TokenTable]) -> bool:
    gc.collect()
    return ref() is None


USES: dict[str, Callable[[TokenTable, TokenTable], object]] = {
    "first_piece": lambda table, other: _first_piece(table, b" Sofia"),
    "union_vocab": lambda table, other: _union_vocab((other, table)),
    "union_vocab_drafter": lambda table, other: _union_vocab((table, other)),
    "ids_by_bytes": lambda table, other: _ids_by_bytes(table),
    "marker_ids": lambda table, other: _marker_ids(table, b"\nUser:"),
}


@pytest.mark.parametrize("use", sorted(USES))
def test_a_cached_derivation_does_not_keep_a_freed_table_alive(use: str) -> None:
    other = _table(b" Sofia")
    table = _table()
    first = USES[use](table, other)
    assert USES[use](table, other) == first  # remembered: the same answer again
    ref = weakref.ref(table)
    del table
    assert _gone(ref)


def test_a_union_is_not_taken_for_another_table_at_a_reused_id() -> None:
    drafter, verifier = _table(b" Sofia"), _table()
    assert b" So" in _union_vocab((drafter, verifier)).keys
    del verifier
    gc.collect()
    for _ in range(20):  # a new table may well get the freed one's id
        other = _table(b" oS")
        assert b" oS" in _union_vocab((drafter, other)).keys


def test_safe_generate_then_close_frees_every_members_table() -> None:
    members = [HFMember("bytes-fresh", tiny_llama(byte_level_tokenizer(), 0), byte_level_tokenizer()),
               HFMember("meta-fresh", tiny_llama(metaspace_tokenizer(), 1), metaspace_tokenizer())]
    refs = [weakref.ref(m.table) for m in members]
    with EnsembleEngine(members, method="safe", max_new_tokens=12) as engine:
        engine.generate("Sofia walked to the park")  # greedy: first pieces, turn markers
        engine.generate("Sofia walked to the park", temperature=1.0, seed=1)  # sampled: ids by bytes
    assert all(ref() is not None for ref in refs)
    del members, engine
    assert all(_gone(ref) for ref in refs)
