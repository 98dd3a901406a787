"""Actions of a space with ``Sequence``/``Graph`` parts, through each group's store.

An action space with a variable-size part (one choice per entity) has no fixed batch
shape, but each part has a fixed element, as for observations. So each group gets a
:class:`~envmgr.protocol.ragged.RaggedStore` of the action space, written by the parent and
read by the group (the other direction from the observations' stores)::

    parent (ActionStores.place)                    group (envside.serve.serve_step)
    ---------------------------                    --------------------------------
    each env's action -> its group's store         read_store(store): Gymnasium's batch form,
      a row over capacity: the store is re-laid     fresh arrays, as SyncVectorEnv's envs
      larger at once (a new segment, a new          get them
      version) and written there
    store.attached?  yes: the doorbell alone
                     no:  Step(actions_layout=...) --> the group maps that store first, and
                                                       writes its version in the header word

The parent owns these stores, so a grow needs no round trip: the next step's message
carries the new layout, and until the group's header word says it maps a store, every
step tells it again (a message lost on the way costs nothing). A private store (the
caller group's, a Ray actor's, which travels in the step's message) grows in place.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.protocol.ragged import RaggedStore, row_of
from envmgr.protocol.ragged_layout import ACTIONS_ROOT, RaggedLayout, grown
from envmgr.protocol.segments import SEGMENT_PREFIX
from envmgr.protocol.trees import take_rows

__all__ = ["ActionStores"]


class ActionStores:
    """The groups' stores of one action space, in group order (see the module docstring).

    Args:
        space: The single-env action space.
        capacities: The starting capacity of each slot (``capacity=`` hints under ``actions``).
    """

    def __init__(self, space: gym.Space[Any], capacities: tuple[int, ...]) -> None:
        self.space = space
        self.capacities = capacities
        self.stores: list[RaggedStore] = []
        self._firsts: list[int] = []

    def add(self, sizes: Sequence[int], shared: bool) -> None:
        """Give each group of ``sizes`` (after those already added) its store.

        ``shared``: in a new segment each (a worker's), else in this process's memory.
        """
        for n in sizes:
            first = self._firsts[-1] + self.stores[-1].layout.rows if self.stores else 0
            layout = RaggedLayout("", 1, self.space, n, self.capacities, ACTIONS_ROOT)
            store = (
                RaggedStore.create(layout, SEGMENT_PREFIX)
                if shared
                else RaggedStore.private(self.space, n, self.capacities, True, ACTIONS_ROOT)
            )
            self.stores.append(store)
            self._firsts.append(first)

    def place(self, actions: Any, groups: Sequence[int], ids: np.ndarray | None) -> None:
        """Write each group's rows of a batch of actions (Gymnasium's form) into its store.

        Every group's rows are written before this returns, so a bad action leaves no group
        told to step. A shared store too small is re-laid larger first (see the module
        docstring).

        Args:
            actions: The batch.
            groups: The groups stepped.
            ids: The global env of each row of ``actions`` (``None``: the whole batch).

        Raises:
            ValueError: An action of the wrong structure, shape or dtype, naming the env and
                the path in the space (``actions['targets']``).
        """
        space = self.space
        for g in groups:
            store, first = self.stores[g], self._firsts[g]
            n = store.layout.rows
            rows: Any
            if ids is None:
                rows = slice(first, first + n)
            else:
                mine = np.flatnonzero((ids >= first) & (ids < first + n))
                rows = mine[np.argsort(ids[mine])]
            share = take_rows(space, actions, rows)
            values = [row_of(space, share, i) for i in range(n)]
            if not store.write_rows(values, first):
                store = self._relay(g, store.wants)
                store.write_rows(values, first)

    def _relay(self, g: int, wants: list[int]) -> RaggedStore:
        """A larger store for group ``g`` in a new segment; the old one is freed at once.

        The group's mapping of the old one stays valid (only its name is unlinked) until it
        maps the new one, which it does before it next reads.
        """
        old = self.stores[g]
        caps = tuple(
            grown(c, w) if w > c else c for c, w in zip(old.layout.capacities, wants, strict=True)
        )
        self.stores[g] = store = RaggedStore.create(
            old.layout.with_capacities(caps), SEGMENT_PREFIX
        )
        old.close()
        return store

    def layout(self, g: int) -> RaggedLayout | None:
        """The layout group ``g`` maps (``None``: its store is private, handed over whole)."""
        if g >= len(self.stores):
            return None
        layout = self.stores[g].layout
        return layout if layout.name else None

    def unmapped(self, groups: Sequence[int]) -> list[int]:
        """The groups of ``groups`` with a shared store they have not mapped yet."""
        stores = self.stores
        return [g for g in groups if stores[g].layout.name and not stores[g].attached]

    def close(self) -> None:
        """Free every store (idempotent)."""
        stores, self.stores, self._firsts = self.stores, [], []
        for store in stores:
            store.close()
