"""Tests for shared_engine.members (HFMember / HFSession) on tiny random models: the KV cache kept
across edits, rollbacks and single steps must give exactly the logits of a fresh forward."""

from __future__ import annotations

import asyncio
import random
import threading
import time

import pytest
import torch

from shared_engine.members import HFMember
from shared_engine.members.cache import truncate
from shared_engine.members.chat import PLAIN_TEMPLATE_STOPS, render_plain
from shared_engine.members.session import PrefixSession
from tests import toy

ATOL = 1e-4
TEXT = "Hello Sofia, how are you today? I walked to the park at 10:30 and counted 42 apples."
OTHER = " Maria said: \"I drove to Berlin with Sofia,\" and smiled.\n"

ARCH_TOK = [(a, t) for a in ("llama", "gpt2") for t in ("byte_level", "metaspace")]


def member(arch: str, tok: str = "byte_level") -> HFMember:
    return toy.toy_member(f"{arch}-{tok}", tok, arch)


@torch.inference_mode()
def fresh(m: HFMember, ids: list[int]) -> torch.Tensor:
    """Logits for every position of ``ids`` from one cache-free forward: row i predicts ids[i+1]."""
    return m.model(input_ids=torch.tensor([ids])).logits[0].float()


def expected_rows(m: HFMember, target: list[int], first_row: int) -> torch.Tensor:
    return fresh(m, target)[first_row - 1:]


def assert_close(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b, atol=ATOL, rtol=0)


def text_ids(m: HFMember, text: str) -> list[int]:
    ids = m.table.encode_fragment(text)
    assert len(ids) >= 10
    return ids


# --------------------------------------------------------------------- sync after an edit


