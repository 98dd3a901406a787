"""Worker timer trees people can read: start-up is its own node, worker-node counts are calls."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from support.envs import DictObsEnv
from support.fault_envs import fault_env_fns

from envmgr import SubprocessEnvManager, timers

pytestmark = pytest.mark.timeout(120)


def _node(tree: dict[str, Any], *path: str) -> dict[str, Any]:
    node = tree
    for name in path:
        children = node.get("children", {})
        assert name in children, f"no {name!r} under {'/'.join(path)}: children {sorted(children)}"
        node = children[name]
    return node


def _timed_cartpole() -> gym.Env[Any, Any]:
    """CartPole whose construction leaves a mark in the worker's timers."""
    with timers.hierarchical_timer("build_me"):
        timers.set_gauge("built", 1.0)
        return gym.make("CartPole-v1")


def test_start_up_is_its_own_node_not_the_first_resets(fresh_timers: None) -> None:
    with SubprocessEnvManager(_timed_cartpole, 2, 2, context="fork") as envs:
        with timers.hierarchical_timer("first_reset"):
            envs.reset(seed=0)
        tree = timers.get_timer_tree()
    start = _node(tree, "start_workers")
    assert start["count"] == 1
    assert _node(start, "worker_root")["count"] == 2  # one start-up per worker
    for w in range(2):
        worker = _node(start, f"worker_{w}")
        assert worker["is_parallel"] and worker["count"] == 1
        make = _node(worker, "make_envs")
        assert make["count"] == 1
        assert _node(make, "build_me")["count"] == 2  # env code's own timers nest there
    # The first reset's worker trees hold the reset only: no build, one call each.
    for w in range(2):
        worker = _node(tree, "first_reset", "workers", f"worker_{w}")
        assert worker["count"] == 1
        assert "make_envs" not in worker.get("children", {})
        assert _node(worker, "reset")["count"] == 1
    assert tree["gauges"]["built"]["count"] == 4  # gauges set while building still arrive


@pytest.mark.parametrize("timer_interval", [0.0, 3600.0])
def test_worker_node_count_is_the_number_of_calls(
    timer_interval: float, fresh_timers: None
) -> None:
    n_steps = 9
    with SubprocessEnvManager(
        DictObsEnv, 2, 2, context="fork", timer_interval=timer_interval
    ) as envs:
        envs.reset(seed=0)
        actions = [envs.action_space.sample() for _ in range(n_steps)]
        with timers.hierarchical_timer("loop"):
            for a in actions:
                envs.step(a)
        envs.get_attr("spec")  # not a step or reset: not counted
        tree = timers.get_timer_tree()
    workers = _node(tree, "loop", "workers")
    assert workers["count"] == n_steps
    assert _node(workers, "worker_root")["count"] == 2 * n_steps
    for w in range(2):
        assert _node(workers, f"worker_{w}")["count"] == n_steps
    assert _node(tree, "workers", "worker_0")["count"] == 1  # the reset


def test_a_replacement_workers_start_up_lands_under_its_restart_node(
    tmp_path: Path, fresh_timers: None
) -> None:
    fns = fault_env_fns("exit", 4, 3, at_step=2, state_dir=tmp_path)
    zeros = np.zeros(4, dtype=np.int64)
    with SubprocessEnvManager(fns, 2, 2, context="fork", max_restarts=1) as envs:
        envs.reset(seed=0)
        with timers.hierarchical_timer("loop"):
            for _ in range(4):
                envs.step(zeros)
        assert envs.restarts == [0, 1]
        tree = timers.get_timer_tree()
    restart = _node(tree, "loop", "workers", "restart_worker_1")
    assert restart["count"] == 1
    assert _node(restart, "worker_1", "make_envs")["count"] == 1
    assert "worker_0" not in restart["children"]
    # Everything the workers shipped while stepping was calls, never a build.
    for name, node in _node(tree, "loop", "workers")["children"].items():
        if name.startswith("worker_"):
            assert "make_envs" not in node.get("children", {}), name


def test_start_up_and_counts_on_both_backends(backend: Backend, fresh_timers: None) -> None:
    n_steps = 5
    with backend(DictObsEnv, 2, 2, timer_interval=3600.0) as envs:
        envs.reset(seed=0)
        actions = [envs.action_space.sample() for _ in range(n_steps)]
        with timers.hierarchical_timer("loop"):
            for a in actions:
                envs.step(a)
        tree = timers.get_timer_tree()
    (start_name,) = [k for k in tree["children"] if k.startswith("start_")]
    groups = tree["children"][start_name]["children"]
    names = sorted(k for k in groups if k != "worker_root")
    assert len(names) == 2, groups.keys()
    assert groups["worker_root"]["count"] == 2
    for name in names:
        assert groups[name]["count"] == 1 and _node(groups[name], "make_envs")["count"] == 1
    stepped = _node(tree, "loop", "workers")
    assert stepped["children"]["worker_root"]["count"] == 2 * n_steps
    for name in names:
        assert stepped["children"][name]["count"] == n_steps, name
        assert "make_envs" not in stepped["children"][name].get("children", {})
