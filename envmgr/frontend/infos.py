"""The parent side of infos: Gymnasium's vector info dict, built a key at a time.

Two sources feed a batch's infos:

* **Columns** (:mod:`envmgr.protocol.info_columns`): numeric values the groups wrote
  into the info arena. :class:`InfoColumns` keeps each group's layout (from the
  answers' :class:`~envmgr.protocol.info_columns.Schema`, acknowledged in the ack
  word) and copies each key's column and mask out with one copy each.
* **Pickled pairs** ``(env, info)`` from the answers: :func:`merge_pairs` groups them
  by key and fills each key's array once, instead of one ``_add_info`` per env.

Both give exactly what ``VectorEnv._add_info`` would give for the same values in env
order: same keys, dtypes (picked by the lowest env's value) and ``_key`` masks. A
key that comes from both sources in one batch, or whose values differ in type, is
built by ``_add_info`` itself, value by value in env order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from envmgr.protocol.info_columns import Column, Schema, ack_word, views
from envmgr.protocol.layout import Layout

__all__ = ["InfoColumns", "merge", "merge_pairs"]

AddInfo = Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]]
Pairs = Sequence[tuple[int, dict[str, Any]]]
Read = tuple[
    dict[str, tuple[np.ndarray, np.ndarray]], dict[str, bool], dict[str, list[tuple[int, Any]]]
]

_NO_SCHEMA = Schema(0, ())

#: A key's place in a read: its column, its mask's key (``"_" + key``) and the views of
#: its values and its mask.
Planned = tuple[Column, str, np.ndarray, np.ndarray]


class InfoColumns:
    """Every group's info columns, read for the whole batch or for some groups.

    Args:
        arena: The batch's info arena (``uint8[num_envs, ROW_BYTES]``).
        layout: The groups.
    """

    def __init__(self, arena: np.ndarray, layout: Layout) -> None:
        self.arena = arena
        self.layout = layout
        self.schemas: list[Schema] = [_NO_SCHEMA] * layout.n_groups
        # Per key, its views over all rows, when every group with columns lays the key
        # out alike (the usual case); rebuilt on a change.
        self._plan: list[Planned] | None = []
        self._absent = bytes(layout.num_envs)  # a mask's bytes when no env has the key
        # The same per group, over its own rows: recv's usual answer is one group.
        self._group_plans: list[list[Planned]]
        self._group_plans = [[] for _ in range(layout.n_groups)]
        self._group_absent = [bytes(size) for size in layout.sizes]

    @property
    def any(self) -> bool:
        """Some group has columns."""
        return self._plan is None or bool(self._plan)

    def update(self, g: int, schema: Schema) -> None:
        """Read group ``g`` with ``schema`` from now on, and say so in its ack word."""
        if schema != self.schemas[g]:
            self.schemas[g] = schema
            self._plan = self._whole_batch_plan()
            rows = self.arena[self.layout.starts[g] : self.layout.starts[g] + self.layout.sizes[g]]
            self._group_plans[g] = [_planned(rows, column) for column in schema.columns]
        ack_word(self.arena, self.layout.starts[g])[0] = schema.version

    def forget(self, g: int) -> None:
        """Group ``g`` was replaced: it has no columns until its replacement says so."""
        self.schemas[g] = _NO_SCHEMA
        self._plan = self._whole_batch_plan()
        self._group_plans[g] = []
        ack_word(self.arena, self.layout.starts[g])[0] = 0

    def batch(self) -> dict[str, Any] | None:
        """Return the whole batch's vector infos from the columns alone: the usual step.

        This is what :func:`merge` gives for ``read(None)`` and no pairs, when the groups with
        columns lay them out alike. ``None`` when they differ (then ``merge(read(None), ...)``).
        """
        plan = self._plan
        return None if plan is None else _copy_out(plan, self._absent)

    def group_batch(self, g: int) -> dict[str, Any]:
        """As :meth:`batch`, for group ``g`` alone: arrays with a row per env of ``g``."""
        return _copy_out(self._group_plans[g], self._group_absent[g])

    def _whole_batch_plan(self) -> list[Planned] | None:
        """One view pair per key over every row, if the groups that have columns agree."""
        laid = [s.columns for s in self.schemas if s.columns]
        if not laid:
            return []
        if any(c != laid[0] for c in laid[1:]):
            return None
        return [_planned(self.arena, column) for column in laid[0]]

    def read_columns(self, groups: Iterable[int] | None) -> Read:
        """The columns' values of the keys some env has, as fresh arrays.

        Args:
            groups: The groups whose rows to read (``None``: all); the arrays have a row
                per env of the batch, zero (and unmasked) outside those groups.

        Returns:
            ``({key: (values, mask)}, {key: python}, {key: [(env, value), ...]})``: the
            third holds keys whose columns differ between groups in type, as values.
        """
        plan = self._plan
        if groups is None and plan is not None:
            flat = _copy_out(plan, self._absent)
            had = [(c.key, mask_key, c.python) for c, mask_key, _, _ in plan if c.key in flat]
            return {k: (flat[k], flat[m]) for k, m, _ in had}, {k: p for k, _, p in had}, {}
        columns: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        python: dict[str, bool] = {}
        chosen = range(self.layout.n_groups) if groups is None else groups
        parts: dict[str, list[tuple[int, Column, np.ndarray, np.ndarray]]] = {}
        starts, plans, absent = self.layout.starts, self._group_plans, self._group_absent
        for g in chosen:
            for column, _, values, mask in plans[g]:
                if mask.tobytes() != absent[g]:  # mask.any(), in a tenth of the time
                    parts.setdefault(column.key, []).append((starts[g], column, values, mask))
        n = self.layout.num_envs
        mixed: dict[str, list[tuple[int, Any]]] = {}
        for key, got in parts.items():
            kinds = {(c.dtype, c.shape, c.python) for _, c, _, _ in got}
            if len(kinds) > 1:
                # The lowest env picks the dtype (as _add_info does): value by value.
                mixed[key] = [
                    (a + int(i), v[i].item() if c.python else v[i])
                    for a, c, v, m in got
                    for i in np.flatnonzero(m)
                ]
                continue
            column = got[0][1]
            out = np.zeros((n, *column.shape), np.dtype(column.dtype))
            out_mask = np.zeros(n, np.bool_)
            for a, _, v, m in got:
                out[a : a + len(m)] = v
                out_mask[a : a + len(m)] = m
            columns[key] = (out, out_mask)
            python[key] = column.python
        return columns, python, mixed


def _planned(rows: np.ndarray, column: Column) -> Planned:
    return (column, f"_{column.key}", *views(rows, column))


def _copy_out(plan: list[Planned], absent: bytes) -> dict[str, Any]:
    """Return the vector info dict of the planned columns that some row has.

    Each key's values and mask are fresh copies; ``absent`` is the bytes of a mask no row has.
    """
    infos: dict[str, Any] = {}
    for column, mask_key, values, mask in plan:
        m = mask.copy()
        if m.tobytes() != absent:  # m.any(), in a tenth of the time
            infos[column.key] = values.copy()
            infos[mask_key] = m
    return infos


def merge(read: Read, pairs: Pairs, n: int, add_info: AddInfo) -> dict[str, Any]:
    """The vector info dict of column values and pickled pairs (env indices in ``0..n``).

    Args:
        read: What :meth:`InfoColumns.read` returned.
        pairs: ``(env, info)`` of the values that travelled pickled.
        n: The batch size.
        add_info: Gymnasium's ``VectorEnv._add_info`` (its ``num_envs`` is ``n``).
    """
    columns, python, mixed = read
    if not pairs and not mixed:  # the usual step: the columns say it all
        only: dict[str, Any] = {}
        for key, (values, mask) in columns.items():
            only[key] = values
            only["_" + key] = mask
        return only
    by_key = _by_key(pairs)
    for key, items in mixed.items():
        by_key[key] = [*items, *by_key.get(key, ())]
    infos: dict[str, Any] = {}
    for key, (values, mask) in columns.items():
        if key in by_key:
            # Also pickled in this batch (another group's value changed type): the
            # whole key is built value by value, in env order.
            back = _as_python if python[key] else _as_is
            by_key[key] = [*((int(i), back(values[i])) for i in np.flatnonzero(mask)), *by_key[key]]
            continue
        infos[key] = values
        infos[f"_{key}"] = mask
    _merge_by_key(infos, by_key, n, add_info)
    return infos


def _as_python(value: Any) -> Any:
    return value.item()


def _as_is(value: Any) -> Any:
    return value


def merge_pairs(infos: dict[str, Any], pairs: Pairs, n: int, add_info: AddInfo) -> dict[str, Any]:
    """``infos`` with the pickled ``(env, info)`` pairs merged in, a key at a time."""
    _merge_by_key(infos, _by_key(pairs), n, add_info)
    return infos


def _by_key(pairs: Pairs) -> dict[str, list[tuple[int, Any]]]:
    by_key: dict[str, list[tuple[int, Any]]] = {}
    for env, info in pairs:
        for key, value in info.items():
            got = by_key.get(key)
            if got is None:
                by_key[key] = [(env, value)]
            else:
                got.append((env, value))
    return by_key


def _merge_by_key(
    infos: dict[str, Any], by_key: dict[str, list[tuple[int, Any]]], n: int, add_info: AddInfo
) -> None:
    for key, items in by_key.items():
        if key in infos or not _build(infos, key, items, n, add_info):
            for env, value in sorted(items, key=lambda p: p[0]):
                add_info(infos, {key: value}, env)


def _build(
    infos: dict[str, Any], key: str, items: list[tuple[int, Any]], n: int, add_info: AddInfo
) -> bool:
    """Fill ``infos[key]`` and its mask in one go, as ``_add_info`` would.

    ``False`` if the values are not all alike (then the caller adds them one by one).
    """
    first = items[0][1]
    kind = type(first)
    if key == "final_obs" or any(type(v) is not kind for _, v in items):
        return False
    ids = [env for env, _ in items]
    if len(set(ids)) != len(ids):
        return False  # an env twice (cannot happen from one batch); keep the exact order
    if isinstance(first, dict):
        sub: dict[str, Any] = infos.get(key, {})
        sub = merge_pairs(sub, items, n, add_info)
        array: Any = sub
    elif kind is int or kind is float or kind is bool or issubclass(kind, np.number):
        array = np.zeros(n, dtype=kind)
        array[ids] = [v for _, v in items]
    elif kind is np.ndarray:
        if any(v.shape != first.shape or v.dtype != first.dtype for _, v in items):
            return False
        array = np.zeros((n, *first.shape), dtype=first.dtype)
        array[ids] = [v for _, v in items]
    else:
        array = np.full(n, None, dtype=object)
        for env, value in items:  # one by one: numpy would unpack sequences
            array[env] = value
    mask = np.zeros(n, dtype=np.bool_)
    mask[ids] = True
    infos[key], infos[f"_{key}"] = array, mask
    return True