@pytest.mark.parametrize("arch,tok", ARCH_TOK)
def test_sync_after_edit_matches_fresh_session(arch, tok):
    m = member(arch, tok)
    a = text_ids(m, TEXT)
    keep = len(a) // 2
    b = a[:keep] + m.table.encode_fragment(OTHER)
    assert b[keep] != a[keep]
    vocab = m.model.config.vocab_size
    for first_row in (keep + 1, keep, 3, 1, len(b)):
        session = m.new_session()
        session.sync(a, len(a))
        rows = session.sync(b, first_row)
        assert rows.shape == (len(b) - first_row + 1, vocab)
        assert session.ids == b
        assert session.last_sync == (min(keep, first_row - 1), len(a) - min(keep, first_row - 1))
        assert_close(rows, expected_rows(m, b, first_row))
        other = m.new_session()
        assert_close(rows, other.sync(b, first_row))
        # row r predicts target[first_row + r]: compare with the prefix forward that ends just before it
        for r in (0, len(rows) // 2):
            prefix = b[: first_row + r]
            assert_close(rows[r], fresh(m, prefix)[-1])


@pytest.mark.parametrize("arch,tok", ARCH_TOK)
def test_sync_validates_first_row(arch, tok):
    m = member(arch, tok)
    session = m.new_session()
    ids = text_ids(m, TEXT)
    for bad in (0, len(ids) + 1):
        with pytest.raises(ValueError):
            session.sync(ids, bad)
    assert session.num_forwards == 0


@pytest.mark.parametrize("arch,tok", ARCH_TOK)
def test_crop_then_refeed_matches_fresh(arch, tok):
    m = member(arch, tok)
    ids = text_ids(m, TEXT)
    session = m.new_session()
    assert_close(session.sync(ids, len(ids)), expected_rows(m, ids, len(ids)))
    short = ids[:7]
    assert_close(session.sync(short, len(short)), expected_rows(m, short, len(short)))
    assert session.ids == short
    assert session.last_sync == (6, len(ids) - 6)
    # refeed the rest, asking for every row of it at once (a verifier scoring a draft)
    assert_close(session.sync(ids, 8), expected_rows(m, ids, 8))
    assert session.last_sync == (7, 0)
    assert_close(session.sync(ids, 2), expected_rows(m, ids, 2))
    # extend past what was ever fed
    more = ids + m.table.encode_fragment(OTHER)
    assert_close(session.sync(more, len(ids)), expected_rows(m, more, len(ids)))


@pytest.mark.parametrize("arch,tok", ARCH_TOK)
def test_draft_block_reuses_last_logits(arch, tok):
    """After a sync the distribution after the last id is kept: scoring a draft that starts
    right there feeds only the draft, in one forward."""
    m = member(arch, tok)
    ids = text_ids(m, TEXT)
    prompt, draft = ids[:10], ids[10:16]
    session = m.new_session()
    session.sync(prompt, len(prompt))
    rows = session.sync(prompt + draft, len(prompt))
    assert rows.shape[0] == len(draft) + 1
    assert session.num_forwards == 2
    assert session.last_sync == (len(prompt), 0)
    assert_close(rows, expected_rows(m, prompt + draft, len(prompt)))


@pytest.mark.parametrize("arch,tok", ARCH_TOK)
def test_step_equals_sync(arch, tok):
    m = member(arch, tok)
    ids = text_ids(m, TEXT)
    stepped, synced = m.new_session(), m.new_session()
    stepped.sync(ids[:4], 4)
    synced.sync(ids[:4], 4)
    for i in range(4, len(ids)):
        out = stepped.step(ids[i])
        assert out.shape == (m.model.config.vocab_size,)
        ref = synced.sync(ids[: i + 1], i + 1)
        assert ref.shape == (1, m.model.config.vocab_size)
        assert_close(out, ref[-1])
        assert stepped.ids == ids[: i + 1]
    assert_close(out, fresh(m, ids)[-1])
    assert stepped.num_forwards == 1 + len(ids) - 4


@pytest.mark.parametrize("arch", ["llama", "gpt2", "sliding"])
def test_num_forwards_counts_only_real_compute(arch):
    m = member(arch)
    ids = text_ids(m, TEXT)
    s = m.new_session()
    assert s.num_forwards == 0
    # Forward passes after each call. A sliding-window session that must restart (rollback behind
    # what its window kept) re-prefills in two forwards: the never-rolled-back part, then the rest.
    sliding = arch == "sliding" and len(ids) >= toy.SLIDING_WINDOW
    expected = [2, 2, 3, 3, 5, 6, 8] if sliding else [1, 1, 2, 2, 3, 4, 5]
    counts = []
    first = s.sync(ids, len(ids))
    counts.append(s.num_forwards)
    again = s.sync(ids, len(ids))  # nothing changed: no forward, same logits
    counts.append(s.num_forwards)
    assert_close(again, first)
    s.step(5)
    counts.append(s.num_forwards)
    s.sync(ids + [5], len(ids) + 1)  # already held: no forward
    counts.append(s.num_forwards)
    s.sync(ids + [5], 3)  # more rows than held: one forward (sliding: a restart)
    counts.append(s.num_forwards)
    s.sync(ids[:-3], len(ids) - 3)  # rollback: one forward of the last kept token
    counts.append(s.num_forwards)
    s.sync(ids[:5] + [7, 8, 9], 4)  # edit: one forward for the whole changed tail (sliding: restart)
    counts.append(s.num_forwards)
    assert counts == expected


# --------------------------------------------------------------------- greedy decoding


@pytest.mark.parametrize("arch,tok", ARCH_TOK)
def test_greedy_steps_match_generate(arch, tok):
    m = member(arch, tok)
    prompt = m.prompt_ids([{"role": "user", "content": "Where did Sofia walk to?"}])
    session = m.new_session()
    logits = session.sync(prompt, len(prompt))[-1]
    ours = []
    for _ in range(20):
        token = int(torch.argmax(logits))
        ours.append(token)
        if token in m.eos_ids:
            break
        logits = session.step(token)
    with torch.inference_mode():
        out = m.model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                               max_new_tokens=20, do_sample=False, pad_token_id=m.tokenizer.pad_token_id)
    theirs = out[0, len(prompt):].tolist()
    assert ours == theirs
    assert len(ours) >= 5


