"""Human-readable views of a timer tree (the dict from ``timers.get_timer_tree()``).

The plain-text tree shows, per node: total seconds, call count, self seconds,
share of its parent and mean per call. Parallel nodes (worker trees merged into
the parent) are marked ``||``: their totals add up time spent concurrently in
several processes, so a worker total may exceed its parent's wall time.
"""

from __future__ import annotations

from typing import Any

__all__ = ["format_tree"]


def _fmt_seconds(s: float) -> str:
    if s >= 1.0:
        return f"{s:8.3f} s "
    if s >= 1e-3:
        return f"{s * 1e3:8.3f} ms"
    return f"{s * 1e6:8.3f} µs"


def format_tree(tree: dict[str, Any], max_depth: int | None = None) -> str:
    """Render a timer tree as an indented table.

    Args:
        tree: A node dict as produced by ``get_timer_tree()`` (or read from a
            ``timers.json``, ML-Agents' included).
        max_depth: Stop descending below this depth (``None``: everything).

    Returns:
        The table, one line per node, with a header.
    """
    header = f"{'name':<44} {'total':>11} {'count':>9} {'self':>11} {'%parent':>8} {'per call':>11}"
    lines = [header, "-" * len(header)]

    def walk(name: str, node: dict[str, Any], depth: int, parent_total: float | None) -> None:
        total = float(node.get("total", 0.0))
        count = int(node.get("count", 0))
        self_t = float(node.get("self", total))
        mark = "|| " if node.get("is_parallel") else ""
        label = ("  " * depth + mark + name)[:44]
        share = "" if not parent_total else f"{100.0 * total / parent_total:7.1f}%"
        per_call = _fmt_seconds(total / count) if count else ""
        lines.append(
            f"{label:<44} {_fmt_seconds(total):>11} {count:>9} {_fmt_seconds(self_t):>11} "
            f"{share:>8} {per_call:>11}"
        )
        if max_depth is not None and depth >= max_depth:
            return
        children = node.get("children", {})
        for child_name, child in sorted(children.items(), key=lambda kv: -kv[1].get("total", 0.0)):
            walk(child_name, child, depth + 1, total)

    walk(str(tree.get("name", "root")), tree, 0, None)
    lines.append("(|| = parallel: time summed over concurrent workers; it may exceed the parent's)")
    return "\n".join(lines)
