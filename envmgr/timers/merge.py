"""Where worker timer trees land in the caller's tree, and when workers ship them.

Shared by :class:`~envmgr.managers.local.SubprocessEnvManager` and the Ray manager.
Shipping a tree every step would cost several percent of throughput, so workers
keep their timings and ship them every ``interval`` seconds, or at once when
the caller's timer context changes (so timings land under the node that was
current when they were taken). A read of the tree through :mod:`envmgr.timers`
first calls the manager's ``flush``, so a read always reflects every completed
step.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Sequence
from time import perf_counter
from typing import Any

from envmgr import timers
from envmgr.timers import GaugeNode, TimerNode, TimerStack

__all__ = ["WorkerTimers"]

#: One worker's shipment: its subtree name, its root (or None), its gauges.
_Shipment = tuple[str, TimerNode | None, dict[str, GaugeNode] | None]


class WorkerTimers:
    """The merge target of one manager's worker trees.

    Each group has its own shipping deadline: first-ready stepping sends one group at a
    time, and a group must ship once per ``interval`` whatever the others do (a single
    clock reset only when every group had answered would never be reset there, and every
    step would ship).

    Args:
        interval: Seconds between shipments during a steady loop.
        flush: The manager's method that asks every worker for its unshipped
            tree and hands it to :meth:`merge` (held weakly: no reference cycle).
        n_groups: How many groups ship trees.
    """

    def __init__(self, interval: float, flush: Callable[[], None], n_groups: int = 1) -> None:
        self.interval = interval
        self._flush = weakref.WeakMethod(flush)  # type: ignore[arg-type]
        #: The stack (thread) the manager is stepped from; timings merge into it.
        self.stack: TimerStack | None = None
        self.target: TimerNode | None = None
        self._under: TimerNode | None = None  # the node ``target`` is the child of
        self._thread = threading.get_ident()
        #: Workers hold timings not merged yet.
        self.unshipped = False
        first = perf_counter() + interval
        self._due = [first] * n_groups  # when each group next ships
        self._next_due = first  # min(self._due): the per-step check is one comparison
        self._unhook: Callable[[], None] | None = timers.register_flush_hook(self._on_read)

    def timers_due(self, groups: Sequence[int] | None = None) -> bool:
        """Before a command to ``groups`` (default all): whether they should ship their trees.

        A yes counts as their shipment: their next one is due ``interval`` from now.
        Also follows the caller's timer context: if it moved, what workers hold
        is flushed into the old place first.
        """
        stack = timers.get_default_stack()
        if stack is not self.stack:
            self.stack = stack
            self._thread = threading.get_ident()
        current = stack.current()
        if current is not self._under:  # (checked per step: compare before looking up)
            self._under = current
            target = current.get_child("workers")
            if target is not self.target:
                if self.unshipped and self.target is not None:
                    self._call_flush()
                self.target = target
        now = perf_counter()
        if now < self._next_due:
            return False
        due = self._due
        chosen = range(len(due)) if groups is None else groups
        if all(due[g] > now for g in chosen):
            return False
        later = now + self.interval
        for g in chosen:
            due[g] = later
        self._next_due = min(due)
        return True

    def wait_node(self) -> TimerNode:
        """The ``workers`` node under the caller's current timer (where a wait is timed)."""
        stack = timers.get_default_stack()
        current = stack.current()
        if current is self._under and self.target is not None:
            return self.target
        return current.get_child("workers")

    def merge(self, trees: Iterable[_Shipment], target: TimerNode | None = None) -> None:
        """Merge ``(subtree name, root, gauges)`` per worker as parallel nodes.

        Each root goes under ``workers`` (or ``target``) twice: summed over all
        workers in ``worker_root`` (the ML-Agents shape) and alone under its own
        name, so a slow worker stands out. A root's ``count`` is the number of
        calls the worker served in it.
        """
        stack = self.stack
        if target is None:
            target = self.target
        elif stack is None:
            stack = timers.get_default_stack()
        for name, root, gauges in trees:
            if root is not None and target is not None:
                target.merge(root, root_name="worker_root", is_parallel=True)
                target.merge(root, root_name=name, is_parallel=True)
            if gauges and stack is not None:
                stack.merge_gauges(gauges)

    def shipped(self) -> None:
        """Every worker's timings are merged (a flush): none is due for ``interval``."""
        self.unshipped = False
        later = perf_counter() + self.interval
        self._due = [later] * len(self._due)
        self._next_due = later

    def close(self) -> None:
        """Stop pulling timings on reads (the manager is closing)."""
        if self._unhook is not None:
            self._unhook()
            self._unhook = None

    def _call_flush(self) -> None:
        flush = self._flush()
        if flush is not None:
            flush()

    def _on_read(self, stack: TimerStack) -> None:
        # Only the thread that steps the manager may talk to its workers.
        if stack is self.stack and threading.get_ident() == self._thread:
            self._call_flush()

    def __repr__(self) -> str:
        state: dict[str, Any] = {"unshipped": self.unshipped, "interval": self.interval}
        return f"WorkerTimers({state})"
