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


def test_close_while_a_request_renders_its_prompt_frees_the_members_only_when_it_ends(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The request used to register as live only after rendering; a close() in between freed (closed)
    # the members at once and the request went on scoring the prompt on closed members.
    import asyncio
    import time

    used_after_close: list[str] = []

    class SlowTemplate(_Closable):
        def prompt_ids(self, messages: list, tools: list | None = None) -> list[int]:  # type: ignore[override]
            time.sleep(0.5)  # a slow chat template
            return super().prompt_ids(messages, tools)

        async def run(self, fn, *args):  # type: ignore[no-untyped-def]
            if self.closed:
                used_after_close.append(fn.__name__)
            return await super().run(fn, *args)

    def build(config, progress):  # type: ignore[no-untyped-def]
        tokenizer = byte_level_tokenizer() if config.spec.target.endswith("a") else metaspace_tokenizer()
        model = tiny_llama(tokenizer, 0) if config.spec.target.endswith("a") else tiny_gpt2(tokenizer, 1)
        return SlowTemplate(config.spec.target, model, tokenizer)

    monkeypatch.setattr(registry, "_build", build)
    monkeypatch.setattr(engine_module, "check_members_fit", lambda configs: None)
    engine = EnsembleEngine(["transformers:toy-close-a", "transformers:toy-close-b"], method="safe",
                            max_new_tokens=8, weights="auto")
    members = engine.members

    async def main() -> str:
        task = asyncio.ensure_future(engine.agenerate("Q: What is 1 + 2?\nA: 3.\n\nQ: What is 2 + 2?\nA:"))
        await asyncio.sleep(0.2)
        assert engine.live_requests == 1  # starting counts
        engine.close()
        assert not any(m.closed for m in members)  # not while the request still starts
        return (await task).finish_reason

    assert asyncio.run(main()) == "cancelled"
    assert not used_after_close and all(m.closed for m in members)


def test_an_old_engines_release_never_counts_off_a_new_registration_under_the_same_name() -> None:
    old = toy_member("toy-reg-d", "byte_level")
    register_member(old)
    engine = EnsembleEngine(["toy-reg-d", toy_member("toy-reg-e", "metaspace", seed=1)], method="safe")
    _ = engine.members  # the engine holds toy-reg-d too
    unregister_member("toy-reg-d")  # a test ends; its engine lives on (an adapter's cache)
    new = toy_member("toy-reg-d", "byte_level", seed=2)
    register_member(new)  # the next test registers its own under the same name
    try:
        engine.close()  # the old engine lets go: only its own hold
        assert registry._LOADED["transformers:toy-reg-d"] is new
    finally:
        unregister_member("toy-reg-d")
    assert "transformers:toy-reg-d" not in registry._LOADED
