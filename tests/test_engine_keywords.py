"""The engine's own keywords, misspelt (``generate("hi", response_fromat=...)``): the error names the
keyword meant and the ones accepted, as a misspelt generation parameter's does (``options.validated``),
and a device asked for members that cannot use it is refused, as the CLI refuses ``--device``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from shared_engine import EnsembleEngine, InvalidRequestError, MemberConfig
from tests.toy import toy_member

TIMEOUT_S = 30.0


@pytest.fixture(scope="module")
def engine() -> EnsembleEngine:
    return EnsembleEngine([toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)])


def _first_event(engine: EnsembleEngine, **params: Any) -> Any:
    async def first() -> Any:
        stream = engine.astream("hi", **params)
        try:
            return await stream.__anext__()
        finally:
            await stream.aclose()
    return asyncio.run(asyncio.wait_for(first(), TIMEOUT_S))


def _agenerate(engine: EnsembleEngine, **params: Any) -> Any:
    return asyncio.run(asyncio.wait_for(engine.agenerate("hi", **params), TIMEOUT_S))


CALLS: dict[str, Callable[..., Any]] = {
    "astream": _first_event,
    "stream": lambda engine, **params: next(engine.stream("hi", **params)),
    "agenerate": _agenerate,
    "generate": lambda engine, **params: engine.generate("hi", **params),
}


@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(("name", "meant"), [("response_fromat", "response_format"), ("tool", "tools"),
                                             ("raw_promt", "raw_prompt"), ("prefx", "prefix"),
                                             ("max_new_token", "max_new_tokens")])
def test_a_misspelt_keyword_names_the_one_meant(engine: EnsembleEngine, call: str, name: str, meant: str) -> None:
    """``response_fromat`` (astream's own keyword, not a generation parameter) got no hint: only
    GenerationParams' names were matched."""
    with pytest.raises(InvalidRequestError) as raised:
        CALLS[call](engine, **{name: {"type": "json_object"}})
    message = str(raised.value)
    assert message.startswith(f"invalid parameters: {name}: Extra inputs are not permitted "
                              f"(did you mean '{meant}'?); accepted keywords of ")
    assert "max_new_tokens, temperature" in message and "response_format" in message and "raw_prompt" in message


@pytest.mark.parametrize("call", ["agenerate", "generate"])
def test_keep_events_is_named_by_generate_alone(engine: EnsembleEngine, call: str) -> None:
    with pytest.raises(InvalidRequestError) as raised:
        CALLS[call](engine, keep_event=True)
    assert "keep_event: Extra inputs are not permitted (did you mean 'keep_events'?)" in str(raised.value)
    assert str(raised.value).endswith(", keep_events")
    with pytest.raises(InvalidRequestError) as raised:  # stream takes no keep_events: not offered there
        CALLS["stream"](engine, keep_event=True)
    assert "did you mean" not in str(raised.value) and "keep_events" not in str(raised.value)


def test_the_keywords_spelt_right_still_answer(engine: EnsembleEngine) -> None:
    result = engine.generate("hi", max_new_tokens=2, prefix="", raw_prompt=False, keep_events=True)
    assert result.finish_reason in ("length", "stop") and result.events


ZOO = "smollm2-135m-instruct"


@pytest.mark.parametrize(("members", "placement", "runs"), [
    ([f"llamacpp:{ZOO}"], {"device": "cuda"}, "llamacpp"),
    ([f"llamacpp:{ZOO}", "llamacpp:gemma-3-270m"], {"dtype": "bfloat16"}, "llamacpp"),
    ([f"llamacpp:{ZOO}", "llamacpp:http://127.0.0.1:9"], {"device_map": "auto"}, "llamacpp"),
    ([f"llamacpp:{ZOO}", "vllm:http://127.0.0.1:9#Qwen/Qwen2.5-0.5B-Instruct"], {"device": "cpu"}, "llamacpp, vllm"),
])
def test_placement_no_member_uses_is_refused(members: list[str], placement: dict[str, Any], runs: str) -> None:
    """``EnsembleEngine(["llamacpp:NAME"], device="cuda")`` ran on the CPU, silently (the device was
    applied to transformers members alone, and there were none); the CLI refuses ``--device`` there."""
    (name, value), = placement.items()
    with pytest.raises(InvalidRequestError) as raised:
        EnsembleEngine(members, method="single" if len(members) == 1 else "safe", **placement)
    assert str(raised.value).startswith(f"{name}={value!r}: only for transformers members, and every member "
                                        f"here runs on {runs} (drop it, or run a member on transformers")


def test_placement_for_built_members_is_refused() -> None:
    toys = [toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)]
    with pytest.raises(InvalidRequestError, match="device='cpu': only for transformers members, and every "
                                                  "member here runs on built members"):
        EnsembleEngine(toys, device="cpu")