# --------------------------------------------------------------------- sliding window


def test_sliding_toy_has_a_window():
    m = member("sliding")
    assert m.sliding_window == toy.SLIDING_WINDOW
    assert m.model.config.layer_types == ["sliding_attention", "full_attention"]


def _sync_checked(m: HFMember, session, target: list[int], first_row: int) -> torch.Tensor:
    rows = session.sync(target, first_row)
    assert_close(rows, expected_rows(m, target, first_row))
    assert session.ids == target
    return rows


def test_sliding_window_rollback_within_recorded_past():
    """Prompt shorter than the window, then steps far past it: the cache recorded the past, so a
    rollback far behind the window crops exactly (no re-prefill)."""
    m = member("sliding")
    ids = text_ids(m, TEXT)
    w = toy.SLIDING_WINDOW
    assert len(ids) >= 3 * w
    s = m.new_session()
    _sync_checked(m, s, ids[:5], 5)
    for i in range(5, 3 * w):
        assert_close(s.step(ids[i]), fresh(m, ids[: i + 1])[-1])
    _sync_checked(m, s, ids[:3], 3)
    assert s.last_sync == (2, 3 * w - 2)  # cropped, not restarted
    for i in range(3, 2 * w):  # and it keeps working after the crop
        assert_close(s.step(ids[i]), fresh(m, ids[: i + 1])[-1])


def test_sliding_window_rollback_before_prefill_restarts():
    """Prompt longer than the window: the prefill kept only the window, so rolling back into the
    prompt must re-prefill, and rolling back after it may crop; logits exact either way."""
    m = member("sliding")
    ids = text_ids(m, TEXT)
    w = toy.SLIDING_WINDOW
    p = w + 4
    s = m.new_session()
    _sync_checked(m, s, ids[:p], p)
    for i in range(p, p + 2 * w):
        s.step(ids[i])
    _sync_checked(m, s, ids[: p - 2], p - 2)
    assert s.last_sync[0] == 0  # restarted: the kept prefix was behind the window
    assert s.num_forwards == 4 + 2 * w  # each (re-)prefill is split in two, see HFSession._compute
    # now the floor is p - 2: a rollback to after it crops
    for i in range(p - 2, p + 2 * w):
        s.step(ids[i])
    _sync_checked(m, s, ids[: p + 3], p + 3)
    assert s.last_sync == (p + 2, 2 * w - 2)  # cropped
    _sync_checked(m, s, ids[: p + 2] + [ids[0]], p + 3)  # edit right at the new floor
    assert s.last_sync == (p + 2, 1)  # cropped again
    _sync_checked(m, s, ids[: p + 2 * w], p + 3)
    assert s.last_sync == (p + 2, 1)
    # a rollback before the new floor (p + 2) restarts again
    _sync_checked(m, s, ids[:p], p)
    assert s.last_sync == (0, p + 2 * w)
    _sync_checked(m, s, ids, 1)


@pytest.mark.parametrize("arch", ["llama", "gpt2", "sliding"])
@pytest.mark.parametrize("seed", [0, 1])
def test_random_edit_sequences_match_fresh(arch, seed):
    """Random walks of steps, rollbacks, edits and draft scoring: every sync is exact."""
    m = member(arch)
    rng = random.Random(seed)
    pool = m.table.encode_fragment(TEXT + OTHER)
    s = m.new_session()
    target = pool[: rng.randint(1, 12)]
    _sync_checked(m, s, target, len(target))
    for _ in range(25):
        op = rng.choice(["step", "step", "rollback", "edit", "draft"])
        if op == "step":
            token = rng.choice(pool)
            assert_close(s.step(token), fresh(m, target + [token])[-1])
            target = target + [token]
            continue
        if op == "rollback" and len(target) > 1:
            target = target[: rng.randint(1, len(target) - 1)]
        elif op == "edit":
            cut = rng.randint(1, len(target))
            target = target[:cut] + [rng.choice(pool) for _ in range(rng.randint(1, 6))]
        elif op == "draft":
            target = target + [rng.choice(pool) for _ in range(rng.randint(1, 6))]
        if len(target) > 120:
            target = target[:40]
        first_row = rng.randint(max(1, len(target) - 8), len(target))
        _sync_checked(m, s, target, first_row)


