"""The multi-agent ceiling's loop: PettingZoo envs stepped here, their agents packed in rows.

PettingZoo ``ParallelEnv`` envs are stepped in one process and their agent dicts packed into
arrays, with nothing else.

Slot ``s`` is ``possible_agents[s]``, as in :func:`envmgr.make_parallel`. Slots whose
agents share an observation space share one array, so a step writes each agent's
observation where envmgr's workers would, and clears an env's rows with one write per
group::

    actions[k][s]  --{agent: action} of env k's live agents-->  env.step
    obs, rewards, terminations, truncations  --packed-->  obs[g][k, p]   (group g, place p)
                                                          rewards[k, s], terminations[k, s],
                                                          truncations[k, s], active[k, s]

An env whose agents are all gone is reset at its next step (next-step autoreset); infos are
dropped. :class:`AgentBlock` is what one ceiling process of ``envmgr tune --parallel`` steps;
the multi-agent benchmark times the same loop (``benchmarks/_common/agent_peers.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium.vector.utils import create_empty_array

from envmgr.envside.agent_trees import put_tree, zero_row
from envmgr.protocol.trees import tree_map
from envmgr.tune.ceiling import run_for

__all__ = ["AgentBlock", "SerialAgentRows"]

#: Action batches drawn once per ceiling process and walked cyclically.
_N_ACTIONS = 64


class SerialAgentRows:
    """``n`` ParallelEnvs stepped in this process, packed as envmgr packs them.

    Row ``(k, s)`` is env ``k``'s agent ``possible_agents[s]``: its observation, reward and
    flags when it is live or ended on this step, zeros otherwise.

    Args:
        env_fn: Zero-argument factory of one ``ParallelEnv`` with ``possible_agents``.
        n: How many envs.

    Attributes:
        agents: ``possible_agents`` of the first env, in slot order.
        obs: One array (or Dict/Tuple tree of arrays) per group of slots with one
            observation space, ``[n, slots in the group, *shape]``.
        rewards, terminations, truncations, active: ``[n, slots]``.
    """

    def __init__(self, env_fn: Callable[[], Any], n: int) -> None:
        self.envs = [env_fn() for _ in range(n)]
        self.agents = list(self.envs[0].possible_agents)
        spaces: list[Any] = []
        counts: list[int] = []
        #: agent -> (slot, group, place in the group)
        self.where: dict[str, tuple[int, int, int]] = {}
        for s, agent in enumerate(self.agents):
            space = self.envs[0].observation_space(agent)
            g = next((i for i, known in enumerate(spaces) if known == space), len(spaces))
            if g == len(spaces):
                spaces.append(space)
                counts.append(0)
            self.where[agent] = (s, g, counts[g])
            counts[g] += 1
        self.obs = [
            _per_env(create_empty_array(space, n * c, fn=np.zeros), n, c)
            for space, c in zip(spaces, counts, strict=True)
        ]
        shape = (n, len(self.agents))
        self.rewards = np.zeros(shape)
        self.terminations = np.zeros(shape, np.bool_)
        self.truncations = np.zeros(shape, np.bool_)
        self.active = np.zeros(shape, np.bool_)
        self.ended = [False] * n

    def reset(self, seed: int | None = None) -> None:
        """Reset every env, env ``k`` with ``seed + k``."""
        for k, env in enumerate(self.envs):
            obs, _ = env.reset(seed=None if seed is None else seed + k)
            self._write_reset(k, obs)

    def step(self, actions: Sequence[Sequence[Any]]) -> tuple[Any, ...]:
        """Step every env with ``actions[k][s]`` for its live agent of slot ``s``.

        Returns:
            ``(obs, rewards, terminations, truncations, active)``, the arrays above.
        """
        where, groups = self.where, self.obs
        rewards, terms, truncs, active = (
            self.rewards,
            self.terminations,
            self.truncations,
            self.active,
        )
        for k, env in enumerate(self.envs):
            if self.ended[k]:
                self._write_reset(k, env.reset()[0])
                continue
            row = actions[k]
            obs, rew, term, trunc, _ = env.step({a: row[where[a][0]] for a in env.agents})
            self._clear(k)
            live = set(env.agents)
            for a, o in obs.items():
                t, u = term.get(a, False), trunc.get(a, False)
                if not (t or u or a in live):
                    continue
                s, g, p = where[a]
                leaf = groups[g]
                if isinstance(leaf, np.ndarray):  # the common case, without a call
                    leaf[k, p] = o
                else:
                    self._put(g, k, p, o, a)
                rewards[k, s] = rew.get(a, 0.0)
                terms[k, s], truncs[k, s], active[k, s] = t, u, True
            self.ended[k] = not live
        return self.obs, rewards, terms, truncs, active

    def close(self) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()

    def _put(self, g: int, k: int, p: int, value: Any, agent: str) -> None:
        leaf = self.obs[g]
        if isinstance(leaf, np.ndarray):
            leaf[k, p] = value
        else:
            put_tree(leaf, k, p, value, f"env {k}, agent {agent!r}: observation")

    def _write_reset(self, k: int, obs: dict[str, Any]) -> None:
        self._clear(k)
        for a, o in obs.items():
            s, g, p = self.where[a]
            self._put(g, k, p, o, a)
            self.active[k, s] = True
        self.ended[k] = False

    def _clear(self, k: int) -> None:
        for leaf in self.obs:
            zero_row(leaf, k)
        self.rewards[k] = 0.0
        self.terminations[k] = False
        self.truncations[k] = False
        self.active[k] = False


def _per_env(batch: Any, n: int, c: int) -> Any:
    """A batch of ``n * c`` values, each leaf seen as ``[n, c, ...]``."""
    return tree_map(lambda a: a.reshape(n, c, *a.shape[1:]), batch)


class AgentBlock:
    """What one multi-agent ceiling process steps: ``n`` envs on actions drawn once.

    Args:
        env_fn: Zero-argument factory of one ``ParallelEnv``.
        n: Envs in this process.
        seed: Env ``k`` is reset with ``seed + k``; slot ``s``'s action space draws from
            ``seed + s``.
    """

    def __init__(self, env_fn: Callable[[], Any], n: int, seed: int) -> None:
        self.rows = SerialAgentRows(env_fn, n)
        self.rows.reset(seed=seed)
        env = self.rows.envs[0]
        spaces = [env.action_space(a) for a in self.rows.agents]
        for s, space in enumerate(spaces):
            space.seed(seed + s)
        self.actions = [
            [[space.sample() for space in spaces] for _ in range(n)] for _ in range(_N_ACTIONS)
        ]
        self.n = n
        self.k = 0

    def run(self, seconds: float) -> tuple[int, float]:
        """Step for ``seconds``; returns the env steps and the seconds they took."""
        batches, elapsed = run_for(self.rows.step, self.actions, self.k, seconds)
        self.k += batches
        return batches * self.n, elapsed

    def close(self) -> None:
        """Close the envs."""
        self.rows.close()
