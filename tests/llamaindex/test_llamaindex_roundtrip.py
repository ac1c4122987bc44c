"""EnsembleLLM's fields describe its engine: pickling and to_dict/to_json rebuild the same LLM, a
string is not a member list, and the fields that built the engine cannot change under it (toy
members, seconds)."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Iterator

import pytest
from pydantic import ValidationError

from llamaindex_ensemble import EnsembleLLM
from shared_engine import EnsembleEngine, InvalidRequestError, MemberConfig
from tests.toy import registered_members, toy_member


@pytest.fixture(scope="module")
def names() -> Iterator[list[str]]:
    toys = [toy_member("toy-li-trip-a", "byte_level"), toy_member("toy-li-trip-b", "metaspace", seed=1)]
    with registered_members(toys) as registered:
        yield registered


def test_an_llm_over_member_configs_survives_pickle_and_to_dict(names: list[str]) -> None:
    """Both wrote ``models`` beside ``members``, which ``__init__`` refused: the unpickled LLM
    (``IngestionPipeline(num_workers=N)`` pickles it) said it was closed, ``from_dict`` raised."""
    llm = EnsembleLLM(members=[MemberConfig(model=names[0]), MemberConfig(model=names[1], device="cpu")],
                      method="every-token", max_tokens=2, plausibility=0.25)
    for again in (pickle.loads(pickle.dumps(llm)), EnsembleLLM.from_dict(llm.to_dict()),
                  EnsembleLLM.from_json(llm.to_json())):
        assert again.models == names and again.members is not None and again.members[1].device == "cpu"
        assert again.engine is not llm.engine and again.engine.options.plausibility == 0.25
        assert again.complete("Hi").raw is not None
    with pytest.raises(InvalidRequestError, match="not both"):  # other models than the members: ambiguous
        EnsembleLLM(models=[names[1], names[0]], members=[MemberConfig(model=m) for m in names])


def test_no_members_says_what_to_give() -> None:
    with pytest.raises(InvalidRequestError, match=r"give models=\[names\] or members="):
        EnsembleLLM()


def test_pickling_logs_no_warning(names: list[str], caplog: pytest.LogCaptureFixture) -> None:
    """LlamaIndex's own ``__getstate__`` tried to pickle the engine and logged "Removing unpickleable
    private attribute _engine" (and _shared) on every pickle: each IngestionPipeline worker's."""
    with caplog.at_level(logging.WARNING):
        back = pickle.loads(pickle.dumps(EnsembleLLM(models=names)))
    assert not caplog.records and back.complete("hi", max_tokens=2).text


def test_a_failed_rebuild_on_unpickling_surfaces() -> None:
    """LlamaIndex's ``__setstate__`` fell back, on any error, to an LLM without an engine (closed)."""
    state = EnsembleLLM(models=["a", "b"]).__getstate__()
    state["__dict__"]["method"] = "bogus"
    fresh = EnsembleLLM.__new__(EnsembleLLM)
    with pytest.raises(InvalidRequestError, match="method"):
        fresh.__setstate__(state)


def test_an_llm_over_built_members_refuses_pickling(names: list[str]) -> None:
    """Unpickling rebuilds from names, which a built member (not in the registry) does not have."""
    llm = EnsembleLLM(models=[toy_member("toy-li-unregistered", "byte_level"), names[1]])
    with pytest.raises(InvalidRequestError, match="toy-li-unregistered.*cannot be pickled"):
        pickle.dumps(llm)


@pytest.mark.parametrize("build", [
    pytest.param(lambda: EnsembleLLM(models="toy-a,toy-b"), id="llm-models"),
    pytest.param(lambda: EnsembleLLM(members="toy-a,toy-b"), id="llm-members"),
    pytest.param(lambda: EnsembleEngine("toy-a,toy-b"), id="engine"),
])
def test_a_string_is_not_a_member_list(build: object) -> None:
    """``models="a,b"`` (as on the CLI) was one member per character: safe(t+o+y+...), failing on
    the first call with "unknown model 't'"."""
    with pytest.raises(InvalidRequestError, match=r"list of names, e\.g\. \['toy-a', 'toy-b'\]"):
        build()  # type: ignore[operator]


