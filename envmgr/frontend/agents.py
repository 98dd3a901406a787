"""The agent rows of multi-agent envs, on the parent's side: one row per (env, slot).

The manager underneath steps ``E`` envs whose observation holds every agent slot
(:mod:`envmgr.envside.agent_rows`); this module turns its batch into the rows the
user sees, by reshaping, so the rows of ``copy=False`` are views of shared memory::

    manager batch: obs[group]["obs"]     [E, S_g, *shape]    -> obs       [E * S_g, *shape]
                   obs[group]["rewards"] [E, S_g]            -> rewards   [E * S_g]
                   obs[group][flags]     [E, S_g] int8       -> bool      [E * S_g]
                   infos["envmgr.agents.<group>.<key>"]      -> infos[key] with "_key" per row
                   manager truncation + envmgr_restarted     -> truncated rows that were active

:class:`AgentVectorEnv` is the one-group case, a ``gymnasium.vector.VectorEnv``;
:class:`AgentGroupsVectorEnv` gives one batch per group, in dicts keyed by group name.
Both share :class:`AgentRows`, which does the reshaping for a whole batch or for the
envs a :meth:`recv` returned.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space

from envmgr.envside.agent_layout import FIELDS, FINAL_KEY, AgentGroup, AgentLayout, info_key
from envmgr.protocol.shared_memory import fits_shared_memory
from envmgr.protocol.trees import tree_map

__all__ = ["AgentRows", "AgentVectorEnv", "AgentGroupsVectorEnv", "RESTART_KEY"]

#: The manager's note on the envs of a replaced worker.
RESTART_KEY = "envmgr_restarted"
GroupBatch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class _Rows:
    """What ``gymnasium.vector.VectorEnv._add_info`` needs of its owner: the row count."""

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs

    _add_info = gym.vector.VectorEnv._add_info


def add_row_info(
    infos: dict[str, Any], info: dict[str, Any], row: int, rows: int
) -> dict[str, Any]:
    """Add one row's info dict to a batch of ``rows`` rows, exactly as Gymnasium does."""
    return gym.vector.VectorEnv._add_info(_Rows(rows), infos, info, row)  # type: ignore[arg-type]


