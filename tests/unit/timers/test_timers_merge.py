"""Worker timer trees merged into the parent's: counts equal calls under every start
method and shipping interval, reading the tree flushes without losing a step in
flight, and forked workers start with empty timers.

(envmgr.timers, envmgr.frontend.vector_env's timer flush)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from support.envs import DictObsEnv
from support.helpers import batch_actions

from envmgr import SubprocessEnvManager, timers

pytestmark = pytest.mark.timeout(60)


def _node(tree: dict[str, Any], *path: str) -> dict[str, Any]:
    node = tree
    for name in path:
        children = node.get("children", {})
        assert name in children, f"no {name!r} under {'/'.join(path)}: children {sorted(children)}"
        node = children[name]
    return node


def _check_worker_counts(
    workers: dict[str, Any], n_workers: int, envs_per_worker: int, steps: int
) -> None:
    root = _node(workers, "worker_root")
    assert root.get("is_parallel") is True
    assert _node(root, "step")["count"] == steps * n_workers
    for w in range(n_workers):
        sub = _node(workers, f"worker_{w}")
        assert sub.get("is_parallel") is True
        step = _node(sub, "step")
        assert step["count"] == steps, f"worker_{w}"
        env_calls = sum(
            step.get("children", {}).get(k, {}).get("count", 0) for k in ("env.step", "env.reset")
        )
        assert env_calls == steps * envs_per_worker, f"worker_{w}"


def test_merged_timer_tree(start_method: str, fresh_timers: None) -> None:
    n_steps = 7  # far fewer than a timer shipment's worth: reading must flush
    with SubprocessEnvManager(DictObsEnv, 2, 2, context=start_method) as envs:
        actions = batch_actions(envs, n_steps)
        envs.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in actions:
                envs.step(a)
        tree = timers.get_timer_tree()
    env_step = _node(tree, "env_step")
    assert env_step["count"] == 1
    workers = _node(env_step, "workers")
    assert workers["count"] == n_steps
    _check_worker_counts(workers, 2, 2, n_steps)
    # The reset happened outside env_step: its timings sit under root/workers.
    reset_root = _node(tree, "workers", "worker_root", "reset")
    assert reset_root["count"] == 2
    assert _node(reset_root, "env.reset")["count"] == 4


@pytest.mark.parametrize("timer_interval", [0.0, 3600.0])
def test_timer_counts_do_not_depend_on_the_shipping_interval(
    timer_interval: float, fresh_timers: None
) -> None:
    n_steps = 7
    with SubprocessEnvManager(DictObsEnv, 2, 3, timer_interval=timer_interval) as envs:
        actions = batch_actions(envs, 2 * n_steps)
        envs.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in actions[:n_steps]:
                envs.step(a)
        first = timers.get_timer_tree()
        again = timers.get_timer_tree()  # a second read must not count anything twice
        with timers.hierarchical_timer("env_step"):
            for a in actions[n_steps:]:
                envs.step(a)
    after_close = timers.get_timer_tree()  # close() pulled in the rest
    _check_worker_counts(_node(first, "env_step", "workers"), 2, 3, n_steps)
    _check_worker_counts(_node(again, "env_step", "workers"), 2, 3, n_steps)
    _check_worker_counts(_node(after_close, "env_step", "workers"), 2, 3, 2 * n_steps)


def test_reading_timers_while_send_steps_are_in_flight_loses_no_step(fresh_timers: None) -> None:
    # Reading the tree flushes worker timings; with send() steps in flight that
    # flush must neither be sent over them nor swallow them.
    with SubprocessEnvManager(DictObsEnv, 2, 1, spin_seconds=0.0, step_timeout=5) as envs:
        envs.reset(seed=0)
        actions = np.zeros((2, 2), dtype=np.int64)
        for _ in range(3):
            envs.send(actions)
            timers.get_timer_tree()
            *_, env_ids = envs.recv(batch_size=2)
            assert env_ids.tolist() == [0, 1]
        tree = timers.get_timer_tree()
    assert _node(tree, "workers", "worker_root", "step")["count"] == 3 * 2


def test_forked_worker_timers_start_empty(fresh_timers: None) -> None:
    n_steps = 5
    with SubprocessEnvManager(DictObsEnv, 2, 2, context="fork") as first:
        first.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in batch_actions(first, 3 * n_steps):
                first.step(a)
    # The parent's tree is full of the first manager's timings when the second forks.
    assert _node(timers.get_timer_tree(), "env_step", "workers", "worker_0", "step")["count"] > 0
    with SubprocessEnvManager(DictObsEnv, 2, 2, context="fork") as second:
        timers.reset_timers()
        second.reset(seed=0)
        with timers.hierarchical_timer("env_step"):
            for a in batch_actions(second, n_steps):
                second.step(a)
        tree = timers.get_timer_tree()
    _check_worker_counts(_node(tree, "env_step", "workers"), 2, 2, n_steps)
