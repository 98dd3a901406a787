"""One shared-memory segment per manager holding every fixed-shape batch array.

The parent allocates the segment; each worker attaches by name and writes its
own slice of the observation, reward and done arrays in place, and reads its
slice of the action arrays. Nothing of this crosses a pipe per step.

Which spaces fit: Box, Discrete, MultiDiscrete, MultiBinary, and Dict/Tuple
nests of those. An observation space with ``Sequence``/``Graph`` parts of fixed
elements lives in one :class:`~envmgr.protocol.ragged.RaggedStore` per group
(:attr:`SharedBuffers.ragged`: padded rows plus lengths, at a capacity that grows).
Anything else (Text, OneOf, custom spaces) has no fixed shape, so its observations
or actions travel pickled inside the step messages instead; the manager picks this
per space, automatically.

The batch layout is derived from gymnasium's own ``create_empty_array`` so the
arrays a user receives have exactly the structure ``SyncVectorEnv`` returns.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from multiprocessing import shared_memory
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array

from envmgr.protocol.action_stores import ActionStores
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.ragged import RaggedStore
from envmgr.protocol.ragged_layout import (
    ACTIONS_ROOT,
    RaggedLayout,
    RaggedOptions,
    capacities_for,
    fits_ragged,
    slot_names,
)
from envmgr.protocol.segments import SEGMENT_PREFIX, open_segment
from envmgr.protocol.trees import tree_map

__all__ = [
    "fits_shared_memory",
    "SharedLayout",
    "SharedBuffers",
    "tree_map",
    "SEGMENT_PREFIX",
    "open_segment",
]

_ALIGN = 64  # a cache line: workers writing neighbouring arrays never share one
_FIXED = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)


def fits_shared_memory(space: gym.Space[Any]) -> bool:
    """Whether batches of ``space`` have a fixed shape and dtype (can live in shared memory)."""
    if isinstance(space, _FIXED):
        return True
    if isinstance(space, gym.spaces.Dict):
        return all(fits_shared_memory(s) for s in space.spaces.values())
    if isinstance(space, gym.spaces.Tuple):
        return all(fits_shared_memory(s) for s in space.spaces)
    return False


def _leaves(tree: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    tree_map(out.append, tree)
    return out


@dataclass(frozen=True)
class SharedLayout:
    """What a process needs to attach to a manager's segment and rebuild its views.

    Attributes:
        name: The segment's name.
        observation_space: Single-env observation space.
        action_space: Single-env action space.
        num_envs: Number of envs in the batch.
        n_workers: Number of workers (one control row each, see
            :mod:`envmgr.backends.local.doorbell`).
        info_row_bytes: Bytes of info columns per env (:mod:`envmgr.protocol.info_columns`).
    """

    name: str
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    num_envs: int
    n_workers: int = 1
    info_row_bytes: int = ROW_BYTES

    @property
    def shared_observations(self) -> bool:
        """Observations live in the segment (else they travel pickled)."""
        return fits_shared_memory(self.observation_space)

    @property
    def shared_actions(self) -> bool:
        """Actions live in the segment (else they travel pickled)."""
        return fits_shared_memory(self.action_space)

    def templates(self) -> dict[str, Any]:
        """Unbacked arrays with the shape and dtype of every region, in segment order."""
        n = self.num_envs
        # One 64-byte row per worker plus one for the parent: the words each side
        # polls never share a cache line with another process's writes.
        regions: dict[str, Any] = {"control": np.empty((self.n_workers + 1, 8), dtype=np.int64)}
        if self.shared_observations:
            regions["observations"] = create_empty_array(self.observation_space, n, fn=np.empty)
        if self.shared_actions:
            regions["actions"] = create_empty_array(self.action_space, n, fn=np.empty)
        regions["rewards"] = np.empty(n, dtype=np.float64)
        regions["terminations"] = np.empty(n, dtype=np.bool_)
        regions["truncations"] = np.empty(n, dtype=np.bool_)
        # Cumulative env.step seconds per env, so per-env timing costs no tree nodes.
        regions["env_seconds"] = np.empty(n, dtype=np.float64)
        regions["env_steps"] = np.empty(n, dtype=np.int64)
        # Numeric info values, one row per env (envmgr.protocol.info_columns).
        regions["info_arena"] = np.empty((n, self.info_row_bytes), dtype=np.uint8)
        return regions

    def size(self) -> int:
        """Bytes the segment needs, with every array aligned to a cache line."""
        offset = 0
        for leaf in _leaves(self.templates()):
            offset = _aligned(offset) + leaf.nbytes
        return max(_aligned(offset), _ALIGN)


def _aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


class SharedBuffers:
    """Numpy views over one manager segment.

    Attributes:
        layout: The layout the views follow.
        observations: Batched observations (dict/tuple nest of arrays), or ``None``
            when the observation space cannot live in shared memory.
        actions: Batched actions, or ``None`` likewise.
        rewards: ``float64[num_envs]``.
        terminations: ``bool[num_envs]``.
        truncations: ``bool[num_envs]``.
        env_seconds: ``float64[num_envs]``, cumulative seconds inside ``env.step`` per env.
        env_steps: ``int64[num_envs]``, cumulative ``env.step`` calls per env.
        info_arena: ``uint8[num_envs, ROW_BYTES]``, the info columns
            (:mod:`envmgr.protocol.info_columns`).
        control: ``int64[n_workers + 1, 8]``, the hand-off words of
            :mod:`envmgr.backends.local.doorbell`.
    """

    observations: Any
    actions: Any
    rewards: np.ndarray
    terminations: np.ndarray
    truncations: np.ndarray
    env_seconds: np.ndarray
    env_steps: np.ndarray
    info_arena: np.ndarray
    control: np.ndarray

    def __init__(
        self, layout: SharedLayout, shm: shared_memory.SharedMemory | None, owner: bool
    ) -> None:
        self.layout = layout
        self._shm: shared_memory.SharedMemory | None = shm
        self._owner = owner
        # Views take their buffer from the mmap itself, not from ``shm.buf``: a
        # view made from the memoryview does not stop ``shm.close()`` unmapping
        # the memory under it (a later read would crash), whereas an export of
        # the mmap makes close() refuse while any view is alive.
        buf: Any
        if shm is None:  # private memory: the same arrays for a backend without shared memory
            buf = bytearray(layout.size())
        else:
            buf = getattr(shm, "_mmap", None) or shm.buf
        offset = 0

        def place(template: np.ndarray) -> np.ndarray:
            nonlocal offset
            offset = _aligned(offset)
            view = np.ndarray(template.shape, template.dtype, buffer=buf, offset=offset)
            offset += template.nbytes
            return view

        regions = {k: tree_map(place, v) for k, v in layout.templates().items()}
        self.control = regions["control"]
        self.observations = regions.get("observations")
        self.actions = regions.get("actions")
        self.rewards = regions["rewards"]
        self.terminations = regions["terminations"]
        self.truncations = regions["truncations"]
        self.env_seconds = regions["env_seconds"]
        self.env_steps = regions["env_steps"]
        self.info_arena = regions["info_arena"]
        if owner:
            for leaf in _leaves(regions):
                leaf.fill(0)
        #: One store per group for an observation space with Sequence/Graph parts
        #: (``None`` for a group this process does not read that way), else ``None``.
        self.ragged: list[RaggedStore | None] | None = None
        #: Re-laid stores whose writer has not moved to them yet, by group.
        self.pending: dict[int, RaggedStore] = {}
        #: The whole blocks the groups' stores are parts of (``ragged="padded"``), by name.
        self._blocks: dict[str, RaggedStore] = {}
        #: The groups' stores of an action space with Sequence/Graph parts, else ``None``.
        self.action_stores: ActionStores | None = None

    def add_ragged(
        self,
        sizes: Sequence[int],
        options: RaggedOptions | None,
        shared: bool,
    ) -> None:
        """Give each group of ``sizes`` its store of the observation space, and of the actions.

        Groups are taken in order, after those already added, when the space has Sequence/Graph
        parts: in new segments (``shared``, workers'), else private and growing in place. Shared
        stores under ``ragged="padded"`` are the parts of one block, so that a batch of them is
        one array per leaf (views under ``copy=False``).
        """
        if options is not None and options.mode == "pickled":
            return
        obs, acts = self.layout.observation_space, self.layout.action_space
        known = [*slot_names(obs), *slot_names(acts, ACTIONS_ROOT)]
        hint = None if options is None else options.capacity
        if fits_ragged(acts):
            if self.action_stores is None:
                caps = capacities_for(acts, hint, ACTIONS_ROOT, known)
                self.action_stores = ActionStores(acts, caps)
            self.action_stores.add(sizes, shared)
        if not fits_ragged(obs):
            if hint is not None and not isinstance(hint, int):
                capacities_for(obs, hint, "", known)  # a key naming no part is refused
            return
        caps = capacities_for(obs, hint, "", known)
        if self.ragged is None:
            self.ragged = []
        if shared and options is not None and options.mode == "padded":
            whole = RaggedStore.create(
                RaggedLayout("", 1, obs, sum(sizes), caps, writers=len(sizes)), SEGMENT_PREFIX
            )
            self._blocks[whole.block] = whole
            first, base = 0, len(self.ragged)
            for k, n in enumerate(sizes):
                self.ragged.append(whole.part(first, n, base + k))
                first += n
            return
        for n in sizes:
            if shared:
                self.ragged.append(
                    RaggedStore.create(RaggedLayout("", 1, obs, n, caps), SEGMENT_PREFIX)
                )
            else:
                self.ragged.append(RaggedStore.private(obs, n, caps))

    def relay(self, grows: Mapping[int, tuple[int, ...]]) -> dict[int, RaggedLayout]:
        """Lay larger stores for the groups of ``grows`` (at those capacities) in new segments.

        A group whose store is part of a block moves with every group of that block, to a new
        block at the largest capacities. Returns the layout each group's writer is to map; the
        stores are pending until it does (:meth:`settle`).
        """
        assert self.ragged is not None
        out: dict[int, RaggedLayout] = {}
        blocks: dict[str, tuple[int, ...]] = {}
        for g, caps in grows.items():
            current = self.ragged[g]
            assert current is not None
            if current.layout.block_rows:
                before = blocks.get(current.block, current.layout.capacities)
                blocks[current.block] = tuple(map(max, before, caps))
                continue
            self._unpend(g)
            store = RaggedStore.create(current.layout.with_capacities(caps), SEGMENT_PREFIX)
            self.pending[g] = store
            out[g] = store.layout
        for name, caps in blocks.items():
            old = self._blocks[name]
            whole = RaggedStore.create(old.layout.with_capacities(caps), SEGMENT_PREFIX)
            self._blocks[whole.block] = whole
            for g, member in enumerate(self.ragged):
                if member is not None and member.block == name:
                    self._unpend(g)
                    at = member.layout
                    part = whole.part(at.first, at.rows, at.writer)
                    self.pending[g] = part
                    out[g] = part.layout
        self._free_blocks()
        return out

    def _unpend(self, g: int) -> None:
        old = self.pending.pop(g, None)
        if old is not None:
            old.close()

    def settle(self) -> None:
        """Read each group from the store its writer maps.

        A pending store it has attached to (its header says so) replaces the old one, which is
        freed (a block, once no group is left in it).
        """
        assert self.ragged is not None
        for g, store in list(self.pending.items()):
            if store.attached:
                del self.pending[g]
                old, self.ragged[g] = self.ragged[g], store
                if old is not None:
                    old.close()
        if self._blocks:
            self._free_blocks()

    def _free_blocks(self) -> None:
        """Close the blocks no group's store (current or pending) is a part of."""
        used = {s.block for s in [*(self.ragged or ()), *self.pending.values()] if s is not None}
        for name in [n for n in self._blocks if n not in used]:
            self._blocks.pop(name).close()

    def ragged_layout(self, g: int) -> RaggedLayout | None:
        """The layout group ``g``'s writer is to map: the newest (a pending replacement's)."""
        if self.ragged is None:
            return None
        self.settle()
        store = self.pending[g] if g in self.pending else self.ragged[g]
        return None if store is None else store.layout

    @classmethod
    def create(
        cls,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        num_envs: int,
        n_workers: int = 1,
        info_row_bytes: int = ROW_BYTES,
    ) -> SharedBuffers:
        """Allocate a new segment (parent side); the caller must :meth:`close` it."""
        spaces = (observation_space, action_space, num_envs, n_workers, info_row_bytes)
        draft = SharedLayout("", *spaces)
        name = f"{SEGMENT_PREFIX}{secrets.token_hex(6)}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=draft.size())
        layout = SharedLayout(shm.name, *spaces)
        return cls(layout, shm, owner=True)

    @classmethod
    def private(
        cls,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        num_envs: int,
        n_workers: int = 1,
        info_row_bytes: int = ROW_BYTES,
    ) -> SharedBuffers:
        """The same arrays in this process's own memory (a Ray driver or actor)."""
        layout = SharedLayout(
            "", observation_space, action_space, num_envs, n_workers, info_row_bytes
        )
        return cls(layout, None, True)

    @classmethod
    def attach(cls, layout: SharedLayout) -> SharedBuffers:
        """Map an existing segment (worker side)."""
        return cls(layout, open_segment(layout.name), owner=False)

    @property
    def name(self) -> str:
        """The segment's name."""
        return self.layout.name

    def slice(self, start: int, stop: int) -> dict[str, Any]:
        """Views of envs ``start:stop`` of every region (what one worker writes)."""
        sl = slice(start, stop)
        out: dict[str, Any] = {
            "rewards": self.rewards[sl],
            "terminations": self.terminations[sl],
            "truncations": self.truncations[sl],
            "env_seconds": self.env_seconds[sl],
            "env_steps": self.env_steps[sl],
            "info_arena": self.info_arena[sl],
        }
        out["observations"] = (
            None if self.observations is None else tree_map(lambda a: a[sl], self.observations)
        )
        out["actions"] = None if self.actions is None else tree_map(lambda a: a[sl], self.actions)
        return out

    def close(self) -> None:
        """Unmap the segment here and, in the process that created it, unlink its name.

        Idempotent. Views handed out earlier must not be used afterwards.
        """
        stores = [*(self.ragged or ()), *self.pending.values(), *self._blocks.values()]
        self.ragged, self.pending = None if self.ragged is None else [], {}
        self._blocks = {}
        for store in stores:
            if store is not None:
                store.close()
        if self.action_stores is not None:
            self.action_stores.close()
        shm, self._shm = self._shm, None
        if shm is None:
            return
        self.observations = self.actions = None
        self.rewards = self.terminations = self.truncations = np.empty(0)
        self.env_seconds = self.env_steps = self.control = self.info_arena = np.empty(0)
        if self._owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        # numpy keeps a reference to the mmap, not a buffer export, so
        # ``shm.close()`` would unmap memory that a zero-copy view still points
        # at. Take the mmap out of the SharedMemory object instead: it is
        # unmapped when the last array using it is garbage collected (at once,
        # when nobody holds a view). close() then only releases the descriptor.
        if getattr(shm, "_mmap", None) is not None:
            shm._mmap = None  # type: ignore[attr-defined]
        shm.close()
