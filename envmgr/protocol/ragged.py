"""Variable-size values (``Sequence``, ``Graph``) as padded arrays plus lengths.

A space with a ``Sequence`` or ``Graph`` part has no fixed batch shape, but each
part has a fixed *element*: a ``Sequence(Box((16,)))`` row is ``L`` elements of
shape ``(16,)``. So every group of envs gets a :class:`RaggedStore`: one block of
memory holding, for each leaf of the space, its rows at a *capacity*::

    leaf                      arrays (one row per env of the group)
    Box / Discrete / ...      values[rows, *shape]                     (fixed parts)
    Sequence(Box(shape))      data[rows, capacity, *shape], lengths[rows]
    Graph(Box(n), Box(e))     nodes[rows, cap_nodes, *n], counts[rows, 3] (nodes, edges
                              (-1: none), the links' integer type), edges[rows,
                              cap_edges, *e], links[rows, cap_edges, 2] (int64)

Data flow::

    env side                             parent
    --------                             ------
    store.write_rows(obs per env)  --->  read_stores(parts) -> SyncVectorEnv's batch form
      a row over capacity: not written,                        (tuples of arrays,
      ``spill`` keeps it and the length                         GraphInstances), or
      it wanted ---- pickled in the answer ->  its rows' value  ``(data, lengths)``
                                               taken from there; the parent then
                                               lays a larger store (new *version*)

A store in shared memory (a worker's) has a fixed capacity: what does not fit travels
pickled that once and the parent re-lays the group's store larger
(:class:`~envmgr.protocol.ragged_layout.RaggedLayout`, which also says where each
array lies, carries the version; the group puts the version it attached
with in its header word, so the parent knows when the group has moved, even
if the answer saying so was lost). A private store (a Ray actor's, the caller
group's) grows in place and never spills.

Under ``ragged="padded"`` the workers' stores are *parts* of one block (one segment,
one capacity per slot, a header word per group): each worker writes its rows of the
same arrays, so the batch is those arrays (views, under ``copy=False``). One worker's
overflow re-lays the whole block, and every worker moves to it.

The parent reads the stores back with :mod:`envmgr.protocol.ragged_read`. The same store
carries actions the other way (:mod:`envmgr.protocol.action_stores`):
the parent writes, the group reads (:func:`~envmgr.protocol.ragged_read.read_store`).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from multiprocessing import shared_memory
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import GraphInstance

from envmgr.protocol.ragged_layout import (
    ALIGN,
    LINK_TYPES,
    LeafPath,
    RaggedLayout,
    aligned,
    grown,
    shape_dtype,
    where_of,
)
from envmgr.protocol.segments import open_segment

__all__ = [
    "RaggedSpill",
    "RaggedStore",
    "StoreLeaf",
    "row_of",
]


@dataclass(frozen=True)
class RaggedSpill:
    """What a group's rows could not hold: its answer carries it pickled.

    Attributes:
        rows: ``(local row, observation)`` of every env whose value did not fit.
        wants: Each slot's length needed (``0``: it fitted), in slot order.
    """

    rows: tuple[tuple[int, Any], ...]
    wants: tuple[int, ...]


class StoreLeaf:
    """One leaf's arrays in a store, and how a row is written and read."""

    __slots__ = (
        "path", "space", "arrays", "slots", "shape", "dtype", "edge_shape", "edge_dtype", "where"
    )  # fmt: skip

    def __init__(
        self,
        path: LeafPath,
        space: gym.Space[Any],
        arrays: dict[str, np.ndarray],
        root: str = "observations",
    ) -> None:
        self.path, self.space, self.arrays = path, space, arrays
        self.where = where_of(path, root)
        self.edge_shape: tuple[int, ...] = ()
        self.edge_dtype: np.dtype[Any] = np.dtype(np.int64)
        if isinstance(space, gym.spaces.Sequence):
            self.shape, self.dtype = shape_dtype(space.feature_space)
            self.slots = 1
        elif isinstance(space, gym.spaces.Graph):
            self.shape, self.dtype = shape_dtype(space.node_space)
            if space.edge_space is not None:
                self.edge_shape, self.edge_dtype = shape_dtype(space.edge_space)
            self.slots = 2
        else:
            self.shape, self.dtype = shape_dtype(space)
            self.slots = 0

    def elements(self, value: Any, shape: tuple[int, ...], dtype: np.dtype[Any], what: str) -> Any:
        """``value`` as ``(L, *shape)`` elements of ``dtype``, or a ValueError naming it."""
        a = value if type(value) is np.ndarray else np.asarray(value)
        if a.size == 0 and a.ndim <= 1:
            a = np.empty((0, *shape), dtype)  # an empty tuple of elements: no dtype of its own
        if a.ndim != len(shape) + 1 or a.shape[1:] != shape:
            raise ValueError(
                f"{self.where}{what} has shape {a.shape}, expected (length, *{shape}) "
                f"for {self.space}"
            )
        if a.dtype != dtype and not np.can_cast(a.dtype, dtype, "same_kind"):
            raise ValueError(
                f"{self.where}{what} has dtype {a.dtype}, which {self.space} "
                f"(dtype {dtype}) cannot hold unchanged"
            )
        return a

    def write(self, i: int, value: Any, wants: list[int], slot: int) -> bool:
        """Write row ``i``; ``False`` (nothing written, ``wants`` raised) if over capacity."""
        arrays = self.arrays
        if self.slots == 0:
            a = np.asarray(value)
            out = arrays["values"]
            if a.shape != out.shape[1:] or not np.can_cast(a.dtype, out.dtype, "same_kind"):
                raise ValueError(
                    f"{self.where} has shape {a.shape} and dtype {a.dtype}, expected "
                    f"shape {out.shape[1:]} and dtype {out.dtype}"
                )
            out[i] = a
            return True
        if self.slots == 1:
            a = self.elements(value, self.shape, self.dtype, "")
            data = arrays["data"]
            if len(a) > data.shape[1]:
                wants[slot] = max(wants[slot], len(a))
                return False
            data[i, : len(a)] = a
            arrays["lengths"][i] = len(a)
            return True
        if not isinstance(value, GraphInstance):
            raise ValueError(f"{self.where} is a {type(value).__name__}, not a GraphInstance")
        nodes = self.elements(value.nodes, self.shape, self.dtype, ".nodes")
        edges = links = None
        if value.edges is not None or value.edge_links is not None:
            if "edges" not in arrays:
                raise ValueError(f"{self.where} has edges, but {self.space} has no edge space")
            edges = self.elements(value.edges, self.edge_shape, self.edge_dtype, ".edges")
            links = self.elements(value.edge_links, (2,), np.dtype(np.int64), ".edge_links")
            if links.dtype not in LINK_TYPES:
                raise ValueError(
                    f"{self.where}.edge_links has dtype {links.dtype}, expected integers"
                )
            if len(links) != len(edges):
                raise ValueError(f"{self.where} has {len(edges)} edges but {len(links)} edge_links")
        fits = True
        if len(nodes) > arrays["nodes"].shape[1]:
            wants[slot] = max(wants[slot], len(nodes))
            fits = False
        if edges is not None and len(edges) > arrays["edges"].shape[1]:
            wants[slot + 1] = max(wants[slot + 1], len(edges))
            fits = False
        if not fits:
            return False
        arrays["nodes"][i, : len(nodes)] = nodes
        counts = arrays["counts"][i]
        counts[0] = len(nodes)
        counts[1] = -1 if edges is None else len(edges)
        if edges is not None and links is not None:
            counts[2] = LINK_TYPES.index(links.dtype)
            arrays["edges"][i, : len(edges)] = edges
            arrays["links"][i, : len(edges)] = links
        return True

    def items(self, rows: range) -> Any:
        """Rows ``rows`` in Gymnasium's batch form: an array, or a tuple of items."""
        arrays = self.arrays
        if self.slots == 0:
            return arrays["values"][rows.start : rows.stop].copy()
        if self.slots == 1:
            data, lengths = arrays["data"], arrays["lengths"]
            if self.space.stack:  # type: ignore[attr-defined]
                return tuple(data[i, : lengths[i]].copy() for i in rows)
            return tuple(tuple(data[i, j].copy() for j in range(lengths[i])) for i in rows)
        out = []
        for i in rows:
            n_nodes, n_edges, link_type = arrays["counts"][i]
            nodes = arrays["nodes"][i, :n_nodes].copy()
            if n_edges < 0:
                out.append(GraphInstance(nodes, None, None))
            else:
                edges = arrays["edges"][i, :n_edges].copy()
                links = arrays["links"][i, :n_edges].astype(LINK_TYPES[link_type])
                out.append(GraphInstance(nodes, edges, links))
        return tuple(out)


