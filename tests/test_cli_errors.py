"""A mistyped flag or value gives one readable ``error:`` line (and where to look), not argparse's
usage block above it: in every subcommand, nested ones too. No models are loaded."""

from __future__ import annotations

import pytest

from shared_engine.cli import build_parser


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
