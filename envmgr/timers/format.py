"""Views of a timer tree: a terminal table, folded stacks, and a per-worker summary.

Every function takes the dict that ``envmgr.timers.get_timer_tree()`` returns, or the same
document read back from a ``timers.json`` (ML-Agents' included); a
:class:`~envmgr.timers.TimerNode` is accepted too. A node is a dict with ``total`` seconds,
an optional ``count``, ``self`` (seconds not covered by children), ``is_parallel`` and
``children`` (name -> node); the root may also carry ``name``, ``gauges`` and ``metadata``.

* :func:`format_tree` - an indented table for the terminal, followed by the gauges.
* :func:`folded_stacks` - self time per path as ``a;b;c <µs>`` (speedscope, flamegraph.pl).
* :func:`worker_summary` - per worker: env calls vs. waiting vs. moving results; the straggler.
* :func:`load_tree` / :func:`check_tree` - read and validate a tree (one-line errors).

The summary lives in ``worker_view`` and reading in ``reading``; both are re-exported here,
where the README and callers have always found them.

Parallel nodes (``is_parallel``: worker trees merged into the parent, marked ``||``) sum time
that processes spent concurrently; the table gives their share of the worker's own wall time,
never of the parent. Each worker's tree is merged under ``worker_root`` (all workers summed)
and ``worker_<i>``; time-summing views skip ``worker_root`` when ``worker_<i>`` nodes exist.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from envmgr.timers.reading import (
    PROCESS_ROOT_RE,
    UNTIMED,
    TimerFileError,
    TimerTreeError,
    check_tree,
    child_nodes,
    format_seconds,
    load_tree,
    node_count,
    self_seconds,
    short_seconds,
    summing_children,
    total_seconds,
)
from envmgr.timers.worker_view import STRAGGLER_EXCESS, worker_summary

__all__ = [
    "TimerTreeError",
    "TimerFileError",
    "check_tree",
    "load_tree",
    "format_tree",
    "format_gauges",
    "folded_stacks",
    "worker_summary",
    "STRAGGLER_EXCESS",
]


# ------------------------------------------------------------------ text tree


def format_tree(
    tree: Any,
    max_depth: int | None = None,
    min_share: float | None = None,
    *,
    show_empty: bool = False,
) -> str:
    """Renders a timer tree as an indented table, followed by its gauges.

    Columns: total seconds, call count, self seconds (total minus the children), share of the
    parent's total and mean time per call. Children are sorted by total, largest first.
    Parallel nodes are marked ``||`` and explained in a legend below the table; their share is
    of the worker's own wall time (the ``worker_<i>``, ``worker_root`` or ``actor_<k>`` node
    above them), because a worker's clock also runs while the parent is elsewhere: a share of
    the parent could exceed 100%. Those worker nodes themselves get no share.

    Args:
        tree: A node dict as produced by ``get_timer_tree()`` or read from a ``timers.json``
            (ML-Agents' included), or a ``TimerNode``.
        max_depth: Do not descend below this depth (the root is depth 0; ``None``: no limit).
            A node whose children were cut off ends in ``[+N]``.
        min_share: Fold children whose total is below this fraction of their parent's total
            (e.g. ``0.01`` for 1%) into one ``(N below x%)`` line per parent.
        show_empty: Also list timers that were never entered (count 0, total 0), such as a
            worker's ``reset`` branch in a run that never reset; hidden by default.

    Returns:
        The table, one line per node, with a header, a legend and the gauges if any.

    Raises:
        TimerTreeError: If ``tree`` is not a timer tree.
        ValueError: If ``max_depth`` is negative or ``min_share`` is outside ``[0, 1)``.
    """
    tree = check_tree(tree)
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    if min_share is not None and not 0.0 <= min_share < 1.0:
        raise ValueError(f"min_share is a fraction in [0, 1), got {min_share}")

    rows: list[tuple[str, str, str, str, str, str]] = []
    hidden_empty = 0
    any_parallel = False
    any_cut = False

    # Explicit stack (deep trees must not hit the recursion limit): (name, node, depth,
    # what the node's share is taken of, whether the parent is parallel); an entry with node
    # None is a "folded" summary line.
    stack: list[tuple[str, Any, int, float | None, bool]] = [
        (str(tree.get("name", "root")), tree, 0, None, False)
    ]
    while stack:
        name, node, depth, of_total, parent_parallel = stack.pop()
        indent = "  " * depth
        if node is None:  # a summary of children folded by min_share
            rows.append((indent + name, "", "", "", "", ""))
            continue
        total, count = total_seconds(node), node_count(node)
        parallel = bool(node.get("is_parallel"))
        any_parallel |= parallel
        # A worker's tree merged here: its total is on the worker's clock, so it has no share
        # of the parent, and everything below is a share of it (the worker's wall time).
        process_root = parallel and (not parent_parallel or bool(PROCESS_ROOT_RE.fullmatch(name)))
        if process_root:
            of_total = None
        kids = sorted(child_nodes(node).items(), key=lambda kv: -total_seconds(kv[1]))
        if not show_empty:
            shown = [(k, v) for k, v in kids if node_count(v) or total_seconds(v)]
            hidden_empty += _count_nodes(kids) - _count_nodes(shown)
            kids = shown
        label = indent + ("|| " if parallel else "") + name
        if depth == 1 and name == "workers":
            label += f" {UNTIMED}"
        if kids and max_depth is not None and depth >= max_depth:
            label += f" [+{len(kids)}]"
            any_cut = True
            kids = []
        share = f"{100.0 * total / of_total:.1f}%" if of_total else ""
        rows.append(
            (
                label,
                format_seconds(total),
                str(count),
                format_seconds(self_seconds(node)),
                share,
                format_seconds(total / count) if count else "",
            )
        )
        folded: list[tuple[str, Any]] = []
        if min_share and total > 0:
            cutoff = min_share * total
            folded = [(k, v) for k, v in kids if total_seconds(v) < cutoff]
            kids = [(k, v) for k, v in kids if total_seconds(v) >= cutoff]
        # Children of a parallel node share the worker's clock; others take the parent's total.
        of_kids = (total if process_root else of_total) if parallel else total
        todo: list[tuple[str, Any, int, float | None, bool]] = [
            (k, v, depth + 1, of_kids, parallel) for k, v in kids
        ]
        if folded:
            small = sum(total_seconds(v) for _, v in folded)
            what = f"({len(folded)} below {100 * (min_share or 0):g}%: {short_seconds(small)})"
            todo.append((what, None, depth + 1, None, parallel))
        stack.extend(reversed(todo))

    width = min(max(len("name"), *(len(r[0]) for r in rows)), 72)
    header = (
        f"{'name':<{width}} {'total':>11} {'count':>9} {'self':>11} {'%parent':>8} {'per call':>11}"
    )
    lines = [header, "-" * len(header)]
    for label, total_s, count_s, self_s, share, per_call in rows:
        if len(label) > width:
            label = label[: width - 1] + "…"
        lines.append(
            f"{label:<{width}} {total_s:>11} {count_s:>9} {self_s:>11} {share:>8} {per_call:>11}"
        )
    lines.append("self = total minus the children's totals; per call = total / count")
    if any_parallel:
        lines.append(
            "|| = parallel: merged from worker processes that ran at the same time. Their times"
        )
        lines.append(
            "     are summed over the workers, so a total can exceed the parent's wall time;"
        )
        lines.append(
            "     their % is of the worker's own wall time (the worker_<i> / worker_root row)."
        )
        lines.append("     worker_root = all workers together, worker_<i> = worker i alone.")
    if any_cut:
        lines.append("[+N] = N child timers below the depth limit")
    if hidden_empty:
        lines.append(
            f"({hidden_empty} timers never entered are hidden: each worker's tree holds a timer "
            "for every command it"
        )
        lines.append(
            "     can serve, and where a command did not run, its timers have count 0; "
            "show_empty=True"
        )
        lines.append("     or `envmgr timers show --all` lists them)")
    gauges = format_gauges(tree)
    if gauges:
        lines.append("")
        lines.append(gauges)
    return "\n".join(lines)


def _count_nodes(items: list[tuple[str, Any]]) -> int:
    """Number of nodes in the given subtrees."""
    n = 0
    pending = [v for _, v in items]
    while pending:
        node = pending.pop()
        n += 1
        pending.extend(child_nodes(node).values())
    return n


def format_gauges(tree: Any) -> str:
    """Renders the root's ``gauges`` (value, min, max, count) as a table; ``""`` if none."""
    gauges = tree.get("gauges") if isinstance(tree, Mapping) else None
    if not gauges:
        return ""
    rows = []
    for name in sorted(gauges):
        g = gauges[name]
        if not isinstance(g, Mapping):
            continue
        rows.append(
            (
                str(name),
                _fmt_number(g.get("value")),
                _fmt_number(g.get("min")),
                _fmt_number(g.get("max")),
                _fmt_number(g.get("count")),
            )
        )
    if not rows:
        return ""
    width = min(max(len("gauge"), *(len(r[0]) for r in rows)), 72)
    header = f"{'gauge':<{width}} {'value':>12} {'min':>12} {'max':>12} {'count':>9}"
    lines = [header, "-" * len(header)]
    for name, value, lo, hi, count in rows:
        lines.append(f"{name:<{width}} {value:>12} {lo:>12} {hi:>12} {count:>9}")
    return "\n".join(lines)


def _fmt_number(x: Any) -> str:
    if isinstance(x, bool) or x is None:
        return "" if x is None else str(x)
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        return str(int(x)) if x.is_integer() and abs(x) < 1e15 else f"{x:.6g}"
    return str(x)


# ------------------------------------------------------------------ folded stacks


def _frame(name: str) -> str:
    # ";" separates frames and a line ends in " <count>"; names must not break either.
    return name.replace(";", ":").replace("\r", " ").replace("\n", " ")


def folded_stacks(
    tree: Any, root_name: str | None = None, *, keep_worker_root: bool = False
) -> str:
    """Renders self time per path in the "folded stacks" format.

    One line per node with non-zero self time: the frames from the root down, joined by
    ``;``, a space, and the self time in integer microseconds (rounded), e.g.
    ``root;training_loop;env_step 129040``. speedscope (https://www.speedscope.app),
    ``flamegraph.pl`` and inferno read it. Lines come depth-first in the tree's own order.

    Under a parallel merge the times are each worker's own, summed: a flame graph of the
    result is "time across processes", like a CPU profile of a multi-threaded program.
    ``worker_root`` is skipped when ``worker_<i>`` siblings exist (it is their sum, so keeping
    both would count every worker twice) unless ``keep_worker_root`` is set.

    Args:
        tree: A timer tree (see :func:`format_tree`).
        root_name: Name of the outermost frame; default the tree's ``name`` or ``"root"``.
        keep_worker_root: Also emit the ``worker_root`` aggregate.

    Returns:
        The lines joined by newlines, with a trailing newline (``""`` if all times are 0).
        ``;`` in timer names becomes ``:``.
    """
    tree = check_tree(tree)
    root = _frame(root_name if root_name is not None else str(tree.get("name", "root")))
    lines = []
    stack: list[tuple[str, Any]] = [(root, tree)]
    while stack:
        path, node = stack.pop()
        micros = round(self_seconds(node) * 1e6)
        if micros > 0:
            lines.append(f"{path} {micros}")
        kids = list(child_nodes(node).items()) if keep_worker_root else summing_children(node)
        stack.extend((f"{path};{_frame(k)}", v) for k, v in reversed(kids))
    return "".join(line + "\n" for line in lines)