class AgentRows:
    """The reshaping between a manager's env batch and each group's agent rows.

    Args:
        manager: The manager (a :class:`~envmgr.frontend.vector_env.BatchedVectorEnv`)
            hosting :class:`~envmgr.envside.agent_rows.ParallelEnvRows`.
        layout: The envs' groups and slots.
    """

    def __init__(self, manager: Any, layout: AgentLayout) -> None:
        self.manager = manager
        self.layout = layout
        self.num_parallel_envs: int = manager.num_envs
        e = self.num_parallel_envs
        self.rows = {
            g.name: [(i, slot) for i in range(e) for slot in g.slots] for g in layout.groups
        }
        self._active = {g.name: np.zeros((e, len(g.slots)), np.bool_) for g in layout.groups}
        #: Variable-size slots come as padded arrays (``ragged="padded"``), not as items.
        self.padded = getattr(manager, "ragged", "gymnasium") == "padded"

    def group(self, name: str) -> AgentGroup:
        """The group called ``name``."""
        for g in self.layout.groups:
            if g.name == name:
                return g
        raise KeyError(
            f"no agent group {name!r}; the groups: {[g.name for g in self.layout.groups]}"
        )

    def actions(self, by_group: dict[str, Any], envs: int) -> dict[str, Any]:
        """Each group's row actions, reshaped to the manager's ``[envs, S_g, ...]``."""
        out = {}
        for g in self.layout.groups:
            if g.name not in by_group:
                raise ValueError(f"no actions for agent group {g.name!r}")
            size = len(g.slots)

            def per_env(a: Any, size: int = size, name: str = g.name) -> np.ndarray:
                a = np.asarray(a)
                if a.shape[:1] != (envs * size,):
                    raise ValueError(
                        f"actions for group {name!r} have shape {a.shape}, expected "
                        f"({envs * size}, ...): one per agent row ({envs} envs x {size} slots)"
                    )
                return a.reshape(envs, size, *a.shape[1:])

            out[g.name] = tree_map(per_env, by_group[g.name])
        return out

    def env_mask(self, options: dict[str, Any] | None, rows: int) -> dict[str, Any] | None:
        """``options`` with a per-row ``reset_mask`` made per env (all rows of an env agree)."""
        if not options or options.get("reset_mask") is None:
            return options
        mask = np.asarray(options["reset_mask"], dtype=np.bool_)
        e = self.num_parallel_envs
        if mask.shape == (e,):
            return options
        if mask.shape != (e * rows,):
            raise ValueError(
                f"reset_mask has shape {mask.shape}: give one per env ({e},) or one per agent "
                f"row ({e * rows},)"
            )
        per_env = mask.reshape(e, rows)
        split = np.flatnonzero(per_env.any(axis=1) != per_env.all(axis=1))
        if split.size:
            raise ValueError(
                f"reset_mask resets some rows of env {int(split[0])} but not others: an env "
                "resets all its agents or none"
            )
        return {**options, "reset_mask": per_env[:, 0]}

    def unpack(
        self,
        obs: Any,
        truncations: np.ndarray,
        infos: dict[str, Any],
        env_ids: np.ndarray | None = None,
    ) -> dict[str, GroupBatch]:
        """Every group's ``(obs, rewards, terminations, truncations, infos)`` over its rows."""
        ids = np.arange(self.num_parallel_envs) if env_ids is None else np.asarray(env_ids)
        restarted = truncations.astype(np.bool_) & infos.get("_" + RESTART_KEY, False)
        return {
            g.name: self._unpack_group(g, obs[g.name], restarted, infos, ids)
            for g in self.layout.groups
        }

    def _unpack_group(
        self,
        group: AgentGroup,
        part: dict[str, Any],
        restarted: Any,
        infos: dict[str, Any],
        ids: np.ndarray,
    ) -> GroupBatch:
        size = len(group.slots)
        n = len(ids) * size
        if isinstance(part["obs"], tuple) and not fits_shared_memory(group.observation_space):
            # Variable-size slots arrive as a tuple over slots of per-env batches.
            rows_obs: Any = (_padded_rows if self.padded else _rows_of_slots)(part["obs"], size)
        else:
            rows_obs = tree_map(lambda a: a.reshape(n, *a.shape[2:]), part["obs"])
        rewards = part["rewards"].reshape(n)
        terms, truncs, active = (part[f].view(np.bool_).reshape(n) for f in FIELDS[1:])
        memory = self._active[group.name]
        if np.any(restarted):
            envs = np.flatnonzero(restarted)
            was = memory[ids[envs]]
            truncs = truncs.copy()
            active = active.copy()
            truncs.reshape(-1, size)[envs] |= was
            active.reshape(-1, size)[envs] |= was
        memory[ids] = active.reshape(-1, size)
        out: dict[str, Any] = {"active": active, "_active": np.ones(n, np.bool_)}
        prefix = info_key(group.name, "")
        for key, value in infos.items():
            if not key.startswith(prefix) or key.endswith("@rows"):
                continue
            rows = infos.get(key + "@rows")
            if rows is None:
                continue
            values = np.asarray(value).reshape(n, *np.shape(value)[2:])
            mask = np.asarray(rows, dtype=np.bool_).reshape(n)
            if values.dtype == object:
                values = values.copy()
                values[~mask] = None
            name = key[len(prefix) :]
            out[name], out["_" + name] = values, mask
        if RESTART_KEY in infos and np.any(restarted):
            note = np.repeat(np.asarray(infos[RESTART_KEY]), size)
            mask = np.repeat(restarted, size) & active
            out[RESTART_KEY], out["_" + RESTART_KEY] = note, mask
        final = infos.get(FINAL_KEY)
        if final is not None:
            self._add_final(group, out, final, infos["_" + FINAL_KEY], size, n)
        return rows_obs, rewards, terms, truncs, out

    def _add_final(
        self,
        group: AgentGroup,
        out: dict[str, Any],
        final: np.ndarray,
        present: np.ndarray,
        size: int,
        n: int,
    ) -> None:
        """Same-step mode: each row active on an episode's last step, its final obs and info."""
        g = self.layout.groups.index(group)
        for e in np.flatnonzero(present):
            rows_of_env, infos_by_slot = final[e]
            rows = rows_of_env[group.name]
            ragged = not fits_shared_memory(group.observation_space)
            for s in np.flatnonzero(rows["active"]):
                obs = rows["obs"][s] if ragged else _row(rows["obs"], int(s))
                info = infos_by_slot.get((g, int(s)), {})
                add_row_info(out, {"final_obs": obs, "final_info": info}, int(e) * size + int(s), n)


