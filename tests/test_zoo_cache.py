"""The zoo's cache as several processes and users share it: the assembly lock, leftovers of killed
assemblies, file modes and a new pin's re-assembly. Fake zoo specs (tests/test_zoo.py's), a temporary
cache, pip faked: fast."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from shared_engine import zoo
from shared_engine.zoo import ZooError, ZooSpec, assemble_gguf
from tests.test_zoo import CHUNKS, PAYLOAD, _fake_packages, _fake_spec


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV, str(root))
    return root


@pytest.fixture
def fake_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path) -> ZooSpec:
    return _fake_spec(_fake_packages(tmp_path, monkeypatch, CHUNKS), PAYLOAD)


def held(lock: Path) -> bool:
    """Whether another open file description holds ``lock`` (as another process would see it)."""
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def uninstalled(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: ZooSpec, pip_s: float = 0.0) -> list[str]:
    """Move the spec's part packages out of sys.path; pip (faked) puts them back after ``pip_s``
    seconds. Returns a log of pip's and the assembly's starts and ends."""
    site = tmp_path / "site"
    staged = tmp_path / "staged"
    shutil.move(site, staged)
    site.mkdir()
    log: list[str] = []

    def fake_pip(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        log.append("pip")
        time.sleep(pip_s)
        shutil.copytree(staged, site, dirs_exist_ok=True)
        log.append("pip done")
        return subprocess.CompletedProcess(command, 0, "", "")

    concatenate = zoo._concatenate

    def logged(*args: Any, **kwargs: Any) -> None:
        log.append("assemble")
        concatenate(*args, **kwargs)

    monkeypatch.setattr(zoo.subprocess, "run", fake_pip)
    monkeypatch.setattr(zoo, "_concatenate", logged)
    return log


# ------------------------------------------------------------------------ the assembly lock


def test_pip_and_the_assembly_run_under_the_models_assembly_lock(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_spec: ZooSpec, tmp_cache: Path
) -> None:
    """Two processes loading one zoo model on llama.cpp (gguf_path) both ran pip into the venv and
    both assembled the GGUF at once: assemble_gguf took no lock."""
    lock = tmp_cache / "locks" / "gguf-fake-model.lock"
    seen: list[bool] = []
    uninstalled(tmp_path, monkeypatch, fake_spec)
    pip, concatenate = zoo.subprocess.run, zoo._concatenate
    monkeypatch.setattr(zoo.subprocess, "run", lambda *a, **k: (seen.append(held(lock)), pip(*a, **k))[1])
    monkeypatch.setattr(zoo, "_concatenate", lambda *a, **k: (seen.append(held(lock)), concatenate(*a, **k))[1])
    monkeypatch.setitem(zoo.ZOO, fake_spec.name, fake_spec)
    assert zoo.gguf_path(fake_spec.name, progress=False).read_bytes() == PAYLOAD
    assert seen == [True, True]
    assert not held(lock)  # and let go


def test_concurrent_first_loads_install_and_assemble_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fake_spec: ZooSpec, tmp_cache: Path
) -> None:
    log = uninstalled(tmp_path, monkeypatch, fake_spec, pip_s=0.3)
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(assemble_gguf(fake_spec, progress=False)))
               for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert log == ["pip", "pip done", "assemble"]  # the second waited, then found it all done
    assert len(paths) == 2 and paths[0] == paths[1] and paths[0].read_bytes() == PAYLOAD


def test_resolve_takes_both_locks_without_deadlock(fake_spec: ZooSpec, tmp_cache: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """_resolve_spec holds the model's conversion lock while it assembles under the assembly lock."""
    monkeypatch.setattr(zoo, "_dequantize_to", lambda gguf, out, progress: (out / "config.json").write_text("{}"))
    assert (zoo._resolve_spec(fake_spec, progress=False).path / ".complete").is_file()


# ------------------------------------------------------------------ leftovers of a killed run


