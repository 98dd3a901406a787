"""``AgentsVecEnv``: PettingZoo agents as the rows of a Stable-Baselines3 ``VecEnv``.

Parameter sharing, as SuperSuit's ``concat_vec_envs_v1(..., base_class=
"stable_baselines3")`` gives it, without its limits: agents may die and arrive, and
rows are packed in shared memory::

    AgentsVecEnv(env_fn, num_envs)
      -> make_parallel(env_fn, num_envs, autoreset_mode=SAME_STEP)    (SB3's autoreset)
      -> step_wait: (obs [rows, ...], rewards, dones, infos: one dict per row)

A row without an agent (one that died, or whose slot is not yet taken) reads zeros
with ``done=False``; its info says ``{"active": False}``, so a callback can drop it.
Row ``r`` is env ``r // slots``; calls (``env_method``, ``get_attr``) reach that env.

Requires ``pip install "envmgr[sb3,multiagent]"``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode
from stable_baselines3.common.vec_env.base_vec_env import (
    VecEnv,
    VecEnvIndices,
    VecEnvObs,
    VecEnvStepReturn,
)

from envmgr.frontend.agents import AgentVectorEnv
from envmgr.managers.parallel import make_parallel

__all__ = ["AgentsVecEnv"]


class AgentsVecEnv(VecEnv):
    """SB3's ``VecEnv`` over the agent rows of ``num_envs`` ParallelEnvs (one group).

    Args:
        env_fn: Zero-argument factory of one ``ParallelEnv``.
        num_envs: ParallelEnvs; SB3's ``num_envs`` is their rows (envs x slots).
        **options: :func:`~envmgr.make_parallel`'s (``n_workers``, ``pad``,
            ``max_agents``, ``caller_envs``, ``step_timeout``...), but not
            ``autoreset_mode`` (SB3's same-step mode is set here) or ``groups``.
    """

    def __init__(self, env_fn: Callable[[], Any], num_envs: int, **options: Any) -> None:
        for key in ("autoreset_mode", "groups"):
            if key in options:
                raise TypeError(f"AgentsVecEnv sets {key!r} itself")
        envs = make_parallel(
            env_fn, num_envs, autoreset_mode=AutoresetMode.SAME_STEP, groups=False, **options
        )
        assert isinstance(envs, AgentVectorEnv)
        self.agents = envs
        self.slots = envs.slots
        self._seed: int | None = None
        self._actions: np.ndarray | None = None
        super().__init__(envs.num_envs, envs.single_observation_space, envs.single_action_space)

    def reset(self) -> VecEnvObs:
        """Reset the envs (seeded by the last ``seed`` call, once); return the rows' obs."""
        obs, infos = self.agents.reset(seed=self._seed)
        self._seed = None
        self.reset_infos = _row_infos(infos, self.num_envs)
        return obs

    def step_async(self, actions: np.ndarray) -> None:
        """Keep the actions for ``step_wait``."""
        self._actions = actions

    def step_wait(self) -> VecEnvStepReturn:
        """Step the envs with the kept actions; return SB3's ``(obs, rewards, dones, infos)``.

        A row that is done carries ``TimeLimit.truncated`` and, when it has one,
        ``terminal_observation``.
        """
        obs, rewards, terms, truncs, infos = self.agents.step(self._actions)
        dones = terms | truncs
        rows = _row_infos(infos, self.num_envs)
        final = infos.get("_final_obs")
        for r in np.flatnonzero(dones):
            rows[r]["TimeLimit.truncated"] = bool(truncs[r] and not terms[r])
            if final is not None and final[r]:
                rows[r]["terminal_observation"] = infos["final_obs"][r]
        return obs, rewards.astype(np.float32), dones, rows

    def seed(self, seed: int | None = None) -> Sequence[None | int]:
        """Seeds the next reset: env ``e`` gets ``seed + e`` (its rows share it)."""
        self._seed = seed
        return [None if seed is None else seed + r // self.slots for r in range(self.num_envs)]

    def close(self) -> None:
        """Close the envs and their manager."""
        self.agents.close()

    def _envs_of(self, indices: VecEnvIndices) -> list[int]:
        return [r // self.slots for r in self._get_indices(indices)]

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        """Return attribute ``attr_name`` of the env of each chosen row."""
        values = self.agents.manager.call(attr_name)
        return [values[e] for e in self._envs_of(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        """Set attribute ``attr_name`` to ``value`` on the envs of the chosen rows."""
        envs = sorted(set(self._envs_of(indices)))
        self.agents.manager.set_attr(attr_name, [value] * len(envs), env_ids=envs)

    def env_method(
        self, method_name: str, *method_args: Any, indices: VecEnvIndices = None, **kwargs: Any
    ) -> list[Any]:
        """Call method ``method_name`` of the env of each chosen row."""
        values = self.agents.manager.call(method_name, *method_args, **kwargs)
        return [values[e] for e in self._envs_of(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: VecEnvIndices = None) -> list[bool]:
        """Return ``False`` per chosen row: its env is a PettingZoo env, not a wrapped gym env."""
        return [False for _ in self._get_indices(indices)]


def _row_infos(infos: dict[str, Any], rows: int) -> list[dict[str, Any]]:
    """One info dict per row from the batch's vector infos (its numeric keys, where set)."""
    out: list[dict[str, Any]] = [{} for _ in range(rows)]
    for key, value in infos.items():
        if key.startswith("_") or key in ("final_obs", "final_info"):
            continue
        mask = infos.get("_" + key)
        if mask is None or not isinstance(value, np.ndarray):
            continue
        for r in np.flatnonzero(mask):
            out[r][key] = value[r].item() if value.ndim == 1 else value[r]
    return out
