"""``make_parallel``: PettingZoo ``ParallelEnv``s in workers, their agents as batch rows.

::

    make_parallel(env_fn, num_envs)
      |  one env built here and closed: its agents, slots and groups (describe_agents)
      v
    SubprocessEnvManager / RayEnvManager(vector_fn=ParallelRowsFactory(env_fn, layout))
      |  each worker hosts ParallelEnvRows over its share of the envs
      v
    AgentVectorEnv (one group: a gymnasium VectorEnv of envs x slots rows)
    or AgentGroupsVectorEnv (one batch per group)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from envmgr.envside.agent_layout import describe_agents
from envmgr.envside.agent_rows import ParallelRowsFactory
from envmgr.frontend.agents import AgentGroupsVectorEnv, AgentVectorEnv
from envmgr.managers.local import SubprocessEnvManager
from envmgr.protocol.info_columns import ROW_BYTES

__all__ = ["make_parallel", "INFO_BYTES_PER_SLOT"]

#: Info column bytes per agent slot: three 8-byte values, each with its presence masks.
INFO_BYTES_PER_SLOT = 32


def make_parallel(
    env_fn: Callable[[], Any],
    num_envs: int,
    *,
    n_workers: int | None = None,
    max_agents: int | None = None,
    pad: bool = False,
    groups: bool | None = None,
    observation_space: gym.Space[Any] | None = None,
    action_space: gym.Space[Any] | None = None,
    done_on: str = "all",
    autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
    ray: bool = False,
    **manager_options: Any,
) -> AgentVectorEnv | AgentGroupsVectorEnv:
    """Step ``num_envs`` PettingZoo parallel envs in workers, one batch row per agent slot.

    Example:
        >>> from mpe2 import simple_spread_v3
        >>> from envmgr import make_parallel
        >>> with make_parallel(lambda: simple_spread_v3.parallel_env(N=3), 4) as envs:
        ...     obs, infos = envs.reset(seed=0)          # obs: (4 * 3, 18)
        ...     out = envs.step(envs.action_space.sample())

    Args:
        env_fn: Zero-argument factory of one ``ParallelEnv`` (an AEC env goes through
            ``pettingzoo.utils.conversions.aec_to_parallel``, or
            ``turn_based_aec_to_parallel`` for turn-based games). One env is built here,
            to read its agents and spaces, and closed.
        num_envs: ParallelEnvs in all; ``reset(seed=s)`` seeds env ``e`` with ``s + e``.
        n_workers: Worker processes (Ray: actors); default ``min(num_envs, cpu_count)``.
        max_agents: Slots per env, for an env without ``possible_agents`` (its agents'
            spaces are then those of the first agent that a reset of the probe env shows,
            unless ``observation_space``/``action_space`` say them).
        pad: One batch for agents of different spaces: 1-d Box observations padded with
            zeros to the largest, Discrete actions to the largest.
        groups: ``True``: always one batch per group (:class:`AgentGroupsVectorEnv`);
            ``False``: one batch, refusing mixed spaces with an error naming the agents;
            ``None`` (default): one batch where the spaces allow, else one per group.
        observation_space: One agent's observation space, for every agent.
        action_space: One agent's action space, for every agent.
        done_on: ``"all"``: an episode ends when ``env.agents`` is empty (PettingZoo's
            rule); ``"any"``: at the first agent that terminates or truncates, the others
            truncated.
        autoreset_mode: Gymnasium's autoreset mode, applied per env.
        ray: Run the workers as Ray actors (:class:`~envmgr.RayEnvManager`).
        **manager_options: Everything the manager takes: ``caller_envs``,
            ``step_timeout``, ``max_restarts``, ``copy``, ``context``, ``timer_interval``...

    Returns:
        An :class:`~envmgr.frontend.agents.AgentVectorEnv` (one group) or an
        :class:`~envmgr.frontend.agents.AgentGroupsVectorEnv` (several).
    """
    if done_on not in ("all", "any"):
        raise ValueError(f"done_on must be 'all' or 'any', got {done_on!r}")
    probe = env_fn()
    try:
        layout = describe_agents(
            probe,
            max_agents=max_agents,
            pad=pad,
            observation_space=observation_space,
            action_space=action_space,
            one_group=groups is False,
        )
    finally:
        probe.close()
    factory = ParallelRowsFactory(env_fn, layout, AutoresetMode(autoreset_mode), done_on)
    # Per-agent infos are a value and a presence byte per slot: room for a few per slot.
    slots = sum(len(g.slots) for g in layout.groups)
    manager_options.setdefault("info_bytes_per_env", ROW_BYTES + INFO_BYTES_PER_SLOT * slots)
    manager: Any
    if ray:
        from envmgr.managers.ray import RayEnvManager

        manager = RayEnvManager(
            n_actors=n_workers, vector_fn=factory, num_envs=num_envs, **manager_options
        )
    else:
        manager = SubprocessEnvManager(
            n_workers=n_workers, vector_fn=factory, num_envs=num_envs, **manager_options
        )
    if len(layout.groups) == 1 and not groups:
        return AgentVectorEnv(manager, layout)
    return AgentGroupsVectorEnv(manager, layout)