def test_a_killed_assemblys_partial_file_is_removed(fake_spec: ZooSpec, tmp_cache: Path) -> None:
    """A killed assembly (SIGTERM, SIGKILL, power loss) left its hidden .partial temp file, the size
    of the model, in cache/gguf for good."""
    gguf = tmp_cache / "gguf"
    gguf.mkdir(parents=True)
    leftovers = [gguf / ".fake-model.gguf.k1ll3d.partial", gguf / ".fake-model.gguf.0ther.partial"]
    for leftover in leftovers:
        leftover.write_bytes(b"GGUF" + b"\0" * 1000)
    other = gguf / ".other-model.gguf.x.partial"  # another model's: its own lock guards it
    other.write_bytes(b"x")
    path = assemble_gguf(fake_spec, progress=False)
    assert sorted(p.name for p in gguf.iterdir()) == sorted([path.name, f"{path.name}.sha256", other.name])


# ---------------------------------------------------------------------------- file modes


@pytest.fixture
def umask() -> Iterator[Any]:
    previous = os.umask(0o022)
    try:
        yield os.umask
    finally:
        os.umask(previous)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize("mask", [0o022, 0o027])
def test_cache_files_follow_the_umask(mask: int, umask: Any, fake_spec: ZooSpec, tmp_cache: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """mkstemp / mkdtemp made the assembled GGUF 0600 and the hf/ and tokenizers/ folders 0700
    whatever the umask: a cache shared by a group (or a server's user) was unreadable to the others."""
    umask(mask)

    def dequantize(gguf: Path, out: Path, progress: bool) -> None:
        (out / "config.json").write_text("{}")

    class FakeTokenizer:
        @classmethod
        def from_pretrained(cls, *args: object, **kwargs: object) -> FakeTokenizer:
            return cls()

        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "tokenizer.json").write_text("{}")

    monkeypatch.setattr(zoo, "_dequantize_to", dequantize)
    monkeypatch.setattr("transformers.AutoTokenizer", FakeTokenizer)
    monkeypatch.setitem(zoo.ZOO, fake_spec.name, fake_spec)
    tokenizers = zoo.tokenizer_dir(fake_spec.name, progress=False)
    converted = zoo._resolve_spec(fake_spec, progress=False).path
    assert mode(zoo._assembled_path(fake_spec)) == 0o666 & ~mask
    assert mode(converted) == mode(tokenizers) == 0o777 & ~mask
    assert mode(converted / "config.json") == mode(tokenizers / "tokenizer.json") == 0o666 & ~mask


# --------------------------------------------------------------------------------- a new pin


def test_a_new_pin_is_assembled_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path) -> None:
    """A new package release (new parts, size and sha256) failed with 'Delete it and it will be
    re-assembled': the old assembled file failed the new pin's check."""
    old = _fake_spec(_fake_packages(tmp_path / "v1", monkeypatch, CHUNKS), PAYLOAD)
    assert assemble_gguf(old, progress=False).read_bytes() == PAYLOAD
    chunks = [b"GGUF" + os.urandom(2 * 1024 * 1024), os.urandom(77)]
    new = _fake_spec(_fake_packages(tmp_path / "v2", monkeypatch, chunks), b"".join(chunks))
    path = assemble_gguf(new, progress=False)
    assert path == zoo._assembled_path(old) and path.read_bytes() == b"".join(chunks)
    assert json.loads(zoo._stamp_path(new).read_text())[-1]["sha256"] == new.sha256
    assert assemble_gguf(new, progress=False) == path  # stamped: nothing assembled again
    assert hashlib.sha256(path.read_bytes()).hexdigest() == new.sha256


def test_a_stale_file_raises_only_if_its_new_assembly_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path
) -> None:
    damaged = _fake_spec(_fake_packages(tmp_path, monkeypatch, CHUNKS), PAYLOAD, sha256="0" * 64)
    target = zoo._assembled_path(damaged)
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD)  # right size, not the pinned sha256; the parts do not match it either
    with pytest.raises(ZooError, match="assembled from parts.*sha256 mismatch") as info:
        assemble_gguf(damaged, progress=False)
    assert "reinstall them" in str(info.value)
    assert target.read_bytes() == PAYLOAD  # the failed assembly replaced nothing
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


# ------------------------------------------------------------------- the tokenizer alone