class RaggedStore:
    """One group's rows of a space with variable-size parts (see the module docstring).

    Args:
        layout: Its layout.
        shm: The segment it lives in (``None``: private memory, or ``buffer``).
        owner: This process created the segment (and unlinks it).
        growable: Grow in place instead of spilling (private memory only).
        buffer: The memory of the block this store is a part of (:meth:`part`).
    """

    def __init__(
        self,
        layout: RaggedLayout,
        shm: shared_memory.SharedMemory | None = None,
        owner: bool = True,
        growable: bool = False,
        buffer: Any = None,
    ) -> None:
        self.layout = layout
        self._shm = shm
        self._owner = owner
        self.growable = growable
        buf: Any = buffer
        if buf is None:
            buf = bytearray(layout.size()) if shm is None else _memory(shm)
        self._buffer = buf
        self.header = np.ndarray((layout.header_bytes() // 8,), np.int64, buffer=buf, offset=0)
        offset = layout.header_bytes()
        rows = slice(layout.first, layout.first + layout.rows)
        self.leaves: list[StoreLeaf] = []
        #: Each leaf's arrays over the whole block (the store's own, when it is no part).
        self.block_arrays: list[dict[str, np.ndarray]] = []
        for path, space, templates in layout.templates():
            whole = {}
            for key, (shape, dtype) in templates.items():
                offset = aligned(offset)
                whole[key] = np.ndarray(shape, dtype, buffer=buf, offset=offset)
                offset += whole[key].nbytes
            self.block_arrays.append(whole)
            arrays = whole if not layout.block_rows else {k: a[rows] for k, a in whole.items()}
            self.leaves.append(StoreLeaf(path, space, arrays, layout.root))
        self._first_slot = np.cumsum([0] + [leaf.slots for leaf in self.leaves]).tolist()
        self.spilled: list[tuple[int, Any]] = []
        self.wants = [0] * len(layout.capacities)
        #: The row whose value :meth:`write_rows` refused last.
        self.failed_row: int | None = None

    # ------------------------------------------------------------------ making

    @classmethod
    def create(cls, layout: RaggedLayout, prefix: str) -> RaggedStore:
        """A new store in a new shared-memory segment (parent side); :meth:`close` it."""
        name = f"{prefix}{secrets.token_hex(6)}"
        shm = shared_memory.SharedMemory(name=name, create=True, size=max(layout.size(), ALIGN))
        return cls(replace(layout, name=shm.name), shm, owner=True)

    @classmethod
    def private(
        cls,
        space: gym.Space[Any],
        rows: int,
        capacities: tuple[int, ...],
        growable: bool = True,
        root: str = "observations",
    ) -> RaggedStore:
        """A store in this process's memory (a Ray actor or driver, the caller group)."""
        return cls(RaggedLayout("", 1, space, rows, capacities, root), None, True, growable)

    def part(self, first: int, rows: int, writer: int) -> RaggedStore:
        """Rows ``first:first + rows`` of this store (a whole block), written by ``writer``.

        The part shares this store's memory; closing it frees nothing (the block does).
        """
        return RaggedStore(self.layout.part(first, rows, writer), None, False, buffer=self._buffer)

    @property
    def block(self) -> str:
        """What names the memory of the block: equal for the parts of one block."""
        return self.layout.name or f"private-{id(self._buffer)}"

    # ------------------------------------------------------------------ writing

    def write_rows(self, values: list[Any], first_env: int = 0) -> bool:
        """Write one observation per row.

        ``False`` if some rows did not fit (they are in :attr:`spilled`, their needs in
        :attr:`wants`). A private store grows instead.

        Raises:
            ValueError: A value of the wrong structure, shape or dtype, naming the env
                (``first_env`` + row) and the path in the space.
        """
        self.spilled = []
        wants = self.wants = [0] * len(self.wants)
        for i, value in enumerate(values):
            if not self._write(i, value, wants, first_env):
                if self.growable:
                    self._grow(wants)
                    wants = self.wants = [0] * len(wants)
                    self._write(i, value, wants, first_env)
                else:
                    self.spilled.append((i, value))
        return not self.spilled

    def write_batch(self, batch: Any, first_env: int = 0) -> bool:
        """:meth:`write_rows` of a batch in Gymnasium's form (a hosted VectorEnv's)."""
        return self.write_rows(
            [row_of(self.layout.space, batch, i) for i in range(self.layout.rows)], first_env
        )

    def _write(self, i: int, value: Any, wants: list[int], first_env: int) -> bool:
        self.failed_row = i
        fits = True
        for leaf, slot in zip(self.leaves, self._first_slot, strict=False):
            try:
                part = value
                for k in leaf.path:
                    part = part[k]
            except (KeyError, IndexError, TypeError) as exc:
                raise ValueError(
                    f"env {first_env + i}: {leaf.where} is missing ({type(exc).__name__}: {exc})"
                ) from None
            try:
                if not leaf.write(i, part, wants, slot):
                    fits = False
            except ValueError as exc:
                raise ValueError(f"env {first_env + i}: {exc}") from None
        self.failed_row = None
        return fits

    def _grow(self, wants: list[int]) -> None:
        """Re-lay this private store at the capacities ``wants`` need, keeping its rows."""
        caps = tuple(
            c if w <= c else grown(c, w) for c, w in zip(self.layout.capacities, wants, strict=True)
        )
        bigger = RaggedStore(self.layout.with_capacities(caps), None, True, True)
        bigger.load(self)
        self._take(bigger)

    def _take(self, bigger: RaggedStore) -> None:
        """Become ``bigger`` (a private store re-laid larger)."""
        self.layout, self.leaves, self.header = bigger.layout, bigger.leaves, bigger.header
        self.block_arrays, self._buffer = bigger.block_arrays, bigger._buffer

    def load(self, other: RaggedStore) -> None:
        """Copy every row of ``other`` (the same space and rows) into this store.

        It grows this store (if private) to ``other``'s capacities.
        """
        if self._shm is None and any(
            o > c for o, c in zip(other.layout.capacities, self.layout.capacities, strict=True)
        ):
            caps = tuple(map(max, other.layout.capacities, self.layout.capacities))
            self._take(RaggedStore(self.layout.with_capacities(caps), None, True, self.growable))
        for mine, theirs in zip(self.leaves, other.leaves, strict=True):
            for key, dst in mine.arrays.items():
                src = theirs.arrays[key]
                if src.ndim >= 2 and key not in ("counts",):
                    dst[:, : src.shape[1]] = src[:, : dst.shape[1]]
                else:
                    dst[...] = src

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # Pickled (a Ray actor's answer): the rows as private memory.
        return _private_copy, (self.layout, [leaf.arrays for leaf in self.leaves])

    # ------------------------------------------------------------------ attaching

    @classmethod
    def attach(cls, layout: RaggedLayout) -> RaggedStore:
        """Map the segment of ``layout`` (worker side) and say so in its header word."""
        store = cls(layout, open_segment(layout.name), owner=False)
        store.header[layout.writer] = layout.version
        return store

    @property
    def attached(self) -> bool:
        """The group maps this store (its header word holds this layout's version)."""
        return int(self.header[self.layout.writer]) == self.layout.version

    def close(self) -> None:
        """Unmap (and, in the creating process, unlink) the segment; idempotent."""
        shm, self._shm = self._shm, None
        if shm is None:
            return
        self.leaves, self.block_arrays = [], []
        self.header = np.zeros(self.header.shape, np.int64)
        if self._owner:
            try:
                shm.unlink()
            except FileNotFoundError:
                pass
        if getattr(shm, "_mmap", None) is not None:
            shm._mmap = None  # type: ignore[attr-defined]  # see SharedBuffers.close
        shm.close()


def _memory(shm: shared_memory.SharedMemory) -> Any:
    """The segment's memory to lay arrays over: the mmap itself (see SharedBuffers)."""
    return getattr(shm, "_mmap", None) or shm.buf


def _private_copy(layout: RaggedLayout, arrays: list[dict[str, np.ndarray]]) -> RaggedStore:
    store = RaggedStore(
        RaggedLayout("", layout.version, layout.space, layout.rows, layout.capacities, layout.root)
    )
    for leaf, got in zip(store.leaves, arrays, strict=True):
        for key, a in got.items():
            leaf.arrays[key][...] = a
    return store


def row_of(space: gym.Space[Any], batch: Any, i: int) -> Any:
    """Env ``i``'s observation out of a batch in Gymnasium's form."""
    if isinstance(space, gym.spaces.Dict):
        return {k: row_of(s, batch[k], i) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(row_of(s, batch[j], i) for j, s in enumerate(space.spaces))
    return batch[i]
