"""Hierarchical timers and gauges for profiling, compatible with ML-Agents' ``timers.json``.

Wrap code in ``with hierarchical_timer("name"):`` or decorate functions with ``@timed``; time
and call counts accumulate in a tree that follows the nesting of the timers::

    with hierarchical_timer("rollout"):
        for _ in range(3):
            env_step()  # decorated with @timed -> node "rollout" / "env_step"

Each thread gets its own default :class:`TimerStack`, and a forked child starts with empty
stacks, so threads and worker processes never corrupt each other's timings. Workers ship their
root :class:`TimerNode` (cheap to pickle) to the parent, which folds it in with
:meth:`TimerNode.merge`; flush hooks let the parent pull pending worker data just before a read.

The JSON layout and :data:`TIMER_FORMAT_VERSION` match what ML-Agents writes, so existing
``timers.json`` tooling reads our output and :meth:`TimerNode.from_dict` reads theirs.

One module: the stacks, ``hierarchical_timer`` and the flush hooks share the per-thread
state and the fork hook that clears it (the nodes are :mod:`envmgr.timers.nodes`).
"""

from __future__ import annotations

import contextvars
import functools
import json
import math
import os
import sys
import threading
import time
import types
import warnings
import weakref
from collections.abc import Callable
from time import perf_counter
from typing import Any, TypeVar

from envmgr.timers.nodes import TIMER_FORMAT_VERSION, GaugeNode, TimerNode

FuncT = TypeVar("FuncT", bound=Callable[..., Any])
T = TypeVar("T")