@pytest.mark.parametrize("field, value", [
    ("method", "adafuse"), ("models", ["x", "y"]), ("members", None),
    ("engine_options", {"draft_length": 2}), ("member_options", {"dtype": "float32"}),
])
def test_the_fields_that_built_the_engine_are_frozen(field: str, value: object) -> None:
    """Assigning one was accepted: ``model_name`` changed, the engine ran the original ensemble."""
    llm = EnsembleLLM(models=["a", "b"], method="every-token", max_tokens=4)
    with pytest.raises(ValidationError, match="frozen"):
        setattr(llm, field, value)
    with pytest.raises(InvalidRequestError, match=f"cannot update \\['{field}'\\]"):
        llm.model_copy(update={field: value})
    assert llm.model_name == "every-token(a+b)"
    llm.max_tokens = 8  # per-request fields still change
    clone = llm.model_copy(update={"temperature": 0.5})
    assert (clone.max_tokens, clone.temperature, llm.temperature) == (8, 0.5, 0.0) and clone.engine is llm.engine


@pytest.mark.parametrize("window", [0, -5])
def test_a_context_window_below_one_is_refused(window: int) -> None:
    """-5 was accepted; 0 read as "not given" and loaded the members to find one."""
    with pytest.raises(InvalidRequestError, match="context_window must be at least 1"):
        EnsembleLLM(models=["a", "b"], context_window=window)


@pytest.mark.parametrize("window", [0, -5])
def test_a_context_window_below_one_is_refused_after_construction_too(window: int) -> None:
    """``llm.context_window = -5`` and ``model_copy(update={"context_window": 0})`` were accepted, and
    LlamaIndex's prompt helper then used -5 (0 read as "not given": it loaded the members)."""
    llm = EnsembleLLM(models=["a", "b"], context_window=64)
    with pytest.raises(InvalidRequestError, match=f"context_window must be at least 1, got {window}"):
        llm.context_window = window
    with pytest.raises(InvalidRequestError, match=f"context_window must be at least 1, got {window}"):
        llm.model_copy(update={"context_window": window})
    assert llm.metadata.context_window == 64
    llm.context_window = 32  # a valid one, or None (the members' own), still goes
    assert llm.model_copy(update={"context_window": None}).context_window is None
    assert llm.metadata.context_window == 32


def test_to_json_refuses_an_api_key_with_a_readable_error() -> None:
    """A member with ``http.api_key`` made to_json() raise "Object of type SecretStr is not JSON
    serializable"; writing the masked '**********' would be refused by the server (401) later."""
    keyed = MemberConfig(model="vllm:http://127.0.0.1:9/v1#toy-key", http={"api_key": "sk-real", "retries": 0})
    llm = EnsembleLLM(members=[keyed, MemberConfig(model="vllm:http://127.0.0.1:9/v1#toy-other")])
    with pytest.raises(InvalidRequestError, match=r"api_key.*toy-key.*to_dict\(\) or pickle") as caught:
        llm.to_json()
    assert isinstance(caught.value, ValueError) and "sk-real" not in str(caught.value)
    again = EnsembleLLM.from_dict(llm.to_dict())  # these keep the key
    assert again.members is not None and again.members[0].http is not None
    assert again.members[0].http.api_key is not None and again.members[0].http.api_key.get_secret_value() == "sk-real"
    plain = EnsembleLLM(members=[MemberConfig(model="vllm:http://127.0.0.1:9/v1#toy-key", http={"retries": 0}),
                                 MemberConfig(model="vllm:http://127.0.0.1:9/v1#toy-other")])
    assert EnsembleLLM.from_json(plain.to_json()).members == plain.members
