"""Resident memory over repeated engine create / answer / close cycles, with and without handing the
heap the closed members freed back to the OS (``members.return_freed_memory``), printed as JSON.

    python scripts/engine_cycles_memory.py                       # SmolLM2 on llama.cpp, 8 cycles
    python scripts/engine_cycles_memory.py --models qwen2.5-coder-0.5b-instruct,smollm2-135m-instruct --cycles 6

Each engine builds its members in a new worker thread, whose allocations land in another glibc malloc
arena; glibc keeps what a closed member freed there, so without the trim RSS grows every cycle although
no object is left (the registry is empty after each close). Each mode runs in a fresh subprocess. Memory
figures do not depend on CPU contention.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from _report import emit_report  # scripts/_report.py: this folder is on sys.path when run

ROOT = Path(__file__).resolve().parents[1]
CYCLES = """
import gc, json, sys
from shared_engine import EnsembleEngine, members
if sys.argv[3] == "off":
    members.return_freed_memory = lambda: False  # the registry calls it after closing members
rss = lambda: next(int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
names, out = sys.argv[1].split(","), []
for _ in range(int(sys.argv[2])):
    engine = EnsembleEngine(names, method="safe" if len(names) > 1 else "single")
    engine.generate("Say hi.", max_new_tokens=8)
    engine.close()
    del engine
    gc.collect()
    out.append(round(rss()))
print(json.dumps({"rss_mb": out, "registry_after": len(members._LOADED)}))
"""


def run(models: str, cycles: int, trim: str) -> dict[str, object]:
    done = subprocess.run([sys.executable, "-c", CYCLES, models, str(cycles), trim], cwd=ROOT,
                          capture_output=True, text=True, check=True)
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="smollm2-135m-instruct")
    parser.add_argument("--cycles", type=int, default=8)
    parser.add_argument("--json", help="also write the report here")
    args = parser.parse_args()
    report: dict[str, object] = {"models": args.models, "cycles": args.cycles}
    for trim in ("on", "off"):
        report[f"trim_{trim}"] = found = run(args.models, args.cycles, trim)
        rss = found["rss_mb"]
        assert isinstance(rss, list)
        found["growth_mb"] = rss[-1] - rss[0]
        print(f"trim {trim}: RSS {rss} MB", file=sys.stderr, flush=True)
    return emit_report(report, args.json)


if __name__ == "__main__":
    sys.exit(main())
