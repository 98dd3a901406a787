"""The nodes of a timer tree: timers (time and call counts, children) and gauges.

Cheap to pickle (workers ship their root every interval) and read and written as
ML-Agents' ``timers.json``, whose layout :data:`TIMER_FORMAT_VERSION` names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["TIMER_FORMAT_VERSION", "TimerNode", "GaugeNode"]


TIMER_FORMAT_VERSION = "0.1.0"


# Compact pickled form of a node: (total, count) for plain leaves, (total, count, is_parallel)
# for parallel leaves, (total, count, is_parallel, {name: state}) when there are children.
_NodeState = tuple[Any, ...]


class TimerNode:
    """Accumulated time and call count of one timed block.

    The node does not know its own name: names are the keys of the parent's ``children``, which
    keeps nodes small and lets the same block reached through different paths stay distinct.

    Attributes:
        children: Child nodes by timer name.
        total: Total seconds spent in the block (for the root: wall time since start/reset).
        count: Number of times the block was entered.
        is_parallel: True when the timings came from concurrent workers, so ``total`` may be
            smaller than the sum of the children's totals.
    """

    __slots__ = ("children", "total", "count", "is_parallel")

    def __init__(self, total: float = 0.0, count: int = 0, is_parallel: bool = False) -> None:
        self.children: dict[str, TimerNode] = {}
        self.total: float = total
        self.count: int = count
        self.is_parallel: bool = is_parallel

    def get_child(self, name: str) -> TimerNode:
        """Returns the child called ``name``, creating an empty one on first use."""
        child = self.children.get(name)
        if child is None:
            child = self.children[name] = TimerNode()
        return child

    def add_time(self, elapsed: float, count: int = 1) -> None:
        """Adds ``elapsed`` seconds and ``count`` calls to this node."""
        self.total += elapsed
        self.count += count

    def merge(
        self, other: TimerNode, root_name: str | None = None, is_parallel: bool = True
    ) -> None:
        """Adds another tree's totals and counts into this one, recursively.

        Args:
            other: Tree to fold in; it is not modified. It must not be part of this tree.
            root_name: If given, merge into the child of that name instead of into ``self``.
            is_parallel: Whether ``other`` ran concurrently with this process. It is ORed into
                every node that receives data; nodes already parallel in ``other`` stay so.
        """
        target = self.get_child(root_name) if root_name is not None else self
        # An explicit work list avoids recursion limits and per-level call overhead.
        pending = [(target, other)]
        while pending:
            dst, src = pending.pop()
            dst.total += src.total
            dst.count += src.count
            dst.is_parallel = dst.is_parallel or is_parallel or src.is_parallel
            for name, src_child in src.children.items():
                pending.append((dst.get_child(name), src_child))

    def to_dict(self) -> dict[str, Any]:
        """Returns this subtree in the ``timers.json`` node layout.

        ``self`` is the time not covered by any child, clamped at zero because the children of a
        parallel node (or clock jitter) can add up to more than the node's total.
        """
        res: dict[str, Any] = {"total": self.total, "count": self.count}
        if self.is_parallel:
            res["is_parallel"] = True
        children = {name: child.to_dict() for name, child in self.children.items()}
        child_total = sum(child.total for child in self.children.values())
        res["self"] = max(0.0, self.total - child_total)
        if children:
            res["children"] = children
        return res

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TimerNode:
        """Builds a tree from :meth:`to_dict` output or an ML-Agents ``timers.json`` node.

        ``self`` is derived data and root-only keys (``name``, ``gauges``, ``metadata``) are
        ignored, so a whole ``timers.json`` document can be passed in directly.
        """
        node = cls(float(d.get("total", 0.0)), int(d.get("count", 0)), bool(d.get("is_parallel")))
        for name, child in (d.get("children") or {}).items():
            node.children[name] = cls.from_dict(child)
        return node

    def _state(self) -> _NodeState:
        if self.children:
            kids = {name: child._state() for name, child in self.children.items()}
            return (self.total, self.count, self.is_parallel, kids)
        if self.is_parallel:
            return (self.total, self.count, True)
        return (self.total, self.count)

    def __reduce__(self) -> tuple[Callable[[_NodeState], TimerNode], tuple[_NodeState]]:
        # One reduce call for the whole tree with plain tuples inside: smaller and faster to
        # (un)pickle than per-node slot dicts, which matters when every worker ships its root.
        return _node_from_state, (self._state(),)

    def __repr__(self) -> str:
        return (
            f"TimerNode(total={self.total!r}, count={self.count!r}, "
            f"is_parallel={self.is_parallel!r}, children={list(self.children)!r})"
        )


def _node_from_state(state: _NodeState) -> TimerNode:
    node = TimerNode(state[0], state[1])
    if len(state) > 2:
        node.is_parallel = state[2]
        if len(state) > 3:
            node.children = {name: _node_from_state(s) for name, s in state[3].items()}
    return node


class GaugeNode:
    """Latest value of a metric plus its running min, max and number of updates."""

    __slots__ = ("value", "min_value", "max_value", "count")

    def __init__(self, value: float) -> None:
        self.value: float = value
        self.min_value: float = value
        self.max_value: float = value
        self.count: int = 1

    def update(self, new_value: float) -> None:
        """Records a new value."""
        self.value = new_value
        self.min_value = min(self.min_value, new_value)
        self.max_value = max(self.max_value, new_value)
        self.count += 1

    def merge(self, other: GaugeNode) -> None:
        """Folds in another gauge, treating its value as the more recent one."""
        self.value = other.value
        self.min_value = min(self.min_value, other.min_value)
        self.max_value = max(self.max_value, other.max_value)
        self.count += other.count

    def as_dict(self) -> dict[str, float]:
        """Returns the gauge in the ``timers.json`` layout."""
        return {
            "value": self.value,
            "min": self.min_value,
            "max": self.max_value,
            "count": self.count,
        }

    @classmethod
    def from_dict(cls, d: dict[str, float]) -> GaugeNode:
        """Inverse of :meth:`as_dict`."""
        return _gauge_from_state(d["value"], d["min"], d["max"], int(d["count"]))

    def copy(self) -> GaugeNode:
        """Returns an independent copy, so merged-in gauges never alias another stack's."""
        return _gauge_from_state(self.value, self.min_value, self.max_value, self.count)

    def __reduce__(self) -> tuple[Callable[..., GaugeNode], tuple[float, float, float, int]]:
        return _gauge_from_state, (self.value, self.min_value, self.max_value, self.count)

    def __repr__(self) -> str:
        return f"GaugeNode({self.as_dict()!r})"


def _gauge_from_state(value: float, min_value: float, max_value: float, count: int) -> GaugeNode:
    gauge = GaugeNode(value)
    gauge.min_value, gauge.max_value, gauge.count = min_value, max_value, count
    return gauge
