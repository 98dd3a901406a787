"""Batches of a space as nests of arrays: copy, scatter, join, cut, and their infos.

Every helper that walks a batched observation or action (a dict/tuple nest of
arrays, or a tuple of items for spaces without a fixed shape) lives here, so the
front end, the worker and the Ray actor all treat batches the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "tree_map",
    "copy_tree",
    "scatter_tree",
    "concat_batches",
    "take_rows",
    "unbatch_infos",
    "has_rows",
    "rows_of_info",
]


def tree_map(fn: Callable[[np.ndarray], Any], tree: Any) -> Any:
    """Apply ``fn`` to every array leaf of a dict/tuple nest, keeping the structure."""
    if isinstance(tree, dict):
        return {k: tree_map(fn, v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(tree_map(fn, v) for v in tree)
    return fn(tree)


def copy_tree(dst: Any, src: Any) -> None:
    """Copy a batched nest into the arrays of the same structure."""
    if isinstance(dst, dict):
        for k, d in dst.items():
            copy_tree(d, src[k])
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src, strict=True):
            copy_tree(d, s)
    elif (
        type(src) is np.ndarray
        and src.ndim == 2
        and src.shape[0] >= _MANY_ROWS
        and src.shape[1] <= _FEW_COLUMNS
        and src.flags.f_contiguous
        and not src.flags.c_contiguous
    ):
        # A batch kept as columns (a vectorized env's ``state.T``, CartPole's): one copy
        # per column runs along the rows; numpy's element-wise transposing loop over an
        # (n, 4) array takes 1.3-1.9x as long at 1,024 rows, 3x at 8,192 (fewer rows:
        # the per-column calls cost more than they save; `benchmarks/probes/probe.py
        # column-copy`).
        for j in range(src.shape[1]):
            dst[:, j] = src[:, j]
    else:
        dst[...] = src


#: Column-major batches of at least this many rows and at most this many columns are
#: copied a column at a time.
_MANY_ROWS, _FEW_COLUMNS = 1024, 8


def scatter_tree(dst: Any, rows: np.ndarray | slice, src: Any) -> None:
    """Copy a batched nest into rows ``rows`` of the arrays of the same structure."""
    if isinstance(dst, dict):
        for k, d in dst.items():
            scatter_tree(d, rows, src[k])
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src, strict=True):
            scatter_tree(d, rows, s)
    else:
        dst[rows] = src


def concat_batches(space: gym.Space[Any], parts: Sequence[Any]) -> Any:
    """Join batches of ``space`` (one per group) into one batch, as fresh arrays."""
    if isinstance(space, ARRAY_SPACES):
        return np.concatenate(parts, axis=0)
    if isinstance(space, gym.spaces.Dict):
        return {k: concat_batches(s, [p[k] for p in parts]) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(concat_batches(s, [p[i] for p in parts]) for i, s in enumerate(space.spaces))
    # Text, Graph, Sequence, OneOf, custom spaces: the batch is a tuple of items.
    return tuple(itertools.chain.from_iterable(parts))


def take_rows(space: gym.Space[Any], batch: Any, rows: np.ndarray | slice) -> Any:
    """Rows ``rows`` of a batch of ``space``, as contiguous arrays (or a tuple of items)."""
    if isinstance(space, ARRAY_SPACES):
        return np.ascontiguousarray(np.asarray(batch)[rows])
    if isinstance(space, gym.spaces.Dict):
        return {k: take_rows(s, batch[k], rows) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(take_rows(s, batch[i], rows) for i, s in enumerate(space.spaces))
    items = list(batch)
    if isinstance(rows, slice):
        return tuple(items[rows])
    return tuple(items[int(r)] for r in rows)


def unbatch_infos(infos: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Split a Gymnasium vector info dict back into one info dict per env.

    A key without its ``_key`` mask (ale-py's ``AtariVectorEnv`` and EnvPool give none)
    belongs to every env: an array with a row per env is split by rows, a nested dict
    recursed, and any other value is the same for each env.
    """
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if isinstance(value, dict):
            sub: Any = unbatch_infos(value, n)
            if mask is None:
                mask = [bool(d) for d in sub]
        elif mask is None and not has_rows(value, n):
            sub = [value] * n
        elif isinstance(value, np.ndarray) and value.dtype == np.bool_ and value.ndim == 1:
            # Only Python bools make a bool array (``_add_info`` stores np.bool_ as an
            # object): give them back as such, or merging them again makes an object array.
            sub = value.tolist()
        else:
            sub = value
        for i in range(n) if mask is None else np.flatnonzero(mask):
            out[i][key] = sub[i]
    return out


def has_rows(value: Any, n: int) -> bool:
    """Whether ``value`` is an array with a row for each of ``n`` envs."""
    return isinstance(value, np.ndarray) and value.ndim > 0 and value.shape[0] == n


def rows_of_info(infos: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """The vector info dict restricted to envs ``rows`` (arrays indexed, nests recursed)."""
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if isinstance(v, dict):
            out[k] = rows_of_info(v, rows)
        elif isinstance(v, np.ndarray):
            out[k] = v[rows]
        else:
            out[k] = v
    return out


#: Spaces whose batch is one array.
ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)