def write_gguf(path: Path, vocab_size: int | None = None) -> Path:
    """A GGUF header as llama.cpp's converter writes it (the gguf package's writer), no tensors."""
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_name("tiny")
    writer.add_context_length(8192)
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list([f"tok{i}" for i in range(300)] + ["héllo", ""])
    writer.add_token_types([1] * 302)
    writer.add_token_merges(["t o", "to k"])
    writer.add_array("test.nested", [[1, 2], [3]])
    writer.add_eos_token_id(2)
    writer.add_bos_token_id(1)
    if vocab_size is not None:
        writer.add_vocab_size(vocab_size)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_gguf_metadata_reads_the_header_as_the_gguf_package_does(tmp_path: Path) -> None:
    from gguf import GGUFReader

    path = write_gguf(tmp_path / "tiny.gguf")
    metadata = zoo.gguf_metadata(path)
    fields = {k: f for k, f in GGUFReader(str(path)).fields.items() if not k.startswith("GGUF.")}  # its own
    assert list(metadata) == list(fields)
    for key, field in fields.items():
        if key == "test.nested":  # the reader flattens an array of arrays; it holds 2
            assert metadata[key] == 2
            continue
        value = field.contents()
        assert metadata[key] == (len(value) if isinstance(value, list) else value), key
    assert metadata["tokenizer.ggml.tokens"] == 302 and metadata["llama.context_length"] == 8192
    (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(ZooError, match="not a GGUF file"):
        zoo.gguf_metadata(tmp_path / "not.gguf")
    (tmp_path / "cut.gguf").write_bytes(path.read_bytes()[:200])
    with pytest.raises(ZooError, match="unreadable GGUF header"):
        zoo.gguf_metadata(tmp_path / "cut.gguf")


@pytest.mark.parametrize("vocab_size", [None, 320])
def test_tokenizer_info_needs_no_conversion(vocab_size: int | None, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch, tmp_cache: Path) -> None:
    """llama.cpp members read their tokenizer through zoo.resolve: the full fp32 conversion (15-45 s,
    ~2 GB for Qwen), silent, for a tokenizer. tokenizer_info gives what they need from the GGUF."""
    payload = write_gguf(tmp_path / "model.gguf", vocab_size).read_bytes()
    spec = _fake_spec(_fake_packages(tmp_path, monkeypatch, [payload]), payload)
    monkeypatch.setitem(zoo.ZOO, spec.name, spec)
    read: list[str] = []

    class FakeTokenizer:
        @classmethod
        def from_pretrained(cls, folder: str, gguf_file: str) -> FakeTokenizer:
            read.append(gguf_file)
            return cls()

        def save_pretrained(self, folder: Path) -> None:
            (Path(folder) / "tokenizer.json").write_text("{}")

    def no_conversion(*args: object, **kwargs: object) -> None:
        raise AssertionError("the weights must not be converted for a tokenizer")

    monkeypatch.setattr("transformers.AutoTokenizer", FakeTokenizer)
    monkeypatch.setattr(zoo, "_convert", no_conversion)
    info = zoo.tokenizer_info(spec.name, progress=False)
    assert info.path == tmp_cache / "tokenizers" / spec.name and (info.path / "tokenizer.json").is_file()
    assert info.eos_token_ids == {2} and info.context_length == 8192
    assert info.vocab_size == (vocab_size or 302)
    assert zoo.tokenizer_info(spec.name, progress=False) == info and len(read) == 1  # cached
    with pytest.raises(zoo.UnknownModelError):
        zoo.tokenizer_info("no-such-model")


@pytest.mark.zoo
@pytest.mark.parametrize("name", sorted(zoo.ZOO))
def test_tokenizer_info_agrees_with_the_converted_model(name: str) -> None:
    """The numbers the GGUF's header gives are those the conversion wrote (the user's cache)."""
    info = zoo.tokenizer_info(name, progress=False)
    converted = zoo.resolve(name, progress=False).path
    config = json.loads((converted / "config.json").read_text())
    generation = json.loads((converted / "generation_config.json").read_text())
    eos = generation.get("eos_token_id", config.get("eos_token_id"))
    assert info.eos_token_ids == frozenset(eos if isinstance(eos, list) else [eos])
    assert info.vocab_size == config["vocab_size"]
    assert info.context_length == config["max_position_embeddings"]
