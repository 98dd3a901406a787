"""The env side of info columns: write numeric info values in place, pass the rest on.

:class:`InfoWriter` takes a batch's ``(local env, info)`` pairs, writes every value
a column holds into the group's rows of the info arena (see
:mod:`envmgr.protocol.info_columns` for the layout and the ack protocol), and
returns what is left to pickle: only the keys no column holds. Columns are laid out
as keys first appear; a key whose type, dtype or shape changes, or that finds the
row full, pickles from then on.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from itertools import chain
from operator import itemgetter
from typing import Any

import numpy as np

from envmgr.protocol.info_columns import (
    ALWAYS_PICKLED,
    HEADER_BYTES,
    Column,
    Schema,
    ack_word,
    column_kind,
    views,
)
from envmgr.protocol.trees import has_rows, unbatch_infos

__all__ = ["InfoWriter"]

Infos = list[tuple[int, dict[str, Any]]]


class _Layout(Exception):
    """The batch met a new key or a changed one: the columns changed, write it again."""


class _Slot:
    """A column and what the group writes into it."""

    __slots__ = ("column", "type", "dtype", "shape", "values", "mask", "zero", "dirty", "full")

    def __init__(self, column: Column, kind: type, arena: np.ndarray) -> None:
        self.column = column
        self.type: Any = kind
        self.dtype = np.dtype(column.dtype)
        self.shape = column.shape
        self.values, self.mask = views(arena, column)
        self.zero: Any = np.zeros(self.shape, self.dtype) if self.shape else self.dtype.type(0)
        self.dirty = False  # some mask byte is set
        self.full = False  # every mask byte is set

    def fits(self, value: Any) -> bool:
        if type(value) is not self.type:
            return False
        # A numpy scalar's type fixes its dtype; an array's dtype and shape are its own.
        return self.type is not np.ndarray or (
            value.shape == self.shape and value.dtype == self.dtype
        )


class InfoWriter:
    """One group's info columns.

    Args:
        arena: The group's rows of the info arena (``uint8[n, row bytes]``).
    """

    def __init__(self, arena: np.ndarray) -> None:
        self.arena = arena
        self.n = arena.shape[0]
        self._every_env = np.ones(self.n, np.bool_)  # the mask of a key given without one
        arena[:] = 0  # a replacement may inherit its predecessor's rows
        self._slots: dict[str, _Slot] = {}
        self._pickled: set[str] = set(ALWAYS_PICKLED)
        self._next = HEADER_BYTES
        self._block: _Block | None = None  # the slots as one record (rebuilt as they change)
        # The block while every slot's mask is all set (the last batch was uniform): the
        # next uniform batch then writes its values and nothing else (cleared by whatever
        # may unset a mask byte or change the slots).
        self._full_block: _Block | None = None
        # A random base: a replacement group never repeats a version its
        # predecessor's parent acknowledged.
        self.version = int.from_bytes(os.urandom(5), "little") + 1
        # A memoryview: reading it gives a Python int, compared without a numpy scalar.
        self._ack = memoryview(ack_word(arena, 0))  # type: ignore[arg-type]

    @property
    def unacked(self) -> bool:
        """The parent does not read with the current layout yet: send it."""
        return self._ack[0] != self.version  # type: ignore[no-any-return]

    def schema(self) -> Schema:
        """The current layout, for an answer."""
        return Schema(self.version, tuple(s.column for s in self._slots.values()))

    def split(self, infos: Infos) -> Infos:
        """Write what columns hold for this batch; return the pairs left to pickle."""
        block = self._full_block
        if block is not None and len(infos) == self.n and block.write(infos):
            return []  # the usual step after the first: as _write_uniform, in one call
        if not infos and not any(s.dirty for s in self._slots.values()):
            return infos
        while True:
            try:
                return self._write(infos)
            except _Layout:
                continue  # the layout changed (and terminates: keys are finite)

    def _write(self, infos: Infos) -> Infos:
        self._full_block = None  # set again below if the batch is uniform
        if len(infos) == self.n and self._write_uniform(infos):
            return []
        slots, pickled = self._slots, self._pickled
        staged: dict[str, list[tuple[int, Any]]] = {k: [] for k in slots}
        left: Infos = []
        for i, info in infos:
            rest: dict[str, Any] | None = None
            for k, v in info.items():
                slot = slots.get(k)
                if slot is not None:
                    if slot.fits(v):
                        staged[k].append((i, v))
                        continue
                    self._retire(k)
                    raise _Layout
                if k not in pickled:
                    kind = column_kind(v)
                    if kind is not None and self._place(k, *kind, type(v)):
                        raise _Layout
                    pickled.add(k)
                if rest is None:
                    rest = {}
                rest[k] = v
            if rest:
                left.append((i, rest))
        for k, items in staged.items():
            slot = slots[k]
            if not items:
                if slot.dirty:  # absent envs read as zero, as in _add_info's fresh arrays
                    slot.values[:] = 0
                    slot.mask[:] = False
                    slot.dirty = slot.full = False
                continue
            values = [slot.zero] * self.n
            present = [False] * self.n
            for i, v in items:
                values[i] = v
                present[i] = True
            try:
                slot.values[:] = values
            except (OverflowError, ValueError, TypeError):
                self._retire(k)  # a Python int beyond int64, say
                raise _Layout from None
            slot.mask[:] = present
            slot.dirty = True
            slot.full = False
        return left

    def _write_uniform(self, infos: Infos) -> bool:
        """Write the usual MuJoCo or Atari batch in one assignment, with no per-env staging.

        In such a batch every env said exactly the keys the columns hold, each a scalar of its
        column's type. ``False`` sends the batch the general way (which writes every row again).

        ``infos`` has a pair for every env, so in env order.
        """
        slots = self._slots
        if self._block is None or not self._block.write(infos):
            return False
        for slot in slots.values():
            if not slot.full:
                slot.mask[:] = True
                slot.dirty = slot.full = True
        self._full_block = self._block
        return True

    def split_vector(self, infos: dict[str, Any]) -> Infos:
        """Run :meth:`split` for a hosted VectorEnv's vector info dict.

        Its numeric arrays (with their ``_key`` masks) are the columns, one copy each.
        """
        self._full_block = None  # the masks are the env's own here
        slots, pickled, n = self._slots, self._pickled, self.n
        left: dict[str, Any] = {}
        written = set()
        for key, value in infos.items():
            if key.startswith("_") and key[1:] in infos:
                continue  # a mask, read with its key
            mask = infos.get(f"_{key}")
            if mask is None:
                # No "_key" mask (ale-py's AtariVectorEnv, EnvPool): every env has the
                # key, and the batch's infos carry it with a mask of all envs, as
                # Gymnasium's own vector envs give every key one.
                if not has_rows(value, n):
                    left[key] = value  # split per env as it is (unbatch_infos)
                    continue
                mask = self._every_env
            slot = slots.get(key)
            numeric = (
                type(value) is np.ndarray
                and value.dtype.kind in "biufc"
                and value.shape[:1] == (n,)
                and key not in pickled
            )
            if numeric and slot is None:
                # Python's own scalar types give these dtypes under _add_info.
                python = value.dtype in (np.bool_, np.int64, np.float64)
                if self._place(key, value.dtype, value.shape[1:], python, np.ndarray):
                    slot = slots[key]
                else:
                    pickled.add(key)
            if slot is not None:
                if numeric and slot.dtype == value.dtype and slot.shape == value.shape[1:]:
                    slot.values[:] = value
                    slot.mask[:] = mask
                    slot.dirty, slot.full = True, False
                    written.add(key)
                    continue
                self._retire(key)
            left[key], left[f"_{key}"] = value, mask
        for key, slot in slots.items():
            if slot.dirty and key not in written:
                slot.values[:] = 0
                slot.mask[:] = False
                slot.dirty = slot.full = False
        if not left:
            return []
        return [(i, info) for i, info in enumerate(unbatch_infos(left, n)) if info]

    def _place(
        self, key: Any, dtype: np.dtype[Any], shape: tuple[int, ...], python: bool, kind: type
    ) -> bool:
        """A column for ``key``, if the row has room for it (``False``: pickle it)."""
        if not isinstance(key, str) or key.startswith("_"):
            return False  # "_key" names are the masks' own
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        align = min(dtype.itemsize, 8) or 1
        offset = -(-self._next // align) * align
        if offset + size + 1 > self.arena.shape[1]:
            return False
        column = Column(key, dtype.str, shape, offset, offset + size, python)
        self._slots[key] = _Slot(column, kind, self.arena)
        self._block = _Block.of(self._slots, self.arena)
        self._full_block = None
        self._next = offset + size + 1
        self.version += 1
        return True

    def _retire(self, key: str) -> None:
        """``key`` pickles from now on; its column's bytes stay unused."""
        slot = self._slots.pop(key)
        self._block = _Block.of(self._slots, self.arena)
        self._full_block = None
        slot.values[:] = 0
        slot.mask[:] = False
        self._pickled.add(key)
        self.version += 1


