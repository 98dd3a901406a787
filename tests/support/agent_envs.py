"""Small, real PettingZoo ``ParallelEnv`` classes for the multi-agent tests.

Every env here is deterministic given the seed of its first seeded ``reset``: all
randomness comes from one ``np.random.default_rng(seed)`` made in ``reset(seed=...)``; a
reset without a seed goes on with the same generator (an env never reset with a seed
starts from ``default_seed``, so even SB3's unseeded first reset is reproducible).

==========================  ===============================================================
env                         what it exercises
==========================  ===============================================================
``SyntheticAgentsEnv``      possible_agents; infos with an int, a float and a small array;
                            agents that die at seeded steps (and keep a reward entry after
                            death, as some PettingZoo envs do); late agents that arrive at
                            seeded steps; truncation at ``max_steps``. ``kinds`` gives
                            groups (``two_group_env``), ``action_mask`` puts a mask in the
                            infos (``masked_env``), ``declare_agents=False`` hides
                            possible_agents (slots by ``max_agents``).
``CheapAgentsEnv``          16 agents, numpy only (the benchmark's env): numeric infos,
                            deaths and arrivals, truncation.
``BadAgentsEnv``            one error case of the spec's Errors section, from ``at_step``.
``AgentFaultEnv``           raises / exits / SIGKILLs itself / hangs at a lifetime step,
                            once (``state_dir`` and ``fire_in`` as ``fault_envs.FaultEnv``).
==========================  ===============================================================

Observations carry the step count ``t`` (column 0) and the agent's index (column 1), so a
test can read what it is looking at.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv

from support.fault_envs import EXIT_CODE, HANG_SECONDS, InjectedFault, record_construction

__all__ = [
    "SyntheticAgentsEnv",
    "CheapAgentsEnv",
    "BadAgentsEnv",
    "AgentFaultEnv",
    "BAD_CASES",
    "AGENT_FAULTS",
    "fault_env_fn",
    "spread_env",
    "tag_env",
    "kaz_env",
    "kaz_sequence_env",
    "connect_four_env",
    "generated_env",
    "GENERATED_SPACES",
    "one_group_env",
    "two_group_env",
    "masked_env",
    "undeclared_env",
]

#: Per kind: (name prefix, number of agents, observation length).
Kind = tuple[str, int, int]


class SyntheticAgentsEnv(ParallelEnv):  # type: ignore[type-arg]
    """Agents that die, arrive and are truncated at seeded steps (see the module doc).

    Args:
        kinds: ``(prefix, count, obs_dim)`` per kind; agents are ``f"{prefix}_{i}"``,
            kinds with different ``obs_dim`` are different groups.
        n_actions: Size of every agent's ``Discrete`` action space.
        max_steps: Agents still alive at this step are truncated.
        late: How many of each kind's agents (its last ones) arrive during the episode
            instead of at reset.
        action_mask: Put ``"action_mask"`` (int8, one entry per action, at least one 1)
            into every info; a masked action costs a reward of -1.
        dead_rewards: Keep a reward entry (-1.0) for every agent that has died, as some
            PettingZoo envs do; those rows must still read 0.
        declare_agents: Set ``possible_agents`` (False: slots come from ``max_agents``).
        deaths: Whether agents die (False: all live until the truncation).
        default_seed: The generator's seed when the first reset has none.
    """

    metadata: dict[str, Any] = {"name": "synthetic_agents_v0", "render_modes": []}
    render_mode: str | None = None  # SB3's VecEnv reads it from every env

    def __init__(
        self,
        kinds: Sequence[Kind] = (("agent", 4, 4),),
        n_actions: int = 3,
        max_steps: int = 12,
        late: int = 1,
        action_mask: bool = False,
        dead_rewards: bool = True,
        declare_agents: bool = True,
        deaths: bool = True,
        default_seed: int = 0,
    ) -> None:
        self.kinds = tuple(kinds)
        self.deaths = deaths
        self.n_actions = n_actions
        self.max_steps = max_steps
        self.action_mask = action_mask
        self.dead_rewards = dead_rewards
        self.default_seed = default_seed
        names = [f"{p}_{i}" for p, count, _ in self.kinds for i in range(count)]
        self._index = {a: k for k, a in enumerate(names)}
        self._obs_space = {}
        self._late: list[str] = []
        for prefix, count, dim in self.kinds:
            space = spaces.Box(-np.inf, np.inf, (dim,), np.float32)
            for i in range(count):
                self._obs_space[f"{prefix}_{i}"] = space
            self._late += [f"{prefix}_{i}" for i in range(max(count - late, 0), count)]
        self._act_space = spaces.Discrete(n_actions)
        self._names = names
        if declare_agents:
            self.possible_agents = list(names)
        self.agents: list[str] = []
        self._rng: np.random.Generator | None = None

    def observation_space(self, agent: str) -> spaces.Space:  # type: ignore[type-arg]
        return self._obs_space[agent]

    def action_space(self, agent: str) -> spaces.Space:  # type: ignore[type-arg]
        return self._act_space

    # ---------------------------------------------------------------- episode

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(self.default_seed if seed is None else seed)
        rng = self._rng
        self.t = 0
        self._death = {a: int(rng.integers(2, 3 * self.max_steps // 2)) for a in self._names}
        if not self.deaths:
            self._death = dict.fromkeys(self._names, -1)
        self._arrive = {a: int(rng.integers(1, self.max_steps - 1)) for a in self._late}
        self._dead: list[str] = []
        self._score = dict.fromkeys(self._names, 0.0)
        self._mask = {a: self._new_mask() for a in self._names}
        self.agents = [a for a in self._names if a not in self._arrive]
        obs = {a: self._obs(a) for a in self.agents}
        return obs, {a: self._info(a) for a in self.agents}

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        assert self._rng is not None, "step() before reset()"
        self.t += 1
        t = self.t
        obs: dict[str, Any] = {}
        rewards: dict[str, float] = {}
        terms: dict[str, bool] = {}
        truncs: dict[str, bool] = {}
        infos: dict[str, Any] = {}
        for a in self.agents:
            act = int(actions[a])
            reward = 0.5 * act + float(self._rng.standard_normal())
            if self.action_mask and not self._mask[a][act]:
                reward -= 1.0
            self._score[a] += reward
            self._mask[a] = self._new_mask()
            rewards[a] = reward
            terms[a] = self._death[a] == t
            truncs[a] = t >= self.max_steps and not terms[a]
            obs[a] = self._obs(a, act)
            infos[a] = self._info(a)
        if self.dead_rewards:
            rewards.update(dict.fromkeys(self._dead, -1.0))
        arrivals = [a for a in self._late if self._arrive[a] == t]
        for k in self._rng.permutation(len(arrivals)).tolist():  # arrival order is seeded
            a = arrivals[k]
            self.agents.append(a)
            obs[a] = self._obs(a)
            infos[a] = self._info(a)  # no reward nor flags: the packer's defaults
        self._dead += [a for a in self.agents if terms.get(a) or truncs.get(a)]
        self.agents = [a for a in self.agents if not (terms.get(a) or truncs.get(a))]
        return obs, rewards, terms, truncs, infos

    # ---------------------------------------------------------------- pieces

    def _new_mask(self) -> np.ndarray:
        assert self._rng is not None
        mask = (self._rng.random(self.n_actions) < 0.6).astype(np.int8)
        mask[int(self._rng.integers(self.n_actions))] = 1
        return mask

    def _obs(self, agent: str, action: int = -1) -> np.ndarray:
        assert self._rng is not None
        dim = self._obs_space[agent].shape[0]
        out = np.empty(dim, dtype=np.float32)
        out[0] = self.t
        out[1] = self._index[agent]
        out[2:] = self._rng.standard_normal(dim - 2)
        if dim > 2:
            out[2] += action
        return out

    def _info(self, agent: str) -> dict[str, Any]:
        info: dict[str, Any] = {
            "steps": self.t,
            "score": self._score[agent],
            "pos": np.array([self.t, self._index[agent]], dtype=np.float32),
        }
        if self.action_mask:
            info["action_mask"] = self._mask[agent].copy()
        return info


def one_group_env(**kwargs: Any) -> SyntheticAgentsEnv:
    """(a): one group of four agents, one of them late."""
    return SyntheticAgentsEnv(**kwargs)


def two_group_env(**kwargs: Any) -> SyntheticAgentsEnv:
    """(c): ``scout_*`` (obs of 3) and ``tank_*`` (obs of 5): two groups."""
    return SyntheticAgentsEnv(kinds=(("scout", 2, 3), ("tank", 3, 5)), **kwargs)


def masked_env(**kwargs: Any) -> SyntheticAgentsEnv:
    """(d): an action mask in every info."""
    return SyntheticAgentsEnv(action_mask=True, **kwargs)


def undeclared_env(**kwargs: Any) -> SyntheticAgentsEnv:
    """(a) without possible_agents: slots in first-seen order, up to ``max_agents``."""
    return SyntheticAgentsEnv(declare_agents=False, **kwargs)


class CheapAgentsEnv(ParallelEnv):  # type: ignore[type-arg]
    """16 agents (12 at reset, 4 arriving before ``arrive_by``), numpy only: what the
    benchmark steps.

    Each step an agent dies with probability ``death_p``; survivors are truncated at
    ``max_steps``. Infos hold an int and a float.
    """

    metadata: dict[str, Any] = {"name": "cheap_agents_v0", "render_modes": []}
    N = 16
    DIM = 8

    def __init__(
        self,
        max_steps: int = 200,
        death_p: float = 0.01,
        arrive_by: int | None = None,
        default_seed: int = 0,
    ) -> None:
        self.possible_agents = [f"agent_{i}" for i in range(self.N)]
        self.max_steps = max_steps
        self.arrive_by = max(2, max_steps // 2) if arrive_by is None else arrive_by
        self.death_p = death_p
        self.default_seed = default_seed
        self._obs_space = spaces.Box(-np.inf, np.inf, (self.DIM,), np.float32)
        self._act_space = spaces.Discrete(4)
        self.agents: list[str] = []
        self._rng: np.random.Generator | None = None

    def observation_space(self, agent: str) -> spaces.Space:  # type: ignore[type-arg]
        return self._obs_space

    def action_space(self, agent: str) -> spaces.Space:  # type: ignore[type-arg]
        return self._act_space

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        if seed is not None or self._rng is None:
            self._rng = np.random.default_rng(self.default_seed if seed is None else seed)
        self.t = 0
        self._arrive = self._rng.integers(1, self.arrive_by, size=4)
        self.agents = self.possible_agents[:12]
        obs = self._rng.standard_normal((self.N, self.DIM)).astype(np.float32)
        return {a: obs[i] for i, a in enumerate(self.agents)}, {
            a: {"t": 0, "v": 0.0} for a in self.agents
        }

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        assert self._rng is not None, "step() before reset()"
        self.t += 1
        live = self.agents
        obs = self._rng.standard_normal((self.N, self.DIM)).astype(np.float32)
        obs[:, 0] = self.t
        dies = self._rng.random(self.N) < self.death_p
        index = {a: int(a[6:]) for a in live}
        rewards = {a: float(actions[a]) + float(obs[index[a], 1]) for a in live}
        terms = {a: bool(dies[index[a]]) for a in live}
        cut = self.t >= self.max_steps
        truncs = {a: cut and not terms[a] for a in live}
        arrivals = [self.possible_agents[12 + k] for k in np.flatnonzero(self._arrive == self.t)]
        seen = live + arrivals
        out = {a: obs[int(a[6:])] for a in seen}
        infos = {a: {"t": self.t, "v": float(obs[int(a[6:]), 2])} for a in seen}
        self.agents = [a for a in live if not (terms[a] or truncs[a])] + arrivals
        return out, rewards, terms, truncs, infos


#: BadAgentsEnv's cases: what goes wrong at ``at_step``.
BAD_CASES = (
    "obs_shape",  # an agent's observation has the wrong shape
    "obs_dtype",  # ... or the wrong dtype
    "missing_agent",  # an agent stays in env.agents but has no observation
    "unknown_agent",  # an agent outside possible_agents joins env.agents
    "changing_space",  # observation_space(agent) changes after at_step
)


class BadAgentsEnv(SyntheticAgentsEnv):
    """``SyntheticAgentsEnv`` (no deaths, no arrivals) that commits ``case`` at step ``at_step``
    (0: in the reset). The culprit is always ``agent_1``, or ``intruder_0`` for
    ``unknown_agent``.

    With ``state_dir``, only the envs constructed ``bad_in``-th (0-based, counted over
    every process) misbehave: with one worker, construction order is env order, so
    ``bad_in=(1,)`` makes env 1 the bad one. The others are well behaved.
    """

    CULPRIT = "agent_1"
    INTRUDER = "intruder_0"

    def __init__(
        self,
        case: str,
        at_step: int = 2,
        state_dir: str | None = None,
        bad_in: Sequence[int] = (1,),
        **kwargs: Any,
    ) -> None:
        if case not in BAD_CASES:
            raise ValueError(f"unknown case {case!r}; choose from {BAD_CASES}")
        kwargs.setdefault("late", 0)
        kwargs.setdefault("max_steps", 50)
        super().__init__(**kwargs)
        if state_dir is not None and record_construction(state_dir, 0) not in bad_in:
            case = "none"
        self.case = case
        self.at_step = at_step
        self._other_space = spaces.Box(-np.inf, np.inf, (7,), np.float32)

    def observation_space(self, agent: str) -> spaces.Space:  # type: ignore[type-arg]
        if agent == self.INTRUDER or (
            self.case == "changing_space" and agent == self.CULPRIT and self.t >= self.at_step
        ):
            return self._other_space
        return super().observation_space(agent)

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, infos = super().reset(seed=seed, options=options)
        self._death = dict.fromkeys(self._death, 10**9)  # nobody dies
        if self.at_step == 0 and self.case != "none":
            self._commit(obs, infos)
        return obs, infos

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        result = super().step(actions)
        if self.t == self.at_step and self.case != "none":
            self._commit(result[0], result[4])
        return result

    def _commit(self, obs: dict[str, Any], infos: dict[str, Any]) -> None:
        bad = self.CULPRIT
        if self.case == "obs_shape":
            obs[bad] = np.zeros(obs[bad].shape[0] + 1, dtype=np.float32)
        elif self.case == "obs_dtype":
            obs[bad] = obs[bad].astype(np.complex64)  # float64 would cast, as Sync casts it
        elif self.case == "missing_agent":
            del obs[bad]
        elif self.case == "unknown_agent":
            self.agents.append(self.INTRUDER)
            obs[self.INTRUDER] = np.zeros(7, dtype=np.float32)
            infos[self.INTRUDER] = {}
        # changing_space: observation_space() says it


#: AgentFaultEnv's kinds.
AGENT_FAULTS = ("raise", "exit", "sigkill", "hang")


class AgentFaultEnv(SyntheticAgentsEnv):
    """``SyntheticAgentsEnv`` whose ``at_step``-th step call (1-based, over its lifetime)
    commits ``kind``: raises ``InjectedFault``, ``os._exit(EXIT_CODE)``, SIGKILLs its own
    process, or sleeps ``HANG_SECONDS`` (tests set ``step_timeout``).

    With ``state_dir``, only the incarnations in ``fire_in`` fire (a replaced worker builds
    the env again: its new life must not crash at the same step).
    """

    def __init__(
        self,
        kind: str = "raise",
        at_step: int = 3,
        tag: int = 0,
        state_dir: str | None = None,
        fire_in: Sequence[int] | None = (0,),
        **kwargs: Any,
    ) -> None:
        if kind not in AGENT_FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; choose from {AGENT_FAULTS}")
        super().__init__(**kwargs)
        self.kind = kind
        self.at_step = at_step
        self.tag = tag
        incarnation = 0 if state_dir is None else record_construction(state_dir, tag)
        self.armed = state_dir is None or fire_in is None or incarnation in fire_in
        self.calls = 0

    def step(
        self, actions: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        self.calls += 1
        if self.armed and self.calls == self.at_step:
            if self.kind == "raise":
                raise InjectedFault(f"env {self.tag} failed at step {self.calls}")
            if self.kind == "exit":
                os._exit(EXIT_CODE)
            if self.kind == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(HANG_SECONDS)
        return super().step(actions)


def spread_env() -> Any:
    """MPE2 ``simple_spread_v3`` with three agents (one group ``agent``)."""
    from mpe2 import simple_spread_v3

    return simple_spread_v3.parallel_env(N=3)


def tag_env() -> Any:
    """MPE2 ``simple_tag_v3``: groups ``adversary`` and ``agent``."""
    from mpe2 import simple_tag_v3

    return simple_tag_v3.parallel_env()


def kaz_env() -> Any:
    """Knights, archers, zombies with vector observations and zombies often enough that
    someone dies within about 150 steps."""
    from pettingzoo.butterfly import knights_archers_zombies_v11

    return knights_archers_zombies_v11.parallel_env(
        obs_method="vector", spawn_delay=5, max_zombies=20
    )


def kaz_sequence_env() -> Any:
    """``kaz_env`` observing the entities as ``Sequence(Box(-1, 1, (11,)), stack=True)``."""
    from pettingzoo.butterfly import knights_archers_zombies_v11

    return knights_archers_zombies_v11.parallel_env(
        obs_method="vector-sequence", spawn_delay=5, max_zombies=20
    )


def connect_four_env() -> Any:
    """Connect four, turn-based, as a ParallelEnv (action masks in the observations)."""
    from pettingzoo.classic import connect_four_v3
    from pettingzoo.utils.conversions import turn_based_aec_to_parallel

    return turn_based_aec_to_parallel(connect_four_v3.env())


def generated_env() -> Any:
    """PettingZoo's ``generated_agents_parallel_v0`` (no possible_agents; spaces drawn per
    episode: pad into ``GENERATED_SPACES``)."""
    from pettingzoo.test.example_envs import generated_agents_parallel_v0

    return generated_agents_parallel_v0.parallel_env()


#: Spaces every agent of ``generated_env`` fits in (observation, action).
GENERATED_SPACES = (spaces.Box(0, 1, (50,), np.float32), spaces.Discrete(10))


def fault_env_fn(kind: str, at_step: int, tag: int, state_dir: str, **kwargs: Any) -> Any:
    """A factory of ``AgentFaultEnv`` (picklable: a ``functools.partial``)."""
    return functools.partial(
        AgentFaultEnv, kind=kind, at_step=at_step, tag=tag, state_dir=state_dir, **kwargs
    )
