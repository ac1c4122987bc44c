"""An in-process llama.cpp server's life: a GGUF it cannot load is refused by name, and closing a
member waits for its calls still running (a cancelled request's) instead of dropping the server
under them, off the event loop when an engine lets go of it."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from shared_engine.errors import InvalidRequestError
from shared_engine.members import load_member
from shared_engine.members.llamacpp import LocalLlamaServer
from tests import toy

# ------------------------------------------------------------------ a GGUF llama.cpp cannot load


def _garbage(tmp_path: Path) -> Path:
    path = tmp_path / "bad.gguf"
    path.write_bytes(b"GGUF garbage" * 10)
    return path


def test_a_gguf_llamacpp_cannot_read_is_refused_naming_the_file(tmp_path: Path) -> None:
    """llama.cpp's own error says only "Failed to init server, please check the input params"."""
    bad = _garbage(tmp_path)
    with pytest.raises(InvalidRequestError, match="is not a readable GGUF file") as raised:
        LocalLlamaServer(bad, n_ctx=64, threads=1, slots=1)
    assert str(bad) in str(raised.value) and "\n" not in str(raised.value)
    headless = tmp_path / "empty.gguf"
    headless.write_bytes(b"")
    with pytest.raises(InvalidRequestError, match="is not a readable GGUF file") as raised:
        LocalLlamaServer(headless, n_ctx=64, threads=1, slots=1)
    assert str(headless) in str(raised.value)


def test_a_gguf_whose_header_reads_but_llamacpp_cannot_load_is_refused_naming_the_file(tmp_path: Path) -> None:
    """A header and nothing after it (no architecture, no tensors): the header check passes, llama.cpp fails."""
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 0))
    with pytest.raises(InvalidRequestError, match="could not load") as raised:
        LocalLlamaServer(cut, n_ctx=64, threads=1, slots=1)
    assert str(cut) in str(raised.value) and "xllamacpp" in str(raised.value)


def test_a_bad_gguf_with_an_explicit_tokenizer_is_one_error_naming_the_file(tmp_path: Path) -> None:
    """``llamacpp:/path/bad.gguf#TOKENIZER``: the tokenizer loads (it is not read from the GGUF), so
    only llama.cpp met the file: a 51-line traceback ending in ``RuntimeError: Failed to init server``.
    Without ``#TOKENIZER`` the same file was already refused by name (read for its tokenizer)."""
    bad = _garbage(tmp_path)
    folder = tmp_path / "tokenizer"
    toy.TOKENIZERS["byte_level"]().save_pretrained(folder)
    with pytest.raises(InvalidRequestError, match="is not a readable GGUF file") as raised:
        load_member(f"llamacpp:{bad}#{folder}", progress=False)
    assert str(bad) in str(raised.value)
