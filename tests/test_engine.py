"""The engine end to end on toy members: SAFE vs baselines, cancellation, concurrency, bad input."""

from __future__ import annotations

import asyncio
import copy
from functools import cache

import pytest
import torch

from shared_engine import ContextLengthError, EnsembleEngine, InvalidRequestError
from shared_engine.alignment import TokenizedText, shared_boundaries
from shared_engine.members import HFMember
from tests.loop_watch import loop_gaps
from tests.toy import (
    byte_level_tokenizer,
    memorise,
    metaspace_tokenizer,
    registered_members,
    tiny_llama,
    toy_member,
)

ANSWER = "Hi Sofia, hi Sofia."
QUESTION = [{"role": "user", "content": "Greet her twice."}]


@cache
def trained_member(kind: str, seed: int = 0) -> HFMember:
    """A tiny Llama that memorised ANSWER (in its own tokenization) after QUESTION."""
    return answering(kind, ANSWER, QUESTION[0]["content"], seed, f"{kind}-trained")


@cache
def answering(kind: str, answer: str, question: str, seed: int = 0, name: str | None = None) -> HFMember:
    """A tiny Llama that memorised ``answer`` (in its own tokenization, then EOS) after the user's
    ``question``: it is sure of every token of it."""
    tokenizer = byte_level_tokenizer() if kind == "byte_level" else metaspace_tokenizer()
    torch.manual_seed(seed)
    model = copy.deepcopy(tiny_llama(tokenizer, seed))
    member = HFMember(name or f"{kind}-answers-{len(answer)}", model, tokenizer)
    prompt = member.prompt_ids([{"role": "user", "content": question}])
    memorise(model, prompt, member.table.encode_fragment(answer) + [tokenizer.eos_token_id])
    return member


def test_toy_pair_really_disagrees_on_sofia() -> None:
    byte_level = trained_member("byte_level").table
    metaspace = trained_member("metaspace").table
    assert byte_level.token_id(b" Sofia") is not None and metaspace.token_id(b" Sofia") is None
    assert metaspace.token_id(b" So") is not None and byte_level.token_id(b" So") is None


def _boundaries(member: HFMember, text: str) -> set[int]:
    tokens = TokenizedText(member.table)
    tokens.set_text(text.encode())
    return tokens.boundaries()


def test_every_token_commits_a_subword_prefix_and_safe_does_not() -> None:
    drafter, verifier = trained_member("metaspace"), trained_member("byte_level")
    options = dict(fusion="gac", weights=[0.6, 0.4], max_new_tokens=16)

    every = EnsembleEngine([drafter, verifier], method="every-token", **options).generate(QUESTION, keep_events=True)
    prefix_commits = [e for e in every.events if e.type == "ensemble" and e.chosen == " So"]
    assert prefix_commits, "every-token should fuse ' So' (the verifier's ' Sofia' has no boundary there)"
    # The verifier would never stop after " So": in its tokenization of the answer there is no
    # boundary at the end of the committed " So", so it was forced to continue from inside " Sofia".
    verifier_bounds = _boundaries(verifier, every.text)
    assert any(e.offset + 3 not in verifier_bounds for e in prefix_commits)

    safe = EnsembleEngine([drafter, verifier], method="safe", **options).generate(QUESTION, keep_events=True)
    assert safe.text == ANSWER
    shared = set(shared_boundaries(safe.text.encode(), [
        _tokens(drafter, safe.text), _tokens(verifier, safe.text)]))
    assert all(e.offset in shared for e in safe.events if e.type == "ensemble")
    assert not any(e.type == "ensemble" and e.chosen == " So" for e in safe.events)


def _tokens(member: HFMember, text: str) -> TokenizedText:
    tokens = TokenizedText(member.table)
    tokens.set_text(text.encode())
    return tokens