class TimerStack:
    """A timer tree plus the path of timers currently open, gauges and run metadata.

    Prefer :class:`hierarchical_timer` and :func:`timed` over :meth:`push`/:meth:`pop`: they
    keep pushes and pops matched even when the timed code raises.

    Attributes:
        root: Root of the timer tree.
        stack: Open timers, outermost first; ``stack[0]`` is always ``root``.
        start_time: ``perf_counter()`` at creation or the last :meth:`reset`.
        gauges: Gauges by name.
        metadata: Free-form string annotations written to the root of the JSON tree.
    """

    __slots__ = ("root", "stack", "start_time", "gauges", "metadata")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Discards all timings, gauges and metadata and restarts the wall clock."""
        self.root = TimerNode()
        self.stack: list[TimerNode] = [self.root]
        self.start_time = perf_counter()
        self.gauges: dict[str, GaugeNode] = {}
        self.metadata: dict[str, str] = {
            "timer_format_version": TIMER_FORMAT_VERSION,
            "start_time_seconds": str(int(time.time())),
            "python_version": sys.version,
            "command_line_arguments": " ".join(sys.argv),
        }

    def push(self, name: str) -> TimerNode:
        """Opens the timer ``name`` under the current one and returns its node."""
        node = self.stack[-1].get_child(name)
        self.stack.append(node)
        return node

    def pop(self) -> None:
        """Closes the innermost open timer.

        Raises:
            RuntimeError: If no timer is open (the root can never be popped).
        """
        if len(self.stack) <= 1:
            raise RuntimeError("TimerStack.pop() called with no open timer")
        self.stack.pop()

    def current(self) -> TimerNode:
        """Returns the innermost open timer: where new timers and merges would go."""
        return self.stack[-1]

    def get_root(self) -> TimerNode:
        """Returns the root with its total set to the wall time since start/reset."""
        root = self.root
        root.total = perf_counter() - self.start_time
        root.count = 1
        return root

    def get_timing_tree(self, node: TimerNode | None = None) -> dict[str, Any]:
        """Returns the ``timers.json`` dict for ``node``, or for the whole stack if omitted.

        The whole-stack form adds ``name``, ``gauges`` and ``metadata`` at the root and stamps
        ``end_time_seconds`` into the metadata.
        """
        if node is not None:
            return node.to_dict()
        root = self.get_root()
        self.metadata["end_time_seconds"] = str(int(time.time()))
        res: dict[str, Any] = {
            "name": "root",
            "gauges": {name: gauge.as_dict() for name, gauge in self.gauges.items()},
            "metadata": dict(self.metadata),
        }
        res.update(root.to_dict())
        return res

    def set_gauge(self, name: str, value: float) -> None:
        """Records ``value`` for gauge ``name``; NaN is ignored so it cannot poison min/max."""
        if math.isnan(value):
            return
        gauge = self.gauges.get(name)
        if gauge is None:
            self.gauges[name] = GaugeNode(value)
        else:
            gauge.update(value)

    def merge_gauges(self, gauges: dict[str, GaugeNode]) -> None:
        """Folds in gauges from another stack (e.g. a worker's); the inputs are not modified."""
        for name, other in gauges.items():
            mine = self.gauges.get(name)
            if mine is None:
                self.gauges[name] = other.copy()
            else:
                mine.merge(other)

    def add_metadata(self, key: str, value: str) -> None:
        """Sets a metadata entry, overwriting any previous value."""
        self.metadata[key] = value


class _ThreadState(threading.local):
    stack: TimerStack
    flushing: bool = False


_local = _ThreadState()
# A stack that stands in for the thread's default while :func:`run_in_stack` runs.
_stand_in: contextvars.ContextVar[TimerStack | None] = contextvars.ContextVar(
    "envmgr_timer_stack", default=None
)


def get_default_stack() -> TimerStack:
    """Returns the calling thread's default :class:`TimerStack`, creating it on first use."""
    stand_in = _stand_in.get()
    if stand_in is not None:
        return stand_in
    try:
        return _local.stack
    except AttributeError:
        stack = _local.stack = TimerStack()
        return stack


def run_in_stack(stack: TimerStack, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` with ``stack`` as the default stack (timers that name none nest there).

    The switch lives in a copy of the calling context, entered and left by
    ``Context.run`` in C: no exception raised by a signal handler (Ctrl-C) between two
    bytecodes can leave ``stack`` in place after ``fn`` returns or raises, as it could
    where Python code sets and restores a thread's stack.
    """
    return contextvars.copy_context().run(_run_in, stack, fn, args)


def _run_in(stack: TimerStack, fn: Callable[..., T], args: tuple[Any, ...]) -> T:
    _stand_in.set(stack)  # in the copied context: gone with it
    return fn(*args)


class hierarchical_timer:  # noqa: N801 - used like a function, as in ML-Agents
    """Times a block under the innermost open timer: ``with hierarchical_timer("x") as node:``.

    The time and count are added and the timer closed even when the block raises; the
    exception still propagates. Also usable as a decorator (``@hierarchical_timer("name")``).

    This is a class rather than a ``@contextmanager`` generator because it is roughly 2.5x
    cheaper per use, and it wraps every env step. An instance may be entered again after it
    exits, but not while it is still open.

    Args:
        name: Timer name, a key in the enclosing node's ``children``.
        timer_stack: Stack to record into; None means the calling thread's default stack,
            looked up when the block is entered.
    """

    __slots__ = ("_name", "_timer_stack", "_stack", "_node", "_start")

    def __init__(self, name: str, timer_stack: TimerStack | None = None) -> None:
        self._name = name
        self._timer_stack = timer_stack
        self._node: TimerNode | None = None

    def __enter__(self) -> TimerNode:
        if self._node is not None:
            raise RuntimeError(f"hierarchical_timer({self._name!r}) is already open")
        timer_stack = self._timer_stack
        if timer_stack is None:
            # Inlined fast path of get_default_stack(): saves a call on every env step.
            timer_stack = _stand_in.get()
            if timer_stack is None:
                try:
                    timer_stack = _local.stack
                except AttributeError:
                    timer_stack = get_default_stack()
        # Inlined push(): this runs on every timed env step.
        stack = timer_stack.stack
        children = stack[-1].children
        node = children.get(self._name)
        if node is None:
            node = children[self._name] = TimerNode()
        stack.append(node)
        # Keep the list itself, so a reset() inside the block cannot make us pop the new root.
        self._stack = stack
        self._node = node
        self._start = perf_counter()
        return node

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        elapsed = perf_counter() - self._start
        node = self._node
        assert node is not None
        self._node = None
        node.total += elapsed
        node.count += 1
        stack = self._stack
        popped = stack.pop()
        if popped is not node:
            # Timers held open across generator yields can close out of order; remove our own
            # entry rather than whichever timer happens to be innermost.
            stack.append(popped)
            for i in range(len(stack) - 1, 0, -1):
                if stack[i] is node:
                    del stack[i]
                    break

    def __call__(self, func: FuncT) -> FuncT:
        """Time every call of ``func`` under this timer's name."""
        name, timer_stack = self._name, self._timer_stack

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with hierarchical_timer(name, timer_stack):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def timed(func: FuncT) -> FuncT:
    """Decorator timing each call under the name ``func.__qualname__``.

    The timer goes on the default stack of whichever thread makes the call.
    """
    name = func.__qualname__

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with hierarchical_timer(name):
            return func(*args, **kwargs)

    return wrapper  # type: ignore[return-value]


class _FlushHook:
    __slots__ = ("ref", "warned")

    def __init__(self, hook: Callable[[TimerStack], None]) -> None:
        # Bound methods are held weakly so registering one does not keep its owner (e.g. an env
        # manager with live worker pipes) alive; anything else is held strongly because a
        # lambda or closure would otherwise die immediately.
        self.ref: Callable[[], Callable[[TimerStack], None] | None]
        if isinstance(hook, types.MethodType):
            self.ref = weakref.WeakMethod(hook)
        else:
            self.ref = lambda: hook
        self.warned = False


_flush_hooks: list[_FlushHook] = []
_flush_hooks_lock = threading.Lock()


def register_flush_hook(hook: Callable[[TimerStack], None]) -> Callable[[], None]:
    """Registers ``hook(stack)`` to run before the module-level read functions.

    Hooks run in registration order at the start of :func:`get_timer_root`,
    :func:`get_timer_tree` and :func:`write_timing_tree`, receiving the stack about to be read,
    e.g. so a worker manager can merge in timings its workers have not shipped yet. A hook that
    raises is reported once with :func:`warnings.warn` and otherwise skipped; a hook that reads
    timers itself does not re-trigger the hooks.

    Args:
        hook: Callable taking the :class:`TimerStack`. Bound methods are held weakly and dropped
            once their object is garbage collected; other callables are held strongly.

    Returns:
        A callable that unregisters the hook; calling it more than once is harmless.
    """
    entry = _FlushHook(hook)
    with _flush_hooks_lock:
        _flush_hooks.append(entry)

    def unregister() -> None:
        with _flush_hooks_lock:
            if entry in _flush_hooks:
                _flush_hooks.remove(entry)

    return unregister


def _run_flush_hooks(timer_stack: TimerStack) -> None:
    if _local.flushing or not _flush_hooks:
        return
    with _flush_hooks_lock:
        # Drop hooks whose object died, and snapshot so hooks may (un)register while running.
        _flush_hooks[:] = [entry for entry in _flush_hooks if entry.ref() is not None]
        entries = tuple(_flush_hooks)
    _local.flushing = True
    try:
        for entry in entries:
            hook = entry.ref()
            if hook is None:
                continue
            try:
                hook(timer_stack)
            except Exception as exc:
                if not entry.warned:
                    entry.warned = True
                    warnings.warn(
                        f"timer flush hook {hook!r} raised {exc!r}; its data is skipped",
                        RuntimeWarning,
                        stacklevel=3,
                    )
    finally:
        _local.flushing = False


def _after_fork_in_child() -> None:
    global _local, _flush_hooks_lock
    # The parent's timings and hooks (which talk to the parent's workers) mean nothing in the
    # child; keeping them would also make a worker's tree grow with every manager created. The
    # lock is replaced because another parent thread may have held it at the moment of fork.
    _local = _ThreadState()
    _flush_hooks_lock = threading.Lock()
    _flush_hooks.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _resolve(timer_stack: TimerStack | None) -> TimerStack:
    return get_default_stack() if timer_stack is None else timer_stack


def set_gauge(name: str, value: float, timer_stack: TimerStack | None = None) -> None:
    """Records ``value`` for gauge ``name`` (default stack if ``timer_stack`` is None)."""
    _resolve(timer_stack).set_gauge(name, value)


def merge_gauges(gauges: dict[str, GaugeNode], timer_stack: TimerStack | None = None) -> None:
    """Folds gauges from another stack into ``timer_stack`` (default stack if None)."""
    _resolve(timer_stack).merge_gauges(gauges)


def add_metadata(key: str, value: str, timer_stack: TimerStack | None = None) -> None:
    """Sets metadata ``key`` on ``timer_stack`` (default stack if None)."""
    _resolve(timer_stack).add_metadata(key, value)


def get_timer_root(timer_stack: TimerStack | None = None) -> TimerNode:
    """Runs the flush hooks, then returns the root node with its wall time refreshed."""
    stack = _resolve(timer_stack)
    _run_flush_hooks(stack)
    return stack.get_root()


def get_timer_tree(timer_stack: TimerStack | None = None) -> dict[str, Any]:
    """Runs the flush hooks, then returns the stack's ``timers.json`` dict."""
    stack = _resolve(timer_stack)
    _run_flush_hooks(stack)
    return stack.get_timing_tree()


def reset_timers(timer_stack: TimerStack | None = None) -> None:
    """Resets ``timer_stack`` (default stack if None); see :meth:`TimerStack.reset`."""
    _resolve(timer_stack).reset()


def write_timing_tree(path: str | os.PathLike[str], timer_stack: TimerStack | None = None) -> None:
    """Runs the flush hooks, then writes the ``timers.json`` dict to ``path`` (indent 4).

    The parent directory must already exist.
    """
    tree = get_timer_tree(timer_stack)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(tree, f, indent=4)
