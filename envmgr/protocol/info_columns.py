"""Info values that are numbers, as typed columns in the batch's shared memory.

MuJoCo and Atari envs return a small info dict on every step (``x_position``,
``lives``, ...). Pickling those dicts down a pipe and merging them per env in the
parent cost more than the envs' own steps; so each env gets a row of
:data:`ROW_BYTES` bytes in the segment (the *info arena*), and a group writes each
numeric info key into a column of its rows, with a presence byte per env beside it::

    arena[env] = | ack (8 B, first env of a group) | key a | mask a | key b ... | mask b |
                   ^ the parent's word              ^ int64  ^ bool ...

Who decides what:

* The env side (:mod:`envmgr.envside.info_writer`) lays out its group's columns as
  keys first appear, append-only, and numbers every layout with a *version* (a
  random base per group plus a counter, so a replacement never reuses one).
* The layout travels to the parent in a step answer (:class:`Schema`, pickled once
  per change) and the parent writes the version it now reads with into the *ack*
  word of the group's first row. WaitEnd the ack matches, the group puts its layout
  in every answer: a layout lost with an answer (Ctrl-C dropped it) is sent again.
* A value that does not fit a column (a string, a dict, a key whose type or shape
  changed, a key first seen when the row is full, ``final_obs``/``final_info``)
  travels pickled, as before; only those keys pickle.

The parent side (:mod:`envmgr.frontend.infos`) reads each column for the whole
batch with one copy, and must give exactly what Gymnasium's ``VectorEnv._add_info``
builds from the same values: :attr:`Column.dtype` is the dtype ``_add_info`` picks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ROW_BYTES", "HEADER_BYTES", "Column", "Schema", "column_kind", "ack_word", "views"]

#: Bytes of info arena per env.
ROW_BYTES = 256
#: The ack word at the start of each group's first row (every row keeps the room, so
#: every row has the same column offsets).
HEADER_BYTES = 8

#: Keys Gymnasium adds at autoreset whose values are objects, never columns.
ALWAYS_PICKLED = frozenset({"final_obs", "final_info"})


@dataclass(frozen=True, slots=True)
class Column:
    """One info key's column in every row of a group.

    Attributes:
        key: The info key.
        dtype: The values' dtype, as ``_add_info`` picks it (``int`` gives int64).
        shape: The shape of one env's value (``()`` for scalars).
        offset: Byte offset of the value in the row.
        mask: Byte offset of the presence byte in the row.
        python: The env gave Python scalars (``int``/``float``/``bool``), not numpy ones.
    """

    key: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    mask: int
    python: bool


@dataclass(frozen=True, slots=True)
class Schema:
    """A group's columns and the version that numbers them."""

    version: int
    columns: tuple[Column, ...]


def column_kind(value: Any) -> tuple[np.dtype[Any], tuple[int, ...], bool] | None:
    """``(dtype, shape, python)`` of a value a column can hold, or ``None``.

    Exactly the values ``_add_info`` turns into a typed array: Python ``int``,
    ``float`` and ``bool`` (by exact type), numpy number scalars (not ``np.bool_``,
    which it stores as an object), and numeric arrays.
    """
    t = type(value)
    if t is float or t is int or t is bool:
        return np.dtype(t), (), True
    if isinstance(value, np.number):
        return value.dtype, (), False
    if t is np.ndarray and value.dtype.kind in "biufc":
        return value.dtype, value.shape, False
    return None


def ack_word(arena: np.ndarray, row: int) -> np.ndarray:
    """The one-element int64 view of the ack word in ``row`` of ``arena``."""
    return arena[row, :HEADER_BYTES].view(np.int64)


def views(arena: np.ndarray, column: Column) -> tuple[np.ndarray, np.ndarray]:
    """``(values, mask)`` views of ``column`` over every row of ``arena`` (any rows slice)."""
    dtype = np.dtype(column.dtype)
    size = int(np.prod(column.shape, dtype=np.int64)) * dtype.itemsize
    flat = arena[:, column.offset : column.offset + size].view(dtype)
    values = flat.reshape((arena.shape[0], *column.shape))
    mask = arena[:, column.mask].view(np.bool_)
    return values, mask
