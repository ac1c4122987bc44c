"""ChatEnsemble's two ``profile``s (langchain-core's ModelProfile and the engine's calibration profile
path), and the shared engine a copy or an edited configuration holds. Toy members only."""

from __future__ import annotations

from pathlib import Path

import pytest
from langchain_core.runnables import ConfigurableField

import langchain_ensemble.chat_models as chat_models
from langchain_ensemble import ChatEnsemble
from shared_engine.profile import EnsembleProfile, FitInfo, profile_digest
from tests.toy import registered_members, toy_member


def _save_profile(path: Path, names: list[str], weights: list[float]) -> Path:
    EnsembleProfile(members=names, weights=weights, drafter=names[1],
                    fitted=FitInfo(bench="gsm8k", data="train.jsonl", questions=1, method="test")).save(path)
    return path


def test_configurable_fields_and_a_model_profile_keep_both_profiles_apart(tmp_path: Path) -> None:
    """LangChain rebuilds a ``configurable_fields`` model with its fields, langchain-core's
    ``profile`` (the ModelProfile dict the model filled) among them: ChatEnsemble read that dict as
    the calibration profile's path (TypeError: expected str ... not dict) on every such call, and
    ``ChatEnsemble(profile={"max_input_tokens": ...})`` the same at construction."""
    toys = [toy_member("lc-twoprof-bpe", "byte_level"), toy_member("lc-twoprof-sp", "metaspace", seed=1)]
    with registered_members(toys) as names:
        path = _save_profile(tmp_path / "profile.json", names, [0.25, 0.75])
        plain = ChatEnsemble(models=names, max_tokens=2)
        assert plain.profile is not None and plain.profile["tool_calling"]  # ChatEnsemble's own ModelProfile
        configurable = plain.configurable_fields(temperature=ConfigurableField(id="temperature"))
        assert configurable.invoke("Hi", config={"configurable": {"temperature": 0.0}}).content == \
            plain.invoke("Hi").content

        given = ChatEnsemble(models=names, max_tokens=2, profile={"max_input_tokens": 100})
        assert given.profile == {"max_input_tokens": 100} and "profile" not in given.engine_options

        for source in (str(path), path):  # a calibration profile still reaches the engine, rebuilt too
            calibrated = ChatEnsemble(models=names, max_tokens=2, profile=source)
            assert calibrated.engine_options == {"profile": source} and calibrated.profile is not None
            rebuilt = calibrated.configurable_fields(temperature=ConfigurableField(id="t"))
            config = {"configurable": {"t": 0.0}}
            for runnable in (rebuilt, rebuilt.bind_tools([{"type": "function", "function": {
                    "name": "f", "parameters": {"type": "object", "properties": {}}}}])):
                weights = runnable.invoke("Hi", config=config).response_metadata["ensemble"]["member_weights"]
                assert weights == {names[0]: 0.25, names[1]: 0.75}
            calibrated.close()
        plain.close()
        given.close()
        assert not [key for key in chat_models._ENGINES if key[0] == tuple(names)]


@pytest.mark.parametrize("profile", [3, ["profile.json"]])
def test_a_profile_neither_path_nor_model_profile_is_the_engines_readable_refusal(profile: object) -> None:
    """``ChatEnsemble(profile=3)`` raised a raw TypeError from reading the profile's digest, where
    EnsembleEngine and EnsembleLLM say what a profile must be."""
    assert profile_digest(profile) == "unreadable"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="profile must be a path to a profile JSON"):
        ChatEnsemble(models=["qwen2.5-coder-0.5b-instruct", "smollm2-135m-instruct"], profile=profile)



def test_a_copy_with_other_engine_options_or_edited_options_holds_its_own_engine() -> None:
    """``model_copy(update={"engine_options": ...})`` copies (and holds the original's engine) before
    it updates, and an edited ``engine_options`` is read at the next call: the engine built for the new
    configuration was held by no one, so ``close()`` and collection never closed it (its members
    stayed loaded), while the copy counted itself a user of the original's engine until it went."""
    toys = [toy_member("lc-move-bpe", "byte_level"), toy_member("lc-move-sp", "metaspace", seed=1)]
    with registered_members(toys) as names:
        llm = ChatEnsemble(models=names, max_tokens=2, weights=[2, 1])
        original = chat_models._engine_key(*llm._engine_config())
        copy = llm.model_copy(update={"engine_options": {"weights": [1, 3]}})
        assert copy.invoke("Hi").response_metadata["ensemble"]["member_weights"] == {names[0]: 0.25, names[1]: 0.75}
        moved = chat_models._engine_key(*copy._engine_config())
        assert (chat_models._ENGINES[original].users, chat_models._ENGINES[moved].users) == (1, 1)
        copy.close()
        assert moved not in chat_models._ENGINES and chat_models._ENGINES[original].users == 1

        llm.engine_options["weights"] = [3, 1]  # edited in place: the next call moves this model too
        assert llm.invoke("Hi").response_metadata["ensemble"]["member_weights"] == {names[0]: 0.75, names[1]: 0.25}
        assert original not in chat_models._ENGINES
        edited = chat_models._engine_key(*llm._engine_config())
        assert chat_models._ENGINES[edited].users == 1
        llm.close()
        assert not [key for key in chat_models._ENGINES if key[0] == tuple(names)]
