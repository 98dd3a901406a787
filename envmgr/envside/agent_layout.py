"""The agent slots of multi-agent envs: which agent is in which group and slot.

Built once, in the parent, from one env (:func:`describe_agents`), and sent to every
worker inside the hosted env's factory::

    env.possible_agents, env.observation_space(a), env.action_space(a)
          |  describe_agents: groups by (observation space, action space), slot order
          v
    AgentLayout(groups=(AgentGroup(name, slots, spaces), ...))
          |  .observation_space / .action_space: one env's Dict of every group's slots
          v
    envside.agent_rows.ParallelEnvRows (packing) and frontend.agents (the rows)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

__all__ = [
    "AgentGroup",
    "AgentLayout",
    "AgentSpaceError",
    "FIELDS",
    "FINAL_KEY",
    "check_fits",
    "describe_agents",
    "info_key",
    "spaces_of",
]

#: The per-slot fields of a group, beside its ``"obs"``.
FIELDS = ("rewards", "terminations", "truncations", "active")
#: The info key that carries, at an episode's end in same-step mode, the final rows.
FINAL_KEY = "envmgr.agents.final"


class AgentSpaceError(ValueError):
    """An agent, its spaces or its values do not fit the layout of the env's slots."""


def info_key(group: str, key: str) -> str:
    """The vector info key of a group's per-agent info ``key`` (its presence: ``+ "@rows"``)."""
    return f"envmgr.agents.{group}.{key}"


@dataclass(frozen=True)
class AgentGroup:
    """Agents that share an observation and an action space, and so one batch.

    Attributes:
        name: The group's name (the agents' common prefix, or ``group<i>``).
        slots: The slot labels: agent names, or ``slot_<i>`` for slots given on first sight.
        observation_space: One agent's observation space.
        action_space: One agent's action space.
        source: Where the spaces came from, for messages (the first agent seen, or the
            declared spaces), for slots given on first sight.
    """

    name: str
    slots: tuple[str, ...]
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    source: str = ""


