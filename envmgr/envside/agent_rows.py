"""PettingZoo ``ParallelEnv``s hosted as one ``gymnasium.vector.VectorEnv`` per worker.

A multi-agent env becomes one env of the manager: its agent dicts are packed, per
step, into fixed arrays with one row per *agent slot*, so they travel through the
manager's shared memory like any Dict observation and nothing per agent is pickled::

    ParallelEnv k: {agent: obs}, {agent: reward}, ...        (pettingzoo dicts)
          |  ParallelEnvRows.step: slots by name, one numpy write per field and group
          v
    observation of env k = {group: {"obs":          [S_g, *agent obs shape]
                                    "rewards":      [S_g] float64
                                    "terminations": [S_g] int8
                                    "truncations":  [S_g] int8
                                    "active":       [S_g] int8}}
          |  the manager's shared memory (a Dict observation, rows = envs)
          v
    frontend/agents.py: reshape (envs, S_g, ...) -> (envs * S_g, ...), one row per agent

Numeric per-agent infos ride the info columns as ``[S_g]`` arrays per env beside a
presence mask (:func:`~envmgr.envside.agent_layout.info_key`); other infos pickle. The
packing rules (slots, death, arrival, the end of an episode and the three autoreset
modes) are those of ``docs/guide/multi-agent.md``; the slots and groups, which the parent
and the workers agree on, are :mod:`envmgr.envside.agent_layout`'s.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, create_empty_array

from envmgr import timers
from envmgr.envside.agent_layout import (
    FIELDS,
    FINAL_KEY,
    AgentGroup,
    AgentLayout,
    AgentSpaceError,
    check_fits,
    info_key,
    spaces_of,
)
from envmgr.envside.agent_pack import GroupRows, write_step_rows
from envmgr.envside.agent_trees import (
    SlotValues,
    add_agent_value,
    add_env_value,
    copy_row,
    put_tree,
    take_slot,
    zero_row,
)
from envmgr.protocol.shared_memory import fits_shared_memory

__all__ = [
    "ParallelEnvRows",
    "ParallelRowsFactory",
]


@dataclass(frozen=True)
class ParallelRowsFactory:
    """``fn(k) -> ParallelEnvRows`` of ``k`` envs: the ``vector_fn`` a manager hosts.

    Attributes:
        env_fn: Zero-argument factory of one ``ParallelEnv``.
        layout: The slots every env packs into.
        autoreset_mode: The Gymnasium autoreset mode, applied per env.
        done_on: ``"all"`` (PettingZoo's rule: the episode ends when no agent is left) or
            ``"any"`` (at the first agent that terminates or truncates).
    """

    env_fn: Callable[[], Any]
    layout: AgentLayout
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP
    done_on: str = "all"

    def __call__(self, k: int) -> ParallelEnvRows:
        """Return ``k`` envs as one ``ParallelEnvRows``."""
        return ParallelEnvRows(
            [self.env_fn] * k, self.layout, self.autoreset_mode, done_on=self.done_on
        )


class ParallelEnvRows(gym.vector.VectorEnv):  # type: ignore[type-arg]
    """``k`` ParallelEnvs as a VectorEnv of ``k`` envs, each observing all its agent slots.

    The autoreset is done here, per env, in the given mode; the manager hosting it
    takes the mode from ``metadata["autoreset_mode"]``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        layout: AgentLayout,
        autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
        *,
        done_on: str = "all",
    ) -> None:
        if done_on not in ("all", "any"):
            raise ValueError(f"done_on must be 'all' or 'any', got {done_on!r}")
        self.envs = [fn() for fn in env_fns]
        #: The manager's index of env 0 here, for messages; a hosting group sets it.
        self.first_env_index = 0
        self.num_envs = len(self.envs)
        self.layout = layout
        self.done_on = done_on
        self.mode = AutoresetMode(autoreset_mode)
        self.metadata = {"autoreset_mode": self.mode}
        self.render_mode = None
        self.single_observation_space = layout.observation_space
        self.single_action_space = layout.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        out: Any = {
            g.name: {
                "obs": create_empty_array(space["obs"], self.num_envs, np.zeros)
                if fits_shared_memory(g.observation_space)
                else SlotValues(g.observation_space, len(g.slots), self.num_envs),
                **{f: create_empty_array(space[f], self.num_envs, np.zeros) for f in FIELDS},
            }
            for g in layout.groups
            for space in (spaces_of(layout.observation_space, g.name),)
        }
        self._shapes: list[Any] = [g.observation_space.shape for g in layout.groups]
        self._use_arrays(out)
        self._turn_based = [hasattr(env, "aec_env") and _is_turn_based(env) for env in self.envs]
        self._slot_index = (
            {a: s for a, (_, s) in layout.slot_of.items()}
            if len(layout.groups) == 1 and not layout.dynamic
            else None
        )
        # Per env: "next" (reset at its next step), "ended" (disabled mode: not stepped).
        self._state = [""] * self.num_envs
        self._dynamic_slots: list[dict[str, int]] = [{} for _ in self.envs]
        # Per env, where pad=True joined Box actions: each agent's own action size.
        self._action_sizes: list[dict[str, int | None]] = [{} for _ in self.envs]
        # Per env, the observation space object last accepted for each agent.
        self._accepted: list[dict[str, Any]] = [{} for _ in self.envs]

    def _use_arrays(self, out: Any) -> None:
        """Pack into ``out`` (``{group: {"obs": ..., field: ...}}``) from now on."""
        groups = self.layout.groups
        self._out = out
        self._ragged = any(isinstance(out[g.name]["obs"], SlotValues) for g in groups)
        self._obs_leaves = [out[g.name]["obs"] for g in groups]
        self._fields = [[out[g.name][f] for f in FIELDS] for g in groups]
        # Per group, (shape, dtype) of one agent's observation where it is one array.
        self._plain = [
            (leaf.shape[2:], leaf.dtype) if isinstance(leaf, np.ndarray) else None
            for leaf in self._obs_leaves
        ]
        # Fixed slots and one array per agent: whole groups are packed at once.
        self._group_rows = (
            None
            if self.layout.dynamic or any(p is None for p in self._plain)
            else [GroupRows(o, f) for o, f in zip(self._obs_leaves, self._fields, strict=True)]
        )

    def observe_into(self, arrays: Any) -> bool:
        """Pack observations straight into ``arrays`` (the host's shared ones) from now on.

        Saves the host one copy of every batch. ``arrays`` must have the layout of this
        env's own (the batch of ``single_observation_space``); otherwise nothing changes.

        Returns:
            Whether ``arrays`` are used: the step and reset results are then ``arrays``.
        """
        if self._ragged or not _same_arrays(self._out, arrays):
            return False
        for name, part in self._out.items():
            for key, value in part.items():
                arrays[name][key][...] = value
        self._use_arrays(arrays)
        return True

    # --------------------------------------------------------------------- the API

    def reset(
        self, *, seed: int | list[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs (those in ``options["reset_mask"]``); env ``k`` gets ``seed + k``.

        ``seed`` may instead be a list with one seed per env.
        """
        opts = dict(options or {})
        mask = opts.pop("reset_mask", None)
        seeds = (
            seed
            if isinstance(seed, list)
            else [None if seed is None else seed + k for k in range(self.num_envs)]
        )
        infos: dict[str, Any] = {}
        for k, env in enumerate(self.envs):
            if mask is not None and not mask[k]:
                continue
            obs, info = env.reset(seed=seeds[k], options=opts or None)
            self._write_reset(k, obs, info, infos)
        return self._batch(), infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its agents' actions; envs autoreset here, in the mode given."""
        n = self.num_envs
        rewards = np.zeros(n)
        infos: dict[str, Any] = {}
        group_actions = [actions[g.name] for g in self.layout.groups]
        packing = 0.0
        for k, env in enumerate(self.envs):
            state = self._state[k]
            if state == "next":
                obs, info = env.reset()
                self._write_reset(k, obs, info, infos)
                continue
            if state == "ended":
                self._clear(k)
                continue
            t0 = perf_counter()
            act = self._actions_of(k, env.agents, group_actions)
            if self.layout.padded:
                act = self._unpadded(k, env, act)
            t1 = perf_counter()
            obs, rew, term, trunc, info = env.step(act)
            t2 = perf_counter()
            ended, written = self._write_step(k, env, obs, rew, term, trunc)
            rewards[k] = sum(rew.values()) if rew else 0.0
            if not ended or self.mode is not AutoresetMode.SAME_STEP:
                self._put_infos(k, written, info, infos)
            if ended:
                if self.mode is AutoresetMode.NEXT_STEP:
                    self._state[k] = "next"
                elif self.mode is AutoresetMode.DISABLED:
                    self._state[k] = "ended"
                else:
                    final = self._rows_of(k)
                    final_info = {self._slot(k, a): info.get(a, {}) for a in written}
                    r_obs, r_info = env.reset()
                    self._write_reset(k, r_obs, r_info, infos, keep_fields=True)
                    add_env_value(infos, FINAL_KEY, k, n, (final, final_info))
            packing += (t1 - t0) + (perf_counter() - t2)
        stack = timers.get_default_stack()
        stack.root.get_child("step").get_child("env.step").get_child("agents.pack").add_time(
            packing, 1
        )
        return self._batch(), rewards, np.zeros(n, np.bool_), np.zeros(n, np.bool_), infos

    def _batch(self) -> Any:
        """The observation batch, variable-size slots in Gymnasium's batch form."""
        if not self._ragged:
            return self._out
        return {
            name: {key: v.batch() if isinstance(v, SlotValues) else v for key, v in part.items()}
            for name, part in self._out.items()
        }

    def _rows_of(self, k: int) -> dict[str, Any]:
        """A copy of env ``k``'s rows, every group's obs and fields."""
        return {
            g.name: {key: copy_row(value, k) for key, value in self._out[g.name].items()}
            for g in self.layout.groups
        }

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` of each env (or read attribute ``name``); one result per env."""
        out = []
        for env in self.envs:
            attr = getattr(env, name)
            out.append(attr(*args, **kwargs) if callable(attr) else attr)
        return tuple(out)

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Return attribute ``name`` of each env."""
        return tuple(getattr(env, name) for env in self.envs)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` of each env: one value for all, or a list/tuple with one each."""
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        for env, value in zip(self.envs, values, strict=True):
            setattr(env, name, value)

    def close_extras(self, **kwargs: Any) -> None:
        """Close every env."""
        for env in self.envs:
            env.close()

    # -------------------------------------------------------------------- packing

    def _env(self, k: int) -> str:
        """Env ``k`` here, as the manager numbers it."""
        return f"env {self.first_env_index + k}"

    def _slot(self, k: int, agent: str) -> tuple[int, int]:
        """The (group, slot) of ``agent`` in env ``k``, given on first sight if dynamic."""
        layout = self.layout
        if not layout.dynamic:
            where = layout.slot_of.get(agent)
            if where is None:
                raise AgentSpaceError(
                    f"{self._env(k)}: agent {agent!r} is not in possible_agents, so it has no slot "
                    f"(slots: {', '.join(layout.slot_of)})"
                )
            return where
        slots = self._dynamic_slots[k]
        s = slots.get(agent)
        if s is None:
            s = len(slots)
            if s >= len(layout.groups[0].slots):
                raise AgentSpaceError(
                    f"{self._env(k)}: agent {agent!r} is agent {s + 1} of this episode, past "
                    f"max_agents={s}; pass a larger max_agents"
                )
            slots[agent] = s
        return 0, s

    def _actions_of(self, k: int, agents: list[str], group_actions: list[Any]) -> dict[str, Any]:
        """The action dict of env ``k``: each agent's from its row."""
        slot_of = self.layout.slot_of
        index = self._slot_index
        if index is not None and type(group_actions[0]) is np.ndarray:
            try:
                slots = [index[a] for a in agents]
            except KeyError:
                pass  # an agent with no slot: the general path names it
            else:
                return dict(zip(agents, group_actions[0][k][slots], strict=True))
        if not self.layout.dynamic and all(type(a) is np.ndarray for a in group_actions):
            rows = [a[k] for a in group_actions]
            try:
                return {a: rows[slot_of[a][0]][slot_of[a][1]] for a in agents}
            except KeyError:
                pass  # an agent with no slot: the general path names it
        return {a: self._action(k, a, group_actions) for a in agents}

    def _unpadded(self, k: int, env: Any, actions: dict[str, Any]) -> dict[str, Any]:
        """Each agent's part of its padded action: the first entries of a longer Box."""
        want = self.layout.groups[0].action_space
        sizes = self._action_sizes[k]
        out = {}
        for agent, value in actions.items():
            size = sizes.get(agent, -1)
            if size == -1:
                space = env.action_space(agent)
                fits = isinstance(space, gym.spaces.Box) and space.shape != want.shape
                size = sizes[agent] = space.shape[0] if fits else None
            out[agent] = value if size is None else value[:size]
        return out

    def _action(self, k: int, agent: str, group_actions: list[Any]) -> Any:
        g, s = self._slot(k, agent)
        return take_slot(group_actions[g], k, s)

    def _clear(self, k: int) -> None:
        for leaf, fields in zip(self._obs_leaves, self._fields, strict=True):
            zero_row(leaf, k)
            for f in fields:
                f[k] = 0

    def _write_reset(
        self,
        k: int,
        obs: dict[str, Any],
        info: dict[str, Any],
        infos: dict[str, Any],
        keep_fields: bool = False,
    ) -> None:
        self._state[k] = ""
        self._dynamic_slots[k] = {}
        self._action_sizes[k] = {}
        env = self.envs[k]
        if keep_fields:
            for leaf in self._obs_leaves:
                zero_row(leaf, k)
        else:
            self._clear(k)
        self._check_live(k, env, obs)
        for agent, value in obs.items():
            g, s = self._slot(k, agent)
            self._check_space(k, env, agent, self.layout.groups[g])
            self._put_obs(k, g, s, agent, value)
        for agent in self._live(k, env, obs):
            g, s = self._slot(k, agent)
            self._fields[g][3][k, s] = 1
        self._put_infos(k, obs, info, infos)

    def _write_step(
        self,
        k: int,
        env: Any,
        obs: dict[str, Any],
        rew: dict[str, Any],
        term: dict[str, Any],
        trunc: dict[str, Any],
    ) -> tuple[bool, list[str]]:
        """Write env ``k``'s step into its rows: whether its episode ended, and whose rows.

        The rows of a group are written with one numpy assignment per field, not one per
        agent: a MAgent battle steps hundreds of agents per env.
        """
        if self._group_rows is not None and not self._turn_based[k]:
            done = write_step_rows(
                k,
                self._group_rows,
                self.layout,
                env.agents,
                env.observation_space,
                self._accepted[k],
                (obs, rew, term, trunc),
                self.done_on,
            )
            if done is not None:
                return done
        self._clear(k)
        self._check_live(k, env, obs)
        live = set(self._live(k, env, obs))
        groups = self.layout.groups
        written: list[str] = []
        per_group: list[list[Any]] = [[[], [], [], [], []] for _ in groups]
        any_done = False
        # Bound once: this loop runs for every agent on every step.
        slot_of = None if self.layout.dynamic else self.layout.slot_of
        observation_space, accepted, plain = env.observation_space, self._accepted[k], self._plain
        for agent, value in obs.items():
            t, u = term.get(agent, False), trunc.get(agent, False)
            if not (t or u or agent in live):
                continue
            if t or u:
                any_done = True
            where = None if slot_of is None else slot_of.get(agent)
            g, slot = self._slot(k, agent) if where is None else where
            if accepted.get(agent) is not observation_space(agent):
                self._check_space(k, env, agent, groups[g])
            layout = plain[g]
            if not (
                type(value) is np.ndarray
                and layout is not None
                and value.shape == layout[0]
                and value.dtype == layout[1]
            ):
                value = self._checked_obs(k, g, slot, agent, value)
            rows = per_group[g]
            rows[0].append(slot)
            rows[1].append(value)
            rows[2].append(rew.get(agent, 0.0))
            rows[3].append(t)
            rows[4].append(u)
            written.append(agent)
        ended = not env.agents or (self.done_on == "any" and any_done)
        for g, (slots, values, rewards, terms, truncs) in enumerate(per_group):
            if not slots:
                continue
            if ended and self.done_on == "any":
                truncs = [u or not t for t, u in zip(terms, truncs, strict=True)]
            self._put_rows(k, g, slots, values, written)
            fields = self._fields[g]
            fields[0][k, slots] = rewards
            fields[1][k, slots] = terms
            fields[2][k, slots] = truncs
            fields[3][k, slots] = 1
        return ended, written

    def _check_space(self, k: int, env: Any, agent: str, group: AgentGroup) -> None:
        """The agent's observation space is still its group's: a slot's layout is fixed.

        Runs for every agent on every step, so it compares what the layout depends on
        (a Box's shape and dtype, not its bounds: ``Box.__eq__`` is two ``allclose``) and
        remembers the space object it last accepted for the agent.
        """
        space = env.observation_space(agent)
        seen = self._accepted[k]
        if seen.get(agent) is space:
            return
        want = group.observation_space
        if space is want or _same_layout(space, want):
            seen[agent] = space
            return
        if self.layout.padded:
            try:
                check_fits(space, group.observation_space, agent)
            except AgentSpaceError as exc:
                raise AgentSpaceError(f"{self._env(k)}: {exc}") from None
            return
        raise AgentSpaceError(
            f"{self._env(k)}: agent {agent!r} now observes {space}, but its slot was laid out for "
            f"{group.observation_space} ({group.source or 'its group'}): an agent's space must "
            "not change between calls "
            "(pad=True with observation_space= takes spaces that fit one)"
        )

    def _live(self, k: int, env: Any, obs: dict[str, Any]) -> list[str]:
        if self._turn_based[k]:
            aec = env.aec_env
            return [aec.agent_selection] if env.agents else []
        return list(env.agents)

    def _check_live(self, k: int, env: Any, obs: dict[str, Any]) -> None:
        for agent in env.agents:
            if agent not in obs:
                raise AgentSpaceError(
                    f"{self._env(k)}: agent {agent!r} is in env.agents but its step result has no "
                    f"observation for it (observations for: {', '.join(map(str, obs))})"
                )

    def _checked_obs(self, k: int, g: int, slot: int, agent: str, value: Any) -> Any:
        """``value``, checked to fit slot ``slot`` of group ``g`` (padded where it may be)."""
        leaf = self._obs_leaves[g]
        if not isinstance(leaf, np.ndarray):
            return value  # a Dict/Tuple (checked as it is written) or variable-size
        shape = self._shapes[g]
        got = value.shape if type(value) is np.ndarray else np.shape(value)
        if got != shape:
            if not (self.layout.padded and _fits_in(got, shape)):
                raise AgentSpaceError(
                    f"{self._env(k)}: agent {agent!r} observed shape {got}, expected {shape} "
                    f"(its space: {self.layout.groups[g].observation_space})"
                )
            padded = np.zeros(shape, leaf.dtype)
            padded[tuple(slice(0, d) for d in got)] = value
            return padded
        dtype = getattr(value, "dtype", None)
        if (
            dtype is not None
            and dtype != leaf.dtype
            and not np.can_cast(dtype, leaf.dtype, "same_kind")
        ):
            raise AgentSpaceError(
                f"{self._env(k)}: agent {agent!r} observed dtype {dtype}, which does not cast "
                f"to {leaf.dtype} (its space: {self.layout.groups[g].observation_space})"
            )
        return value

    def _put_rows(
        self, k: int, g: int, slots: list[int], values: list[Any], agents: Sequence[str]
    ) -> None:
        """Write checked observations into env ``k``'s ``slots`` of group ``g``.

        ``agents`` names them in messages.
        """
        leaf = self._obs_leaves[g]
        if isinstance(leaf, np.ndarray):
            leaf[k, slots] = values
            return
        for slot, value in zip(slots, values, strict=True):
            if isinstance(leaf, SlotValues):
                leaf.values[slot][k] = value
            else:
                agent = next((a for a in agents if self._slot(k, a) == (g, slot)), slot)
                put_tree(leaf, k, slot, value, f"{self._env(k)}: agent {agent!r} observation")

    def _put_obs(self, k: int, g: int, slot: int, agent: str, value: Any) -> None:
        self._put_rows(k, g, [slot], [self._checked_obs(k, g, slot, agent, value)], [agent])

    def _put_infos(
        self,
        k: int,
        agents: Sequence[str] | dict[str, Any],
        info: dict[str, Any],
        infos: dict[str, Any],
    ) -> None:
        if not any(map(info.get, agents)):
            return
        groups = self.layout.groups
        n = self.num_envs
        for agent in agents:
            d = info.get(agent)
            if not d:
                continue
            g, s = self._slot(k, agent)
            name, size = groups[g].name, len(groups[g].slots)
            for key, value in d.items():
                add_agent_value(infos, info_key(name, key), k, s, n, size, value)


def _same_arrays(ours: Any, theirs: Any) -> bool:
    """Whether ``theirs`` is a ``{group: {key: array}}`` of the shapes and dtypes of ``ours``."""
    try:
        return set(ours) == set(theirs) and all(
            set(part) == set(theirs[name])
            and all(
                type(theirs[name][key]) is np.ndarray
                and theirs[name][key].shape == value.shape
                and theirs[name][key].dtype == value.dtype
                for key, value in part.items()
            )
            for name, part in ours.items()
        )
    except TypeError:
        return False


def _same_layout(space: gym.Space[Any], want: gym.Space[Any]) -> bool:
    """Whether ``space`` packs into ``want``'s arrays as they are laid out."""
    if isinstance(space, gym.spaces.Box) and isinstance(want, gym.spaces.Box):
        return space.shape == want.shape and space.dtype == want.dtype
    return bool(space == want)


def _fits_in(got: tuple[int, ...], shape: tuple[int, ...]) -> bool:
    return len(got) == len(shape) and all(a <= b for a, b in zip(got, shape, strict=True))


def _is_turn_based(env: Any) -> bool:
    return type(env).__name__ == "turn_based_aec_to_parallel_wrapper"
