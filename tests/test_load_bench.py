"""scripts/load_bench.py on tiny random members: a short bounded run of the load benchmark (the
figures themselves come from running the script on the real zoo; see docs/speed.md, "Load")."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("load_bench", ROOT / "scripts" / "load_bench.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # pydantic resolves the models' annotations through it
    spec.loader.exec_module(module)
    return module


def test_load_bench_on_toy_members_reports_every_request(tmp_path: Path) -> None:
    # One slot and one queue place: 2 clients fit, 4 clients must see 429s, and nothing may fail.
    _load_bench().main(["--toy", "--levels", "1,2,4", "--requests-per-client", "2", "--max-tokens", "6",
                        "--max-active", "1", "--max-waiting", "1", "--out", str(tmp_path)])
    report = json.loads((tmp_path / "load.json").read_text())
    assert {"config", "machine", "server_startup_s", "server_idle_rss_mib", "server_peak_rss_mib", "levels",
            "inconsistent_prompts"} <= report.keys()
    levels = report["levels"]
    assert [lv["clients"] for lv in levels] == [1, 2, 4]
    for lv in levels:
        assert {"requests_per_s", "tokens_per_s", "ttft_s", "latency_s", "peak_rss_mib", "rejected_429",
                "errors", "error_messages", "wall_s"} <= lv.keys()
        assert lv["errors"] == 0 and lv["error_messages"] == [], lv["error_messages"]
        assert lv["requests"] == 2 * lv["clients"] == lv["completed"] + lv["rejected_429"]
        assert 0 < lv["completion_tokens"] <= 6 * lv["completed"]
        assert {"p50", "p95", "p99"} <= lv["ttft_s"].keys() and lv["ttft_s"]["n"] == lv["completed"]
        assert 0 < lv["ttft_s"]["p50"] <= lv["latency_s"]["p50"] and lv["latency_s"]["p99"] >= lv["latency_s"]["p50"]
        assert lv["peak_rss_mib"] > 0 and lv["requests_per_s"] > 0
    assert levels[0]["rejected_429"] == levels[1]["rejected_429"] == 0
    assert levels[2]["rejected_429"] >= 1  # four clients at once, room for two
    assert report["server_peak_rss_mib"] >= max(lv["peak_rss_mib"] for lv in levels)
    assert report["inconsistent_prompts"] == [] and report["divergent_answers"] == []  # not on the load
    # how throughput grows from one client to four, and the forward passes per token of each member
    assert report["tokens_per_s_at_4_over_1"] == round(levels[2]["tokens_per_s"] / levels[0]["tokens_per_s"], 3)
    for lv in levels:
        assert set(lv["forward_passes_per_token"]) == {"toy-a", "toy-b"}
        assert all(0 < v <= 3 for v in lv["forward_passes_per_token"].values()), lv["forward_passes_per_token"]
    assert report["config"]["backend"] == "transformers"
    assert (tmp_path / "load.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_zoo_names_run_on_llamacpp_by_default_as_on_every_other_surface() -> None:
    parse = _load_bench().parse_args
    assert parse([]).backend == "llamacpp"
    assert parse(["--backend", "transformers"]).backend == "transformers"
    assert parse(["--toy"]).backend == "transformers"  # toy members are transformers folders
    with pytest.raises(SystemExit):
        parse(["--toy", "--backend", "llamacpp"])
