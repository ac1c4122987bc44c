"""The command line's edges, on toy members (fast): Ctrl-C while ``run`` loads, attention kernels and
placement flags that cannot apply, a members file that cannot be read, bench's usage errors. Each is
one ``error:`` line and exit status 2 (130 for Ctrl-C), never a traceback or a flag silently dropped."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared_engine import InvalidRequestError, cli
from shared_engine.cli import build_parser, main
from shared_engine.member_flags import member_configs
from shared_engine.members import MemberConfig
from tests.toy import registered_members, toy_member


def members() -> list:
    return [toy_member("a", "byte_level", "llama", 1), toy_member("b", "metaspace", "gpt2", 2)]


@pytest.fixture
def toy_folders(tmp_path: Path) -> str:
    """Two toy members saved as local Hugging Face folders, as ``--models`` accepts them."""
    paths = []
    for member in members():
        folder = tmp_path / member.name
        member.model.save_pretrained(folder)
        member.tokenizer.save_pretrained(folder)
        paths.append(str(folder))
    return ",".join(paths)


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a failed command printed on stderr (model loading may print progress above it)."""
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip() and "error" in line]
    assert len(lines) == 1, err
    return lines[0]


# -- Ctrl-C while run loads ---------------------------------------------------------------------

@pytest.fixture
def ctrl_c_raises() -> Iterator[None]:
    """Ctrl-C as an interactive run has it: a suite started in the background inherits SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_while_run_loads_its_members_exits_at_once(ctrl_c_raises: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """run loaded in a worker thread: Ctrl-C cancelled the stream, then asyncio.run waited for the load to
    end (a zoo model, a llama.cpp server: up to minutes) before exiting; serve, bench, calibrate stop at once."""
    def slow_load(engine: Any, notice: bool = True) -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(20)

    monkeypatch.setattr(cli, "load_with_notice", slow_load)
    started = time.monotonic()
    with registered_members(members()) as names:
        assert main(["run", "--models", ",".join(names), "--max-new-tokens", "3", "hi"]) == 130
    assert time.monotonic() - started < 10


def test_run_still_streams_an_answer(capsys: pytest.CaptureFixture[str]) -> None:
    with registered_members(members()) as names:
        assert main(["run", "--models", ",".join(names), "--max-new-tokens", "3", "--no-color", "hi"]) == 0
    assert "finish=" in capsys.readouterr().err


# -- attention kernels ----------------------------------------------------------------------------

def test_an_unknown_attention_kernel_is_one_error_line_before_anything_loads(
        toy_folders: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A typo printed transformers' ~60-line traceback (exit 1) once the weights were being read."""
    assert main(["run", "--models", toy_folders, "--attn-implementation", "flash-attention-2", "hi"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1  # no "loading 2 members ..." above it
    assert "unknown attn_implementation 'flash-attention-2'" in err
    file = tmp_path / "members.json"
    file.write_text(json.dumps([{"model": toy_folders.split(",")[0], "attn_implementation": "bogus"}]))
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "--members", str(file), "hi"])
    assert exited.value.code == 2
    assert f"{file}, member 1" in (line := _error_line(capsys)) and "unknown attn_implementation 'bogus'" in line


def test_attention_kernels_transformers_takes_are_accepted() -> None:
    """Not stricter than transformers: its names, paged|, hub kernels and names registered at run time."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    AttentionInterface.register("my_attention", sdpa_attention_forward)
    for name in ("eager", "sdpa", "flex_attention", "flash_attention_3", "paged|eager",
                 "kernels-community/flash-attn", "kernels-community/flash-attn@main:flash_attn", "my_attention"):
        assert MemberConfig(model="m", attn_implementation=name).attn_implementation == name


def test_a_kernel_the_model_cannot_use_names_the_member(toy_folders: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Accepted by name but refused by transformers when it loads (flash_attention_2 not installed, a kernel
    this model does not support): a traceback and exit 1 before, now one line naming the member."""
    assert main(["run", "--models", toy_folders, "--attn-implementation", "flash_attention_9", "--max-new-tokens",
                 "2", "hi"]) == 2
    line = _error_line(capsys)
    assert line.startswith("error: member 'a': attn_implementation='flash_attention_9' cannot be used: ")


# -- placement flags without a transformers member -------------------------------------------------

