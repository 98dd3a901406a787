"""The benchmarks package's folders are layers, and every script runs as a module.

Lowest first: ``_common`` (the harness), ``report`` (tables and plots), ``probes`` (one
question each), ``suites`` (what a user runs). A module imports its own folder or a lower
one, the imports between modules form no cycle, and nothing patches ``sys.path``: each
script runs as ``python -m benchmarks.<folder>.<name>`` from the repository root.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
RANKS = {"benchmarks": 0, "_common": 0, "report": 1, "probes": 2, "suites": 3}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(BENCHMARKS.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def rank(module: str) -> int:
    folder = module.split(".")[1] if "." in module else "benchmarks"
    assert folder in RANKS, f"{module} is in no layer: add its folder to RANKS"
    return RANKS[folder]


def benchmark_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` of every import of a benchmarks module in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("benchmarks"):
            assert node.module is not None
            modules = {module_name(p) for p in BENCHMARKS.rglob("*.py")}
            for alias in node.names:  # `from benchmarks.report import text` names a module
                sub = f"{node.module}.{alias.name}"
                found.append((node.lineno, sub if sub in modules else node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("benchmarks")]
    return found


def graph() -> dict[str, set[str]]:
    return {
        module_name(p): {m for _, m in benchmark_imports(p)} - {module_name(p)}
        for p in BENCHMARKS.rglob("*.py")
    }


def test_imports_only_go_down_the_folders() -> None:
    wrong = []
    for path in sorted(BENCHMARKS.rglob("*.py")):
        here = module_name(path)
        for line, target in benchmark_imports(path):
            if rank(target) > rank(here):
                wrong.append(f"{here}:{line} imports {target}, a higher folder")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules() -> None:
    edges = graph()
    cycles = []

    def walk(node: str, path: list[str], done: set[str]) -> None:
        if node in path:
            cycles.append(" -> ".join([*path[path.index(node) :], node]))
            return
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            walk(nxt, [*path, node], done)
        done.add(node)

    done: set[str] = set()
    for module in sorted(edges):
        walk(module, [], done)
    assert not cycles, "\n".join(sorted(set(cycles)))


def test_no_module_patches_sys_path() -> None:
    patched = [
        f"{module_name(p)}:{node.lineno}"
        for p in sorted(BENCHMARKS.rglob("*.py"))
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr == "path"
        and isinstance(node.value, ast.Name)
        and node.value.id == "sys"
    ]
    assert not patched, patched


def test_the_report_imports_in_a_fresh_interpreter() -> None:
    """The documents' tables and everything they read import together (no cycle at run time:
    the table modules register themselves when doc_tables imports them)."""
    code = "from benchmarks.report import doc_tables; print(len(doc_tables.TABLES))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        cwd=BENCHMARKS.parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert int(proc.stdout) > 10
