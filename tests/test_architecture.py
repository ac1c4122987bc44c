"""The import graph of the shipped packages: no cycles, the engine knows nothing of its users.

The graph is read from the source with ``ast`` (nothing is imported), counting every import
statement: module level, inside functions and under ``if TYPE_CHECKING``. An edge goes to the
module an import statement names: ``from .x import y`` is an edge to ``x.y`` when ``y`` is a
submodule, else to ``x``. Allowed and not counted: the implicit import of parent packages (Python
runs ``pkg/__init__.py`` before ``pkg.sub``), which would turn every re-export in an ``__init__``
into a cycle. Imports from a package's ``__init__`` itself are edges like any other.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("shared_engine", "langchain_ensemble", "llamaindex_ensemble")
FRONT_ENDS = ("langchain_ensemble", "llamaindex_ensemble", "shared_engine.cli", "shared_engine.server")
"""What the engine core must not import: the adapters, the command line and the HTTP server."""
FOREIGN = ("langchain", "langchain_core", "llama_index", "starlette", "uvicorn")


def module_files() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(module: str, path: Path, ours: set[str]) -> set[str]:
    """Every module ``module`` imports (absolute names, third-party ones included)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            source = node.module or ""
            if node.level:
                parts = package.split(".")
                source = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
            # ``from pkg import sub`` imports the submodule; ``from pkg import name`` pkg itself
            names.update(f"{source}.{alias.name}" if f"{source}.{alias.name}" in ours else source
                         for alias in node.names)
    return names


def import_graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges between our modules, every imported module per module)."""
    files = module_files()
    ours = set(files)
    everything = {m: imported_modules(m, p, ours) for m, p in files.items()}
    edges = {m: {n for n in names if n in ours and n != m} for m, names in everything.items()}
    return edges, everything


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def test_the_graph_is_read_from_every_module() -> None:
    edges, _ = import_graph()
    assert {"shared_engine.cli", "shared_engine.engine_args", "shared_engine.members.hf",
            "langchain_ensemble.chat_models", "llamaindex_ensemble.base"} <= set(edges)
    assert "shared_engine.engine_args" in edges["shared_engine.cli"]
    assert "shared_engine.members.cache" in edges["shared_engine.members.hf"]  # `from . import cache as kv`
    assert "shared_engine.zoo" in edges["shared_engine.members.remote"]  # a function-level import


def test_find_cycle_finds_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_import_cycles() -> None:
    edges, _ = import_graph()
    assert find_cycle(edges) is None


def test_the_engine_imports_no_front_end_or_framework() -> None:
    _, names = import_graph()
    for module, imported in names.items():
        if within(module, ("shared_engine",)) and not within(module, FRONT_ENDS):
            bad = sorted(n for n in imported if within(n, FRONT_ENDS + FOREIGN))
            assert not bad, f"{module} imports {bad}"


def test_nothing_imports_the_command_line() -> None:
    edges, _ = import_graph()
    assert [m for m, targets in edges.items() if "shared_engine.cli" in targets] == []


def test_the_command_line_starts_without_torch() -> None:
    """``safe-ensemble --help`` and a usage error answer in well under a second: building the parser
    imports neither torch nor transformers (they took 6.5 s before the first line here); a member's
    configuration is read without them too. The packages' names load on first use (lazy.py)."""
    code = ("import sys, shared_engine.cli as cli; cli.build_parser(); "
            "from shared_engine.members import member_config; member_config('qwen2.5-coder-0.5b-instruct'); "
            "print(sorted(m for m in ('torch', 'transformers', 'lmformatenforcer') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_lazy_packages_give_every_name_they_list() -> None:
    """Each name in a lazy package's ``__all__`` resolves to the object its module defines, and an
    unknown name is still an AttributeError."""
    import shared_engine
    from shared_engine import decoding, evaluation, members

    for package in (shared_engine, decoding, evaluation, members):
        for name in package.__all__:
            assert getattr(package, name) is not None, (package.__name__, name)
        assert set(package.__all__) <= set(dir(package))
        with pytest.raises(AttributeError):
            package.no_such_name  # noqa: B018
    from shared_engine.engine import EnsembleEngine

    assert shared_engine.EnsembleEngine is EnsembleEngine


def test_every_typed_package_ships_its_py_typed_marker() -> None:
    """shared_engine had no py.typed: a user's mypy on `from shared_engine import EnsembleEngine` (the
    README's import) said "module is installed, but missing library stubs or py.typed marker"."""
    import tomllib

    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in ("shared_engine", "langchain_ensemble", "llamaindex_ensemble", "llama_index.llms.safe_ensemble"):
        assert (ROOT / package.replace(".", "/") / "py.typed").is_file(), package
        assert "py.typed" in package_data.get(package, []), package


def test_the_license_text_ships_with_the_package() -> None:
    """pyproject said Apache-2.0 but no file held the license text, which the license asks to distribute."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (ROOT / "LICENSE").read_text().lstrip().startswith("Apache License\n                           Version 2.0")
