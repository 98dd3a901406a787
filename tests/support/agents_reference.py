"""A serial reference for envmgr's multi-agent packing, written from the spec alone.

``ReferenceAgents`` steps PettingZoo ``ParallelEnv`` s in this process, one after the
other, and packs their per-agent dicts into arrays by the rules of
``notes/multiagent_spec.md``. The envmgr tests compare ``envmgr.make_parallel`` with it
bit for bit: two independent implementations of the same rules.

Data flow of one ``step`` (per group ``g``: ``N_g = E * S_g`` rows, row ``e * S_g + j``)::

    actions[g][row] --(agents in env.agents)--> env_e.step(dict)
        --> (obs, rewards, terminations, truncations, infos) dicts
        --> slots: agent -> (group, j)   (possible_agents, or first seen up to max_agents)
        --> rows: active ones get the agent's values, the others zeros / 0.0 / False / {}
        --> the episode's end: NEXT_STEP resets at the next step, SAME_STEP now
            (final_obs / final_info), DISABLED waits for reset(options={"reset_mask": ...})
        --> per group: arrays, and infos built with gymnasium.vector.VectorEnv._add_info
            from the per-row dicts, plus "active" / "_active".

One group (every agent alike, or ``pad=True``) returns arrays over rows; several groups
return dicts by group name of those.

Padding (``pad=True``, declared ``observation_space`` / ``action_space``): an agent's
observation fills the leading corner of the declared shape (zeros elsewhere), cast to the
declared dtype; a ``Box`` action is cut to the agent's shape, any other action is passed as
the row holds it.

Turn-based games (``turn_based_aec_to_parallel``): ``active`` is the agent whose turn it
is (and the agents that ended on the step); every agent in ``env.agents`` gets an action.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, create_empty_array
from pettingzoo.utils.conversions import turn_based_aec_to_parallel_wrapper

__all__ = ["ReferenceAgents", "AgentPackingError", "group_name_of"]


class AgentPackingError(ValueError):
    """A ParallelEnv broke one of the spec's rules (the message names env and agent)."""


class _InfoBuilder:
    """What ``VectorEnv._add_info`` needs of ``self``: ``num_envs`` (and itself, recursing)."""

    _add_info = VectorEnv._add_info

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs


def group_name_of(agents: Sequence[str]) -> str | None:
    """The agents' common name prefix before the last ``_``, or None when they have none."""
    prefixes = {a.rpartition("_")[0] for a in agents}
    if len(prefixes) != 1:
        return None
    prefix = prefixes.pop()
    return prefix or None


def _fits(small: spaces.Space, big: spaces.Space) -> bool:  # type: ignore[type-arg]
    """Whether ``small`` pads into ``big`` (same kind, every size at most big's)."""
    if isinstance(small, spaces.Box) and isinstance(big, spaces.Box):
        return len(small.shape) == len(big.shape) and all(
            s <= b for s, b in zip(small.shape, big.shape, strict=True)
        )
    if isinstance(small, spaces.Discrete) and isinstance(big, spaces.Discrete):
        return bool(small.start >= big.start and small.start + small.n <= big.start + big.n)
    return bool(small == big)


def _put(space: spaces.Space, batch: Any, row: int, value: Any, pad: bool, where: str) -> None:  # type: ignore[type-arg]
    """Write one agent's ``value`` into ``batch[row]`` (checked against ``space``)."""
    if isinstance(space, spaces.Dict):
        if not isinstance(value, dict) or value.keys() != space.spaces.keys():
            raise AgentPackingError(f"{where}: expected a dict with keys {list(space.spaces)}")
        for key, sub in space.spaces.items():
            _put(sub, batch[key], row, value[key], pad, f"{where}[{key!r}]")
        return
    if isinstance(space, spaces.Tuple):
        for k, sub in enumerate(space.spaces):
            _put(sub, batch[k], row, value[k], pad, f"{where}[{k}]")
        return
    if isinstance(space, spaces.Sequence):
        array = np.asarray(value)
        feature = space.feature_space
        if array.shape[1:] != feature.shape or array.dtype != feature.dtype:
            raise AgentPackingError(
                f"{where}: elements of shape {array.shape[1:]}, dtype {array.dtype}; "
                f"expected shape {feature.shape}, dtype {feature.dtype}"
            )
        batch[row] = array.copy()
        return
    array = np.asarray(value)
    shape_ok = array.shape == space.shape or (
        pad
        and array.ndim == len(space.shape)
        and all(s <= b for s, b in zip(array.shape, space.shape, strict=True))
    )
    if not shape_ok or (not pad and array.dtype != space.dtype):
        raise AgentPackingError(
            f"{where}: shape {array.shape}, dtype {array.dtype}; "
            f"expected shape {space.shape}, dtype {space.dtype}"
        )
    if pad:
        batch[row][tuple(slice(0, n) for n in array.shape)] = array
    else:
        batch[row] = array


