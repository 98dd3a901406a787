"""The multi-agent benchmark's envs: PettingZoo ``ParallelEnv``s by name, and their actions.

``make_env(name)`` builds one env; a runner of :mod:`benchmarks._common.agent_peers` calls
it once per env (in whichever process steps it), and ``sample_actions`` draws the action
batches every implementation of one configuration walks::

    name --make_env--> ParallelEnv (MPE2 / MAgent2 / KAZ / CheapAgents)
    name, n --sample_actions--> (N_ACTION_BATCHES, n * agents) ints, env-major rows

The envs:

* ``spread-3``, ``spread-10``: MPE2 ``simple_spread_v3`` with ``N=3`` / ``N=10`` agents;
* ``battle``: MAgent2 ``battle_v4`` at ``map_size=45``: 162 agents, 13x13x5 float32
  observations, agents die;
* ``kaz``: PettingZoo's Knights Archers Zombies (v11, ``obs_method="vector"``), agents die;
* ``kaz-sequence``: the same with ``obs_method="vector-sequence"``: each agent observes
  ``Sequence(Box(-1, 1, (11,)), stack=True)``, one row per entity in play (not in
  ``ENVS``: the variable-size benchmark's, :mod:`benchmarks.suites.ragged`);
* ``synthetic``: :class:`CheapAgents`, 16 agents and a few microseconds per step.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pettingzoo import ParallelEnv

__all__ = [
    "DYING",
    "ENVS",
    "ENV_LABELS",
    "N_ACTION_BATCHES",
    "CheapAgents",
    "make_env",
    "sample_actions",
]

ENVS = ["spread-3", "spread-10", "battle", "kaz", "synthetic"]
#: Envs whose agents die before the episode ends (SuperSuit needs ``black_death_v3``).
DYING = {"battle", "kaz", "kaz-sequence"}
ENV_LABELS = {
    "spread-3": "MPE2 simple_spread_v3 N=3",
    "spread-10": "MPE2 simple_spread_v3 N=10",
    "battle": "MAgent2 battle_v4 map_size=45",
    "kaz": "KAZ v11 obs_method=vector",
    "kaz-sequence": "KAZ v11 obs_method=vector-sequence",
    "synthetic": "synthetic, 16 agents",
}
#: Action batches drawn per configuration, walked cyclically.
N_ACTION_BATCHES = 64


class CheapAgents(ParallelEnv):  # type: ignore[misc]
    """16 agents, an 8-float observation each, 4 actions, 64-step episodes; numpy only.

    A step costs a few microseconds (five dicts of 16 entries), so what a benchmark
    measures on it is the vectorization's own cost per agent.
    """

    metadata = {"name": "cheap_agents_v0"}
    render_mode = None

    def __init__(self, n_agents: int = 16, episode: int = 64) -> None:
        import gymnasium as gym

        self.possible_agents = [f"agent_{i}" for i in range(n_agents)]
        self.agents: list[str] = []
        self._obs_space = gym.spaces.Box(-1.0, 1.0, (8,), np.float32)
        self._act_space = gym.spaces.Discrete(4)
        self._state = np.zeros((n_agents, 8), np.float32)
        self._episode = episode
        self._t = 0
        self._zeros = dict.fromkeys(self.possible_agents, 0.0)
        self._false = dict.fromkeys(self.possible_agents, False)
        self._true = dict.fromkeys(self.possible_agents, True)
        self._no_info: dict[str, dict[str, Any]] = {a: {} for a in self.possible_agents}

    def observation_space(self, agent: str) -> Any:
        return self._obs_space

    def action_space(self, agent: str) -> Any:
        return self._act_space

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> Any:
        self.agents = list(self.possible_agents)
        self._t = 0
        self._state[:] = 0.0 if seed is None else (seed % 7) / 7.0
        return dict(zip(self.agents, self._state.copy(), strict=True)), dict(self._no_info)

    def step(self, actions: dict[str, Any]) -> Any:
        self._t += 1
        self._state[:, 0] = self._t / self._episode
        obs = dict(zip(self.agents, self._state.copy(), strict=True))
        done = self._t >= self._episode
        if done:
            self.agents = []
        trunc = self._true if done else self._false
        return obs, dict(self._zeros), dict(self._false), dict(trunc), dict(self._no_info)


def make_env(name: str) -> Any:
    """One ``ParallelEnv`` of benchmark env ``name``."""
    if name.startswith("spread-"):
        from mpe2 import simple_spread_v3

        return simple_spread_v3.parallel_env(N=int(name.split("-")[1]))
    if name == "battle":
        from magent2.environments import battle_v4

        return battle_v4.parallel_env(map_size=45)
    if name in ("kaz", "kaz-sequence"):
        from pettingzoo.butterfly import knights_archers_zombies_v11

        method = "vector-sequence" if name == "kaz-sequence" else "vector"
        return knights_archers_zombies_v11.parallel_env(obs_method=method)
    if name == "synthetic":
        return CheapAgents()
    raise ValueError(f"unknown env {name!r}; choose from {', '.join(ENVS)}")


def sample_actions(name: str, n: int, seed: int) -> np.ndarray:
    """``(N_ACTION_BATCHES, n * agents)`` random actions, rows env-major, slots in
    ``possible_agents`` order (every env here has one Discrete action space)."""
    env = make_env(name)
    agents = list(env.possible_agents)
    space = env.action_space(agents[0])
    env.close()
    rng = np.random.default_rng(seed)
    return rng.integers(0, int(space.n), size=(N_ACTION_BATCHES, n * len(agents)))
