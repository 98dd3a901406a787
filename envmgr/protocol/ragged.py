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
(:class:`RaggedLayout` carries the version; the group puts the version it attached
with in its header word, so the parent knows when the group has moved, even
if the answer saying so was lost). A private store (a Ray actor's, the caller
group's) grows in place and never spills.

Under ``ragged="padded"`` the workers' stores are *parts* of one block (one segment,
one capacity per slot, a header word per group): each worker writes its rows of the
same arrays, so the batch is those arrays (views, under ``copy=False``). One worker's
overflow re-lays the whole block, and every worker moves to it.

The same store carries actions the other way (:mod:`envmgr.protocol.action_stores`):
the parent writes, the group reads :meth:`RaggedStore.batch`.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from multiprocessing import shared_memory
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.spaces import GraphInstance

from envmgr.protocol.segments import open_segment

__all__ = [
    "RAGGED_MODES",
    "RaggedOptions",
    "RaggedLayout",
    "RaggedStore",
    "RaggedSpill",
    "fits_ragged",
    "capacities_for",
    "slot_names",
    "ACTIONS_ROOT",
    "path_name",
    "grown",
    "read_stores",
    "row_of",
]

#: What ``ragged=`` takes: Gymnasium's batch form, ``(data, lengths)`` arrays, or no
#: store at all (every observation pickled, as for spaces without fixed elements: a
#: point of comparison).
RAGGED_MODES = ("gymnasium", "padded", "pickled")
_ALIGN = 64
_HEADER = 64  # word 0: the version the writer attached with
#: Integer types an env's ``edge_links`` come in, by their code in a Graph row's counts.
_LINK_TYPES = tuple(map(np.dtype, ("i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1")))
_ELEMENTS = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)

Path = tuple[Any, ...]


