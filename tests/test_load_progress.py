"""``eval --no-progress`` (and any engine built with ``progress=False``: a server's, a notebook's chat
model) still printed the zoo's one-time "verifying ... .gguf" bar where a model's hash stamp was stale
or missing: the engine loads its members through the registry, which asks the zoo for progress.
The registry's build is a fake here that verifies a small file as the zoo does (no real model)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import shared_engine.calibration as calibration
import shared_engine.evaluation.cli as eval_cli
import shared_engine.members as members_module
from shared_engine import zoo
from shared_engine.cli import build_parser
from shared_engine.engine import EnsembleEngine
from shared_engine.members import MemberConfig

BAR = "verifying toy.gguf"


class Loaded(Exception):
    """Stops a command once its members are loaded: the answers are not what is tested."""


@pytest.fixture
def gguf(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A member name whose build hashes a file with the progress it is given, as ``zoo.assemble_gguf``
    does for a stale stamp, in a registry of its own."""
    path = tmp_path / "toy.gguf"
    path.write_bytes(b"GGUF" + bytes(4096))

    def build(config: MemberConfig, progress: bool) -> Any:
        zoo._sha256_file(path, progress)
        return SimpleNamespace(name="toy", table=object(), model=None)

    monkeypatch.setattr(members_module, "_build", build)
    monkeypatch.setattr(members_module, "_LOADED", {})  # the fakes leave the process's registry as it was
    monkeypatch.setattr(members_module, "_HOLDERS", {})
    return "smollm2-135m-instruct"  # a zoo name: any other is refused before the build


@pytest.mark.parametrize("progress", [True, False])
def test_an_engine_loads_its_members_with_the_progress_it_was_given(gguf: str, progress: bool,
                                                                     capfd: pytest.CaptureFixture[str]) -> None:
    engine = EnsembleEngine([gguf], method="single", progress=progress)
    try:
        assert [m.name for m in engine.members] == ["toy"]
    finally:
        engine.close()
    assert (BAR in capfd.readouterr().err) is progress  # the default (interactive use) keeps the bar


def test_the_default_engine_shows_the_bar(gguf: str, capfd: pytest.CaptureFixture[str]) -> None:
    engine = EnsembleEngine([gguf], method="single")
    try:
        engine.members  # noqa: B018 - loads them
    finally:
        engine.close()
    assert BAR in capfd.readouterr().err


def test_eval_no_progress_shows_no_zoo_bar(gguf: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capfd: pytest.CaptureFixture[str]) -> None:
    async def load_only(engine: EnsembleEngine, *args: Any, **kwargs: Any) -> dict[str, Any]:
        try:
            engine.members  # noqa: B018 - loads them, as evaluate does before the first question
        finally:
            engine.close()
        raise Loaded

    monkeypatch.setattr(eval_cli, "evaluate", load_only)
    argv = ["eval", "--bench", "gsm8k", "--data", "sample", "--models", gguf, "--out", str(tmp_path / "run")]
    with pytest.raises(Loaded):
        eval_cli.run(build_parser().parse_args([*argv, "--no-progress"]))
    assert BAR not in capfd.readouterr().err
    with pytest.raises(Loaded):  # without the flag, as before
        eval_cli.run(build_parser().parse_args([*argv, "--out", str(tmp_path / "run2")]))
    assert BAR in capfd.readouterr().err


def test_calibrate_no_progress_shows_no_zoo_bar(gguf: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                capfd: pytest.CaptureFixture[str]) -> None:
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"question": f"What is {i} + 1?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}"})
                             + "\n" for i in range(6)))
    def load_member(name: str, progress: bool = True, **kwargs: Any) -> Any:
        members_module.load_member(name, progress)  # the fake build above, with what calibrate passes
        raise Loaded

    monkeypatch.setattr(calibration, "load_member", load_member)
    with pytest.raises(Loaded):
        calibration.calibrate([gguf, "other"], "gsm8k", str(train), limit=1, progress=False)
    assert BAR not in capfd.readouterr().err


def test_progress_shown_nests_and_keeps_pip_notices(capfd: pytest.CaptureFixture[str]) -> None:
    with zoo.progress_shown(False):
        with zoo.progress_shown(True):  # an inner caller cannot turn a silenced one's output back on
            zoo._log("converting", True)
        zoo._log("running pip", notice=True)  # the environment changes: said anyway
    zoo._log("after", True)
    err = capfd.readouterr().err
    assert "converting" not in err and "running pip" in err and "after" in err