class AgentVectorEnv(gym.vector.VectorEnv):  # type: ignore[type-arg]
    """Multi-agent envs of one group as a ``VectorEnv`` of ``envs x slots`` rows.

    Row ``e * S + s`` is env ``e``'s slot ``s`` (:attr:`rows`). ``infos["active"]``
    says which rows hold an agent; the rest are zeros. Everything else (timers,
    restarts, ``close``) is the manager's, at ``manager``.
    """

    def __init__(self, manager: Any, layout: AgentLayout) -> None:
        self._rows = AgentRows(manager, layout)
        (group,) = layout.groups
        self._group = group
        self.manager = manager
        self.num_parallel_envs = self._rows.num_parallel_envs
        self.slots = len(group.slots)
        self.rows: list[tuple[int, str]] = self._rows.rows[group.name]
        self.num_envs = self.num_parallel_envs * self.slots
        self.single_observation_space = group.observation_space
        self.single_action_space = group.action_space
        self.observation_space = batch_space(group.observation_space, self.num_envs)
        self.action_space = batch_space(group.action_space, self.num_envs)
        self.metadata = dict(manager.metadata)
        self.render_mode = None
        self.closed = False

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset the envs; return the observations and infos of their agent rows."""
        obs, infos = self.manager.reset(seed=seed, options=self._rows.env_mask(options, self.slots))
        rows_obs, _, _, _, rows_infos = self._one(
            obs, np.zeros(self.num_parallel_envs, np.bool_), infos
        )
        return rows_obs, rows_infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with the actions of its agent rows; return the rows' batch."""
        m = self._to_manager(actions, self.num_parallel_envs)
        obs, _, _, truncs, infos = self.manager.step(m)
        return self._one(obs, truncs, infos)

    def step_async(self, actions: Any) -> None:
        """Send the actions of the agent rows to the envs, without waiting."""
        self.manager.step_async(self._to_manager(actions, self.num_parallel_envs))

    def step_wait(self, timeout: float | None = None) -> Any:
        """Wait for the step ``step_async`` sent; return the rows' batch."""
        obs, _, _, truncs, infos = self.manager.step_wait(timeout)
        return self._one(obs, truncs, infos)

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Step the envs ``env_ids`` (env indices, whole workers) without waiting.

        Args:
            actions: One per agent row of those envs, in ``env_ids`` order.
            env_ids: Env indices (not rows), as :meth:`recv` returns them; ``None``: all.
        """
        count = self.num_parallel_envs if env_ids is None else len(env_ids)
        self.manager.send(self._to_manager(actions, count), env_ids)

    def recv(self, batch_size: int | None = None, timeout: float | None = None) -> Any:
        """Return the first envs to finish, over their agent rows.

        The result is ``(obs, rewards, terminations, truncations, infos, env_ids)``; ``env_ids``
        are env indices, rows follow them.
        """
        obs, _, _, truncs, infos, ids = self.manager.recv(batch_size, timeout)
        return (*self._one(obs, truncs, infos, ids), ids)

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``name`` of every env (not row): one result per env."""
        return tuple(self.manager.call(name, *args, **kwargs))

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every env (not row)."""
        return tuple(self.manager.call(name))

    def close_extras(self, **kwargs: Any) -> None:
        """Close the manager underneath."""
        self.manager.close(**kwargs)

    def __enter__(self) -> AgentVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _to_manager(self, actions: Any, envs: int) -> dict[str, Any]:
        return self._rows.actions({self._group.name: actions}, envs)

    def _one(
        self, obs: Any, truncs: np.ndarray, infos: dict[str, Any], ids: np.ndarray | None = None
    ) -> GroupBatch:
        return self._rows.unpack(obs, truncs, infos, ids)[self._group.name]

    def __repr__(self) -> str:
        return (
            f"AgentVectorEnv({self.num_parallel_envs} envs x {self.slots} slots, "
            f"group {self._group.name!r}, {self.manager!r})"
        )


class AgentGroupsVectorEnv:
    """Multi-agent envs with several groups: one batch per group, dicts keyed by group.

    Attributes:
        group_names: The groups, in order.
        single_observation_spaces: One agent's observation space, by group.
        single_action_spaces: One agent's action space, by group.
        rows: By group, ``rows[r] == (env_index, agent_name)``.
        manager: The manager underneath.
    """

    def __init__(self, manager: Any, layout: AgentLayout) -> None:
        self._rows = AgentRows(manager, layout)
        self.manager = manager
        self.num_parallel_envs = self._rows.num_parallel_envs
        self.group_names = tuple(g.name for g in layout.groups)
        self.single_observation_spaces = {g.name: g.observation_space for g in layout.groups}
        self.single_action_spaces = {g.name: g.action_space for g in layout.groups}
        self.rows = self._rows.rows
        self.num_envs = {g.name: self.num_parallel_envs * len(g.slots) for g in layout.groups}
        self.metadata = dict(manager.metadata)

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """Reset the envs; return the observations and infos of each group's rows.

        A ``reset_mask`` in ``options`` must hold one flag per env.
        """
        if options and options.get("reset_mask") is not None:
            mask = np.asarray(options["reset_mask"], dtype=np.bool_)
            if mask.shape != (self.num_parallel_envs,):
                raise ValueError(
                    f"reset_mask has shape {mask.shape}: with several groups give one per env "
                    f"({self.num_parallel_envs},)"
                )
        obs, infos = self.manager.reset(seed=seed, options=options)
        batches = self._rows.unpack(obs, np.zeros(self.num_parallel_envs, np.bool_), infos)
        return {g: b[0] for g, b in batches.items()}, {g: b[4] for g, b in batches.items()}

    def step(self, actions: dict[str, Any]) -> tuple[dict[str, Any], ...]:
        """Step every env with each group's actions; return the five results, each by group."""
        m = self._rows.actions(actions, self.num_parallel_envs)
        obs, _, _, truncs, infos = self.manager.step(m)
        batches = self._rows.unpack(obs, truncs, infos)
        return tuple({g: b[j] for g, b in batches.items()} for j in range(5))

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """``name`` of every env: one result per env."""
        return tuple(self.manager.call(name, *args, **kwargs))

    def close(self, **kwargs: Any) -> None:
        """Close the manager and its workers."""
        self.manager.close(**kwargs)

    @property
    def closed(self) -> bool:
        """Whether the manager is closed."""
        return bool(self.manager.closed)

    def __enter__(self) -> AgentGroupsVectorEnv:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AgentGroupsVectorEnv(groups {self.group_names}, {self.manager!r})"