def test_device_cpu_passes_where_every_member_runs_on_the_cpu_anyway() -> None:
    """``EnsembleEngine(["llamacpp:NAME"], device="cpu")`` was refused (269cec5), though it asks for what
    happens: an in-process llama.cpp member runs on the CPU. Other options stay refused (they ask for what
    no llama.cpp member does), and so does device="cpu" for members whose device is not known here."""
    for members in ([f"llamacpp:{ZOO}", "llamacpp:gemma-3-270m"],
                    [MemberConfig(model=ZOO, backend="transformers", device="cpu"), f"llamacpp:{ZOO}"]):
        engine = EnsembleEngine(members, device="cpu")
        assert [getattr(s, "device", None) for s in engine.member_specs] == [getattr(members[0], "device", None), None]
        engine.close()
    (alone,) = EnsembleEngine([{"model": ZOO, "backend": "llamacpp"}], method="single", device="cpu").member_specs
    assert isinstance(alone, MemberConfig) and alone.spec.backend == "llamacpp"
    for other in ({"dtype": "float32"}, {"dtype": "auto"}, {"attn_implementation": "sdpa"}):
        with pytest.raises(InvalidRequestError, match="only for transformers members, and every member here runs "
                                                      "on llamacpp"):
            EnsembleEngine([f"llamacpp:{ZOO}", "llamacpp:gemma-3-270m"], device="cpu", **other)
    with pytest.raises(InvalidRequestError, match="^device='cpu': .* runs on llamacpp, vllm"):
        EnsembleEngine([f"llamacpp:{ZOO}", "vllm:http://127.0.0.1:9#Qwen/Qwen2.5-0.5B-Instruct"], device="cpu")


OWN_CPU = MemberConfig(model=ZOO, backend="transformers", device="cpu")


@pytest.mark.parametrize(("members", "placement", "refused", "own"), [
    ([OWN_CPU, "llamacpp:gemma-3-270m"], {"device": "cuda"}, "device='cuda'", f"device ({ZOO}: device='cpu')"),
    ([{"model": ZOO, "backend": "transformers", "device": "cpu"}], {"device": "cuda:1"}, "device='cuda:1'",
     f"device ({ZOO}: device='cpu')"),
    ([OWN_CPU, "llamacpp:gemma-3-270m"], {"device": "cuda", "dtype": "bfloat16"}, "device='cuda'",
     f"device ({ZOO}: device='cpu')"),  # dtype fills the member's unset dtype: only device goes unused
    ([MemberConfig(model=ZOO, backend="transformers", device_map="auto", name="m"), "llamacpp:gemma-3-270m"],
     {"device": "cpu"}, "device='cpu'", "device (m: device_map='auto')"),
    ([MemberConfig(model=ZOO, dtype="float16", name="x"), MemberConfig(model=ZOO, dtype="bfloat16", name="y")],
     {"dtype": "float32", "compile": True}, "dtype='float32'", "dtype (x: dtype='float16', y: dtype='bfloat16')"),
])
def test_placement_every_transformers_member_overrides_is_refused(
        members: list[Any], placement: dict[str, Any], refused: str, own: str) -> None:
    """An engine-wide device was dropped, silently, where every transformers member set its own (the
    check counted any transformers member as using it, 269cec5): a members file's ``device: cpu`` beside
    a llama.cpp member and ``--device cuda:3`` ran on the CPU. Now each option counts the members it fills."""
    with pytest.raises(InvalidRequestError) as raised:
        EnsembleEngine(members, method="single" if len(members) == 1 else "safe", **placement)
    assert str(raised.value) == (f"{refused}: only for transformers members that set none of their own, and every "
                                 f"transformers member here sets its own {own} (drop it, or unset the member's own)")


def test_placement_one_transformers_member_fills_is_used() -> None:
    """One transformers member taking the engine-wide value is enough, whatever the others set; a member's
    own value equal to it runs with it too."""
    from shared_engine.members.config import MemberDefaults, member_config, placement_unused_on

    defaults = MemberDefaults(device="cuda:3", dtype="bfloat16")
    for entries in ([OWN_CPU, ZOO], [{"model": ZOO, "backend": "transformers", "device": "cuda:3"}, "llamacpp:x"],
                    [MemberConfig(model=ZOO, dtype="float16"), MemberConfig(model=ZOO, device="cpu")]):
        assert placement_unused_on(defaults, [member_config(e, defaults) for e in entries]) is None


def test_placement_goes_to_the_members_that_use_it() -> None:
    """A bare zoo name given a device runs on transformers (README), beside a llama.cpp member too."""
    (alone,) = EnsembleEngine([ZOO], method="single", device="cpu").member_specs
    assert isinstance(alone, MemberConfig) and (str(alone.spec), alone.device) == (f"transformers:{ZOO}", "cpu")
    mixed = EnsembleEngine([ZOO, "llamacpp:gemma-3-270m"], dtype="bfloat16").member_specs
    assert [(str(s.spec), s.dtype) for s in mixed if isinstance(s, MemberConfig)] == [
        (f"transformers:{ZOO}", "bfloat16"), ("llamacpp:gemma-3-270m", None)]
