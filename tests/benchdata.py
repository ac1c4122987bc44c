"""The benchmark data folder the eval tests read (../shared/data or $SAFE_ENSEMBLE_DATA), and the
one marker that skips, with the reason, where it is absent (CI lays it out beside the clone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared_engine.bench import default_data_dir
from shared_engine.errors import InvalidRequestError

try:
    DATA: Path | None = default_data_dir()
except InvalidRequestError:
    DATA = None

needs_data = pytest.mark.skipif(DATA is None, reason="benchmark data folder not found (set SAFE_ENSEMBLE_DATA)")
