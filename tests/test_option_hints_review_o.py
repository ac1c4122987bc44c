"""Review o of 9554cc9's member-option hints: an engine-wide name mistyped (torch_dtype, slot, compiled) was
told to go per member (members=[MemberConfig(..., dtype=...)]) though EnsembleEngine(dtype=...) takes it; per
request, such a name (exact or misspelt) got the per-member hint or none, where it is an engine option."""

from __future__ import annotations

import pytest

from shared_engine.errors import InvalidParametersError
from shared_engine.options import EngineOptions, GenerationParams, validated


@pytest.mark.parametrize("name, meant", [("torch_dtype", "dtype"), ("slot", "slots"), ("compiled", "compile"),
                                         ("devices", "device")])
def test_a_mistyped_engine_wide_name_is_pointed_at_the_engine_keyword(name: str, meant: str) -> None:
    with pytest.raises(InvalidParametersError) as caught:
        validated(EngineOptions, **{name: 1})
    assert f"did you mean {meant!r}?)" in str(caught.value) and "per member" not in str(caught.value)


@pytest.mark.parametrize("name, meant", [("dtype", "dtype"), ("torch_dtype", "dtype"), ("top_kk", "top_k")])
def test_an_engine_wide_name_given_per_request_is_an_engine_option(name: str, meant: str) -> None:
    with pytest.raises(InvalidParametersError) as caught:
        validated(GenerationParams, **{name: 1})
    assert f"{meant} is an engine option: EnsembleEngine(..., {meant}=...)" in str(caught.value)


def test_member_only_names_keep_the_per_member_hint() -> None:
    with pytest.raises(InvalidParametersError) as caught:
        validated(EngineOptions, n_ctxx=1)
    assert "did you mean 'n_ctx'?" in str(caught.value) and "per member" in str(caught.value)