# --------------------------------------------------------------------- member plumbing


async def test_run_is_off_the_event_loop_thread():
    m = member("llama")
    loop_thread = threading.get_ident()
    worker = await m.run(threading.get_ident)
    assert worker != loop_thread
    assert await m.run(lambda a, b: a + b, 2, 3) == 5
    with pytest.raises(ZeroDivisionError):
        await m.run(lambda: 1 / 0)


async def test_run_serialises_one_members_compute():
    m = member("gpt2")
    active, peak = 0, 0
    guard = threading.Lock()
    ticks = []

    def work() -> None:
        nonlocal active, peak
        with guard:
            active += 1
            peak = max(peak, active)
        time.sleep(0.03)
        with guard:
            active -= 1

    async def heartbeat() -> None:  # the loop stays responsive while members compute
        for _ in range(5):
            ticks.append(time.perf_counter())
            await asyncio.sleep(0.005)

    await asyncio.gather(*(m.run(work) for _ in range(4)), heartbeat())
    assert peak == 1
    assert len(ticks) == 5


def test_members_on_one_device_compute_on_one_thread():
    # torch's OpenMP team belongs to the calling thread: forwards spread over each event loop's pool
    # (every sync call is an asyncio.run of its own) or one thread per member left teams that slowed
    # the next forwards by 17-40% (hf.py docstring)
    from shared_engine import EnsembleEngine

    first, second = member("llama"), member("gpt2", "metaspace")
    threads = {asyncio.run(m.run(threading.get_ident)) for m in (first, second, first, second)}
    assert len(threads) == 1 and threads != {threading.get_ident()}

    seen: set[int] = set()
    forward = first.model.forward

    def recording(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        seen.add(threading.get_ident())
        return forward(*args, **kwargs)

    first.model.forward = recording
    try:
        engine = EnsembleEngine([first, second], method="every-token")
        for _ in range(2):
            engine.generate("Hello", max_new_tokens=4)
    finally:
        del first.model.forward
    assert seen == threads


def _compute_in_child(m: HFMember, results) -> None:  # noqa: ANN001
    results.put(asyncio.run(m.run(lambda: 42)))


def test_a_forked_child_gets_a_compute_thread_of_its_own():
    # a forked child inherits the parent's executor but not its thread: it would wait forever
    import multiprocessing

    m = member("llama")
    asyncio.run(m.run(threading.get_ident))  # the parent's compute thread exists
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    child = context.Process(target=_compute_in_child, args=(m, results))
    child.start()
    child.join(60)
    if child.is_alive():
        child.kill()
    assert child.exitcode == 0 and results.get(timeout=5) == 42


async def test_run_real_compute_matches_direct_call():
    m = member("llama")
    ids = text_ids(m, TEXT)
    session = m.new_session()
    rows = await m.run(session.sync, ids, len(ids))
    assert_close(rows, expected_rows(m, ids, len(ids)))


def test_prompt_ids_chat_template():
    m = member("llama", "byte_level")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi Sofia"}]
    ids = m.prompt_ids(messages)
    text = m.tokenizer.decode(ids)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi Sofia<|im_end|>\n"
                    "<|im_start|>assistant\n")
    assert m.stop_strings == ()
    assert m.tokenizer.eos_token_id in m.eos_ids