@pytest.mark.parametrize("kind", ["byte_level", "metaspace"])
@pytest.mark.parametrize("method", ["safe", "every-token", "gac-threshold"])
def test_identical_members_equal_single_greedy(kind: str, method: str) -> None:
    member = toy_member("toy", kind, "llama", seed=3)
    single = EnsembleEngine([member], method="single").generate("Sofia walked to the park", max_new_tokens=30)
    result = EnsembleEngine([member, member], method=method).generate("Sofia walked to the park",
                                                                       max_new_tokens=30)
    assert result.text == single.text
    assert result.stats.changed_tokens == 0
    if method == "safe":
        assert result.stats.ensembled_tokens == 0
        # at most one verifier forward per round (none when a round adds no complete text)
        assert 1 <= result.stats.forward_passes["toy'"] <= result.stats.rounds


def test_mixed_tokenizers_safe_is_valid_and_counts_add_up() -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    engine = EnsembleEngine(members, method="safe", max_new_tokens=40)
    events = list(engine.stream("Tom wrote about numbers 12 and 7 😀"))
    finish = events[-1]
    assert finish.type == "finish"
    assert "".join(e.text for e in events if e.type == "token") == finish.text
    stats = finish.stats
    assert stats.tokens == stats.accepted_tokens + stats.chosen_tokens
    assert stats.ensembled_tokens == sum(e.type == "ensemble" for e in events)
    assert stats.forward_passes["b"] <= stats.rounds  # at most one verifier forward per round
    # where the time went: drafting and verifying are parts of the request's time
    assert stats.draft_s > 0 and stats.verify_s > 0 and stats.draft_s + stats.verify_s <= stats.elapsed_s


async def test_cancel_leaves_engine_ready_and_concurrency_matches_sequential() -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    engine = EnsembleEngine(members, method="safe", max_new_tokens=24)
    prompts = ["Sofia visited Berlin", "Nina looked at the lake", "def add(a, b):"]
    fresh = [r.text for r in [EnsembleEngine(members, method="safe", max_new_tokens=24).generate(p)
                              for p in prompts]]
    for _ in range(3):
        stream = engine.astream(prompts[0], max_new_tokens=200)
        async for event in stream:
            if event.type == "token":
                break
        await stream.aclose()
    results = await asyncio.gather(*(engine.agenerate(p) for p in prompts))
    assert [r.text for r in results] == fresh


def test_stop_strings_cut_the_answer_and_are_never_streamed() -> None:
    member = toy_member("toy", "byte_level", "llama", seed=3)
    full = EnsembleEngine([member], method="single").generate("Sofia", max_new_tokens=30).text
    stop = full[10:13]
    assert stop and stop.strip()
    events = list(EnsembleEngine([member], method="single").stream("Sofia", max_new_tokens=30, stop=[stop]))
    streamed = "".join(e.text for e in events if e.type == "token")
    assert events[-1].reason == "stop"
    assert streamed == events[-1].text == full[: full.find(stop)]


def test_sampling_with_a_seed_is_reproducible() -> None:
    members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
    engine = EnsembleEngine(members, method="every-token", max_new_tokens=20)
    a = engine.generate("Lena", temperature=1.0, top_p=0.9, seed=11).text
    b = engine.generate("Lena", temperature=1.0, top_p=0.9, seed=11).text
    c = engine.generate("Lena", temperature=1.0, top_p=0.9, seed=12).text
    assert a == b
    assert a != c or len(a) == 0


@pytest.mark.parametrize("bad", [
    dict(max_new_tokens=-1), dict(temperature=-0.1), dict(top_p=0.0), dict(top_p=1.5), dict(stop=[""]),
    dict(nonsense=1),
])
def test_bad_parameters_raise_typed_errors(bad: dict) -> None:
    engine = EnsembleEngine([toy_member("toy")], method="single")
    with pytest.raises(InvalidRequestError):
        engine.generate("hello", **bad)


@pytest.mark.parametrize("prompt", ["", "   ", [], [{"role": "wizard", "content": "x"}],
                                    [{"role": "user", "content": 3}], ["not a dict"]])
def test_bad_prompts_raise_typed_errors(prompt: object) -> None:
    with pytest.raises(InvalidRequestError):
        EnsembleEngine([toy_member("toy")], method="single").generate(prompt)


