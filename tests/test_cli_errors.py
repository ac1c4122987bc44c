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