class _Block:
    """The group's rows seen as records with one field per column, when every column is a scalar.

    A uniform batch is then checked and written in a few C-level passes instead of a Python pass
    per key.

    Args:
        keys: The columns' keys, in the order of ``types``.
        types: Each key's exact value type.
        records: The rows as a structured array (one field per column).
    """

    __slots__ = ("width", "get", "types", "n", "records")

    def __init__(self, keys: list[str], types: list[type], records: np.ndarray) -> None:
        self.width = len(keys)
        get = itemgetter(*keys)
        # itemgetter of one key gives the value, not a 1-tuple: records want tuples.
        self.get: Callable[[dict[str, Any]], Any] = (
            get if len(keys) > 1 else (lambda info: (get(info),))
        )
        self.n = records.shape[0]
        self.types = types * self.n  # the batch's values' types, row after row
        self.records = records

    @classmethod
    def of(cls, slots: dict[str, _Slot], arena: np.ndarray) -> _Block | None:
        """Return the block of ``slots``.

        ``None`` if there are none or a column holds arrays (those batches go the general way).
        """
        if not slots or any(s.shape for s in slots.values()):
            return None
        keys = list(slots)
        records = arena.view(
            np.dtype(
                {
                    "names": keys,
                    "formats": [s.dtype for s in slots.values()],
                    "offsets": [s.column.offset for s in slots.values()],
                    "itemsize": arena.shape[1],
                }
            )
        )[:, 0]
        return cls(keys, [s.type for s in slots.values()], records)

    def write(self, infos: Infos) -> bool:
        """Write a batch with a pair for every env.

        ``False`` (maybe some rows written) if an env said other keys or a value of another
        type, or one that does not fit (a Python int beyond int64).
        """
        width, get = self.width, self.get
        try:
            rows = [get(info) for _, info in infos if len(info) == width]
        except KeyError:
            return False
        # Each env has the block's keys and no others, each of its column's exact type.
        if len(rows) != self.n or list(map(type, chain.from_iterable(rows))) != self.types:
            return False
        try:
            self.records[:] = rows
        except (OverflowError, ValueError, TypeError):
            return False
        return True