def _row(tree: Any, s: int) -> Any:
    """Slot ``s`` of a tree of ``[S, ...]`` arrays."""
    if isinstance(tree, dict):
        return {k: _row(v, s) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_row(v, s) for v in tree)
    return tree[s]


def _padded_rows(per_slot: tuple[Any, ...], size: int) -> tuple[Any, ...]:
    """One padded batch over rows ``e * S + s`` from each slot's padded arrays over envs.

    A slot's value is a tuple of arrays (``(data, lengths)`` for a Sequence, five for a
    Graph) with the envs on axis 0 and the capacity, which differs between slots, on axis
    1; the rows' arrays take the largest capacity, zero-padded.
    """
    parts: list[Any] = []
    for arrays in zip(*per_slot, strict=True):
        first = arrays[0]
        if first is None:  # a Graph without edge features
            parts.append(None)
            continue
        if first.ndim == 1:  # lengths or counts: one per env
            out = np.stack(arrays, axis=1)
        else:
            cap = max(a.shape[1] for a in arrays)
            out = np.zeros((len(first), size, cap, *first.shape[2:]), first.dtype)
            for s, a in enumerate(arrays):
                out[:, s, : a.shape[1]] = a
        parts.append(out.reshape(-1, *out.shape[2:]))
    return tuple(parts)


def _rows_of_slots(per_slot: tuple[Any, ...], size: int) -> tuple[Any, ...]:
    """Row ``e * S + s`` of a tuple over slots of per-env batches (Gymnasium's form)."""
    envs = len(per_slot[0]) if size else 0
    return tuple(per_slot[s][e] for e in range(envs) for s in range(size))