def _shape_dtype(space: gym.Space[Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    return tuple(space.shape or ()), np.dtype(space.dtype)


def _leaves(space: gym.Space[Any], path: Path = ()) -> list[tuple[Path, gym.Space[Any]]] | None:
    """``(path, space)`` of every leaf, or ``None`` if some part has no fixed element."""
    if isinstance(space, gym.spaces.Dict):
        out: list[tuple[Path, gym.Space[Any]]] = []
        for k, s in space.spaces.items():
            sub = _leaves(s, (*path, k))
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(space, gym.spaces.Tuple):
        out = []
        for i, s in enumerate(space.spaces):
            sub = _leaves(s, (*path, i))
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(space, _ELEMENTS):
        return [(path, space)]
    if isinstance(space, gym.spaces.Sequence) and isinstance(space.feature_space, _ELEMENTS):
        return [(path, space)]
    if (
        isinstance(space, gym.spaces.Graph)
        and isinstance(space.node_space, _ELEMENTS)
        and (space.edge_space is None or isinstance(space.edge_space, _ELEMENTS))
    ):
        return [(path, space)]
    return None


def fits_ragged(space: gym.Space[Any]) -> bool:
    """Whether ``space`` has a ``Sequence``/``Graph`` part and every part a fixed element."""
    leaves = _leaves(space)
    return leaves is not None and any(not isinstance(s, _ELEMENTS) for _, s in leaves)


def path_name(path: Path) -> str:
    """A leaf's name in ``capacity=`` hints: its keys joined by ``/``."""
    return "/".join(map(str, path))


def _where(path: Path, root: str = "observations") -> str:
    return root + "".join(f"[{k!r}]" for k in path)


def _slots(path: Path, space: gym.Space[Any], root: str = "") -> list[str]:
    """The capacity slots of a leaf, by name (none for a fixed part)."""
    name = "/".join(filter(None, (root, path_name(path))))
    if isinstance(space, gym.spaces.Sequence):
        return [name]
    if isinstance(space, gym.spaces.Graph):
        return [f"{name}/nodes" if name else "nodes", f"{name}/edges" if name else "edges"]
    return []


#: The root of the action space's names in ``capacity=`` hints (``"actions/targets"``).
ACTIONS_ROOT = "actions"


def slot_names(space: gym.Space[Any], root: str = "") -> list[str]:
    """The names of the capacity slots of ``space``, below ``root``, in leaf order."""
    return [slot for path, s in _leaves(space) or [] for slot in _slots(path, s, root)]


def capacities_for(
    space: gym.Space[Any],
    hint: int | Mapping[str, int] | None,
    root: str = "",
    known: Sequence[str] | None = None,
) -> tuple[int, ...]:
    """The starting capacity of every slot of ``space`` from a ``capacity=`` hint.

    A hint key names a leaf (``"entities/type_a"``), a Graph's ``nodes``/``edges`` below
    it, or any part above (``"entities"``): the longest key that matches wins. Without a
    hint a slot starts at 0 and grows to what the values need. An int is every slot's.

    Args:
        space: The space (observations, or actions).
        hint: The manager's ``capacity=``.
        root: What the names of this space start with (:data:`ACTIONS_ROOT` for actions).
        known: Every name a key may match (both spaces' slots); default this space's.

    Raises:
        ValueError: A key that names no part of the spaces, or a negative capacity.
    """
    names = slot_names(space, root)

    def matches(name: str, key: str) -> bool:
        return name == key or name.startswith(f"{key}/") or not key

    if hint is None or isinstance(hint, int):
        value = 0 if hint is None else int(hint)
        if value < 0:
            raise ValueError(f"capacity must be >= 0, got {hint!r}")
        return (value,) * len(names)
    every = names if known is None else list(known)
    for key, value in hint.items():
        if not any(matches(n, key) for n in every):
            raise ValueError(
                f"capacity names {key!r}, which is no variable-size part of the spaces: "
                f"their parts are {every}"
            )
        if not isinstance(value, int) or value < 0:
            raise ValueError(f"capacity[{key!r}] must be an int >= 0, got {value!r}")
    out = []
    for n in names:
        keys = [k for k in hint if matches(n, k)]
        out.append(int(hint[max(keys, key=len)]) if keys else 0)
    return tuple(out)


def grown(capacity: int, need: int) -> int:
    """Return the capacity a slot grows to when ``need`` elements did not fit in ``capacity``.

    It is the next power of two of at least ``need`` and twice the old one, so a row that keeps
    growing re-lays the store a logarithmic number of times.
    """
    target = max(need, 2 * capacity, 1)
    return 1 << (target - 1).bit_length()


@dataclass(frozen=True)
class RaggedOptions:
    """The manager's ``ragged=`` and ``capacity=``, as the backends need them.

    Attributes:
        mode: One of :data:`RAGGED_MODES`.
        capacity: The starting capacities' hint (see :func:`capacities_for`).
    """

    mode: str = "gymnasium"
    capacity: int | Mapping[str, int] | None = None


@dataclass(frozen=True)
class RaggedLayout:
    """What a process needs to map one group's store.

    Attributes:
        name: The shared-memory segment's name (``""``: private memory).
        version: Numbers this layout; a re-laid store gets a new one.
        space: The single-env space (observations or actions).
        rows: Envs in the group.
        capacities: Each slot's capacity, in leaf order (see :func:`capacities_for`).
        root: What the rows are, as error messages name them (``"actions"``).
        first: The group's first row in the block, when the store is part of one.
        block_rows: Rows of the whole block (``0``: the store is no part of one).
        writer: The header word the group's writer puts its version in.
        writers: Header words (one per group sharing the block).
    """

    name: str
    version: int
    space: gym.Space[Any]
    rows: int
    capacities: tuple[int, ...]
    root: str = "observations"
    first: int = 0
    block_rows: int = 0
    writer: int = 0
    writers: int = 1

    @property
    def all_rows(self) -> int:
        """Rows of the whole block (its own rows, when it is no part of one)."""
        return self.block_rows or self.rows

    def templates(self) -> list[tuple[Path, gym.Space[Any], dict[str, tuple[Any, ...]]]]:
        """Each leaf's arrays (over the whole block) as ``name -> (shape, dtype)``, in order."""
        n, caps, out = self.all_rows, iter(self.capacities), []
        for path, space in _leaves(self.space) or []:
            arrays: dict[str, tuple[Any, ...]] = {}
            if isinstance(space, gym.spaces.Sequence):
                shape, dtype = _shape_dtype(space.feature_space)
                arrays["data"] = ((n, next(caps), *shape), dtype)
                arrays["lengths"] = ((n,), np.dtype(np.int64))
            elif isinstance(space, gym.spaces.Graph):
                shape, dtype = _shape_dtype(space.node_space)
                arrays["nodes"] = ((n, next(caps), *shape), dtype)
                arrays["counts"] = ((n, 3), np.dtype(np.int64))
                cap_edges = next(caps)
                if space.edge_space is not None:
                    shape, dtype = _shape_dtype(space.edge_space)
                    arrays["edges"] = ((n, cap_edges, *shape), dtype)
                    arrays["links"] = ((n, cap_edges, 2), np.dtype(np.int64))
            else:
                arrays["values"] = ((n, *_shape_dtype(space)[0]), _shape_dtype(space)[1])
            out.append((path, space, arrays))
        return out

    def header_bytes(self) -> int:
        """Bytes of the header: one word per writer, at least a cache line."""
        return max(_HEADER, _aligned(8 * self.writers))

    def size(self) -> int:
        """Bytes of the store (of its whole block), every array aligned to a cache line."""
        offset = self.header_bytes()
        for _, _, arrays in self.templates():
            for shape, dtype in arrays.values():
                offset = _aligned(offset) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return _aligned(offset)

    def with_capacities(self, capacities: tuple[int, ...], name: str = "") -> RaggedLayout:
        """The next version of this layout, with new capacities."""
        return replace(self, name=name, version=self.version + 1, capacities=capacities)

    def part(self, first: int, rows: int, writer: int) -> RaggedLayout:
        """The layout of one group's rows ``first:first + rows`` of this whole block."""
        return replace(self, rows=rows, first=first, block_rows=self.all_rows, writer=writer)


def _aligned(offset: int) -> int:
    return (offset + _ALIGN - 1) // _ALIGN * _ALIGN


@dataclass(frozen=True)
class RaggedSpill:
    """What a group's rows could not hold: its answer carries it pickled.

    Attributes:
        rows: ``(local row, observation)`` of every env whose value did not fit.
        wants: Each slot's length needed (``0``: it fitted), in slot order.
    """

    rows: tuple[tuple[int, Any], ...]
    wants: tuple[int, ...]


class _Leaf:
    """One leaf's arrays in a store, and how a row is written and read."""

    __slots__ = (
        "path", "space", "arrays", "slots", "shape", "dtype", "edge_shape", "edge_dtype", "where"
    )  # fmt: skip

    def __init__(
        self,
        path: Path,
        space: gym.Space[Any],
        arrays: dict[str, np.ndarray],
        root: str = "observations",
    ) -> None:
        self.path, self.space, self.arrays = path, space, arrays
        self.where = _where(path, root)
        self.edge_shape: tuple[int, ...] = ()
        self.edge_dtype: np.dtype[Any] = np.dtype(np.int64)
        if isinstance(space, gym.spaces.Sequence):
            self.shape, self.dtype = _shape_dtype(space.feature_space)
            self.slots = 1
        elif isinstance(space, gym.spaces.Graph):
            self.shape, self.dtype = _shape_dtype(space.node_space)
            if space.edge_space is not None:
                self.edge_shape, self.edge_dtype = _shape_dtype(space.edge_space)
            self.slots = 2
        else:
            self.shape, self.dtype = _shape_dtype(space)
            self.slots = 0

    def _elements(self, value: Any, shape: tuple[int, ...], dtype: np.dtype[Any], what: str) -> Any:
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
            a = self._elements(value, self.shape, self.dtype, "")
            data = arrays["data"]
            if len(a) > data.shape[1]:
                wants[slot] = max(wants[slot], len(a))
                return False
            data[i, : len(a)] = a
            arrays["lengths"][i] = len(a)
            return True
        if not isinstance(value, GraphInstance):
            raise ValueError(f"{self.where} is a {type(value).__name__}, not a GraphInstance")
        nodes = self._elements(value.nodes, self.shape, self.dtype, ".nodes")
        edges = links = None
        if value.edges is not None or value.edge_links is not None:
            if "edges" not in arrays:
                raise ValueError(f"{self.where} has edges, but {self.space} has no edge space")
            edges = self._elements(value.edges, self.edge_shape, self.edge_dtype, ".edges")
            links = self._elements(value.edge_links, (2,), np.dtype(np.int64), ".edge_links")
            if links.dtype not in _LINK_TYPES:
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
            counts[2] = _LINK_TYPES.index(links.dtype)
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
                links = arrays["links"][i, :n_edges].astype(_LINK_TYPES[link_type])
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
        self.leaves: list[_Leaf] = []
        #: Each leaf's arrays over the whole block (the store's own, when it is no part).
        self.block_arrays: list[dict[str, np.ndarray]] = []
        for path, space, templates in layout.templates():
            whole = {}
            for key, (shape, dtype) in templates.items():
                offset = _aligned(offset)
                whole[key] = np.ndarray(shape, dtype, buffer=buf, offset=offset)
                offset += whole[key].nbytes
            self.block_arrays.append(whole)
            arrays = whole if not layout.block_rows else {k: a[rows] for k, a in whole.items()}
            self.leaves.append(_Leaf(path, space, arrays, layout.root))
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
        shm = shared_memory.SharedMemory(name=name, create=True, size=max(layout.size(), _ALIGN))
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

    def batch(self) -> Any:
        """Every row in Gymnasium's batch form, as fresh arrays (a reader's side)."""
        return read_stores(self.layout.space, [(self, range(self.layout.rows), {})], False)

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


# ====================================================================== reading


def read_stores(
    space: gym.Space[Any],
    parts: list[tuple[RaggedStore, range, dict[int, Any]]],
    padded: bool,
    views: bool = False,
) -> Any:
    """The rows of ``parts`` as one batch: SyncVectorEnv's form, or padded.

    Args:
        space: The single-env observation space.
        parts: ``(store, its rows to read, {row: observation that travelled pickled})``
            for each group, in env order.
        padded: Each Sequence leaf as ``(data, lengths)``, each Graph leaf as
            ``(nodes, n_nodes, edges, edge_links, n_edges)`` (``n_edges`` -1: none),
            instead of tuples of per-env items.
        views: When ``parts`` are every row of one block and none travelled pickled, the
            padded arrays are views of the block (else fresh arrays, as always).
    """
    leaves = [leaf for leaf in parts[0][0].leaves]
    whole = _whole_block(parts) if padded else None
    if whole is not None:
        take = (lambda a: a) if views else np.ndarray.copy
        return _nest(
            space, (_padded_view(leaf, a, take) for leaf, a in zip(leaves, whole, strict=True))
        )
    values = []
    for k, leaf in enumerate(leaves):
        pieces = [(store.leaves[k], rows, over) for store, rows, over in parts]
        values.append(_padded(leaf, pieces) if padded and leaf.slots else _gym(leaf, pieces))
    return _nest(space, iter(values))


def _whole_block(
    parts: list[tuple[RaggedStore, range, dict[int, Any]]],
) -> list[dict[str, np.ndarray]] | None:
    """The arrays of the block ``parts`` cover row by row, whole and in order, else ``None``."""
    first = parts[0][0]
    at = 0
    for store, rows, over in parts:
        layout = store.layout
        if over or store.block != first.block or layout.first != at:
            return None
        if rows != range(layout.rows):
            return None
        at += layout.rows
    return first.block_arrays if at == first.layout.all_rows else None


def _padded_view(leaf: _Leaf, arrays: dict[str, np.ndarray], take: Any) -> Any:
    """One leaf of a whole block in the padded form, through ``take`` (a view, or a copy)."""
    if leaf.slots == 0:
        return take(arrays["values"])
    if leaf.slots == 1:
        return take(arrays["data"]), take(arrays["lengths"])
    counts = arrays["counts"]
    edges, links = arrays.get("edges"), arrays.get("links")
    return (
        take(arrays["nodes"]),
        take(counts[:, 0]),
        None if edges is None else take(edges),
        None if links is None else take(links),
        take(counts[:, 1]),
    )


def _gym(leaf: _Leaf, pieces: list[tuple[_Leaf, range, dict[int, Any]]]) -> Any:
    if leaf.slots == 0:
        out = np.concatenate([p.arrays["values"][rows.start : rows.stop] for p, rows, _ in pieces])
        at = 0
        for _, rows, over in pieces:
            for i, value in over.items():
                out[at + i - rows.start] = _part(value, leaf.path)
            at += len(rows)
        return out
    items: list[Any] = []
    for p, rows, over in pieces:
        got = list(p.items(rows))
        for i, value in over.items():
            got[i - rows.start] = _part(value, leaf.path)
        items += got
    return tuple(items)


def _padded(leaf: _Leaf, pieces: list[tuple[_Leaf, range, dict[int, Any]]]) -> Any:
    n = sum(len(rows) for _, rows, _ in pieces)
    keys = ("data",) if leaf.slots == 1 else ("nodes", "edges", "links")
    present = [k for k in keys if k in leaf.arrays]
    caps = {k: max(p.arrays[k].shape[1] for p, _, _ in pieces) for k in present}
    over_rows = [(at, _part(v, leaf.path)) for at, v in _overrides(pieces)]
    if over_rows:
        for _, v in over_rows:
            for k, length in _lengths(leaf, v).items():
                caps[k] = max(caps[k], length)
    out = {
        k: np.zeros((n, caps[k], *leaf.arrays[k].shape[2:]), leaf.arrays[k].dtype) for k in present
    }
    counts_key = "lengths" if leaf.slots == 1 else "counts"
    counts = np.concatenate([p.arrays[counts_key][rows.start : rows.stop] for p, rows, _ in pieces])
    at = 0
    for p, rows, _ in pieces:
        for k in present:
            src = p.arrays[k][rows.start : rows.stop]
            out[k][at : at + len(rows), : src.shape[1]] = src
        at += len(rows)
    for at, v in over_rows:
        if leaf.slots == 1:
            a = leaf._elements(v, leaf.shape, leaf.dtype, "")
            out["data"][at, : len(a)] = a
            counts[at] = len(a)
            continue
        nodes = leaf._elements(v.nodes, leaf.shape, leaf.dtype, ".nodes")
        out["nodes"][at, : len(nodes)] = nodes
        counts[at, :2] = (len(nodes), -1 if v.edges is None else len(v.edges))
        if v.edges is not None:
            out["edges"][at, : len(v.edges)] = v.edges
            out["links"][at, : len(v.edges)] = v.edge_links
    if leaf.slots == 1:
        return out["data"], counts
    edges = out.get("edges")
    return out["nodes"], counts[:, 0].copy(), edges, out.get("links"), counts[:, 1].copy()


def _overrides(pieces: list[tuple[_Leaf, range, dict[int, Any]]]) -> list[tuple[int, Any]]:
    at, out = 0, []
    for _, rows, over in pieces:
        out += [(at + i - rows.start, v) for i, v in sorted(over.items())]
        at += len(rows)
    return out


def _lengths(leaf: _Leaf, value: Any) -> dict[str, int]:
    if leaf.slots == 1:
        return {"data": len(value)}
    got = {"nodes": len(value.nodes)}
    if value.edges is not None:
        got["edges"] = got["links"] = len(value.edges)
    return got


def _part(value: Any, path: Path) -> Any:
    for k in path:
        value = value[k]
    return value


def _nest(space: gym.Space[Any], values: Any) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _nest(s, values) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_nest(s, values) for s in space.spaces)
    return next(values)
