"""``safe-ensemble bench`` at its edges, on toy members: bad ``--data`` files, Ctrl-C while measuring,
``--drafter auto`` and ``--methods`` entries holding commas."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared_engine.cli import main


@pytest.mark.parametrize(("text", "says"), [
    ('{"question": "What is 2+2?"}\n{"q": "no question"}\n', "line 2: no \"question\" string"),
    ("# a README\nnot json\n", "line 1: not JSON"),
    ('["a list"]\n', "line 1: no \"question\" string"),
    ("\n\n", "holds no questions"),
])
def test_a_bad_data_file_is_one_error_line(text: str, says: str, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """A non-JSON line or a row without 'question' gave a JSONDecodeError/KeyError traceback."""
    data = tmp_path / "bad.jsonl"
    data.write_text(text)
    assert main(["bench", "--models", "a,b", "--prompts", "3", "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.count("\n") == 1
    assert err.startswith(f"error: {data}") and says in err


def test_blank_lines_in_the_data_are_skipped(tmp_path: Path) -> None:
    from shared_engine.bench import gsm8k_questions

    data = tmp_path / "blank.jsonl"
    data.write_text('{"question": "A?"}\n\n   \n{"question": "B?"}\n{"question": "C?"}\n')
    assert [q.split("\n")[0] for q in gsm8k_questions(str(data), 2)] == ["A?", "B?"]
    data.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(Exception, match="not UTF-8 text"):
        gsm8k_questions(str(data), 2)
