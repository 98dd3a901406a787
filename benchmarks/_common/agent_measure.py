"""One multi-agent measurement: build an implementation, warm it up, time it, profile envmgr.

The body of a suite's ``--child`` run (:mod:`benchmarks._common.fresh_child`), for any
implementation of :mod:`benchmarks._common.agent_peers` on any env of
:mod:`benchmarks._common.agent_envs`::

    spec {env, n_envs, impl, seconds, warmup, profile}
      build -> reset(seed=0) -> warm-up -> timed window (run_for) -> sample
      envmgr only, after the timed window: profile_envmgr (packing, unpacking, bytes)

Agent-steps are agent rows per batch (dead agents' rows included, as every
implementation here keeps them).
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import numpy as np

from benchmarks._common.agent_envs import sample_actions
from benchmarks._common.agent_peers import ENVMGR_IMPLS, build
from benchmarks._common.timing import warm_then_time
from benchmarks._common.worker_traffic import traffic_window

__all__ = ["measure", "pack_seconds", "profile_envmgr"]


def pack_seconds() -> float:
    """Flush every worker's timers; the merged ``agents.pack`` seconds so far."""
    from envmgr import timers

    node: dict[str, Any] | None = timers.get_timer_tree()
    for name in ("workers", "worker_root", "step", "env.step", "agents.pack"):
        node = (node or {}).get("children", {}).get(name)
    return float(node["total"]) if node else 0.0


def profile_envmgr(vec: Any, actions: np.ndarray, k: int, seconds: float) -> dict[str, Any]:
    """Over ``seconds`` of steps outside the timed window, from a timer flush on:

    * the workers' packing per live agent-step (``agents.pack`` under ``step/env.step``
      of the merged timer tree);
    * the parent's unpacking per live agent-step (``AgentVectorEnv.step`` minus the
      ``manager.step`` inside it);
    * the workers' bytes per batch (:func:`benchmarks._common.worker_traffic.traffic_window`).
    """
    manager = vec.manager
    inner = [0.0]
    manager_step = manager.step

    def timed_manager_step(a: Any) -> Any:
        t0 = perf_counter()
        try:
            return manager_step(a)
        finally:
            inner[0] += perf_counter() - t0

    outer = [0.0]
    live = [0]

    def step(b: int) -> None:
        t0 = perf_counter()
        out = vec.step(actions[(k + b) % len(actions)])
        outer[0] += perf_counter() - t0
        live[0] += int(np.count_nonzero(out[4]["active"]))

    pack0 = pack_seconds()  # a flush: no timer shipment is due for timer_interval from here
    manager.step = timed_manager_step  # the instance attribute shadows the method
    try:
        traffic = traffic_window(step, list(manager.worker_pids), seconds)
    finally:
        del manager.step
    pack = pack_seconds() - pack0
    batches = traffic.pop("batches")
    agents = max(live[0], 1)
    return {
        "profile_batches": batches,
        "live_agents_per_batch": live[0] / batches,
        "worker_pack_us_per_agent": pack / agents * 1e6,
        "parent_unpack_us_per_agent": (outer[0] - inner[0]) / agents * 1e6,
        **traffic,
        "n_workers": len(manager.worker_pids),
    }


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, reset, warm up and time one implementation: the body of a ``--child`` run."""
    env, n, impl, seconds = spec["env"], spec["n_envs"], spec["impl"], spec["seconds"]
    actions = sample_actions(env, n, 1000 + n)
    t0 = perf_counter()
    vec = build(impl, env, n, actions)
    try:
        if impl == "ceiling":
            vec.timed(spec["warmup"])
            sample = vec.timed(seconds)
            sample["build_seconds"] = perf_counter() - t0
            return sample
        vec.reset(seed=0)
        sample = {"build_seconds": perf_counter() - t0}
        pids = list(vec.manager.worker_pids) if impl in ENVMGR_IMPLS else []
        timed = warm_then_time(vec.step, actions, spec["warmup"], seconds, pids)
        batches, elapsed, cpu = timed["batches"], timed["seconds"], timed["cpu_seconds"]
        envs_per_batch = getattr(vec, "envs_per_batch", n)
        rows_per_batch = actions.shape[1] * envs_per_batch // n
        sample.update(
            batches=batches,
            seconds=elapsed,
            envs_per_batch=envs_per_batch,
            agent_steps_per_second=batches * rows_per_batch / elapsed,
            env_steps_per_second=batches * envs_per_batch / elapsed,
            # Per n env-steps, so that half batches compare with whole ones.
            parent_cpu_ms_per_batch=cpu / (batches * envs_per_batch / n) * 1e3,
        )
        if impl in ENVMGR_IMPLS:
            sample["timed_written_bytes_per_batch"] = timed["written_bytes_per_batch"]
            sample.update(profile_envmgr(vec, actions, timed["next"], spec["profile"]))
        return sample
    finally:
        vec.close()
