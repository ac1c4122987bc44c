"""GSM8K-format files for the eval tests, which run on a clone without the benchmark data folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from shared_engine.data_paths import SAMPLE_DIR


def gsm8k_file(folder: Path, rows: list[tuple[str, str]], name: str = "gsm8k.jsonl") -> Path:
    """``rows`` (question, final answer) as a GSM8K file in ``folder``, with the exemplars its prompts
    read beside it (``train.jsonl``, the package's sample): without the data folder a GSM8K prompt
    cannot be built, and eval refuses to start."""
    file = folder / name
    file.write_text("".join(json.dumps({"question": q, "answer": f"#### {a}"}) + "\n" for q, a in rows))
    shutil.copyfile(SAMPLE_DIR / "train.jsonl", folder / "train.jsonl")
    return file
