"""scripts/load_bench.py on tiny random members: a short bounded run of the load benchmark (the
figures themselves come from running the script on the real zoo; see docs/speed.md, "Load")."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
import subprocess
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


@pytest.mark.parametrize("levels", ["1,", "a", "", "1,,2", "0", "2,-1"])
def test_a_bad_levels_list_is_a_usage_error(levels: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--levels 1,`` or ``--levels a`` was a ValueError traceback from int()."""
    with pytest.raises(SystemExit) as exit_:
        _load_bench().parse_args(["--toy", "--levels", levels])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "Traceback" not in err and "--levels" in err


def test_levels_are_read_as_numbers_of_clients() -> None:
    assert _load_bench().parse_args(["--toy", "--levels", " 1, 4 "]).levels == [1, 4]


def test_a_run_without_out_does_not_overwrite_the_tracked_measurements() -> None:
    """--out defaulted to docs/load: a --toy smoke run overwrote the kept load.json and load.png."""
    out = _load_bench().parse_args(["--toy"]).out
    assert out == Path("load-bench") and not out.is_absolute()
    ignored = subprocess.run(["git", "check-ignore", "-q", "load-bench/load.json"], cwd=ROOT, check=False)
    assert ignored.returncode == 0, "load-bench/ is not in .gitignore"


def script_imports() -> list[tuple[str, int, str, str]]:
    """Every ``from shared_engine... import name`` in scripts/*.py, at module level or in a function
    (where an import fails only when that path runs): (script, line, module, name)."""
    found = []
    for script in sorted((ROOT / "scripts").glob("*.py")):
        for node in ast.walk(ast.parse(script.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] in ("shared_engine", "langchain_ensemble", "llamaindex_ensemble"):
                found += [(script.name, node.lineno, node.module, alias.name) for alias in node.names]
    return found


def is_submodule(module: str, name: str) -> bool:
    try:
        return importlib.util.find_spec(f"{module}.{name}") is not None
    except ModuleNotFoundError:  # module is not a package
        return False


def test_every_scripts_imports_resolve() -> None:
    """scripts/dtype_report.py imported default_data_dir from shared_engine.bench, gone since: the
    script failed at its GSM8K step, after its member measurements. The scripts are not type-checked
    (mypy's files are the packages), so their imports are checked here, without running them."""
    imports = script_imports()
    assert len(imports) > 20
    missing = []
    for script, line, module, name in imports:
        imported = importlib.import_module(module)
        if not hasattr(imported, name) and not is_submodule(module, name):
            missing.append(f"{script}:{line}: from {module} import {name}")
    assert missing == []