@dataclass(frozen=True)
class AgentLayout:
    """The groups and slots of a multi-agent env, the same for every env of a manager.

    Attributes:
        groups: The groups, in the order of their first agent.
        dynamic: Slots are given to agents on first sight in each episode (an env
            without ``possible_agents``); there is then one group.
        padded: Observations smaller than the group's space are padded with zeros.
    """

    groups: tuple[AgentGroup, ...]
    dynamic: bool = False
    padded: bool = False
    slot_of: dict[str, tuple[int, int]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not self.dynamic:
            for g, group in enumerate(self.groups):
                for s, agent in enumerate(group.slots):
                    self.slot_of[agent] = (g, s)

    @property
    def observation_space(self) -> gym.spaces.Dict:
        """One env's observation: every group's obs and per-slot fields."""
        return gym.spaces.Dict(
            {
                group.name: gym.spaces.Dict(
                    {
                        "obs": batch_space(group.observation_space, len(group.slots)),
                        "rewards": gym.spaces.Box(-np.inf, np.inf, (len(group.slots),), np.float64),
                        **{f: gym.spaces.MultiBinary(len(group.slots)) for f in FIELDS[1:]},
                    }
                )
                for group in self.groups
            }
        )

    @property
    def action_space(self) -> gym.spaces.Dict:
        """One env's actions: every group's slots."""
        return gym.spaces.Dict(
            {g.name: batch_space(g.action_space, len(g.slots)) for g in self.groups}
        )


def _group_name(agents: Sequence[str], used: set[str], fallback: str) -> str:
    """The agents' common name prefix (``adversary`` of ``adversary_0``...), else ``fallback``."""
    prefixes = {a.rsplit("_", 1)[0] if "_" in a else a for a in agents}
    name = prefixes.pop() if len(prefixes) == 1 else ""
    return name if name and name not in used else fallback


def describe_agents(
    env: Any,
    *,
    max_agents: int | None = None,
    pad: bool = False,
    observation_space: gym.Space[Any] | None = None,
    action_space: gym.Space[Any] | None = None,
    one_group: bool = False,
) -> AgentLayout:
    """The slots and groups of ``env`` (a ``ParallelEnv``), without stepping it.

    Args:
        env: One env, as the factory builds it.
        max_agents: Slots per env for an env without ``possible_agents``.
        pad: Put every agent in one group, padding smaller Box observations with zeros
            to the largest (or to ``observation_space``).
        observation_space: One agent's observation space, for every agent (with ``pad``,
            or for an env without ``possible_agents``).
        action_space: Likewise for actions.
        one_group: Refuse agents of mixed spaces instead of grouping them.

    Raises:
        AgentSpaceError: Mixed spaces where one group is asked for, or no way to know the
            slots.
    """
    possible = getattr(env, "possible_agents", None)
    try:
        agents = list(possible) if possible else []
    except Exception:  # noqa: BLE001 - an env may raise on it, as pettingzoo's base does
        agents = []
    if not agents:
        if max_agents is None:
            raise AgentSpaceError(
                f"{type(env).__name__} has no possible_agents: pass max_agents=K, the most "
                "agents one of its episodes has"
            )
        source = "the declared spaces"
        if observation_space is None or action_space is None:
            source, observation_space, action_space = _first_agents_spaces(
                env, observation_space, action_space
            )
        slots = tuple(f"slot_{i}" for i in range(int(max_agents)))
        group = AgentGroup("agents", slots, observation_space, action_space, source)
        return AgentLayout((group,), dynamic=True, padded=pad)
    spaces = {a: (env.observation_space(a), env.action_space(a)) for a in agents}
    if pad or observation_space is not None:
        obs_space = observation_space or _padded_space([s[0] for s in spaces.values()], spaces)
        act_space = action_space or _common_action_space(spaces)
        for a, (o, _) in spaces.items():
            try:
                check_fits(o, obs_space, a)
            except AgentSpaceError as exc:
                raise AgentSpaceError(f"env 0: {exc}") from None
        group = AgentGroup("agents", tuple(agents), obs_space, act_space)
        return AgentLayout((group,), padded=True)
    groups: list[list[str]] = []
    for a in agents:
        for members in groups:
            if spaces[members[0]] == spaces[a]:
                members.append(a)
                break
        else:
            groups.append([a])
    if one_group and len(groups) > 1:
        described = "; ".join(
            f"{', '.join(m)}: observation {spaces[m[0]][0]}, action {spaces[m[0]][1]}"
            for m in groups
        )
        raise AgentSpaceError(
            f"the agents of {type(env).__name__} have different spaces ({described}): use "
            "pad=True for one padded batch, or take one batch per group"
        )
    used: set[str] = set()
    made = []
    for i, members in enumerate(groups):
        name = _group_name(members, used, "agents" if len(groups) == 1 else f"group{i}")
        used.add(name)
        made.append(AgentGroup(name, tuple(members), *spaces[members[0]]))
    return AgentLayout(tuple(made))


def _first_agents_spaces(env: Any, obs: Any, act: Any) -> tuple[str, Any, Any]:
    """The spaces of the first agent a reset of ``env`` shows (where none were declared)."""
    env.reset()
    if not env.agents:
        raise AgentSpaceError(
            f"{type(env).__name__} has no possible_agents and no agent after a reset: pass "
            "observation_space= and action_space="
        )
    first = env.agents[0]
    return f"those of {first}", obs or env.observation_space(first), act or env.action_space(first)


def _padded_space(obs_spaces: list[Any], spaces: dict[str, Any]) -> gym.Space[Any]:
    if all(s == obs_spaces[0] for s in obs_spaces):
        return obs_spaces[0]
    if not all(isinstance(s, gym.spaces.Box) and len(s.shape) == 1 for s in obs_spaces):
        listed = ", ".join(f"{a}: {o}" for a, (o, _) in spaces.items())
        raise AgentSpaceError(
            f"pad=True pads 1-d Box observations only; these agents observe {listed}: pass "
            "observation_space= that every agent's observation fits"
        )
    size = max(s.shape[0] for s in obs_spaces)
    dtype = np.result_type(*(s.dtype for s in obs_spaces))
    low = min(float(np.min(s.low)) for s in obs_spaces)
    high = max(float(np.max(s.high)) for s in obs_spaces)
    return gym.spaces.Box(min(low, 0.0), max(high, 0.0), (size,), dtype)


def _common_action_space(spaces: dict[str, Any]) -> gym.Space[Any]:
    acts = [a for _, a in spaces.values()]
    if all(a == acts[0] for a in acts):
        return acts[0]
    if all(isinstance(a, gym.spaces.Discrete) and int(a.start) == 0 for a in acts):
        return gym.spaces.Discrete(max(int(a.n) for a in acts))
    if all(isinstance(a, gym.spaces.Box) and len(a.shape) == 1 for a in acts):
        # An agent acts with the first entries of the padded vector (ParallelEnvRows._unpadded).
        size = max(a.shape[0] for a in acts)
        low = min(float(np.min(a.low)) for a in acts)
        high = max(float(np.max(a.high)) for a in acts)
        return gym.spaces.Box(low, high, (size,), np.result_type(*(a.dtype for a in acts)))
    listed = ", ".join(f"{n}: {a}" for n, (_, a) in spaces.items())
    raise AgentSpaceError(
        f"pad=True joins Discrete action spaces (from 0) and 1-d Box action spaces only; these "
        f"agents act in {listed}: pass action_space= that every agent's actions fit"
    )


def check_fits(space: gym.Space[Any], into: gym.Space[Any], agent: str) -> None:
    """Refuse a padded space that ``space`` (agent ``agent``'s) does not fit in."""
    if space == into:
        return
    fits = (
        isinstance(space, gym.spaces.Box)
        and isinstance(into, gym.spaces.Box)
        and len(space.shape) == len(into.shape)
        and all(a <= b for a, b in zip(space.shape, into.shape, strict=True))
    )
    if not fits:
        raise AgentSpaceError(
            f"agent {agent!r} observes {space}, which does not fit the padded space {into}"
        )


def spaces_of(space: gym.spaces.Dict, group: str) -> dict[str, gym.Space[Any]]:
    """The per-slot spaces of ``group`` in one env's observation space."""
    part: Any = space.spaces[group]
    return dict(part.spaces)
