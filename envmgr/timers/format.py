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

Parallel nodes (``is_parallel``: worker trees merged into the parent, marked ``||``) sum time
that processes spent concurrently; the table gives their share of the worker's own wall time,
never of the parent. Each worker's tree is merged under ``worker_root`` (all workers summed)
and ``worker_<i>``; time-summing views skip ``worker_root`` when ``worker_<i>`` nodes exist.
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections.abc import Mapping
from os import PathLike
from typing import Any, TypeGuard

__all__ = [
    "TimerTreeError",
    "TimerFileError",
    "check_tree",
    "load_tree",
    "format_tree",
    "format_gauges",
    "folded_stacks",
    "worker_summary",
]

_WORKER_RE = re.compile(r"worker_(\d+)")
# Where a worker's (or Ray actor's) own tree is merged in: below such a node the times are that
# process's clock, not the parent's.
_PROCESS_ROOT_RE = re.compile(r"worker_root|worker_\d+|actor_\d+(@.*)?")


class TimerTreeError(ValueError):
    """A file or object is not a readable timer tree; the message is a single line."""


class TimerFileError(TimerTreeError):
    """The file could not be read at all (missing, a directory, no permission, not UTF-8)."""


# ------------------------------------------------------------------ reading and checking


#: How a ``workers`` node right under the root is shown: the manager merges worker trees under
#: the caller's current timer, and a call made outside any timer (a reset before the loop) has
#: only the root to go under.
_UNTIMED = "(calls made outside any timer)"

#: A worker is named a straggler when its env time is at least this much above the median
#: worker's. Workers stepping identical envs differ by several percent from scheduling noise
#: alone (2.7-6.2% in a 3-s demo on a 2-core VM, 10% in one under load), so a smaller excess
#: says nothing about the worker; 20% is twice the largest such difference seen.
STRAGGLER_EXCESS = 0.20


def _is_finite_number(x: object) -> TypeGuard[float]:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def check_tree(tree: Any) -> dict[str, Any]:
    """Validates a timer tree and returns it as a dict.

    Args:
        tree: A node dict (e.g. a parsed ``timers.json``) or a ``TimerNode``.

    Returns:
        The tree as a dict (``tree`` itself when it already is one).

    Raises:
        TimerTreeError: If some node is not a dict, lacks a finite, non-negative ``total``,
            has a ``count`` that is not a non-negative number or a ``self`` that is not a
            number, or has ``children`` that is not a dict. The message (one line) names the
            offending node's path.
    """
    if hasattr(tree, "to_dict") and not isinstance(tree, Mapping):
        tree = tree.to_dict()
    if not isinstance(tree, Mapping):
        raise TimerTreeError(f"expected a JSON object at the top, got {type(tree).__name__}")
    pending: list[tuple[str, Any]] = [(str(tree.get("name", "root")), tree)]
    while pending:
        path, node = pending.pop()
        if not isinstance(node, Mapping):
            raise TimerTreeError(f"node {path!r} is a {type(node).__name__}, not an object")
        total = node.get("total")
        if not _is_finite_number(total) or total < 0:
            what = "has no 'total'" if total is None else f"has total={total!r}"
            raise TimerTreeError(
                f"node {path!r} {what}; a timer node needs a finite, non-negative number of seconds"
            )
        for key in ("count", "self"):
            value = node.get(key)
            if value is not None and not _is_finite_number(value):
                raise TimerTreeError(f"node {path!r} has {key}={value!r}, not a number")
        count = node.get("count")
        if count is not None and count < 0:
            raise TimerTreeError(f"node {path!r} has count={count!r}; a count cannot be negative")
        children = node.get("children")
        if children is None:
            continue
        if not isinstance(children, Mapping):
            raise TimerTreeError(f"node {path!r} has 'children' that is not an object")
        for name, child in children.items():
            pending.append((f"{path}/{name}", child))
    gauges = tree.get("gauges")
    if gauges is not None and not isinstance(gauges, Mapping):
        raise TimerTreeError("'gauges' is not an object")
    return dict(tree) if not isinstance(tree, dict) else tree


