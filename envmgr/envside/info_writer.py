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
from typing import Any

import numpy as np

from envmgr.protocol.info_columns import (
    ALWAYS_PICKLED,
    HEADER_BYTES,
    ROW_BYTES,
    Column,
    Schema,
    ack_word,
    column_kind,
    views,
)

__all__ = ["InfoWriter"]

Infos = list[tuple[int, dict[str, Any]]]


class _Layout(Exception):
    """The batch met a new key or a changed one: the columns changed, write it again."""


class _Slot:
    """A column and what the group writes into it."""

    __slots__ = ("column", "type", "dtype", "shape", "values", "mask", "zero", "dirty")

    def __init__(self, column: Column, example: Any, arena: np.ndarray) -> None:
        self.column = column
        self.type = type(example)
        self.dtype = np.dtype(column.dtype)
        self.shape = column.shape
        self.values, self.mask = views(arena, column)
        self.zero: Any = np.zeros(self.shape, self.dtype) if self.shape else self.dtype.type(0)
        self.dirty = False  # some mask byte is set

    def fits(self, value: Any) -> bool:
        if type(value) is not self.type:
            return False
        return not self.shape or (value.shape == self.shape and value.dtype == self.dtype)


class InfoWriter:
    """One group's info columns.

    Args:
        arena: The group's rows of the info arena (``uint8[n, ROW_BYTES]``).
    """

    def __init__(self, arena: np.ndarray) -> None:
        self.arena = arena
        self.n = arena.shape[0]
        arena[:] = 0  # a replacement may inherit its predecessor's rows
        self._slots: dict[str, _Slot] = {}
        self._pickled: set[str] = set(ALWAYS_PICKLED)
        self._next = HEADER_BYTES
        # A random base: a replacement group never repeats a version its
        # predecessor's parent acknowledged.
        self.version = int.from_bytes(os.urandom(5), "little") + 1
        self._ack = ack_word(arena, 0)

    @property
    def unacked(self) -> bool:
        """The parent does not read with the current layout yet: send it."""
        return bool(self._ack[0] != self.version)

    def schema(self) -> Schema:
        """The current layout, for an answer."""
        return Schema(self.version, tuple(s.column for s in self._slots.values()))

    def split(self, infos: Infos) -> Infos:
        """Write what columns hold for this batch; return the pairs left to pickle."""
        if not infos and not any(s.dirty for s in self._slots.values()):
            return infos
        while True:
            try:
                return self._write(infos)
            except _Layout:
                continue  # the layout changed (and terminates: keys are finite)

    def _write(self, infos: Infos) -> Infos:
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
                    self._place(k, v)  # raises _Layout when it made a column
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
                    slot.dirty = False
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
        return left

    def _place(self, key: str, value: Any) -> None:
        """A column for ``key`` if its value fits one and the row has room; else pickle it."""
        kind = None if isinstance(key, str) and key.startswith("_") else column_kind(value)
        if kind is not None:
            dtype, shape, python = kind
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            align = min(dtype.itemsize, 8) or 1
            offset = -(-self._next // align) * align
            if offset + size + 1 <= ROW_BYTES and isinstance(key, str):
                column = Column(key, dtype.str, shape, offset, offset + size, python)
                self._slots[key] = _Slot(column, value, self.arena)
                self._next = offset + size + 1
                self.version += 1
                raise _Layout
        self._pickled.add(key)

    def _retire(self, key: str) -> None:
        """``key`` pickles from now on; its column's bytes stay unused."""
        slot = self._slots.pop(key)
        slot.values[:] = 0
        slot.mask[:] = False
        self._pickled.add(key)
        self.version += 1
