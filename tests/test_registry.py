"""The process-wide member registry under failure and concurrency: an engine whose members fail to
load lets go of those it acquired, and a member acquired by one engine while another lets go of it is
never handed out closed. Toy members, seconds."""

from __future__ import annotations

import threading

import pytest

import shared_engine.engine as engine_module
import shared_engine.members as registry
from shared_engine import EnsembleEngine, EnsembleError, InvalidRequestError
from shared_engine.members import HFMember, register_member, unregister_member
from tests.toy import byte_level_tokenizer, metaspace_tokenizer, tiny_gpt2, tiny_llama, toy_member


def test_a_member_that_fails_to_load_lets_go_of_those_acquired_before_it() -> None:
    register_member(toy_member("toy-reg-a", "byte_level"))  # one hold: the registration
    try:
        engine = EnsembleEngine(["toy-reg-a", "vllm:http://127.0.0.1:9"], method="safe")  # nothing listens
        for _ in range(2):
            with pytest.raises(EnsembleError):
                _ = engine.members
            assert registry._HOLDERS["transformers:toy-reg-a"] == 1, registry._HOLDERS
        engine.close()
        assert registry._HOLDERS["transformers:toy-reg-a"] == 1
    finally:
        unregister_member("toy-reg-a")


def test_a_name_clash_found_after_loading_lets_go_too() -> None:
    # two different models whose members are both named "dup", registered under other names
    register_member(HFMember("dup", tiny_llama(byte_level_tokenizer(), 0), byte_level_tokenizer()), "toy-reg-b")
    register_member(HFMember("dup", tiny_gpt2(metaspace_tokenizer(), 1), metaspace_tokenizer()), "toy-reg-c")
    try:
        clash = EnsembleEngine(["toy-reg-b", "toy-reg-c"], method="safe")
        for _ in range(2):
            with pytest.raises(InvalidRequestError, match="both named 'dup'"):
                _ = clash.members
        clash.close()
        assert registry._HOLDERS["transformers:toy-reg-b"] == registry._HOLDERS["transformers:toy-reg-c"] == 1
    finally:
        unregister_member("toy-reg-b")
        unregister_member("toy-reg-c")


class _Closable(HFMember):
    closed = False

    def close(self) -> None:
        self.closed = True


def test_an_acquired_member_is_never_one_another_engine_just_closed(monkeypatch: pytest.MonkeyPatch) -> None:
    # Two threads build and close engines on one model: acquiring it used to find it (under the lock),
    # let go of the lock, then count the hold; a release in between closed it for good.
    tokenizer = byte_level_tokenizer()
    monkeypatch.setattr(registry, "_build", lambda config, progress: _Closable(
        config.spec.target, tiny_llama(tokenizer, 0), tokenizer))
    monkeypatch.setattr(engine_module, "check_members_fit", lambda configs: None)
    handed_out_closed: list[HFMember] = []

    def churn(times: int) -> None:
        for _ in range(times):
            engine = EnsembleEngine(["transformers:toy-reg-race"], method="single")
            member = engine.members[0]
            if getattr(member, "closed", False):
                handed_out_closed.append(member)
            engine.close()

    threads = [threading.Thread(target=churn, args=(400,)) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not handed_out_closed
    assert "transformers:toy-reg-race" not in registry._LOADED  # the last one let go: freed
