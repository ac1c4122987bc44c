"""``safe-ensemble bench`` at its edges, on toy members: bad ``--data`` files, Ctrl-C while measuring,
``--drafter auto`` and ``--methods`` entries holding commas."""

from __future__ import annotations

import json
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


def interrupt_after(monkeypatch: pytest.MonkeyPatch, answers: int) -> None:
    """Ctrl-C while the engines answer: the ``answers + 1``-th answer raises KeyboardInterrupt."""
    from shared_engine import EnsembleEngine as Engine

    generate, calls = Engine.generate, []

    def interrupted(self: Engine, prompt: object, **params: object) -> object:
        if params.get("max_new_tokens") != 4:  # not the warm-up
            calls.append(1)
            if len(calls) > answers:
                raise KeyboardInterrupt
        return generate(self, prompt, **params)  # type: ignore[arg-type]

    monkeypatch.setattr(Engine, "generate", interrupted)


def test_ctrl_c_keeps_the_prompts_measured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Ctrl-C during bench threw every measurement away: exit 130, nothing printed, --json not written."""
    from tests.toy import registered_members, toy_member

    interrupt_after(monkeypatch, 5)  # 2 prompts x 2 methods, then 1 answer of the third prompt
    out = tmp_path / "bench.json"
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        rc = main(["bench", "--models", "a,b", "--prompts", "4", "--max-new-tokens", "3", "--methods", "single,safe",
                   "--json", str(out)])
    captured = capsys.readouterr()
    assert rc == 130 and "interrupted: the results above" in captured.err
    printed = json.loads(captured.out)
    assert printed == json.loads(out.read_text())
    assert printed["interrupted"] is True and printed["prompts"] == 2 and printed["prompts_asked"] == 4
    assert set(printed["methods"]) == {"single", "safe"}  # whole prompts only: both methods over the same two
    assert printed["methods"]["safe"]["per_prompt_vs_single"]["prompts"] == 2


def test_ctrl_c_before_any_prompt_is_measured_still_stops(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    from tests.toy import registered_members, toy_member

    interrupt_after(monkeypatch, 1)  # within the first prompt: nothing whole to report
    out = tmp_path / "bench.json"
    with registered_members([toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]):
        rc = main(["bench", "--models", "a,b", "--prompts", "2", "--max-new-tokens", "3", "--methods", "single,safe",
                   "--json", str(out)])
    assert rc == 130 and not out.exists() and capsys.readouterr().out == ""


def test_drafter_auto_runs_single_on_the_first_member() -> None:
    """``bench --drafter auto`` (documented in --help) failed the default methods: "method 'single' runs
    one member (name it with drafter=)"."""
    from shared_engine.bench import run_bench
    from tests.test_bench_cli import bench_args, members
    from tests.toy import registered_members

    with registered_members(members()):
        results = run_bench(bench_args("--methods", "single,safe", "--drafter", "auto"))
    assert results["methods"]["single"]["drafter"] == "a" and results["methods"]["safe"]["drafter"] == "auto"
    assert "single_drafter_note" in results and "drafter_note" not in results


def test_a_methods_entry_may_hold_commas_in_a_flag_value() -> None:
    """``--methods single,safe:weights=2,1`` failed with "unknown method '1'" (split at every comma)."""
    from shared_engine.bench import method_entries, parse_method
    from tests.test_bench_cli import bench_args

    assert method_entries("single,safe:weights=2,1,every-token") == ["single", "safe:weights=2,1", "every-token"]
    assert method_entries("single, safe") == ["single", "safe"]
    method, args = parse_method("safe:weights=2,1", bench_args())
    assert method == "safe" and args.weights == [2.0, 1.0]
