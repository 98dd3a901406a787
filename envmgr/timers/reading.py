"""Reading a timer tree: load and check it, and the shared node accessors and number formats.

Every view of it (``format``, ``worker_view``, ``plot``) shares them.

A node is a dict with ``total`` seconds, an optional ``count``, ``self`` (seconds not covered by
children), ``is_parallel`` and ``children`` (name -> node); the root may also carry ``name``,
``gauges`` and ``metadata``. ML-Agents' ``timers.json`` has the same shape.
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Mapping
from os import PathLike
from typing import Any, TypeGuard

__all__ = [
    "TimerTreeError",
    "TimerFileError",
    "check_tree",
    "load_tree",
    "PROCESS_ROOT_RE",
    "UNTIMED",
    "WORKER_RE",
    "child_nodes",
    "node_count",
    "format_seconds",
    "self_seconds",
    "short_seconds",
    "summing_children",
    "total_seconds",
]

WORKER_RE = re.compile(r"worker_(\d+)")
# Where a worker's (or Ray actor's) own tree is merged in: below such a node the times are that
# process's clock, not the parent's.
PROCESS_ROOT_RE = re.compile(r"worker_root|worker_\d+|actor_\d+(@.*)?")


class TimerTreeError(ValueError):
    """A file or object is not a readable timer tree; the message is a single line."""


class TimerFileError(TimerTreeError):
    """The file could not be read at all (missing, a directory, no permission, not UTF-8)."""


#: How a ``workers`` node right under the root is shown: the manager merges worker trees under
#: the caller's current timer, and a call made outside any timer (a reset before the loop) has
#: only the root to go under.
UNTIMED = "(calls made outside any timer)"


# ------------------------------------------------------------------ reading and checking


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


def total_seconds(node: Mapping[str, Any]) -> float:
    """Return ``node``'s total seconds."""
    return float(node.get("total", 0.0))


def node_count(node: Mapping[str, Any]) -> int:
    """Return ``node``'s count (0 when it has none)."""
    return int(node.get("count", 0) or 0)


def child_nodes(node: Mapping[str, Any]) -> dict[str, Any]:
    """Return ``node``'s children by name (empty when it has none)."""
    return node.get("children") or {}


def self_seconds(node: Mapping[str, Any]) -> float:
    """``self`` as stored, else total minus the children's totals (clamped at 0)."""
    value = node.get("self")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(0.0, float(value))
    return max(0.0, total_seconds(node) - sum(total_seconds(c) for c in child_nodes(node).values()))


def summing_children(node: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """Return the children to use where times are added up.

    ``worker_root`` is dropped when ``worker_<i>`` siblings exist, because it is exactly their
    sum.
    """
    kids = child_nodes(node)
    if "worker_root" in kids and any(WORKER_RE.fullmatch(k) for k in kids):
        return [(k, v) for k, v in kids.items() if k != "worker_root"]
    return list(kids.items())


def format_seconds(s: float) -> str:
    """Seconds in a unit that keeps 4 significant digits, right-aligned in 11 chars."""
    if s >= 1.0:
        return f"{s:8.3f} s "
    if s >= 1e-3:
        return f"{s * 1e3:8.3f} ms"
    return f"{s * 1e6:8.3f} µs"


def short_seconds(s: float) -> str:
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
