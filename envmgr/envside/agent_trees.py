"""Per-slot values of the packed agent batch: trees of arrays, variable-size slots, infos.

:class:`~envmgr.envside.agent_rows.ParallelEnvRows` keeps, per group, arrays of
``[envs, slots, ...]`` (or :class:`SlotValues` for a ``Sequence``/``Graph`` observation)
and writes one agent's value into one slot of one env with these helpers; per-agent infos
become the vector info keys of :func:`~envmgr.envside.agent_layout.info_key`.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array

from envmgr.envside.agent_layout import AgentSpaceError
from envmgr.protocol.info_columns import column_kind
from envmgr.protocol.shared_memory import fits_shared_memory

__all__ = [
    "SlotValues",
    "add_agent_value",
    "add_env_value",
    "copy_row",
    "empty_value",
    "put_tree",
    "take_slot",
    "zero_row",
]


def take_slot(batch: Any, k: int, s: int) -> Any:
    """Slot ``s`` of env ``k`` in a tree of ``[envs, slots, ...]`` arrays."""
    if isinstance(batch, dict):
        return {key: take_slot(v, k, s) for key, v in batch.items()}
    if isinstance(batch, tuple):
        return tuple(take_slot(v, k, s) for v in batch)
    return batch[k, s]


class SlotValues:
    """A variable-size observation (``Sequence``, ``Graph``) per slot and env, kept as values.

    The manager's ragged store lays them out in shared memory.

    Args:
        space: One agent's observation space.
        slots: Slots per env.
        envs: Envs.
    """

    def __init__(self, space: gym.Space[Any], slots: int, envs: int) -> None:
        self.empty = empty_value(space)
        self.values = [[self.empty] * envs for _ in range(slots)]

    def zero(self, k: int) -> None:
        """Env ``k``'s slots hold no agent: empty values."""
        for per_env in self.values:
            per_env[k] = self.empty

    def row(self, k: int) -> tuple[Any, ...]:
        """Env ``k``'s value per slot."""
        return tuple(per_env[k] for per_env in self.values)

    def batch(self) -> tuple[tuple[Any, ...], ...]:
        """Gymnasium's batch form of ``batch_space(space, slots)`` over the envs."""
        return tuple(tuple(per_env) for per_env in self.values)


def empty_value(space: gym.Space[Any]) -> Any:
    """What an empty slot observes: no elements for a Sequence or Graph, zeros otherwise."""
    spaces = gym.spaces
    if isinstance(space, spaces.Sequence):
        feature = space.feature_space
        if space.stack and fits_shared_memory(feature):
            return create_empty_array(feature, 0, np.zeros)
        return ()
    if isinstance(space, spaces.Graph):
        node: Any = space.node_space
        edge: Any = space.edge_space
        return spaces.GraphInstance(
            np.zeros((0, *node.shape), node.dtype),
            None if edge is None else np.zeros((0, *edge.shape), edge.dtype),
            np.zeros((0, 2), np.int64),
        )
    if isinstance(space, spaces.Dict):
        return {k: empty_value(v) for k, v in space.spaces.items()}
    if isinstance(space, spaces.Tuple):
        return tuple(empty_value(v) for v in space.spaces)
    empty: Any = create_empty_array(space, 1, np.zeros)
    return empty[0]


def copy_row(leaf: Any, k: int) -> Any:
    """A copy of env ``k``'s slots in a tree of arrays or :class:`SlotValues`."""
    if isinstance(leaf, SlotValues):
        return leaf.row(k)
    if isinstance(leaf, dict):
        return {key: copy_row(v, k) for key, v in leaf.items()}
    if isinstance(leaf, tuple):
        return tuple(copy_row(v, k) for v in leaf)
    return leaf[k].copy()


def zero_row(leaf: Any, k: int) -> None:
    """Env ``k``'s slots hold no agent: zeros, or empty variable-size values."""
    if isinstance(leaf, SlotValues):
        leaf.zero(k)
    elif isinstance(leaf, dict):
        for v in leaf.values():
            zero_row(v, k)
    elif isinstance(leaf, tuple):
        for v in leaf:
            zero_row(v, k)
    else:
        leaf[k] = 0


def put_tree(leaf: Any, k: int, s: int, value: Any, where: str) -> None:
    """Write one agent's Dict/Tuple ``value`` into slot ``s`` of env ``k`` (``where``: errors)."""
    if isinstance(leaf, dict):
        if not isinstance(value, dict) or set(value) != set(leaf):
            raise AgentSpaceError(
                f"{where}: expected a dict with keys {sorted(leaf)}, got {value!r}"
            )
        for key, sub in leaf.items():
            put_tree(sub, k, s, value[key], f"{where}[{key!r}]")
    elif isinstance(leaf, tuple):
        if not isinstance(value, tuple) or len(value) != len(leaf):
            raise AgentSpaceError(f"{where}: expected a tuple of {len(leaf)}, got {value!r}")
        for j, sub in enumerate(leaf):
            put_tree(sub, k, s, value[j], f"{where}[{j}]")
    else:
        expected = leaf.shape[2:]
        if np.shape(value) != expected:
            raise AgentSpaceError(f"{where}: shape {np.shape(value)}, expected {expected}")
        leaf[k, s] = value


def add_agent_value(
    infos: dict[str, Any], key: str, k: int, s: int, n: int, size: int, value: Any
) -> None:
    """Put one agent's info value at (env ``k``, slot ``s``), as ``_add_info`` would per row."""
    rows_key = key + "@rows"
    array = infos.get(key)
    if array is None:
        kind = column_kind(value)
        if kind is None:
            array = np.full((n, size), None, dtype=object)
        else:
            array = np.zeros((n, size, *kind[1]), dtype=kind[0])
        infos[key], infos["_" + key] = array, np.zeros(n, np.bool_)
        infos[rows_key] = np.zeros((n, size), np.bool_)
    array[k, s] = value
    infos["_" + key][k] = True
    infos[rows_key][k, s] = True


def add_env_value(infos: dict[str, Any], key: str, k: int, n: int, value: Any) -> None:
    """Put one env's object ``value`` under ``key`` (with its ``_key`` mask), Gymnasium's way."""
    if key not in infos:
        infos[key], infos["_" + key] = np.full(n, None, dtype=object), np.zeros(n, np.bool_)
    infos[key][k] = value
    infos["_" + key][k] = True
