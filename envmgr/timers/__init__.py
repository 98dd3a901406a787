"""Hierarchical timers: the tree every process keeps, and what reads it.

* :mod:`envmgr.timers.nodes` - a tree's nodes (timers and gauges), picklable, as JSON.
* :mod:`envmgr.timers.tree` - the timer stacks, ``hierarchical_timer``, gauges and the
  ML-Agents-compatible JSON (re-exported here: ``from envmgr import timers``,
  ``timers.hierarchical_timer("x")``).
* :mod:`envmgr.timers.merge` - folding worker trees into the parent's as parallel nodes.
* :mod:`envmgr.timers.format` - reading a tree: text table, folded stacks, worker summary.
* :mod:`envmgr.timers.plot` - an icicle plot of a tree (matplotlib).
"""

from __future__ import annotations

from envmgr.timers.nodes import TIMER_FORMAT_VERSION, GaugeNode, TimerNode
from envmgr.timers.tree import (
    TimerStack,
    add_metadata,
    get_default_stack,
    get_timer_root,
    get_timer_tree,
    hierarchical_timer,
    merge_gauges,
    register_flush_hook,
    reset_timers,
    run_in_stack,
    set_gauge,
    timed,
    write_timing_tree,
)

__all__ = [
    "TIMER_FORMAT_VERSION",
    "GaugeNode",
    "TimerNode",
    "TimerStack",
    "add_metadata",
    "get_default_stack",
    "get_timer_root",
    "get_timer_tree",
    "hierarchical_timer",
    "merge_gauges",
    "register_flush_hook",
    "reset_timers",
    "run_in_stack",
    "set_gauge",
    "timed",
    "write_timing_tree",
]
