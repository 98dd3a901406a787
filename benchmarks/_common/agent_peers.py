"""The multi-agent benchmark's implementations, and how each is built.

Every one steps ``n`` copies of an env of :mod:`benchmarks._common.agent_envs` with
``step(actions)``, ``actions`` a flat row of ``n * agents`` ints (env-major)::

    build(impl, env, n, actions)
      serial         SerialRows: one process, packing agent dicts as envmgr does
      ceiling        AgentCeiling: SerialRows over n / 2 envs in each of two processes
                     (ceiling.Ceiling's processes), with no communication
      supersuit      SuperSuitVec: concat_vec_envs_v1, two processes
      puffer*        PufferVec: PufferLib's Multiprocessing backend
      envmgr*        envmgr.make_parallel (envmgr-padded: ragged="padded")
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np
from gymnasium import spaces

from benchmarks._common.agent_envs import DYING, make_env
from benchmarks._common.ceiling import Ceiling
from benchmarks._common.padded_slots import PaddedSlots
from envmgr.tune.serial_agents import SerialAgentRows

__all__ = [
    "DEFAULT_IMPLS",
    "ENVMGR_IMPLS",
    "IMPLS",
    "PUFFER_IMPLS",
    "AgentCeiling",
    "PufferVec",
    "PaddedSerialRows",
    "SerialRows",
    "serial_rows",
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
    "envmgr-padded",
]
#: ``envmgr-padded`` differs from ``envmgr`` only on variable-size observations.
DEFAULT_IMPLS = [i for i in IMPLS if i not in ("puffer-copy", "envmgr-padded")]
ENVMGR_IMPLS = {"envmgr", "envmgr-caller", "envmgr-padded"}
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


class PaddedSerialRows:
    """The same loop for a ``Sequence(Box)`` observation, which the tune loop does not pack.

    Observations come as ``(data, lengths)``, padded
    (:class:`benchmarks._common.padded_slots.PaddedSlots`), as ``ragged="padded"`` asks.
    """

    def __init__(self, env_fn: Callable[[], Any], n: int) -> None:
        self.envs = [env_fn() for _ in range(n)]
        agents = list(self.envs[0].possible_agents)
        self.slot = {a: s for s, a in enumerate(agents)}
        space = self.envs[0].observation_space(agents[0])
        s = len(agents)
        self.obs = PaddedSlots(space, n, s)
        self.rewards = np.zeros((n, s))
        self.terms = np.zeros((n, s), np.bool_)
        self.truncs = np.zeros((n, s), np.bool_)
        self.active = np.zeros((n, s), np.bool_)
        self.ended = [False] * n
        self.rows = n * s

    def reset(self, seed: int | None = None) -> None:
        for k, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + k)
            self._write_reset(k, obs)

    def _write_reset(self, k: int, obs: dict[str, Any]) -> None:
        self._clear(k)
        for a, o in obs.items():
            s = self.slot[a]
            self.obs[k, s] = o
            self.active[k, s] = True
        self.ended[k] = False

    def _clear(self, k: int) -> None:
        self.obs[k] = 0
        self.rewards[k] = 0.0
        self.terms[k] = False
        self.truncs[k] = False
        self.active[k] = False

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        per_env = actions.reshape(len(self.envs), -1)
        slot, obs_rows, rewards = self.slot, self.obs, self.rewards
        for k, env in enumerate(self.envs):
            if self.ended[k]:
                self._write_reset(k, env.reset()[0])
                continue
            row = per_env[k]
            obs, rew, term, trunc, _ = env.step({a: row[slot[a]] for a in env.agents})
            self._clear(k)
            live = set(env.agents)
            for a, o in obs.items():
                t, u = term.get(a, False), trunc.get(a, False)
                if not (t or u or a in live):
                    continue
                s = slot[a]
                obs_rows[k, s] = o
                rewards[k, s] = rew.get(a, 0.0)
                self.terms[k, s], self.truncs[k, s], self.active[k, s] = t, u, True
            self.ended[k] = not live
        n = self.rows
        flags = (self.terms.reshape(n), self.truncs.reshape(n), self.active.reshape(n))
        return (self.obs.batch(), rewards.reshape(n), *flags)

    def close(self) -> None:
        for env in self.envs:
            env.close()


def serial_rows(env_fn: Callable[[], Any], n: int) -> SerialRows | PaddedSerialRows:
    """The serial loop over ``n`` envs of ``env_fn``: the padded one for Sequence observations."""
    probe = env_fn()
    sequence = isinstance(probe.observation_space(probe.possible_agents[0]), spaces.Sequence)
    probe.close()
    return (PaddedSerialRows if sequence else SerialRows)(env_fn, n)


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
            partial(serial_rows, partial(make_env, env)), per_env, processes
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
        return serial_rows(partial(make_env, env), n)
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
    if impl == "envmgr-padded":
        return envmgr.make_parallel(partial(make_env, env), n, ragged="padded")
    raise ValueError(f"unknown implementation {impl!r}; choose from {', '.join(IMPLS)}")


def skip_reason(impl: str, n: int) -> str | None:
    """Why ``impl`` cannot run ``n`` envs, or ``None``."""
    if impl in ("ceiling", "envmgr-caller", "puffer", "puffer-async", "puffer-copy") and n % 2:
        return "needs an even number of envs (two processes)"
    if impl in ("puffer-async", "puffer-copy") and n % 4:
        return "half batches over 2 workers need n a multiple of 4"
    return None
