"""The layout of a ragged store: which leaves a space has, their capacities, the bytes.

A space with ``Sequence``/``Graph`` parts is cut into leaves (:func:`space_leaves`), each
with a fixed element; a :class:`RaggedLayout` gives every leaf's arrays at a capacity and
their offsets in one block of memory, and is what a process needs to map a store
(:mod:`envmgr.protocol.ragged`) that another process laid::

    space --space_leaves--> [(path, leaf space)]  --capacities_for(hint)--> capacities
          --RaggedLayout(name, version, space, rows, capacities).templates()-->
            [(path, space, {array: (shape, dtype)})]  --size()--> bytes of the block
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "ACTIONS_ROOT",
    "ALIGN",
    "LINK_TYPES",
    "LeafPath",
    "RAGGED_MODES",
    "RaggedLayout",
    "RaggedOptions",
    "aligned",
    "capacities_for",
    "fits_ragged",
    "grown",
    "path_name",
    "shape_dtype",
    "slot_names",
    "space_leaves",
    "where_of",
]

#: What ``ragged=`` takes: Gymnasium's batch form, ``(data, lengths)`` arrays, or no
#: store at all (every observation pickled, as for spaces without fixed elements: a
#: point of comparison).
RAGGED_MODES = ("gymnasium", "padded", "pickled")
ALIGN = 64
_HEADER = 64  # word 0: the version the writer attached with
#: Integer types an env's ``edge_links`` come in, by their code in a Graph row's counts.
LINK_TYPES = tuple(map(np.dtype, ("i8", "i4", "i2", "i1", "u8", "u4", "u2", "u1")))
_ELEMENTS = (gym.spaces.Box, gym.spaces.Discrete, gym.spaces.MultiDiscrete, gym.spaces.MultiBinary)

LeafPath = tuple[Any, ...]


def shape_dtype(space: gym.Space[Any]) -> tuple[tuple[int, ...], np.dtype[Any]]:
    """One element's shape and dtype."""
    return tuple(space.shape or ()), np.dtype(space.dtype)


def space_leaves(
    space: gym.Space[Any], path: LeafPath = ()
) -> list[tuple[LeafPath, gym.Space[Any]]] | None:
    """``(path, space)`` of every leaf, or ``None`` if some part has no fixed element."""
    if isinstance(space, gym.spaces.Dict):
        out: list[tuple[LeafPath, gym.Space[Any]]] = []
        for k, s in space.spaces.items():
            sub = space_leaves(s, (*path, k))
            if sub is None:
                return None
            out += sub
        return out
    if isinstance(space, gym.spaces.Tuple):
        out = []
        for i, s in enumerate(space.spaces):
            sub = space_leaves(s, (*path, i))
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
    leaves = space_leaves(space)
    return leaves is not None and any(not isinstance(s, _ELEMENTS) for _, s in leaves)


def path_name(path: LeafPath) -> str:
    """A leaf's name in ``capacity=`` hints: its keys joined by ``/``."""
    return "/".join(map(str, path))


def where_of(path: LeafPath, root: str = "observations") -> str:
    """A leaf's place in error messages: ``observations['entities']['a']``."""
    return root + "".join(f"[{k!r}]" for k in path)


def _slots(path: LeafPath, space: gym.Space[Any], root: str = "") -> list[str]:
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
    return [slot for path, s in space_leaves(space) or [] for slot in _slots(path, s, root)]


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

    def templates(self) -> list[tuple[LeafPath, gym.Space[Any], dict[str, tuple[Any, ...]]]]:
        """Each leaf's arrays (over the whole block) as ``name -> (shape, dtype)``, in order."""
        n, caps, out = self.all_rows, iter(self.capacities), []
        for path, space in space_leaves(self.space) or []:
            arrays: dict[str, tuple[Any, ...]] = {}
            if isinstance(space, gym.spaces.Sequence):
                shape, dtype = shape_dtype(space.feature_space)
                arrays["data"] = ((n, next(caps), *shape), dtype)
                arrays["lengths"] = ((n,), np.dtype(np.int64))
            elif isinstance(space, gym.spaces.Graph):
                shape, dtype = shape_dtype(space.node_space)
                arrays["nodes"] = ((n, next(caps), *shape), dtype)
                arrays["counts"] = ((n, 3), np.dtype(np.int64))
                cap_edges = next(caps)
                if space.edge_space is not None:
                    shape, dtype = shape_dtype(space.edge_space)
                    arrays["edges"] = ((n, cap_edges, *shape), dtype)
                    arrays["links"] = ((n, cap_edges, 2), np.dtype(np.int64))
            else:
                arrays["values"] = ((n, *shape_dtype(space)[0]), shape_dtype(space)[1])
            out.append((path, space, arrays))
        return out

    def header_bytes(self) -> int:
        """Bytes of the header: one word per writer, at least a cache line."""
        return max(_HEADER, aligned(8 * self.writers))

    def size(self) -> int:
        """Bytes of the store (of its whole block), every array aligned to a cache line."""
        offset = self.header_bytes()
        for _, _, arrays in self.templates():
            for shape, dtype in arrays.values():
                offset = aligned(offset) + int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return aligned(offset)

    def with_capacities(self, capacities: tuple[int, ...], name: str = "") -> RaggedLayout:
        """The next version of this layout, with new capacities."""
        return replace(self, name=name, version=self.version + 1, capacities=capacities)

    def part(self, first: int, rows: int, writer: int) -> RaggedLayout:
        """The layout of one group's rows ``first:first + rows`` of this whole block."""
        return replace(self, rows=rows, first=first, block_rows=self.all_rows, writer=writer)


def aligned(offset: int) -> int:
    """``offset`` rounded up to a cache line."""
    return (offset + ALIGN - 1) // ALIGN * ALIGN
