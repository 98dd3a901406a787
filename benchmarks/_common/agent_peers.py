"""The multi-agent benchmark's implementations, and how each is built.

Every one steps ``n`` copies of an env of :mod:`benchmarks._common.agent_envs` with
``step(actions)``, ``actions`` a flat row of ``n * agents`` ints (env-major)::

    build(impl, env, n, actions)
      serial         SerialRows: one process, packing agent dicts as envmgr does
      ceiling        AgentCeiling: SerialRows over n / 2 envs in each of two processes
                     (ceiling.Ceiling's processes), with no communication
      supersuit      SuperSuitVec: concat_vec_envs_v1, two processes
      puffer*        PufferVec: PufferLib's Multiprocessing backend
      envmgr*        envmgr.make_parallel
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np

from benchmarks._common.agent_envs import DYING, make_env
from benchmarks._common.ceiling import Ceiling
from envmgr.tune.serial_agents import SerialAgentRows

__all__ = [
    "DEFAULT_IMPLS",
    "ENVMGR_IMPLS",
    "IMPLS",
    "PUFFER_IMPLS",
    "AgentCeiling",
    "PufferVec",
    "SerialRows",
    "SuperSuitVec",
    "build",
    "skip_reason",
]

IMPLS = [
    "serial",
    "ceiling",
    "supersuit",
    "puffer",
    "puffer-async",
    "puffer-1w",
    "puffer-copy",
    "envmgr",
    "envmgr-caller",
]
DEFAULT_IMPLS = [i for i in IMPLS if i != "puffer-copy"]
ENVMGR_IMPLS = {"envmgr", "envmgr-caller"}
PUFFER_IMPLS = {"puffer", "puffer-async", "puffer-1w", "puffer-copy"}


class SerialRows(SerialAgentRows):
    """``n`` ParallelEnvs stepped in this process, packed as envmgr packs them.

    The loop of ``envmgr tune --parallel``'s ceiling
    (:class:`envmgr.tune.serial_agents.SerialAgentRows`): row ``k * S + s`` is env ``k``'s
    agent ``possible_agents[s]``, its observation, reward and flags when it is live or
    ended on this step, zeros otherwise; an env whose agents are all gone is reset at its
    next step. Infos are dropped. ``step`` takes the actions as a flat row of ``n * S``
    (env-major) or as ``[n, S]``.
    """

    def step(self, actions: np.ndarray) -> tuple[Any, ...]:
        return super().step(actions.reshape(len(self.envs), -1))


class AgentCeiling:
    """The ceiling: ``processes`` processes, each stepping a :class:`SerialRows` over its
    share of the envs with its own columns of the actions, all at once.

    :class:`benchmarks._common.ceiling.Ceiling`'s processes; a sample adds up their agent
    rows per second.
    """

    def __init__(self, env: str, n: int, actions: np.ndarray, processes: int = 2) -> None:
        self.agents = actions.shape[1] // n
        per_env = actions.reshape(len(actions), n, self.agents)
        self.ceiling = Ceiling.of_blocks(
            partial(SerialRows, partial(make_env, env)), per_env, processes
        )

    def timed(self, seconds: float) -> dict[str, Any]:
        """All processes step for ``seconds`` at once; agent-steps/s is their summed rate."""
        results = self.ceiling.timed(seconds)["per_process"]
        for r in results:
            r["rows"] = r["n_envs"] * self.agents
        rows = sum(r["batches"] * r["rows"] / r["seconds"] for r in results)
        return {
            "agent_steps_per_second": rows,
            "env_steps_per_second": rows / self.agents,
            "batches": min(r["batches"] for r in results),
            "seconds": max(r["seconds"] for r in results),
            "per_process": results,
        }

    def close(self) -> None:
        self.ceiling.close()


class SuperSuitVec:
    """SuperSuit's concatenated vector env of ``n`` copies, two processes."""

    def __init__(self, env: str, n: int) -> None:
        import supersuit as ss

        one = make_env(env)
        if env in DYING:
            one = ss.black_death_v3(one)
        self.vec = ss.concat_vec_envs_v1(
            ss.pettingzoo_env_to_vec_env_v1(one), n, num_cpus=2, base_class="gymnasium"
        )

    def reset(self, seed: int) -> None:
        self.vec.reset(seed=seed)

    def step(self, actions: np.ndarray) -> Any:
        return self.vec.step(actions)

    def close(self) -> None:
        self.vec.close()


class PufferVec:
    """PufferLib's ``Multiprocessing`` backend over ``PettingZooPufferEnv``.

    With ``batch_size < n`` a step hands the actions of the envs it last returned and
    takes the next ready ones (PufferLib's ``send``/``recv``).
    """

    def __init__(self, env: str, n: int, workers: int, batch_size: int, zero_copy: bool) -> None:
        import pufferlib.emulation
        import pufferlib.vector

        def creator(buf: Any = None, seed: int = 0) -> Any:
            return pufferlib.emulation.PettingZooPufferEnv(
                env_creator=partial(make_env, env), buf=buf, seed=seed
            )

        # overwork=True: PufferLib refuses more workers than physical cores, and a
        # 2-vCPU VM may report one.
        self.vec = pufferlib.vector.make(
            creator,
            backend=pufferlib.vector.Multiprocessing,
            num_envs=n,
            num_workers=workers,
            batch_size=batch_size,
            zero_copy=zero_copy,
            overwork=True,
        )
        self.rows = int(self.vec.agents_per_batch)
        self.dtype = self.vec.action_space.dtype
        self.envs_per_batch = batch_size

    def reset(self, seed: int) -> None:
        self.vec.async_reset(seed)
        self.vec.recv()

    def step(self, actions: np.ndarray) -> Any:
        self.vec.send(actions[: self.rows].astype(self.dtype, copy=False))
        return self.vec.recv()

    def close(self) -> None:
        self.vec.close()


def build(impl: str, env: str, n: int, actions: np.ndarray) -> Any:
    """Implementation ``impl`` over ``n`` copies of ``env``."""
    if impl == "serial":
        return SerialRows(partial(make_env, env), n)
    if impl == "ceiling":
        return AgentCeiling(env, n, actions)
    if impl == "supersuit":
        return SuperSuitVec(env, n)
    if impl in PUFFER_IMPLS:
        workers = 1 if impl == "puffer-1w" else 2
        batch = n // 2 if impl in ("puffer-async", "puffer-copy") else n
        return PufferVec(env, n, workers, batch, zero_copy=impl != "puffer-copy")
    import envmgr

    if impl == "envmgr":
        return envmgr.make_parallel(partial(make_env, env), n)
    if impl == "envmgr-caller":
        return envmgr.make_parallel(partial(make_env, env), n, n_workers=1, caller_envs=n // 2)
    raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}")


def skip_reason(impl: str, n: int) -> str | None:
    """Why ``impl`` cannot run ``n`` envs, or ``None``."""
    if impl in ("ceiling", "envmgr-caller", "puffer", "puffer-async", "puffer-copy") and n % 2:
        return "needs an even number of envs (two processes)"
    if impl in ("puffer-async", "puffer-copy") and n % 4:
        return "half batches over 2 workers need n a multiple of 4"
    return None
