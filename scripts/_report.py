"""What every report script ends with: the JSON report on stdout, and in a file when asked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def emit_report(report: dict[str, Any], path: str | None) -> int:
    """Print ``report`` as indented JSON, also write it to ``path`` if given; the exit code (0)."""
    text = json.dumps(report, indent=2)
    if path:
        Path(path).write_text(text + "\n")
    print(text)
    return 0