def load_tree(path: str | PathLike[str]) -> dict[str, Any]:
    """Reads and validates a ``timers.json`` (``"-"`` reads standard input).

    Raises:
        TimerFileError: With a one-line message if the file cannot be read.
        TimerTreeError: With a one-line message if it is not valid JSON or not a timer tree.
    """
    name = str(path)
    try:
        if name == "-":
            text = sys.stdin.read()
            name = "<stdin>"
        else:
            with open(path, encoding="utf-8") as f:
                text = f.read()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise TimerFileError(f"cannot read {name}: {reason}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TimerTreeError(
            f"{name} is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})"
        ) from None
    try:
        return check_tree(doc)
    except TimerTreeError as exc:
        raise TimerTreeError(f"{name} is not a timer tree: {exc}") from None


# ------------------------------------------------------------------ node helpers


def _total(node: Mapping[str, Any]) -> float:
    return float(node.get("total", 0.0))


def _count(node: Mapping[str, Any]) -> int:
    return int(node.get("count", 0) or 0)


def _children(node: Mapping[str, Any]) -> dict[str, Any]:
    return node.get("children") or {}


def _self_time(node: Mapping[str, Any]) -> float:
    """``self`` as stored, else total minus the children's totals (clamped at 0)."""
    value = node.get("self")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(0.0, float(value))
    return max(0.0, _total(node) - sum(_total(c) for c in _children(node).values()))


