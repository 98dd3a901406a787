"""One measurement on the synthetic entity env: build an implementation, time it, count bytes.

The body of the variable-size suite's ``--child`` run for the entity env
(:mod:`benchmarks._common.entity_env`)::

    spec {n_envs, impl, seconds, warmup, profile}
      build(impl) -> reset(seed=0) -> warm-up -> timed window -> sample
      envmgr*, after the timed window: a timer flush, then traffic_window (bytes pickled)

    ceiling         Ceiling.of_blocks(EntityLoop): two processes, n / 2 envs each, no messages
    envmgr          SubprocessEnvManager, 2 workers: entities in shared memory
    envmgr-caller   the same with 1 worker, the parent stepping n / 2 envs (caller_envs)
    envmgr-pickled  2 workers, ragged="pickled": every observation pickled
    async           gymnasium AsyncVectorEnv(shared_memory=False)
    sb3             SB3 SubprocVecEnv; it cannot stack lists of different lengths, so its
                    env pads them itself to 64 entities (what an SB3 user would do)
"""

from __future__ import annotations

from functools import partial
from time import perf_counter
from typing import Any

import gymnasium as gym

from benchmarks._common.ceiling import Ceiling
from benchmarks._common.entity_env import MAX_ENTITIES, EntityBenchEnv, EntityLoop, sample_actions
from benchmarks._common.timing import warm_then_time
from benchmarks._common.worker_traffic import traffic_window

__all__ = ["ENVMGR_IMPLS", "IMPLS", "WORKERS", "build", "measure"]

IMPLS = ["ceiling", "envmgr", "envmgr-caller", "envmgr-pickled", "async", "sb3"]
ENVMGR_IMPLS = {"envmgr", "envmgr-caller", "envmgr-pickled"}
#: Processes of the ceiling and workers of envmgr's default layout here.
WORKERS = 2


def build(impl: str, n: int, actions: Any) -> Any:
    """Implementation ``impl`` over ``n`` entity envs."""
    if impl == "ceiling":
        return Ceiling.of_blocks(EntityLoop, actions, WORKERS)
    fns = [EntityBenchEnv] * n
    if impl in ENVMGR_IMPLS:
        from envmgr import SubprocessEnvManager

        ragged = "pickled" if impl == "envmgr-pickled" else "gymnasium"
        if impl == "envmgr-caller":
            return SubprocessEnvManager(fns, 1, caller_envs=n // 2, capacity=MAX_ENTITIES)
        return SubprocessEnvManager(fns, WORKERS, ragged=ragged, capacity=MAX_ENTITIES)
    if impl == "async":
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False)
    if impl == "sb3":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv([partial(EntityBenchEnv, padded=True)] * n)
    raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}")


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, reset, warm up and time one implementation: the body of a ``--child`` run."""
    n, impl, seconds = spec["n_envs"], spec["impl"], spec["seconds"]
    actions = sample_actions(n, 1000 + n)
    t0 = perf_counter()
    vec = build(impl, n, actions)
    try:
        if impl == "ceiling":
            vec.timed(spec["warmup"])
            sample = vec.timed(seconds)
            sample["env_steps_per_second"] = sample.pop("steps_per_second")
            sample["build_seconds"] = perf_counter() - t0
            return sample
        vec.reset() if impl == "sb3" else vec.reset(seed=0)
        sample = {"build_seconds": perf_counter() - t0}
        pids = list(vec.worker_pids) if impl in ENVMGR_IMPLS else []
        timed = warm_then_time(vec.step, actions, spec["warmup"], seconds, pids)
        sample.update(
            batches=timed["batches"],
            seconds=timed["seconds"],
            env_steps_per_second=timed["batches"] * n / timed["seconds"],
            parent_cpu_ms_per_batch=timed["cpu_seconds"] / timed["batches"] * 1e3,
        )
        if impl in ENVMGR_IMPLS:
            from envmgr import timers

            k = timed["next"]
            sample["timed_written_bytes_per_batch"] = timed["written_bytes_per_batch"]
            timers.get_timer_tree()  # a flush: no shipment is due for timer_interval from here
            traffic = traffic_window(
                lambda b: vec.step(actions[(k + b) % len(actions)]), pids, spec["profile"]
            )
            sample["profile_batches"] = traffic.pop("batches")
            sample.update(traffic, n_workers=len(pids))
        return sample
    finally:
        vec.close()