@pytest.mark.parametrize("argv, flags", [
    (["run", "--models", "smollm2-135m-instruct", "--backend", "llamacpp", "--device", "cuda", "hi"], "--device"),
    (["run", "--models", "llamacpp:smollm2-135m-instruct", "--dtype", "float16", "--compile", "hi"],
     "--dtype, --compile"),
    (["serve", "--models", "vllm:http://127.0.0.1:9/v1", "--attn-implementation", "sdpa"], "--attn-implementation"),
    (["eval", "--bench", "gsm8k", "--models", "llamacpp:x", "--device-map", "auto"], "--device-map"),
])
def test_placement_flags_no_member_can_use_are_refused(argv: list[str], flags: str) -> None:
    """``--backend llamacpp --device cuda`` ran on the CPU with no word (exit 0); a members file's dtype for a
    llama.cpp member was already refused."""
    with pytest.raises(InvalidRequestError, match=f"^{flags}: only for transformers members, and every member "
                                                  "here runs on (llamacpp|vllm)"):
        member_configs(build_parser().parse_args(argv), getattr(build_parser().parse_args(argv), "backend", None))


def test_placement_flags_apply_where_a_member_runs_on_transformers(capsys: pytest.CaptureFixture[str]) -> None:
    parse = build_parser().parse_args
    # a zoo name given placement runs on transformers; a mixed ensemble places its transformers member
    (zoo,) = member_configs(parse(["run", "--models", "smollm2-135m-instruct", "--dtype", "bfloat16", "hi"]))
    assert (zoo.spec.backend, zoo.dtype) == ("transformers", "bfloat16")
    mixed = member_configs(parse(["run", "--models", "llamacpp:x,m", "--device", "cpu", "hi"]))
    assert [(c.spec.backend, c.device) for c in mixed] == [("llamacpp", None), ("transformers", "cpu")]
    # bench measures transformers and llama.cpp in one run: its llama.cpp run is not refused
    both = parse(["bench", "--models", "smollm2-135m-instruct", "--backend", "transformers,llamacpp", "--dtype",
                  "bfloat16"])
    assert member_configs(both, "llamacpp")[0].spec.backend == "llamacpp"
    assert member_configs(parse(["run", "--models", "llamacpp:x", "hi"]))  # no flag: nothing to refuse
    assert main(["run", "--models", "smollm2-135m-instruct", "--backend", "llamacpp", "--dtype", "float16",
                 "hi"]) == 2
    assert _error_line(capsys).startswith("error: --dtype: only for transformers members")


# -- a members file that cannot be read ----------------------------------------------------------

@pytest.mark.parametrize("name, content, says", [
    ("members.json", b'[{"model": "a"},\n  ', "line 2: not valid JSON (Expecting value"),
    ("members.json", b'[{"model": "a"},\n {"model": "caf\xe9"}]', "line 2: not UTF-8 text"),
    ("members.yaml", b"- model: a\n- model: [\n", "line 3: not valid YAML"),
    ("members.yaml", b"- model: a\n- model: caf\xe9\n", "line 2: not UTF-8 text"),
])
def test_a_members_file_that_cannot_be_read_is_named(tmp_path: Path, name: str, content: bytes, says: str,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """A malformed JSON or non-UTF-8 file said only "Expecting value: line 2 column 1 (char 18)" or "'utf-8'
    codec can't decode byte 0xe9 in position 33", naming no file."""
    file = tmp_path / name
    file.write_bytes(content)
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["run", "--members", str(file), "hi"])
    assert exited.value.code == 2
    assert f"--members: {file}, {says}" in _error_line(capsys)


def test_a_members_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    file = tmp_path / "members.json"
    file.write_bytes('\ufeff[{"model": "a", "dtype": "bfloat16"}]'.encode())
    assert build_parser().parse_args(["run", "--members", str(file), "hi"]).members[0].dtype == "bfloat16"


# -- bench usage errors --------------------------------------------------------------------------

@pytest.mark.parametrize("flags, says", [
    (["--methods", "single,safe:draft-length"], "safe-ensemble bench --methods safe:draft-length: error: "
                                                "'draft-length' in --methods is not flag=value"),
    (["--prompts-from", "poetry"], "error: --prompts-from poetry: unknown benchmark 'poetry'"),
])
def test_bench_usage_errors_are_an_error_line_and_exit_2(flags: list[str], says: str,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    """They exited 1 with a bare "bench: ..." line (SystemExit with a message)."""
    with pytest.raises(SystemExit) as exited:
        sys.exit(main(["bench", "--models", "a,b", "--prompts", "1", *flags]))
    assert exited.value.code == 2
    assert _error_line(capsys).startswith(says)
