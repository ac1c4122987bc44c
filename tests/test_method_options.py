"""Options only some methods read (options.METHOD_OPTIONS): set for another method they were accepted and
dropped silently (adafuse with fusion="gac", every-token with drafter_confidence, safe with max_words ran
exactly as without them). EngineOptions now warns, naming the option, the method and the methods that
read it; options left at their default, or given as the method's default (the CLI passes every flag's
default), and options the method reads give no warning."""

from __future__ import annotations

import argparse
import warnings
from typing import Any

import pytest

from shared_engine import EnsembleEngine
from shared_engine.options import METHODS, EngineOptions
from tests.toy import toy_member


def _warnings(**options: Any) -> list[str]:
    """The messages of the warnings building ``EngineOptions(**options)`` gives."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        EngineOptions(**options)
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning)]


@pytest.mark.parametrize(("method", "option", "value"), [
    ("adafuse", "fusion", "gac"), ("adafuse", "plausibility", 0.1), ("adafuse", "sharpen", "heur"),
    ("adafuse", "drafter_confidence", 0.9), ("adafuse", "gate_threshold", 0.2), ("adafuse", "top_k", 1),
    ("every-token", "drafter_confidence", 0.9), ("every-token", "gate_threshold", 0.2),
    ("every-token", "threshold", 0.1), ("every-token", "vote", "uncertain"),
    ("gac-threshold", "drafter_confidence", 0.9), ("gac-threshold", "draft_length", 3),
    ("safe", "gate_threshold", 0.2), ("safe", "max_words", 1), ("safe", "num_candidates", 1),
    ("single", "fusion", "gac"), ("single", "overlap", "on"),
])
def test_an_option_the_method_does_not_read_warns(method: str, option: str, value: object) -> None:
    messages = _warnings(method=method, **{option: value})
    assert len(messages) == 1, messages
    assert f"method {method!r} does not read {option}={value!r}" in messages[0]
    assert "ignored" in messages[0]


def test_the_message_names_every_ignored_option_and_who_reads_it() -> None:
    messages = _warnings(method="every-token", drafter_confidence=0.9, gate_threshold=0.2, vote="uncertain",
                         plausibility=0.1)  # plausibility: read by every-token, not named
    assert len(messages) == 1, messages  # one warning for all of them
    message = messages[0]
    assert "drafter_confidence=0.9 (read by safe)" in message
    assert "gate_threshold=0.2 (read by gac-threshold)" in message
    assert "vote='uncertain' (read by adafuse)" in message
    assert "plausibility" not in message


@pytest.mark.parametrize("method", METHODS)
def test_defaults_give_no_warning(method: str) -> None:
    assert _warnings(method=method) == []


@pytest.mark.parametrize(("method", "options"), [
    ("safe", {"drafter_confidence": 0.9, "draft_length": 3, "draft_schedule": "fixed", "overlap": "on",
              "fusion": "gac", "sharpen": None, "plausibility": 0.1, "top_k": 5}),
    ("every-token", {"fusion": "gac", "sharpen": "heur", "plausibility": 0.1, "top_k": 5}),
    ("gac-threshold", {"gate_threshold": 0.2, "fusion": "unite", "sharpen": "heur", "plausibility": 0.1}),
    ("adafuse", {"uncertainty": "entropy", "threshold": 0.3, "max_words": 2, "num_candidates": 2,
                 "candidate_temperature": 0.5, "vote": "uncertain", "weights": [2.0, 1.0], "drafter_weight": 3.0}),
    ("single", {"draft_length": 3, "drafter": 1}),
])
def test_options_the_method_reads_give_no_warning(method: str, options: dict[str, Any]) -> None:
    assert _warnings(method=method, **options) == []


@pytest.mark.parametrize(("method", "options"), [
    ("safe", {"max_words": 3, "num_candidates": 3, "vote": "always", "gate_threshold": 0.5, "threshold": None}),
    ("adafuse", {"fusion": "unite", "sharpen": None, "top_k": 10, "draft_length": 5, "overlap": "auto"}),
    ("every-token", {"drafter_confidence": None, "draft_schedule": "adaptive", "max_draft_length": 16}),
])
def test_a_default_given_explicitly_gives_no_warning(method: str, options: dict[str, Any]) -> None:
    """A default (the method's: sharpen=None for adafuse) passed explicitly changes nothing either way."""
    assert _warnings(method=method, **options) == []


def test_the_engine_warns_at_construction_naming_the_callers_line() -> None:
    members = [toy_member("toy-bpe", "byte_level"), toy_member("toy-sp", "metaspace", seed=1)]
    with pytest.warns(UserWarning, match=r"method 'adafuse' does not read fusion='gac'") as caught:
        EnsembleEngine(members, method="adafuse", fusion="gac")
    assert [w.filename for w in caught] == [__file__]  # the caller's line, not pydantic's or the engine's


@pytest.mark.parametrize("method", METHODS)
def test_the_cli_defaults_give_no_warning(method: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """``engine_from_args`` passes every flag's default (--max-words 3, --draft-length 5, ...) for any method."""
    from shared_engine import engine as engine_module
    from shared_engine.engine_args import add_engine_args, engine_from_args

    given: dict[str, Any] = {}
    monkeypatch.setattr(engine_module, "EnsembleEngine",
                        lambda members, method, progress, **options: given.update(options, method=method))
    parser = argparse.ArgumentParser()
    add_engine_args(parser)
    args = parser.parse_args(["--models", "smollm2-135m-instruct,gemma-3-270m"])
    engine_from_args(args, method)
    assert "max_words" in given and "draft_length" in given  # the defaults are passed explicitly
    assert _warnings(**given) == []
