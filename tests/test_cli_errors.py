"""A mistyped flag or value gives one readable ``error:`` line (and where to look), not argparse's
usage block above it: in every subcommand, nested ones too. No models are loaded."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared_engine.cli import build_parser
from shared_engine.errors import InvalidRequestError


@pytest.mark.parametrize("argv", [
    ["run", "--models", "a,b", "--method", "nonsense", "hi"],
    ["run", "--models", "a,b", "--weights", "two,1", "hi"],
    ["run", "--models", "a,b", "--weights", "0,0", "hi"],
    ["eval", "--bench", "nonsense", "--models", "a"],
    ["eval", "compare"],
    ["bench", "--models", "a", "--prompts", "many"],
    ["nonsense"],
])
def test_a_usage_error_is_one_line_with_a_pointer_to_help(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        build_parser().parse_args(argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("safe-ensemble") and ": error: " in lines[0] and lines[0].endswith("lists the options)")


def test_serve_with_one_model_runs_it_alone_as_run_eval_and_bench_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """``serve --models ONE`` failed ("needs at least two members") where run / eval / bench use single."""
    from shared_engine.server import command

    methods: list[str] = []

    def stop(args: object, method: str) -> None:
        methods.append(method)
        raise KeyboardInterrupt  # nothing loads: the method is all this checks

    monkeypatch.setattr(command, "engine_from_args", stop)
    for models, expected in (("a", "single"), ("a,b", "safe")):
        args = build_parser().parse_args(["serve", "--models", models, "--port", "0"])
        with pytest.raises(KeyboardInterrupt):
            command.run(args)
        assert methods[-1] == expected


def test_placement_flags_follow_the_engines_rule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--device cuda:3`` beside a members file whose every transformers member sets its own device ran
    every member where it said, silently; ``--device cpu`` for llama.cpp members (where they run anyway)
    is no error, as in the engine (members.config.placement_unused_on)."""
    from shared_engine.cli import main
    from shared_engine.member_flags import member_configs

    members = tmp_path / "members.yaml"
    members.write_text("- {model: smollm2-135m-instruct, backend: transformers, device: cpu}\n"
                       "- llamacpp:gemma-3-270m\n")
    parse = build_parser().parse_args
    with pytest.raises(InvalidRequestError, match=r"^--device: only for transformers members that set none of "
                                                  r"their own, and every transformers member here sets its own "
                                                  r"device \(smollm2-135m-instruct: device='cpu'\) \(drop the flag"):
        member_configs(parse(["run", "--members", str(members), "--device", "cuda:3", "hi"]))
    # --dtype fills the member's unset dtype: it is used, --device is still refused alone
    with pytest.raises(InvalidRequestError, match="^--device: "):
        member_configs(parse(["run", "--members", str(members), "--device", "cuda:3", "--dtype", "bfloat16", "hi"]))
    assert main(["run", "--members", str(members), "--device", "cuda:3", "--max-new-tokens", "1", "hi"]) == 2
    assert capsys.readouterr().err.startswith("error: --device: only for transformers members that set none")
    same = member_configs(parse(["run", "--members", str(members), "--device", "cpu", "hi"]))
    assert [(c.spec.backend, c.device) for c in same] == [("transformers", "cpu"), ("llamacpp", None)]
    llama = member_configs(parse(["run", "--models", "llamacpp:x,llamacpp:y", "--device", "cpu", "hi"]))
    assert [c.spec.backend for c in llama] == ["llamacpp", "llamacpp"]
    with pytest.raises(InvalidRequestError, match="^--dtype: only for transformers members, and every member here "
                                                  "runs on llamacpp"):
        member_configs(parse(["run", "--models", "llamacpp:x", "--device", "cpu", "--dtype", "float32", "hi"]))
