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


def test_the_printer_marks_voted_adafuse_spans() -> None:
    """``--method adafuse`` printed no marker at all: the printer only read token decisions."""
    import importlib.util

    from llamaindex_ensemble import EnsembleSpanEvent
    from shared_engine.events import SpanCandidate

    spec = importlib.util.spec_from_file_location("llamaindex_rag", ROOT / "cookbooks" / "llamaindex_rag.py")
    assert spec is not None and spec.loader is not None
    cookbook = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = cookbook  # pydantic reads the printer's annotations from its module
    spec.loader.exec_module(cookbook)
    printer = cookbook.EnsembleDecisionPrinter()
    candidates = [SpanCandidate(text=t, proposed_by=["qwen"], member_nll={"qwen": 1.0}, score=1.0)
                  for t in (" in 1931", " in 1932")]
    for fused, offset in ((True, 5), (False, 9)):  # a sure leader's span is not a vote: no marker
        printer.handle(EnsembleSpanEvent(model_name="m", position=1, offset=offset, fused=fused,
                                         leader="qwen2.5-coder", member_uncertainty={}, candidates=candidates,
                                         chosen=" in 1931"))
    assert printer.markers_before(4) == ""
    assert printer.markers_before() == "⟨vote ' in 1931' of 2 spans, leader qwen2.5⟩"
