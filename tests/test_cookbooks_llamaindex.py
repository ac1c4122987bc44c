"""Smoke test: the LlamaIndex RAG cookbook runs end to end on the real zoo and prints what it promises."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.zoo
def test_llamaindex_rag_cookbook_runs() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(ROOT / "cookbooks" / "llamaindex_rag.py"), "--max-tokens", "32"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert "Q: Who first climbed Mount Kestrel" in out and "1931" in out
    assert "[ensemble] finish=" in out and "forward passes=" in out
    assert "[sources]" in out and "Mount Kestrel, at 3,412 metres" in out