def _summing_children(node: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Children to use where times are added up: ``worker_root`` is dropped when
    ``worker_<i>`` siblings exist, because it is exactly their sum."""
    kids = _children(node)
    if "worker_root" in kids and any(_WORKER_RE.fullmatch(k) for k in kids):
        return [(k, v) for k, v in kids.items() if k != "worker_root"]
    return list(kids.items())


def _fmt_seconds(s: float) -> str:
    """Seconds in a unit that keeps 4 significant digits, right-aligned in 11 chars."""
    if s >= 1.0:
        return f"{s:8.3f} s "
    if s >= 1e-3:
        return f"{s * 1e3:8.3f} ms"
    return f"{s * 1e6:8.3f} µs"


def _short_seconds(s: float) -> str:
    """Compact seconds (``1.23 s``, ``45.6 ms``, ``789 µs``) for prose and plots."""
    if s >= 100.0:
        return f"{s:.0f} s"
    if s >= 1.0:
        return f"{s:.3g} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3g} ms"
    if s > 0.0:
        return f"{s * 1e6:.3g} µs"
    return "0 s"


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
        total, count = _total(node), _count(node)
        parallel = bool(node.get("is_parallel"))
        any_parallel |= parallel
        # A worker's tree merged here: its total is on the worker's clock, so it has no share
        # of the parent, and everything below is a share of it (the worker's wall time).
        process_root = parallel and (not parent_parallel or bool(_PROCESS_ROOT_RE.fullmatch(name)))
        if process_root:
            of_total = None
        kids = sorted(_children(node).items(), key=lambda kv: -_total(kv[1]))
        if not show_empty:
            shown = [(k, v) for k, v in kids if _count(v) or _total(v)]
            hidden_empty += _count_nodes(kids) - _count_nodes(shown)
            kids = shown
        label = indent + ("|| " if parallel else "") + name
        if depth == 1 and name == "workers":
            label += f" {_UNTIMED}"
        if kids and max_depth is not None and depth >= max_depth:
            label += f" [+{len(kids)}]"
            any_cut = True
            kids = []
        share = f"{100.0 * total / of_total:.1f}%" if of_total else ""
        rows.append(
            (
                label,
                _fmt_seconds(total),
                str(count),
                _fmt_seconds(_self_time(node)),
                share,
                _fmt_seconds(total / count) if count else "",
            )
        )
        folded: list[tuple[str, Any]] = []
        if min_share and total > 0:
            cutoff = min_share * total
            folded = [(k, v) for k, v in kids if _total(v) < cutoff]
            kids = [(k, v) for k, v in kids if _total(v) >= cutoff]
        # Children of a parallel node share the worker's clock; others take the parent's total.
        of_kids = (total if process_root else of_total) if parallel else total
        todo: list[tuple[str, Any, int, float | None, bool]] = [
            (k, v, depth + 1, of_kids, parallel) for k, v in kids
        ]
        if folded:
            small = sum(_total(v) for _, v in folded)
            what = f"({len(folded)} below {100 * (min_share or 0):g}%: {_short_seconds(small)})"
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
        pending.extend(_children(node).values())
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
        micros = round(_self_time(node) * 1e6)
        if micros > 0:
            lines.append(f"{path} {micros}")
        kids = list(_children(node).items()) if keep_worker_root else _summing_children(node)
        stack.extend((f"{path};{_frame(k)}", v) for k, v in reversed(kids))
    return "".join(line + "\n" for line in lines)


# ------------------------------------------------------------------ per-worker summary


class _WorkerStats:
    __slots__ = ("total", "env", "wait", "transfer", "env_calls", "env_steps", "env_resets")

    def __init__(self) -> None:
        self.total = self.env = self.wait = self.transfer = 0.0
        self.env_calls = self.env_steps = self.env_resets = 0

    def add(self, node: Mapping[str, Any]) -> None:
        self.total += _total(node)
        for name, child in _children(node).items():
            if name == "wait_command":
                self.wait += _total(child)
            elif name == "send_response":
                self.transfer += _total(child)
            elif name.startswith("env."):
                self._add_env(name, child)
            else:
                # A command ("step", "reset", ...): env calls inside it are env time, the
                # rest (reading actions, writing observations to shared memory) is transfer.
                inner = 0.0
                for sub_name, sub in _children(child).items():
                    if sub_name.startswith("env."):
                        inner += _total(sub)
                        self._add_env(sub_name, sub)
                if name in ("step", "reset"):
                    self.transfer += max(0.0, _total(child) - inner)

    def _add_env(self, name: str, node: Mapping[str, Any]) -> None:
        self.env += _total(node)
        self.env_calls += _count(node)
        if name == "env.step":
            self.env_steps += _count(node)
        elif name == "env.reset":
            self.env_resets += _count(node)

    @property
    def other(self) -> float:
        return max(0.0, self.total - self.env - self.wait - self.transfer)


def _find_workers(
    tree: Mapping[str, Any],
) -> tuple[dict[int, _WorkerStats], list[tuple[str, float, int]]]:
    """Per-worker stats summed over every place worker trees were merged, and those places
    as (path, parent's total, parent's count)."""
    workers: dict[int, _WorkerStats] = {}
    places: list[tuple[str, float, int]] = []
    stack: list[tuple[str, Mapping[str, Any]]] = [("", tree)]
    while stack:
        path, node = stack.pop()
        found = False
        for name, child in _children(node).items():
            m = _WORKER_RE.fullmatch(name)
            if m:
                found = True
                workers.setdefault(int(m.group(1)), _WorkerStats()).add(child)
            elif name != "worker_root":
                stack.append((f"{path}/{name}" if path else name, child))
        if found:
            places.append((path or str(tree.get("name", "root")), _total(node), _count(node)))
    places.reverse()  # the stack visits later siblings first
    return workers, places


def worker_summary(tree: Any) -> str:
    """Summarises where each worker process spent its time.

    Every ``worker_<i>`` subtree in the tree is found (the manager merges worker trees under
    ``workers`` wherever the loop stepped, e.g. both under ``env_reset`` and ``env_step``) and
    summed per worker. Each worker's time is split into:

    * env: every ``env.*`` call (``env.step``, and ``env.reset`` from resets and autoresets);
    * waiting: ``wait_command``, idle until the parent sends the next command;
    * transfer: ``send_response`` plus the self time of ``step`` / ``reset`` (reading actions,
      writing results to shared memory);
    * other: the rest of the worker's wall time (its loop, time not yet attributed).

    A final line names the straggler: the worker with the most env time, when that is at least
    ``STRAGGLER_EXCESS`` (20%) above the median worker's; below that it says by how much the
    busiest worker led, and that this is within noise.

    Args:
        tree: A timer tree (see :func:`format_tree`).

    Returns:
        The summary as text; a one-line note when the tree has no ``worker_<i>`` nodes.
    """
    tree = check_tree(tree)
    workers, places = _find_workers(tree)
    if not workers:
        return "no per-worker timers in this tree (no worker_<i> nodes)"

    lines = []
    where = ", ".join(_place(p) for p, _, _ in places)
    lines.append(f"per-worker time, summed over {len(places)} merge point(s): {where}")
    for path, total, count in places:
        if count:
            lines.append(
                f"  parent waited in {_place(path)}: {_short_seconds(total)} over {count} call(s) "
                f"({_short_seconds(total / count)} per call)"
            )

    def pct(part: float, whole: float) -> str:
        return f"{100.0 * part / whole:5.1f}%" if whole > 0 else "     -"

    header = (
        f"{'worker':<10} {'total':>11} {'env':>11} {'%':>6} {'waiting':>11} {'%':>6} "
        f"{'transfer':>11} {'%':>6} {'other':>11} {'env calls':>10} {'per call':>11}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    everyone = _WorkerStats()
    for index in sorted(workers):
        s = workers[index]
        lines.append(_worker_row(f"worker_{index}", s, pct))
        for slot in _WorkerStats.__slots__:
            setattr(everyone, slot, getattr(everyone, slot) + getattr(s, slot))
    if len(workers) > 1:
        lines.append(_worker_row("all", everyone, pct))
    lines += [
        "env = env.* calls; waiting = wait_command, idle until the parent's next command;",
        "transfer = send_response plus the step/reset timers' own time: reading actions and",
        "writing observations, rewards and infos to shared memory or the pipe; other = the rest",
        "of the worker's wall time (its own loop)",
    ]
    if everyone.total > 0:
        shares = {
            "env": everyone.env,
            "waiting": everyone.wait,
            "transfer": everyone.transfer,
        }
        top = max(shares, key=lambda k: shares[k])
        share = 100.0 * shares[top] / everyone.total
        verdict = {
            "env": f"env-bound: workers spent {share:.0f}% of their time in env calls",
            "waiting": f"parent-bound: workers spent {share:.0f}% of their time waiting for "
            "the next command",
            "transfer": f"transfer-bound: workers spent {share:.0f}% of their time moving "
            "actions and results",
        }[top]
        lines.append(f"verdict: {verdict}")
    lines.append(_straggler_line(workers))
    return "\n".join(lines)


def _worker_row(label: str, s: _WorkerStats, pct: Any) -> str:
    per_call = _fmt_seconds(s.env / s.env_calls) if s.env_calls else ""
    return (
        f"{label:<10} {_fmt_seconds(s.total):>11} {_fmt_seconds(s.env):>11} "
        f"{pct(s.env, s.total):>6} {_fmt_seconds(s.wait):>11} {pct(s.wait, s.total):>6} "
        f"{_fmt_seconds(s.transfer):>11} {pct(s.transfer, s.total):>6} "
        f"{_fmt_seconds(s.other):>11} {s.env_calls:>10} {per_call:>11}"
    )


def _place(path: str) -> str:
    """A merge point's path as shown: a ``workers`` node under the root says what it holds."""
    return f"workers {_UNTIMED}" if path == "workers" else path


def _straggler_line(workers: dict[int, _WorkerStats]) -> str:
    """The worker with the most env time, named a straggler only past ``STRAGGLER_EXCESS``."""
    if len(workers) < 2:
        return "straggler: n/a (only one worker)"
    env = {i: s.env for i, s in workers.items()}
    median = statistics.median(env.values())
    slowest = max(sorted(env), key=lambda i: env[i])
    fastest = min(sorted(env), key=lambda i: env[i])
    if median <= 0:
        return "straggler: n/a (no env time recorded)"
    excess = 100.0 * (env[slowest] - median) / median
    rule = f"{100 * STRAGGLER_EXCESS:.0f}%"
    if excess < 100.0 * STRAGGLER_EXCESS:
        return (
            f"straggler: none (worker_{slowest} has the most env time, {excess:.1f}% above the "
            f"median {_short_seconds(median)}: under the {rule} that identical workers can "
            "differ by from noise alone)"
        )
    s = workers[slowest]
    calls = (
        f" ({s.env_calls} calls, {_short_seconds(s.env / s.env_calls)} each)" if s.env_calls else ""
    )
    return (
        f"straggler: worker_{slowest} spent {_short_seconds(env[slowest])} in env calls{calls}, "
        f"{excess:.1f}% above the median {_short_seconds(median)} (named from {rule}); "
        f"fastest: worker_{fastest}, {_short_seconds(env[fastest])}"
    )