def _take(space: spaces.Space, batch: Any, row: int) -> Any:  # type: ignore[type-arg]
    """Row ``row`` of a batch of ``space`` (a copy for arrays)."""
    if isinstance(space, spaces.Dict):
        return {key: _take(sub, batch[key], row) for key, sub in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(_take(sub, batch[k], row) for k, sub in enumerate(space.spaces))
    return batch[row].copy() if batch[row].ndim else batch[row]


def _empty_batch(space: spaces.Space, n: int) -> Any:  # type: ignore[type-arg]
    """``n`` empty rows: zeros, or for a ``Sequence(stack=True)`` no elements (a list, as
    rows change length; :meth:`_Group.finish` gives Gymnasium's tuple)."""
    if isinstance(space, spaces.Sequence):
        feature = space.feature_space
        return [np.zeros((0, *feature.shape), feature.dtype) for _ in range(n)]
    return create_empty_array(space, n, fn=np.zeros)


def _check_batch(space: spaces.Space, batch: Any, n: int, where: str) -> None:  # type: ignore[type-arg]
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _check_batch(sub, batch[key], n, f"{where}[{key!r}]")
        return
    shape = np.shape(batch)
    if shape != (n, *space.shape):
        raise AgentPackingError(f"{where}: actions of shape {shape}; expected {(n, *space.shape)}")


def _zero_rows(space: spaces.Space, batch: Any, rows: np.ndarray) -> None:  # type: ignore[type-arg]
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _zero_rows(sub, batch[key], rows)
        return
    if isinstance(space, spaces.Sequence):
        for r in np.arange(len(batch))[rows]:  # rows: a mask or indices
            batch[r] = batch[r][:0]
        return
    batch[rows] = 0


def _copy_rows(space: spaces.Space, dst: Any, src: Any, rows: np.ndarray) -> None:  # type: ignore[type-arg]
    if isinstance(space, spaces.Dict):
        for key, sub in space.spaces.items():
            _copy_rows(sub, dst[key], src[key], rows)
        return
    if isinstance(space, spaces.Sequence):
        for r in np.arange(len(dst))[rows]:  # rows: a mask or indices
            dst[r] = src[r]
        return
    dst[rows] = src[rows]


class _Group:
    """One group's spaces and rows, and the batch being filled by the current call."""

    def __init__(
        self,
        name: str,
        obs_space: spaces.Space,  # type: ignore[type-arg]
        act_space: spaces.Space,  # type: ignore[type-arg]
        slots: int,
        n_envs: int,
    ) -> None:
        self.name = name
        self.obs_space = obs_space
        self.act_space = act_space
        self.slots = slots
        self.n = slots * n_envs
        self.last_obs: Any = None
        self.last_active = np.zeros(self.n, dtype=np.bool_)
        self.begin()

    def begin(self) -> None:
        n = self.n
        self.obs = _empty_batch(self.obs_space, n)
        self.rewards = np.zeros(n, dtype=np.float64)
        self.terms = np.zeros(n, dtype=np.bool_)
        self.truncs = np.zeros(n, dtype=np.bool_)
        self.active = np.zeros(n, dtype=np.bool_)
        self.row_infos: list[dict[str, Any]] = [{} for _ in range(n)]
        self.finals: dict[int, tuple[Any, dict[str, Any]]] = {}

    def finish(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        builder = _InfoBuilder(self.n)
        infos: dict[str, Any] = {}
        for r in range(self.n):
            if r in self.finals:
                final_obs, final_info = self.finals[r]
                infos = builder._add_info(
                    infos, {"final_obs": final_obs, "final_info": final_info}, r
                )
            infos = builder._add_info(infos, self.row_infos[r], r)
        infos["active"] = self.active.copy()
        infos["_active"] = np.ones(self.n, dtype=np.bool_)
        self.last_obs = self.obs
        self.last_active = self.active.copy()
        obs = tuple(self.obs) if isinstance(self.obs, list) else self.obs
        return obs, self.rewards, self.terms, self.truncs, infos


class _EnvState:
    """One ParallelEnv, its slots in the current episode and whether the episode ended."""

    def __init__(self, env: Any, index: int) -> None:
        self.env = env
        self.index = index
        self.turn_based = isinstance(env, turn_based_aec_to_parallel_wrapper)
        self.slot_of: dict[str, tuple[int, int]] = {}  # agent -> (group, slot in group)
        self.next_slot = 0
        self.spaces: dict[str, tuple[Any, Any]] = {}  # first spaces seen, per agent
        self.ended = False

    def live(self) -> set[str]:
        """The agents whose rows are active after a call (the turn's agent if turn-based)."""
        if self.turn_based:
            return {self.env.aec_env.agent_selection} if self.env.agents else set()
        return set(self.env.agents)


class ReferenceAgents:
    """Step ParallelEnvs serially and pack them as the spec says (see the module doc).

    Args:
        env_fns: One zero-argument ParallelEnv factory per env.
        max_agents: Slots per env for envs without ``possible_agents``.
        done_on: ``"all"`` (PettingZoo's rule: ``env.agents`` is empty) or ``"any"``.
        autoreset_mode: Gymnasium's ``AutoresetMode`` (or its string value).
        pad: One group of padded rows (needs the declared spaces).
        observation_space: One agent's observation space (with ``pad``, or for envs
            without ``possible_agents``).
        action_space: One agent's action space (likewise).
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        *,
        max_agents: int | None = None,
        done_on: str = "all",
        autoreset_mode: AutoresetMode | str = AutoresetMode.NEXT_STEP,
        pad: bool = False,
        observation_space: spaces.Space | None = None,  # type: ignore[type-arg]
        action_space: spaces.Space | None = None,  # type: ignore[type-arg]
    ) -> None:
        if done_on not in ("all", "any"):
            raise ValueError(f"done_on must be 'all' or 'any', got {done_on!r}")
        if pad and (observation_space is None or action_space is None):
            raise ValueError("pad=True needs observation_space and action_space")
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.done_on = done_on
        self.pad = pad
        self.envs = [_EnvState(fn(), e) for e, fn in enumerate(env_fns)]
        self.num_parallel_envs = len(self.envs)
        first = self.envs[0].env
        self.possible_agents: list[str] | None = getattr(first, "possible_agents", None)
        if self.possible_agents is None and max_agents is None:
            raise ValueError("an env without possible_agents needs max_agents")
        self._declared = (observation_space, action_space)
        self.groups: list[_Group] = []
        if self.possible_agents is not None:
            self._group_possible_agents(first)
        else:
            assert max_agents is not None
            self.slots = max_agents
            if observation_space is not None and action_space is not None:
                self._one_group(observation_space, action_space)

    # ---------------------------------------------------------------- layout

    def _group_possible_agents(self, env: Any) -> None:
        agents = list(self.possible_agents or [])
        self.slots = len(agents)
        if self.pad:
            obs_space, act_space = self._declared
            self._one_group(obs_space, act_space)
            for s, a in enumerate(agents):
                for state in self.envs:
                    state.slot_of[a] = (0, s)
            return
        keys: list[tuple[Any, Any]] = []
        members: list[list[str]] = []
        for a in agents:
            key = (env.observation_space(a), env.action_space(a))
            for k, known in enumerate(keys):
                if known[0] == key[0] and known[1] == key[1]:
                    members[k].append(a)
                    break
            else:
                keys.append(key)
                members.append([a])
        candidates = [group_name_of(m) for m in members]
        for g, (key, names) in enumerate(zip(keys, members, strict=True)):
            name = candidates[g]
            if name is None or candidates.count(name) > 1:
                name = f"group{g}"
            self.groups.append(_Group(name, key[0], key[1], len(names), len(self.envs)))
            for j, a in enumerate(names):
                for state in self.envs:
                    state.slot_of[a] = (g, j)
        self._members = members

    def _one_group(self, obs_space: Any, act_space: Any) -> None:
        self.groups = [_Group("agents", obs_space, act_space, self.slots, len(self.envs))]

    @property
    def group_names(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.groups)

    @property
    def rows(self) -> Any:
        """rows[r] == (env index, agent) (or (env index, slot) without possible_agents)."""
        by_group = {}
        for g, group in enumerate(self.groups):
            if self.possible_agents is None:
                names: list[Any] = list(range(self.slots))
            elif self.pad:
                names = list(self.possible_agents)
            else:
                names = self._members[g]
            by_group[group.name] = [(e, a) for e in range(len(self.envs)) for a in names]
        return self._one_or_all(by_group)

    @property
    def num_envs(self) -> int:
        (group,) = self.groups
        return group.n

    @property
    def single_observation_space(self) -> Any:
        (group,) = self.groups
        return group.obs_space

    @property
    def single_action_space(self) -> Any:
        (group,) = self.groups
        return group.act_space

    @property
    def action_space(self) -> Any:
        (group,) = self.groups
        return batch_space(group.act_space, group.n)

    @property
    def single_observation_spaces(self) -> dict[str, Any]:
        return {g.name: g.obs_space for g in self.groups}

    @property
    def single_action_spaces(self) -> dict[str, Any]:
        return {g.name: g.act_space for g in self.groups}

    def action_spaces(self) -> dict[str, Any]:
        """Each group's batched action space."""
        return {g.name: batch_space(g.act_space, g.n) for g in self.groups}

    def _one_or_all(self, by_group: dict[str, Any]) -> Any:
        if len(self.groups) == 1:
            return next(iter(by_group.values()))
        return by_group

    # ---------------------------------------------------------------- calls

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, Any]:
        n = len(self.envs)
        if seed is None:
            seeds: list[int | None] = [None] * n
        elif isinstance(seed, int):
            seeds = [seed + e for e in range(n)]
        else:
            seeds = list(seed)
        options = dict(options) if options is not None else None
        mask = np.ones(n, dtype=np.bool_)
        if options is not None and "reset_mask" in options:
            mask = self._env_mask(np.asarray(options.pop("reset_mask")))
        for group in self.groups:
            group.begin()
        for state in self.envs:
            if mask[state.index]:
                obs, infos = state.env.reset(seed=seeds[state.index], options=options)
                self._pack_reset(state, obs, infos)
        if not mask.all():
            self._keep_rows(~mask)
        out = [g.finish() for g in self.groups]
        return self._one_or_all({g.name: o[0] for g, o in zip(self.groups, out, strict=True)}), (
            self._one_or_all({g.name: o[4] for g, o in zip(self.groups, out, strict=True)})
        )

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, Any]:
        if not self.groups:
            raise RuntimeError("step() before reset()")
        by_group = actions if isinstance(actions, dict) and len(self.groups) > 1 else None
        batches = [by_group[g.name] if by_group else actions for g in self.groups]
        for group, batch in zip(self.groups, batches, strict=True):
            _check_batch(group.act_space, batch, group.n, f"group {group.name!r}")
        for group in self.groups:
            group.begin()
        for state in self.envs:
            if state.ended:
                if self.autoreset_mode is AutoresetMode.NEXT_STEP:
                    obs, infos = state.env.reset()
                    self._pack_reset(state, obs, infos)
                # DISABLED: not stepped; its rows stay inactive.
                continue
            self._step_env(state, batches)
        out = [g.finish() for g in self.groups]
        return tuple(  # type: ignore[return-value]
            self._one_or_all({g.name: o[k] for g, o in zip(self.groups, out, strict=True)})
            for k in range(5)
        )

    def close(self) -> None:
        for state in self.envs:
            state.env.close()

    # ---------------------------------------------------------------- per env

    def _env_mask(self, mask: np.ndarray) -> np.ndarray:
        n = len(self.envs)
        if mask.shape == (n,):
            return mask.astype(np.bool_)
        per_env = mask.reshape(n, -1)
        if not (per_env == per_env[:, :1]).all():
            raise ValueError("a per-row reset_mask must be equal within each env")
        return per_env[:, 0].astype(np.bool_)

    def _keep_rows(self, kept_envs: np.ndarray) -> None:
        """Rows of envs a masked reset did not reset keep their last observation."""
        for group in self.groups:
            rows = np.repeat(kept_envs, group.slots)
            if group.last_obs is not None:
                _copy_rows(group.obs_space, group.obs, group.last_obs, rows)
            group.active[rows] = group.last_active[rows]

    def _row(self, state: _EnvState, agent: str) -> tuple[_Group, int]:
        g, j = state.slot_of[agent]
        group = self.groups[g]
        return group, state.index * group.slots + j

    def _give_slot(self, state: _EnvState, agent: str) -> None:
        """A first-seen agent's slot (envs without possible_agents), or an error."""
        if agent in state.slot_of:
            return
        if self.possible_agents is not None:
            raise AgentPackingError(
                f"env {state.index}: agent {agent!r} is not in possible_agents "
                f"{self.possible_agents}: it has no slot"
            )
        if state.next_slot >= self.slots:
            raise AgentPackingError(
                f"env {state.index}: agent {agent!r} is agent {state.next_slot + 1} of the "
                f"episode, past max_agents={self.slots}"
            )
        state.slot_of[agent] = (0, state.next_slot)
        state.next_slot += 1

    def _check_space(self, state: _EnvState, agent: str) -> None:
        env = state.env
        now = (env.observation_space(agent), env.action_space(agent))
        if not self.groups:  # no possible_agents, no declared spaces: the first agent's
            self._one_group(*now)
        group, _ = self._row(state, agent)
        before = state.spaces.setdefault(agent, now)
        if self.pad:
            ok = _fits(now[0], group.obs_space) and _fits(now[1], group.act_space)
        else:
            ok = before[0] == now[0] and before[1] == now[1]
            if ok and self.possible_agents is None:
                ok = now[0] == group.obs_space and now[1] == group.act_space
        if not ok:
            expected = (group.obs_space, group.act_space) if self.pad else before
            raise AgentPackingError(
                f"env {state.index}: agent {agent!r} has spaces ({now[0]}, {now[1]}); "
                f"expected ({expected[0]}, {expected[1]})"
                + (" or spaces that fit them" if self.pad else "")
            )

    def _new_episode(self, state: _EnvState) -> None:
        if self.possible_agents is None:
            state.slot_of = {}
            state.next_slot = 0
        state.ended = False

    def _pack_reset(self, state: _EnvState, obs: dict[str, Any], infos: dict[str, Any]) -> None:
        infos = copy.deepcopy(infos)
        self._new_episode(state)
        env = state.env
        for agent in env.agents:
            self._give_slot(state, agent)
        live = state.live()
        for agent in env.agents:
            self._check_space(state, agent)
            group, r = self._row(state, agent)
            if agent in obs:
                _put(group.obs_space, group.obs, r, obs[agent], self.pad, self._where(state, agent))
            group.row_infos[r] = infos.get(agent, {})
            group.active[r] = agent in live

    def _step_env(self, state: _EnvState, batches: list[Any]) -> None:
        env = state.env
        actions = {}
        for agent in env.agents:
            group, r = self._row(state, agent)
            g = self.groups.index(group)
            action = _take(group.act_space, batches[g], r)
            if self.pad and isinstance(group.act_space, spaces.Box):
                shape = env.action_space(agent).shape
                action = action[tuple(slice(0, n) for n in shape)]
            actions[agent] = action
        obs, rewards, terms, truncs, infos = env.step(actions)
        infos = copy.deepcopy(infos)
        for agent in obs:
            if agent not in state.slot_of and (agent in env.agents):
                self._give_slot(state, agent)
        for agent in env.agents:
            if agent not in state.slot_of:
                self._give_slot(state, agent)  # raises: in env.agents, no slot
            if agent not in obs:
                raise AgentPackingError(
                    f"env {state.index}: agent {agent!r} is in env.agents after the step but "
                    "not in the step's observations"
                )
        flagged = {a for a in obs if terms.get(a, False) or truncs.get(a, False)}
        ended = not env.agents or (self.done_on == "any" and bool(flagged))
        live = state.live()
        final: list[tuple[_Group, int]] = []
        for agent in obs:
            if agent not in state.slot_of:
                continue  # ended on its first appearance without a slot: nothing to show
            if agent not in live and agent not in flagged:
                continue
            self._check_space(state, agent)
            group, r = self._row(state, agent)
            _put(group.obs_space, group.obs, r, obs[agent], self.pad, self._where(state, agent))
            group.rewards[r] = rewards.get(agent, 0.0)
            group.terms[r] = terms.get(agent, False)
            group.truncs[r] = truncs.get(agent, False) or (ended and agent in env.agents)
            group.row_infos[r] = infos.get(agent, {})
            group.active[r] = True
            final.append((group, r))
        if not ended:
            return
        state.ended = True
        if self.autoreset_mode is not AutoresetMode.SAME_STEP:
            return
        for group, r in final:
            group.finals[r] = (_take(group.obs_space, group.obs, r), group.row_infos[r])
            group.row_infos[r] = {}
        for group in self.groups:
            rows = np.arange(state.index * group.slots, (state.index + 1) * group.slots)
            _zero_rows(group.obs_space, group.obs, rows)
        reset_obs, reset_infos = env.reset()
        reset_infos = copy.deepcopy(reset_infos)
        self._pack_reset(state, reset_obs, reset_infos)
        for group, r in final:  # active on the final step, or holding a reset agent
            group.active[r] = True

    def _where(self, state: _EnvState, agent: str) -> str:
        return f"env {state.index}: agent {agent!r}: observation"
