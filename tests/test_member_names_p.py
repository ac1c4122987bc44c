"""Members given distinct names go by them (p, remote-members hunt F1): two replicas of one served model (their
members both named after it) given ``MemberConfig.name`` "east" and "west" were refused with "two different members
are both named ...; give them distinct names", which they had. Toy members registered under other names."""

from __future__ import annotations

import pytest

from shared_engine import EnsembleEngine, InvalidRequestError
from shared_engine.members import HFMember, MemberConfig, register_member, unregister_member
from tests.toy import byte_level_tokenizer, metaspace_tokenizer, tiny_gpt2, tiny_llama


@pytest.fixture
def two_models_one_name():  # noqa: ANN201 - the registered names
    register_member(HFMember("served", tiny_llama(byte_level_tokenizer(), 0), byte_level_tokenizer()), "toy-east")
    register_member(HFMember("served", tiny_gpt2(metaspace_tokenizer(), 1), metaspace_tokenizer()), "toy-west")
    yield "toy-east", "toy-west"
    unregister_member("toy-east")
    unregister_member("toy-west")


def test_members_named_apart_load_and_label_by_their_names(two_models_one_name: tuple[str, str]) -> None:
    east, west = two_models_one_name
    with EnsembleEngine([MemberConfig(model=east, name="east"), MemberConfig(model=west, name="west")],
                        method="safe") as engine:
        assert engine.labels == ["east", "west"]
        result = engine.generate("Sofia", max_new_tokens=4)
        assert set(result.stats.forward_passes) == {"east", "west"}


def test_one_named_one_not_goes_by_the_name_and_the_models_name(two_models_one_name: tuple[str, str]) -> None:
    east, west = two_models_one_name
    with EnsembleEngine([MemberConfig(model=east, name="east"), west], method="safe") as engine:
        assert engine.labels == ["east", "served"]


def test_two_unnamed_different_models_of_one_name_are_still_refused(two_models_one_name: tuple[str, str]) -> None:
    with EnsembleEngine(list(two_models_one_name), method="safe") as engine, \
            pytest.raises(InvalidRequestError, match="both named 'served'"):
        _ = engine.members
