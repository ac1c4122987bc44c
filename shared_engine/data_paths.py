"""Where benchmark questions come from.

The full benchmark data (``$SAFE_ENSEMBLE_DATA``, or ``../shared/data`` beside the repository) is used
whenever it is there; a fresh clone has none, so ``safe-ensemble bench`` and the tests that need a few
questions fall back to a GSM8K sample shipped inside the package (``sample_data/``: the first 32
records of the stored GSM8K test split, MIT, license beside it). Evaluations never fall back: a score
on 32 questions must not pass for a benchmark result.

A leaf module (imports nothing of the engine but its errors), so the CLI, the bench and the evaluation
harness can all use it without importing each other.
"""

from __future__ import annotations

import os
from pathlib import Path

from .errors import InvalidRequestError

SAMPLE_DIR = Path(__file__).resolve().parent / "sample_data"
GSM8K_SAMPLE = SAMPLE_DIR / "gsm8k_test_sample.jsonl"


def _candidates() -> list[Path]:
    env = os.environ.get("SAFE_ENSEMBLE_DATA")
    if env:  # an explicit setting is the only candidate: a typo must not silently read other data
        return [Path(env).expanduser()]
    beside_cwd = Path.cwd().parent / "shared" / "data"
    package = Path(__file__).resolve().parent
    if package.parent.name in ("site-packages", "dist-packages"):  # installed: no repository to look beside
        return [beside_cwd]
    beside_package = package.parents[1] / "shared" / "data"
    return [beside_cwd] if beside_cwd.resolve() == beside_package else [beside_cwd, beside_package]  # named once


def find_data_dir() -> Path | None:
    """The full benchmark data folder, or None where this machine has none."""
    for path in _candidates():
        if path.is_dir():
            return path
    return None


def not_found() -> InvalidRequestError:
    """The error where there is no data folder, naming where it was looked for: a SAFE_ENSEMBLE_DATA
    with a typo said only "set SAFE_ENSEMBLE_DATA", which the user had done."""
    env = os.environ.get("SAFE_ENSEMBLE_DATA")
    where = (f"SAFE_ENSEMBLE_DATA={env} is no folder" if env else
             "looked in " + " and ".join(str(p) for p in _candidates()) + "; set SAFE_ENSEMBLE_DATA")
    return InvalidRequestError(f"benchmark data not found ({where}) or pass --data")


def data_dir() -> Path:
    """The full benchmark data folder; a readable error where there is none."""
    found = find_data_dir()
    if found is None:
        raise not_found()
    return found


def gsm8k_file(path: str | Path | None = None) -> Path:
    """GSM8K questions for the bench and smoke tests: ``path`` if given (it must exist), else the full
    test split when the data folder is there, else the packaged sample."""
    if path is not None:
        given = Path(path).expanduser()
        for inside in (given / "gsm8k" / "test.jsonl", given / "test.jsonl"):  # a folder, as eval's --data
            if given.is_dir() and inside.is_file():
                return inside
        if not given.is_file():
            raise InvalidRequestError(f"GSM8K file not found: {given}")
        return given
    root = find_data_dir()
    if root is not None and (root / "gsm8k" / "test.jsonl").is_file():
        return root / "gsm8k" / "test.jsonl"
    return GSM8K_SAMPLE
