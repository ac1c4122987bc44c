"""A sliding-window member's KV cache stays bounded once rollback is enabled, and stays exact.

Recording the past (``kv.enable_rollback``) made Gemma-3's sliding layers keep every position until a
rollback cropped them: a long answer that never rolled back held its whole length there (about 6x the
KV memory of Gemma-3-270m on long answers). After each forward they now keep ``window - 1`` positions
plus what a rollback of ``rollback_depth`` (or to where the latest forward began) needs; a deeper
rollback re-prefills. Logits are checked against a cache-free forward after every call."""

from __future__ import annotations

import random

import pytest
import torch

from shared_engine.members import HFMember
from shared_engine.members import cache as kv
from tests import toy
from tests.test_member import OTHER, TEXT, assert_close, fresh

DEPTH = 6
W = toy.SLIDING_WINDOW


def bounded_member(depth: int = DEPTH) -> HFMember:
    """The toy Gemma-3 (layer 0 sliding, layer 1 full) as a member of its own, so its depth can be set."""
    tokenizer = toy.TOKENIZERS["byte_level"]()
    member = HFMember("sliding-bounded", toy.tiny_sliding(tokenizer), tokenizer)
    member.rollback_depth = depth
    return member


def held(session) -> tuple[int, int]:
    """Positions held by the sliding layer and by the full-attention layer."""
    sliding, full = session.cache.layers
    assert sliding.is_sliding and not full.is_sliding
    return int(sliding.keys.shape[-2]), int(full.keys.shape[-2])


@pytest.mark.parametrize("prompt_len", [5, W + 4])
@pytest.mark.parametrize("seed", [0, 1])
def test_long_generation_with_rollbacks_stays_bounded_and_exact(prompt_len, seed):
    """Steps, drafts shorter than ``DEPTH`` and rollbacks within them, over ~20 windows: the sliding
    layer never holds more than window - 1 + DEPTH positions (it held the whole answer before), the
    full layer holds everything, a rollback within DEPTH crops, and every logits row is exact."""
    m = bounded_member()
    rng = random.Random(seed)
    pool = m.table.encode_fragment(TEXT + OTHER)
    target = pool[:prompt_len]
    s = m.new_session()
    assert_close(s.sync(target, len(target)), fresh(m, target)[-1:])
    while len(target) < 2 * W + DEPTH:  # steps well past the window: the sliding layer keeps its margin
        token = rng.choice(pool)
        target = target + [token]
        assert_close(s.step(token), fresh(m, target)[-1])
    assert held(s) == (W - 1 + DEPTH, len(target))  # it held all of them before
    while len(target) < 20 * W:
        if rng.random() < 0.5:
            token = rng.choice(pool)
            target = target + [token]
            assert_close(s.step(token), fresh(m, target)[-1])
        else:  # a draft scored in one forward, then the verdict rolls back into it
            draft = [rng.choice(pool) for _ in range(rng.randint(1, DEPTH - 1))]
            assert_close(s.sync(target + draft, len(target)), fresh(m, target + draft)[len(target) - 1:])
            kept = len(target) + rng.randint(0, len(draft) - 1)
            held_ids = target + draft
            target = held_ids[:kept] + [rng.choice([t for t in pool if t != held_ids[kept]])]
            assert_close(s.sync(target, len(target)), fresh(m, target)[-1:])
            assert s.last_sync[0] == kept  # cropped, not re-prefilled
        sliding, full = held(s)
        assert full == len(target)
        assert sliding <= W - 1 + DEPTH, (sliding, len(target))


def test_rollback_deeper_than_kept_reprefills_exactly():
    m = bounded_member()
    ids = m.table.encode_fragment(TEXT + OTHER)
    assert len(ids) >= 5 * W
    s = m.new_session()
    s.sync(ids[:5], 5)
    for i in range(5, 4 * W):
        assert_close(s.step(ids[i]), fresh(m, ids[: i + 1])[-1])
    assert held(s)[0] == W - 1 + DEPTH
    deep = 4 * W - DEPTH - 1  # one past what the sliding layer can rebuild
    assert_close(s.sync(ids[:deep], deep), fresh(m, ids[:deep])[-1:])
    assert s.last_sync == (0, 4 * W)  # re-prefilled
    for i in range(deep, 5 * W):  # and it goes on exactly
        assert_close(s.step(ids[i]), fresh(m, ids[: i + 1])[-1])
    back = 5 * W - DEPTH + 1  # its last row is computed again from DEPTH back
    assert_close(s.sync(ids[:back], back), fresh(m, ids[:back])[-1:])
    assert s.last_sync == (5 * W - DEPTH, DEPTH)  # cropped


def test_a_scorers_next_text_crops():
    """A scorer reads a long text after a shared prefix in one forward, then the next text after the
    same prefix, from the prefix's last row (calibration, AdaFuse's scores): no re-prefill, however
    much longer than DEPTH the text is."""
    m = bounded_member()
    pool = m.table.encode_fragment(TEXT + OTHER)
    prefix, first, second = pool[:2 * W], pool[2 * W:5 * W], pool[5 * W:7 * W]
    s = m.new_session()
    s.sync(prefix, len(prefix))
    s.step(pool[0])  # a step after the prefill: recording is on
    prefix = prefix + [pool[0]]
    assert_close(s.sync(prefix + first, len(prefix)), fresh(m, prefix + first)[len(prefix) - 1:])
    assert_close(s.sync(prefix + second, len(prefix)), fresh(m, prefix + second)[len(prefix) - 1:])
    assert s.last_sync == (len(prefix) - 1, len(first) + 1)
    s.step(pool[1])  # the next forward bounds the layer again
    assert held(s)[0] == W - 1 + DEPTH


def test_an_unknown_sliding_layer_fails_loudly():
    class Changed:  # a recording sliding layer that is not the one bound_sliding was written for
        is_sliding, record_past = True, True

    class Cache:
        layers = [Changed()]

    with pytest.raises(RuntimeError, match="bound_sliding must be updated"):
        kv.bound_sliding(Cache(), DEPTH)


def test_a_layer_that_does_not_record_is_left_alone():
    m = bounded_member()
    ids = m.table.encode_fragment(TEXT)
    cache = kv.new_cache(m.model)
    with torch.inference_mode():
        kv.forward_logits(m.model, m.cache_kwarg, cache, ids[:3 * W], 1)
    assert kv.bound_sliding(cache, 0) == 0  # no layer records yet: nothing read, nothing dropped
    assert int(cache.layers[0].keys.shape[-2]) == W - 1
