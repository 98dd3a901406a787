"""The package tree is the architecture: imports only go down the layers.

Layers, lowest first: errors and timers; protocol (what both sides agree on); the env side;
the backends (transports); the front end (the VectorEnv API over any backend); the managers
(a front end put on a backend); integrations and the CLI. A module may import its own layer or
a lower one, never a higher one, and the two backends never import each other.
"""

from __future__ import annotations

import ast
from pathlib import Path

import envmgr

PACKAGE = Path(envmgr.__file__).parent

RANKS = {
    "envmgr.errors": 0,
    "envmgr.timers": 0,
    "envmgr.protocol": 1,
    "envmgr.envside": 2,
    "envmgr.backends": 3,
    "envmgr.frontend": 4,
    "envmgr.managers": 5,
    "envmgr.integrations": 6,
    "envmgr.cli": 6,
    "envmgr.tune": 6,
    "envmgr.__main__": 6,
    "envmgr": 6,  # the package's __init__: the public surface
}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _rank(module: str) -> tuple[int, str]:
    for prefix in sorted(RANKS, key=len, reverse=True):
        if module == prefix or module.startswith(prefix + "."):
            return RANKS[prefix], prefix
    raise AssertionError(f"{module} belongs to no layer: add it to RANKS")


def _imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("envmgr"):
            if node.module == "envmgr":
                found += [(node.lineno, f"envmgr.{a.name}") for a in node.names]
            else:
                found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("envmgr")]
    return found


def test_imports_only_go_down_the_layers() -> None:
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        here = _module_name(path)
        rank, layer = _rank(here)
        for line, target in _imports(path):
            their_rank, their_layer = _rank(target)
            if their_rank > rank:
                wrong.append(f"{here}:{line} imports {target} ({their_layer} is above {layer})")
            both = {here.split(".")[:3][-1], target.split(".")[:3][-1]}
            if layer == their_layer == "envmgr.backends" and both == {"local", "ray"}:
                wrong.append(f"{here}:{line} imports {target}: the backends stay apart")
    assert not wrong, "\n".join(wrong)


def test_no_import_cycles_between_modules() -> None:
    graph: dict[str, set[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        here = _module_name(path)
        graph[here] = {t for _, t in _imports(path) if t != here}
    # Tarjan-free: a cycle exists iff a depth-first walk meets a module on its own path.
    cycles = []

    def walk(node: str, path: list[str], done: set[str]) -> None:
        if node in path:
            cycles.append(" -> ".join([*path[path.index(node) :], node]))
            return
        if node in done:
            return
        for nxt in sorted(graph.get(node, ())):
            if nxt.startswith("envmgr.") and nxt in graph:
                walk(nxt, [*path, node], done)
        done.add(node)

    done: set[str] = set()
    for module in sorted(graph):
        if module != "envmgr":  # the package imports what it re-exports
            walk(module, [], done)
    assert not cycles, "\n".join(sorted(set(cycles)))