def test_bad_engine_options_raise_typed_errors() -> None:
    member = toy_member("toy")
    with pytest.raises(InvalidRequestError, match="method"):
        EnsembleEngine([member, member], method="nope")
    with pytest.raises(InvalidRequestError, match="at least two"):
        EnsembleEngine([member], method="safe")
    with pytest.raises(InvalidRequestError, match="drafter"):
        EnsembleEngine([member, member], drafter="other")
    with pytest.raises(InvalidRequestError, match="weights"):
        EnsembleEngine([member, member], weights=[1.0])
    with pytest.raises(ValueError, match="known"):
        EnsembleEngine(["no-such-model", "x"]).generate("hi")


def test_drafter_weight_weighs_the_drafter_when_no_weights_are_given() -> None:
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    prompt = "Sofia counted 42 apples."

    def run(**options: object):  # noqa: ANN202 - a GenerationResult
        return EnsembleEngine([a, b], drafter_confidence=None, **options).generate(prompt, max_new_tokens=16)

    weighted = run(drafter_weight=3.0)
    assert weighted.stats.member_weights == {"a": 0.75, "b": 0.25}
    assert run(drafter="b", drafter_weight=3.0).stats.member_weights == {"b": 0.75, "a": 0.25}
    assert run(drafter_weight=3.0, weights=[1.0, 1.0]).stats.member_weights == {"a": 0.5, "b": 0.5}
    explicit = run(weights=[3.0, 1.0])
    assert (weighted.text, weighted.stats.changed_tokens) == (explicit.text, explicit.stats.changed_tokens)
    assert weighted.stats.ensembled_tokens > 0  # the weights were used, not only reported
    with pytest.raises(InvalidRequestError, match="drafter_weight"):
        EnsembleEngine([a, b], drafter_weight=0.0)


