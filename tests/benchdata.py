"""The benchmark data folder the eval tests read (../shared/data or $SAFE_ENSEMBLE_DATA), and the
one marker that skips, with the reason, where it is absent (CI lays it out beside the clone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from shared_engine.data_paths import find_data_dir

DATA: Path | None = find_data_dir()

needs_data = pytest.mark.skipif(DATA is None, reason="benchmark data folder not found (set SAFE_ENSEMBLE_DATA)")