def test_prompt_ids_plain_fallback_for_template_less_tokenizer():
    m = member("llama", "metaspace")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi Sofia"}]
    ids = m.prompt_ids(messages)
    assert ids[0] == m.tokenizer.bos_token_id and m.tokenizer.bos_token_id not in ids[1:]
    assert m.table.to_bytes(ids[1:]) == b" " + render_plain(messages).encode()
    assert m.stop_strings == PLAIN_TEMPLATE_STOPS


def test_a_release_inside_a_member_build_waits_for_the_build_instead_of_deadlocking(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An engine closes from ``weakref.finalize`` (a LangChain chat model collected), so inside any
    garbage collection, also one that runs while this thread holds the registry lock to build a
    member (seen in the suite: a tokenizer's JSON parse collected a chat model, whose engine released
    its members and waited for the lock its own thread held). The release is applied when the
    build ends, and closes the member then."""
    import threading

    from shared_engine import members as registry

    closed: list[str] = []
    first, second = "llamacpp:http://127.0.0.1:1", "llamacpp:http://127.0.0.1:2"

    class Built:
        def __init__(self, key: str) -> None:
            self.key = key

        def close(self) -> None:
            closed.append(self.key)

    def build(config: registry.MemberConfig, progress: bool) -> Built:
        if config.key == second:
            registry.release_member(first)  # what the collected engine's close does mid-build
            assert closed == []  # queued: the lock is this thread's
        return Built(config.key)

    monkeypatch.setattr(registry, "_build", build)
    registry.acquire_member(first)
    loader = threading.Thread(target=registry.acquire_member, args=(second,), daemon=True)
    loader.start()
    loader.join(timeout=60)
    assert not loader.is_alive(), "acquire_member deadlocked on a release made inside its build"
    assert closed == [first] and first not in registry._LOADED and second in registry._LOADED
    assert registry.release_member(second) and closed == [first, second]


class _CountingSession(PrefixSession):
    """A backend whose row after ``target[:p]`` is ``[p]``: which row came back is visible."""

    def _compute(self, target: list[int], first_row: int, common: int) -> torch.Tensor:
        self.last_sync = (common, len(self.ids) - common)
        self.ids = list(target)
        self.num_forwards += 1
        return torch.tensor([[float(p)] for p in range(first_row, len(target) + 1)])


def test_rows_at_recomputes_a_row_before_the_held_end() -> None:
    """Catches rows_at returning the row after the held ids as the row of an earlier position."""
    session = _CountingSession()
    session.sync([1, 2, 3], 3)  # holds [1, 2, 3] and the row after it
    rows = session.rows_at([1, 2, 3, 4, 5], [2, 5])
    assert {p: float(row[0]) for p, row in rows.items()} == {2: 2.0, 5: 5.0}


def test_a_sync_or_rows_at_with_nothing_new_records_what_it_kept() -> None:
    """Catches last_sync keeping the previous sync's (kept, dropped) when the row was already known."""
    session = _CountingSession()
    session.sync([9, 9], 1)
    session.sync([1, 2, 3], 1)
    assert session.last_sync == (0, 2)
    assert float(session.sync([1, 2, 3], 3)[0, 0]) == 3.0 and session.num_forwards == 2
    assert session.last_sync == (3, 0)
    session.sync([9], 1)
    session.sync([1, 2, 3], 1)
    assert session.last_sync == (0, 1)
    assert float(session.rows_at([1, 2, 3], [3])[3][0]) == 3.0 and session.num_forwards == 4
    assert session.last_sync == (3, 0)


def test_truncate_never_crops_when_nothing_is_to_be_removed() -> None:
    """Catches truncate calling crop(0) (it drops everything or raises on some 5.x versions)."""
    class Cache:
        def __init__(self) -> None:
            self.crops: list[int] = []

        def get_seq_length(self) -> int:
            return 5

        def crop(self, n: int) -> None:
            self.crops.append(n)

    cache = Cache()
    truncate(cache, 5)
    truncate(cache, 7)
    assert cache.crops == []
    truncate(cache, 3)
    assert cache.crops == [-2]
