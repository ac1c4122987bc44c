"""``on_member_failure="degrade"`` with members that fail in ways the engine misread (hunt: faults).

1. A llama.cpp member whose tokenizer is read from its server: the tokenizer's client was named
   after the spec, not the member, so its errors named no member the engine knew and degrade raised.
2. The same model listed twice (labels ``m``, ``m'``): the error names the model only, and degrade
   dropped the first copy, healthy, and went on with the failed one.
3. The drafter fails and its heir is weighted 0: the round stayed bound to the old drafter's
   weight, and the heir, which only proposes, wrote the whole answer alone through the gates.
4. A server answering NaN / +inf log-probabilities (or a non-numeric llama.cpp ``index``) was read
   silently (a degenerate answer) or raised a bare ValueError naming no member.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from shared_engine import EnsembleEngine, MemberError
from shared_engine.members import HFMember, load_member
from shared_engine.members import server_tokenizer as server_tokenizer_module
from shared_engine.members.llamacpp import LlamaCppMember
from shared_engine.members.remote import LocalTokenizer
from shared_engine.members.topk import TopK
from tests.fixture_server import LlamaCppLike, serve
from tests.test_llamacpp_slots import _toy, toy_next_logprobs
from tests.toy import fitted_member, toy_member

PROMPT = "Hello Sofia, tell me a story"
Handler = Callable[[str, str, Any], tuple[int, bytes]]


def _local_tokenizer(hf: HFMember) -> LocalTokenizer:
    return LocalTokenizer(hf.tokenizer, hf.table.vocab_size, frozenset(hf.table.eos_ids), 512)


class Failing:
    """A member that raises a ``MemberError`` named after the model from its ``fail_after + 1``-th call on."""

    def __init__(self, inner: HFMember, fail_after: int | None = None) -> None:
        self._inner, self.fail_after, self.calls = inner, fail_after, 0
        self.name = inner.name

    def __getattr__(self, key: str) -> Any:
        return getattr(self._inner, key)

    def new_session(self) -> Any:
        return self._inner.new_session()

    async def run(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.calls += 1
        if self.fail_after is not None and self.calls > self.fail_after:
            raise MemberError(self.name, "http://127.0.0.1:9", "server died")
        return await self._inner.run(fn, *args)


# 1. the server-read tokenizer is named as its member


def test_a_server_read_tokenizer_names_its_member(monkeypatch: pytest.MonkeyPatch) -> None:
    hf = _toy()
    inner = LlamaCppLike(toy_next_logprobs(hf), slots=2)

    def handler(method: str, path: str, body: Any) -> tuple[int, bytes]:
        if (method, path) == ("POST", "/tokenize"):  # the member's tokenizer check
            return 200, json.dumps({"tokens": _local_tokenizer(hf).encode(body["content"])}).encode()
        status, payload = inner(method, path, body)
        if (method, path) == ("GET", "/props"):  # a model file that is not on this machine
            payload = json.dumps({**json.loads(payload), "model_path": "/nowhere/elsewhere.gguf"}).encode()
        return status, payload

    names: list[str | None] = []

    def server_tokenizer(url: str, http: Any = None, name: str | None = None) -> LocalTokenizer:
        names.append(name)  # the name its client gives every error of its calls
        return _local_tokenizer(hf)

    monkeypatch.setattr(server_tokenizer_module, "LlamaCppServerTokenizer", server_tokenizer)
    with serve(handler) as (url, _):
        member = load_member(f"llamacpp:{url}")
        try:
            assert member.name == "elsewhere"
            assert names == ["elsewhere"]
        finally:
            member.close()


# 2. the same model twice: the copy that failed goes, by identity


def test_degrade_drops_the_copy_that_failed_not_the_first_of_its_name() -> None:
    a = toy_member("a", "byte_level", "llama", 0)
    c = toy_member("c", "metaspace", "gpt2", 1)
    members = [Failing(a), Failing(a, fail_after=2), Failing(c)]
    engine = EnsembleEngine(members, method="safe", drafter=0, drafter_confidence=None,
                            on_member_failure="degrade", max_new_tokens=12)
    assert engine.labels == ["a", "a'", "c"]
    result = engine.generate(PROMPT)
    assert list(result.failed_members) == ["a'"]
    assert set(result.stats.forward_passes) == {"a", "c"}
    assert members[1].calls == 3  # the failed copy is not called again; the healthy one goes on
    assert members[0].calls > 3


@pytest.mark.parametrize("fail_on_call", [2, 3, 4, 5])
def test_degrade_drops_the_session_that_failed_of_one_member_listed_twice(fail_on_call: int) -> None:
    hf = _toy()
    server = LlamaCppLike(toy_next_logprobs(hf), slots=4, fail_on_call=fail_on_call)
    with serve(server) as (url, _):
        remote = LlamaCppMember("remote-v", url, _local_tokenizer(hf), check_tokenizer=False, pin_slots=True)
        try:
            engine = EnsembleEngine([toy_member("a", "metaspace", "gpt2", 1), remote, remote],
                                    method="every-token", drafter=0, on_member_failure="degrade",
                                    max_new_tokens=8)
            result = engine.generate("Hello Sofia")
        finally:
            remote.close()
    failed_slot = server.slot_of_call[fail_on_call - 1]
    assert failed_slot is not None
    label = "remote-v" if failed_slot == 0 else "remote-v'"
    assert list(result.failed_members) == [label]
    assert failed_slot not in server.slot_of_call[fail_on_call:]  # the failed copy's session is not called again


def test_an_error_no_single_member_is_known_by_is_raised_not_guessed() -> None:
    """Two copies of one model, the error raised outside either one's calls (no frame of its
    session or member): which copy failed is not known, so no healthy member is dropped."""
    a = toy_member("a", "byte_level", "llama", 0)
    engine = EnsembleEngine([a, a, toy_member("c", "metaspace", "gpt2", 1)], method="every-token", drafter=0,
                            on_member_failure="degrade", max_new_tokens=6)
    from shared_engine.engine import _failed_member

    state = _fake_state(engine)
    assert _failed_member(state, MemberError("a", "http://x", "gone")) is None
    assert _failed_member(state, MemberError("c", "http://x", "gone")) == 2


def _fake_state(engine: EnsembleEngine) -> Any:
    class Record:
        def __init__(self, member: Any) -> None:
            self.member, self.session = member, object()

    class State:
        members = [Record(m) for m in engine.members]

    return State()


# 3. an heir weighted 0 only proposes


@pytest.mark.parametrize("method", ["gac-threshold", "safe"])
def test_an_heir_weighted_zero_does_not_write_alone(method: str) -> None:
    conversation = [{"role": "user", "content": PROMPT},
                    {"role": "assistant", "content": "Once upon a time there was a cat named Sofia who loved the sea."}]
    a = toy_member("a", "byte_level", "llama", 0)
    b = fitted_member("b", "metaspace", conversation, steps=60)
    c = toy_member("c", "byte_level", "gpt2", 2)
    degraded = EnsembleEngine([Failing(a, fail_after=0), b, c], method=method, drafter=0, weights=[1, 0, 1],
                              on_member_failure="degrade", max_new_tokens=30)
    fresh = EnsembleEngine([b, c], method=method, drafter=0, weights=[0, 1], max_new_tokens=30)
    runs = [list(engine.stream(PROMPT)) for engine in (degraded, fresh)]
    sources = [Counter(e.source for e in events if e.type == "token") for events in runs]
    assert list(runs[0][-1].failed_members) == ["a"]
    assert sources[0] == sources[1]
    assert "drafter" not in sources[0]  # a member weighted 0 writes no token alone
    assert runs[0][-1].text == runs[1][-1].text


# 4. log-probabilities that are no probabilities; a llama.cpp index that is no number


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.5])
def test_a_topk_entry_refuses_a_logprob_that_is_no_probability(value: float) -> None:
    with pytest.raises(ValueError, match="log-probability"):
        TopK([1, 2], [-0.5, value])


def test_a_topk_entry_takes_minus_infinity_and_a_rounded_zero() -> None:
    entry = TopK([1, 2, 3], [1e-6, -math.inf, -2.0])
    assert entry.logprobs[1] == -math.inf


@contextmanager
def _remote_answering(rewrite: Callable[[dict[str, Any]], None]) -> Iterator[LlamaCppMember]:
    """A llama.cpp stand-in whose every /completion result goes through ``rewrite``."""
    hf = _toy()
    inner = LlamaCppLike(toy_next_logprobs(hf), slots=4)

    def handler(method: str, path: str, body: Any) -> tuple[int, bytes]:
        status, payload = inner(method, path, body)
        if path == "/completion" and status == 200:
            answer = json.loads(payload)
            for result in answer if isinstance(answer, list) else [answer]:
                rewrite(result)
            payload = json.dumps(answer).encode()  # NaN / Infinity: what Python's json writes and reads
        return status, payload

    with serve(handler) as (url, _):
        remote = LlamaCppMember("remote-v", url, _local_tokenizer(hf), check_tokenizer=False)
        try:
            yield remote
        finally:
            remote.close()


def _set_logprobs(value: float) -> Callable[[dict[str, Any]], None]:
    def rewrite(result: dict[str, Any]) -> None:
        for entry in result["completion_probabilities"][0]["top_logprobs"]:
            entry["logprob"] = value
    return rewrite


def _set_index(result: dict[str, Any]) -> None:
    result["index"] = "x"


@pytest.mark.parametrize("method", ["every-token", "gac-threshold"])
@pytest.mark.parametrize("value", [math.nan, math.inf])
def test_a_server_answering_no_probabilities_is_a_failed_member(method: str, value: float) -> None:
    with _remote_answering(_set_logprobs(value)) as remote:
        engine = EnsembleEngine([toy_member("a", "metaspace", "gpt2", 1), remote], method=method, drafter=0,
                                on_member_failure="degrade", max_new_tokens=8)
        result = engine.generate(PROMPT)
        assert list(result.failed_members) == ["remote-v"]
        strict = EnsembleEngine([toy_member("a", "metaspace", "gpt2", 1), remote], method=method, drafter=0,
                                max_new_tokens=8)
        with pytest.raises(MemberError, match="remote-v"):
            strict.generate(PROMPT)


def test_a_llamacpp_index_that_is_no_number_is_the_members_error() -> None:
    with _remote_answering(_set_index) as remote:
        with pytest.raises(MemberError, match="remote-v.*completion results"):
            remote.score_at(_toy().tokenizer("Hello")["input_ids"], [1, 2])
        engine = EnsembleEngine([toy_member("a", "metaspace", "gpt2", 1), remote], method="every-token",
                                drafter=0, on_member_failure="degrade", max_new_tokens=8)
        assert list(engine.generate(PROMPT).failed_members) == ["remote-v"]