def test_safe_keeps_two_thirds_of_the_weight_for_its_drafter_with_any_number_of_verifiers() -> None:
    a, b, c = (toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2),
               toy_member("c", "metaspace", "llama", 3))
    weights = EnsembleEngine([a, b, c]).generate("Hi", max_new_tokens=2).stats.member_weights
    assert weights == pytest.approx({"a": 2 / 3, "b": 1 / 6, "c": 1 / 6}, abs=1e-4)
    assert EnsembleEngine([a, b]).generate("Hi", max_new_tokens=2).stats.member_weights == \
        pytest.approx({"a": 2 / 3, "b": 1 / 3}, abs=1e-4)
    per_verifier = EnsembleEngine([a, b, c], drafter_weight=2.0).generate("Hi", max_new_tokens=2).stats
    assert per_verifier.member_weights == pytest.approx({"a": 0.5, "b": 0.25, "c": 0.25}, abs=1e-4)
    equal = EnsembleEngine([a, b, c], method="every-token").generate("Hi", max_new_tokens=2).stats
    assert equal.member_weights == pytest.approx({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, abs=1e-4)


def test_context_too_long_is_a_clear_error() -> None:
    member = toy_member("toy")
    with pytest.raises(ContextLengthError, match="context window"):
        EnsembleEngine([member], method="single").generate("hello " * 10, max_new_tokens=10**6)


def test_a_request_whose_max_new_tokens_alone_fills_the_window_says_so() -> None:
    """'prompt (2 bytes: at least 0 tokens) + max_new_tokens (100000) exceed ...' blamed a two-byte
    prompt; the error names the part to cut (seen on the live page, max_tokens 100000)."""
    member = toy_member("toy")
    window = member.context_window
    engine = EnsembleEngine([member], method="single")
    for prompt in ("hi", "hello " * 10):
        with pytest.raises(ContextLengthError, match=rf"max_new_tokens \({window}\) alone fills toy's context "
                                                     rf"window of {window} tokens: ask for fewer new tokens"):
            engine.generate(prompt, max_new_tokens=window)
    with pytest.raises(ContextLengthError, match=r"^prompt \(\d+ tokens\) \+ max_new_tokens"):
        engine.generate("hello " * 10, max_new_tokens=window - 3)


def test_the_drafter_may_be_named_without_its_backend_prefix() -> None:
    """``--drafter qwen`` for a member given as ``llamacpp:qwen`` (nothing is loaded to decide)."""
    engine = EnsembleEngine(["llamacpp:first-model", "llamacpp:second-model"], drafter="second-model")
    assert engine._order == [1, 0]
    assert EnsembleEngine(["a-model", "transformers:b-model"], drafter="transformers:b-model")._order == [1, 0]
    with pytest.raises(InvalidRequestError, match="could be any of"):
        EnsembleEngine(["llamacpp:same-model", "transformers:same-model"], drafter="same-model")
    with pytest.raises(InvalidRequestError, match="is not a member"):
        EnsembleEngine(["llamacpp:first-model", "second-model"], drafter="third-model")


def test_verifiers_read_on_after_the_drafter_commits_invalid_utf8() -> None:
    """A drafter can commit bytes that are not UTF-8 (a random model's lone 0xFF). Verifiers used to
    stop reading there for the rest of the answer, so the ensemble silently became the drafter
    alone; they now leave those bytes out and score the text after them."""
    from shared_engine.decoding import RequestState, request_members
    from shared_engine.decoding.round import _verify

    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    messages = [{"role": "user", "content": "Hi"}]
    state = RequestState(request_members([a, b], ["a", "b"], [a.new_session(), b.new_session()],
                                         [a.prompt_ids(messages), b.prompt_ids(messages)]), max_new_tokens=100)
    invalid = a.table.token_id(b"\xff")
    assert invalid is not None
    state.commit(a.table.spell("ok ") + [invalid] + a.table.spell(" fine"), "draft")
    assert state.text == "ok \ufffd fine"
    text = bytes(state.answer) + b" more"
    views = asyncio.run(_verify(state, text, len(state.answer), ends_with_eos=False, draft_ids=[]))
    assert max(views[0].rows) == len(text)  # the verifier has a distribution at the end of the draft
    assert len(state.answer) in views[0].rows


def test_a_verifier_sharing_the_drafters_vocabulary_reads_its_exact_ids() -> None:
    """Two models with one tokenizer: the verifier reads the drafter's own ids (speculative
    verification), not a re-tokenization that would differ where the drafter split a word its own way."""
    from shared_engine.decoding import RequestState, request_members

    a, b = toy_member("a", "metaspace", "llama", 3), toy_member("b", "metaspace", "gpt2", 5)
    other = toy_member("c", "byte_level", "llama", 1)
    assert a.table.same_vocabulary(b.table) and not a.table.same_vocabulary(other.table)
    messages = [{"role": "user", "content": "Hi"}]
    members = [a, b, other]
    state = RequestState(request_members(members, ["a", "b", "c"], [m.new_session() for m in members],
                                         [m.prompt_ids(messages) for m in members]), max_new_tokens=100)
    split = a.table.spell(" l") + a.table.spell("ool") + a.table.spell(" park")
    canonical = a.table.spell(" lool park")
    assert split != canonical and a.table.to_bytes(split) == a.table.to_bytes(canonical)
    state.commit(split[:2], "draft")
    text = bytes(state.answer) + a.table.to_bytes(split[2:])
    assert state.reading(1, text, split[2:]).ids == split  # as drafted
    assert state.reading(2, text, split[2:]).ids == other.table.spell(" lool park")  # re-tokenized
    assert state.member_context(1) == state.members[1].prompt_ids + split[:2]


def test_a_draft_the_drafter_is_sure_of_everywhere_skips_the_verifiers_forward(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """#18's "verify only what can be fused": with ``drafter_confidence`` a round whose every drafted
    token is at least that likely to the drafter commits without the verifiers' forward, and the
    answer, the fusions and their choices are exactly those of the round that verifies first."""
    from shared_engine.decoding import round as round_module
    from shared_engine.policies import Policy

    drafter, verifier = toy_member("sure", "metaspace", seed=3), toy_member("checks", "byte_level", seed=4)
    options = dict(max_new_tokens=40, draft_length=4)

    def run(threshold: float) -> object:
        return EnsembleEngine([drafter, verifier], method="safe", drafter_confidence=threshold,
                              **options).generate("Tell me a story.", keep_events=True)

    with monkeypatch.context() as patched:  # the lever off: every round is verified, every row scored
        patched.setattr(Policy, "drafter_decides_alone", lambda self, probs: False)
        patched.setattr(round_module, "_undecided_offsets", lambda *args: None)
        probe = run(0.5)
        drafter_probs = sorted(p.probs["sure"] for e in probe.events if e.type == "verify"
                               for p in e.positions if p.probs)
        threshold = drafter_probs[len(drafter_probs) // 4]  # about 3 in 4 positions are "sure"
        verified = run(threshold)
    assert verified.stats.unverified_rounds == 0
    skipping = run(threshold)
    assert skipping.text == verified.text
    assert [(e.position, e.chosen) for e in skipping.events if e.type == "ensemble"] == \
        [(e.position, e.chosen) for e in verified.events if e.type == "ensemble"]
    assert (skipping.stats.ensembled_tokens, skipping.stats.changed_tokens) == \
        (verified.stats.ensembled_tokens, verified.stats.changed_tokens)
    assert 0 < skipping.stats.unverified_rounds < skipping.stats.rounds
    assert skipping.stats.forward_passes["checks"] < verified.stats.forward_passes["checks"]
    # a threshold every token meets: the verifier never runs, the answer is the drafter's alone
    alone = run(1e-9)
    assert alone.stats.unverified_rounds == alone.stats.rounds and alone.stats.forward_passes["checks"] == 0
    single = EnsembleEngine([drafter], method="single", **options).generate("Tell me a story.")
    assert alone.text == single.text


def test_method_single_loads_its_drafter_only() -> None:
    """``single`` runs the drafter alone; the other members given (a bench or a profile may list them)
    are never loaded: a member that cannot load does not stop it, and nothing of it is held."""
    with registered_members([toy_member("toy")]) as (name,):
        engine = EnsembleEngine(["transformers:no-such/model", name], method="single", drafter=name)
        assert engine.generate("Sofia", max_new_tokens=5).text == EnsembleEngine(
            [name], method="single").generate("Sofia", max_new_tokens=5).text
        assert [m.name for m in engine.members] == [name]
        assert [getattr(s, "model", None) for s in engine.decoding_specs] == [name]
        engine.close()
        # the weights of an ensemble run (a profile's) leave the drafter alone as it is
        assert EnsembleEngine(["transformers:no-such/model", name], method="single", drafter=name,
                              weights=[1.0, 0.0]).generate("Sofia", max_new_tokens=5).text


@pytest.mark.parametrize("method", ["single", "safe"])
def test_a_constraint_dead_end_keeps_the_tokens_drafted_before_it(monkeypatch: pytest.MonkeyPatch,
                                                                  method: str) -> None:
    """Where the JSON constraint leaves the drafter no token (a dead end after its 4th token here),
    the answer ends after the tokens drafted before it: the round set the finish first and then
    committed nothing of its draft, so the answer depended on the draft length."""
    import shared_engine.decoding.round as round_module
    from shared_engine.events import FormatRetryEvent

    real = round_module.constrained_token

    def first_attempts(draft_length: int) -> str:
        calls = 0

        def dead_end_after_three(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
            nonlocal calls
            calls += 1
            return None if calls == 4 else real(*args, **kwargs)

        monkeypatch.setattr(round_module, "constrained_token", dead_end_after_three)
        members = [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]
        engine = EnsembleEngine(members[: 1 if method == "single" else 2], method=method,
                                draft_length=draft_length, drafter_confidence=None,
                                **({} if method == "single" else {"draft_schedule": "fixed"}))  # single: fixed
        for event in engine.stream("Hello", max_new_tokens=12, response_format={"type": "json_object"}):
            if isinstance(event, FormatRetryEvent):
                return event.text
        raise AssertionError("the first attempt ended valid")

    whole = first_attempts(1)
    assert len(whole) >= 3 and first_attempts(5) == whole


@pytest.mark.parametrize("method", ["every-token", "safe"])
def test_a_verifier_never_reads_past_its_context_window(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """max_new_tokens counts the drafter's tokens (checked against every window at the start); a
    verifier that spells the answer in more of its own read past its window mid-answer (an n_ctx
    error on llama.cpp, an index error on a transformers model): the answer now ends ('length')
    where every member can still read it."""
    from shared_engine.members import hf

    longest: list[int] = [0]
    real = hf.HFSession.rows_at

    def spy(self: hf.HFSession, target: list[int], positions: list[int]) -> dict[int, torch.Tensor]:
        longest[0] = max(longest[0], len(target))
        return real(self, target, positions)

    monkeypatch.setattr(hf.HFSession, "rows_at", spy)
    verifier = copy.copy(toy_member("b", "metaspace", "gpt2", 2))
    window = len(verifier.prompt_ids([{"role": "user", "content": "Hello"}])) + 40
    verifier.context_window = window  # the drafter's answer of 40 tokens takes the verifier past it
    answer = EnsembleEngine([toy_member("a", "byte_level", "llama", 1), verifier], method=method).generate(
        "Hello", max_new_tokens=40)
    assert answer.finish_reason == "length" and 0 < longest[0] <= window


@pytest.mark.parametrize("method", ["single", "adafuse", "safe", "every-token"])
def test_no_method_commits_a_special_tokens_name(method: str) -> None:
    """A drafted (or AdaFuse-written) special token such as '<pad>' is no answer text: its stored
    bytes are its literal name. Fusion never offers one (candidate_key), but SAFE and every-token
    committed a drafted one wherever no fusion ran (the gate, the consensus skip, no shared boundary)."""
    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    engine = EnsembleEngine([a] if method == "single" else [a, b], method=method, drafter=0)
    for prompt in ["def f(x):\n\t\treturn x\r\n", "   spaces   ", "Sofia", "Maria went"]:
        text = engine.generate(prompt, max_new_tokens=40).text
        assert not any(name in text for name in ("<pad>", "<s>", "<|im_start|>")), text


@pytest.mark.parametrize("method", ["safe", "every-token"])
def test_a_drafter_sure_of_a_special_token_writes_no_name(monkeypatch: pytest.MonkeyPatch, method: str) -> None:
    """A drafter that puts nearly all its mass on a special token (other than EOS) drafted it; the
    gate (drafter_confidence) then committed it unfused, and the answer held its literal name."""
    from shared_engine.members import hf

    a, b = toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)
    special = min(a.table.special_ids - a.table.eos_ids)
    real = hf.HFSession._forward

    def sure_of_special(self: hf.HFSession, feed: list[int], rows: int) -> torch.Tensor:
        logits = real(self, feed, rows)
        if self.member is a:
            logits = logits.clone()
            logits[..., special] += 50.0
        return logits

    monkeypatch.setattr(hf.HFSession, "_forward", sure_of_special)
    name = a.table.pieces[special].decode("utf-8", "replace")
    text = EnsembleEngine([a, b], method=method, drafter=0).generate("Sofia", max_new_tokens=12).text
    assert name not in text and text


async def test_aclose_during_a_load_leaves_the_event_loop_running_and_releases_the_members(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """aclose() took the load lock on the loop thread: every coroutine froze until a slow load ended."""
    import time

    import shared_engine.engine as engine_module
    from shared_engine import members as registry

    real_acquire = engine_module.acquire_member

    def slow_acquire(spec):  # noqa: ANN001, ANN202 - a load that takes a while (weights, a server start)
        time.sleep(0.6)
        return real_acquire(spec)

    monkeypatch.setattr(engine_module, "acquire_member", slow_acquire)
    toys = [toy_member("toy-close-x", "byte_level"), toy_member("toy-close-y", "metaspace", seed=1)]
    with registered_members(toys) as names:
        before = {name: registry._HOLDERS.get(f"transformers:{name}", 0) for name in names}
        engine = EnsembleEngine(names, method="safe", max_new_tokens=10)
        async with loop_gaps() as gaps:
            request = asyncio.create_task(engine.agenerate("Sofia"))
            await asyncio.sleep(0.2)  # the request is loading the members
            await engine.aclose()
            assert (await request).finish_reason == "cancelled"
        assert max(gaps) < 0.5, max(gaps)  # frozen ~1 s before
        assert {name: registry._HOLDERS.get(f"transformers:{name}", 0) for name in names} == before
