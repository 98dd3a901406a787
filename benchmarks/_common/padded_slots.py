"""The serial packer's store for variable-size agent observations: padded arrays + lengths.

:class:`benchmarks._common.agent_peers.SerialRows` writes each agent's observation into
its ``[env, slot]`` place. For a ``Sequence(Box(shape), stack=True)`` observation (a list
of entities whose length changes every step) that place is a padded block::

    slots[k, s] = obs        obs: (m, *shape)  ->  data[k, s, :m] = obs, lengths[k, s] = m
    slots[k] = 0             env k's slots emptied (zeros, length 0)
    slots.batch()            (data (envs * slots, capacity, *shape), lengths (envs * slots,))

An observation longer than the capacity grows it (to the next power of two), for that
step and every later one; nothing is dropped.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

__all__ = ["PaddedSlots"]


class PaddedSlots:
    """``Sequence(Box)`` observations of ``n`` envs x ``slots`` agents, padded to a capacity.

    Args:
        space: One agent's observation space, a ``Sequence`` of a ``Box``.
        n: Envs.
        slots: Agent slots per env.
        capacity: Elements per observation to start with.
    """

    def __init__(self, space: spaces.Sequence, n: int, slots: int, capacity: int = 16) -> None:
        element = space.feature_space
        if not isinstance(element, spaces.Box):
            raise TypeError(f"PaddedSlots packs Sequence(Box) observations, got {space}")
        self.data = np.zeros((n, slots, capacity, *element.shape), element.dtype)
        self.lengths = np.zeros((n, slots), np.int64)

    def __setitem__(self, key: int | tuple[int, int], obs: Any) -> None:
        if not isinstance(key, tuple):  # ``slots[k] = 0``: SerialRows clearing env k
            self.data[key] = 0
            self.lengths[key] = 0
            return
        m = len(obs)
        if m > self.data.shape[2]:
            self._grow(m)
        self.data[key][:m] = obs
        self.lengths[key] = m

    def _grow(self, m: int) -> None:
        capacity = 1 << (m - 1).bit_length()
        n, slots, old = self.data.shape[:3]
        grown = np.zeros((n, slots, capacity, *self.data.shape[3:]), self.data.dtype)
        grown[:, :, :old] = self.data
        self.data = grown

    def batch(self) -> tuple[np.ndarray, np.ndarray]:
        """``(data, lengths)`` with one row per agent slot, env-major (views, not copies)."""
        n, slots = self.lengths.shape
        return self.data.reshape(n * slots, *self.data.shape[2:]), self.lengths.reshape(n * slots)
