"""Batches of a space as nests of arrays: copy, scatter, join, cut, and their infos.

Every helper that walks a batched observation or action (a dict/tuple nest of
arrays, or a tuple of items for spaces without a fixed shape) lives here, so the
front end, the worker and the Ray actor all treat batches the same way.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

from envmgr.layout import Layout
from envmgr.validation import ARRAY_SPACES

__all__ = [
    "tree_map",
    "copy_tree",
    "scatter_tree",
    "concat_batches",
    "take_rows",
    "unbatch_infos",
    "rows_of_info",
    "BatchReader",
    "RESTARTED_INFO_KEY",
]

#: Info key of envs whose worker (or actor) was replaced during the call.
RESTARTED_INFO_KEY = "envmgr_restarted"


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
        # the per-column calls cost more than they save; `benchmarks/probe.py
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
    """Split a Gymnasium vector info dict back into one info dict per env."""
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if mask is None:
            continue
        sub = unbatch_infos(value, n) if isinstance(value, dict) else value
        for i in np.flatnonzero(mask):
            out[i][key] = sub[i]
    return out


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


class BatchReader:
    """Reads a batch (or some groups' rows) out of a manager's batch arrays.

    Observations come from the arrays when their space has a fixed shape, else
    from the groups' answers (``StepResponse.observations``, one per env); infos
    are the answers' per-env infos merged the Gymnasium way, plus the restart
    note of every env of a replaced group (built here, for both backends).

    Args:
        buffers: The batch arrays (``SharedBuffers``: shared or private memory).
        layout: The groups.
        space: The single-env observation space.
        copy: Return copies (else views the next step overwrites).
        add_info: Gymnasium's ``VectorEnv._add_info``.
    """

    def __init__(
        self,
        buffers: Any,
        layout: Layout,
        space: gym.Space[Any],
        copy: bool,
        add_info: Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]],
    ) -> None:
        self.buffers = buffers
        self.layout = layout
        self.starts = layout.starts
        # Each group's rows, as a slice and as env ids: recv's usual answer is one group.
        self._rows = [
            (slice(r.start, r.stop), np.arange(r.start, r.stop))
            for r in map(layout.range, range(layout.n_groups))
        ]
        self.space = space
        self.copy = copy
        self.add_info = add_info
        self.per_env: list[Any] | None = None
        self.views: Any
        if buffers.observations is not None:
            # Writable, as AsyncVectorEnv's shared-memory observations are: a write
            # changes only what the caller sees (groups keep their own copy of what
            # they need, and write every row they own at the next step or reset).
            self.views = tree_map(np.ndarray.view, buffers.observations)
        else:
            self.per_env = [None] * len(buffers.rewards)
            self.views = create_empty_array(space, len(buffers.rewards))

    def read_batch(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """The whole batch when no group said more than its rows (the usual step).

        Only with observations in the arrays: otherwise every answer carries them.
        """
        b = self.buffers
        views = self.views
        if not self.copy:
            obs = views
        elif type(views) is np.ndarray:
            obs = views.copy()
        else:
            obs = tree_map(np.ndarray.copy, views)
        return obs, b.rewards.copy(), b.terminations.copy(), b.truncations.copy(), {}

    def read_groups(
        self, groups: list[int]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """``recv``'s usual answer: the rows of ``groups`` (ascending), their env ids, no
        infos; fresh arrays. Only with observations in the arrays (see :meth:`read_batch`)."""
        b = self.buffers
        if len(groups) == 1:
            rows, ids = self._rows[groups[0]]
            ids = ids.copy()
            views = self.views
            obs = (
                views[rows].copy()
                if type(views) is np.ndarray
                else tree_map(lambda a: a[rows].copy(), views)
            )
            rewards, terms = b.rewards[rows].copy(), b.terminations[rows].copy()
            truncs = b.truncations[rows].copy()
        else:
            ids = np.concatenate([self._rows[g][1] for g in sorted(groups)])
            obs = tree_map(lambda a: a[ids], self.views)  # fancy indexing copies
            rewards, terms, truncs = b.rewards[ids], b.terminations[ids], b.truncations[ids]
        return obs, rewards, terms, truncs, {}, ids

    def read(
        self,
        answers: dict[int, Any],
        replaced: dict[int, tuple[range, str]],
        ids: np.ndarray | None,
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """``(obs, rewards, terminations, truncations, infos)`` of all envs, or of ``ids``.

        Args:
            answers: The groups' answers (``None``: nothing but the arrays).
            replaced: For each replaced group, its envs and the note they carry;
                those envs come back truncated.
            ids: Global envs to return (``recv``); ``None``: all.
        """
        b = self.buffers
        obs = self.observations(answers, ids)
        if ids is None:
            rewards, terms, truncs = b.rewards.copy(), b.terminations.copy(), b.truncations.copy()
        else:
            rewards, terms, truncs = b.rewards[ids], b.terminations[ids], b.truncations[ids]
        for r, _ in replaced.values():
            if ids is None:
                truncs[r.start : r.stop] = True
            else:
                truncs[(ids >= r.start) & (ids < r.stop)] = True
        return obs, rewards, terms, truncs, self.infos(answers, replaced, ids)

    def observations(self, answers: dict[int, Any], ids: np.ndarray | None) -> Any:
        per_env = self.per_env
        if per_env is None:
            if ids is not None:
                return tree_map(lambda a: a[ids], self.views)  # fancy indexing copies
            # ndarray.copy, not np.copy: the function form costs 4x more per call.
            return tree_map(np.ndarray.copy, self.views) if self.copy else self.views
        for g, a in answers.items():
            if a is not None and a.observations is not None:
                start = self.starts[g]
                per_env[start : start + len(a.observations)] = a.observations
        if ids is not None:
            chosen = [per_env[i] for i in ids]
            out: Any = create_empty_array(self.space, len(chosen))
            return concatenate(self.space, chosen, out)
        self.views = concatenate(self.space, per_env, self.views)
        return deepcopy(self.views) if self.copy else self.views

    def infos(
        self,
        answers: dict[int, Any],
        replaced: dict[int, tuple[range, str]],
        rows: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """Gymnasium's vector infos of the answers, then the restart notes, cut to ``rows``."""
        infos: dict[str, Any] = {}
        starts, add = self.starts, self.add_info
        said = [(g, a) for g, a in answers.items() if a is not None and a.infos]
        for g, a in sorted(said) if len(said) > 1 else said:
            for i, info in a.infos:
                infos = add(infos, info, starts[g] + i)
        for envs, note in replaced.values():
            for i in envs:
                infos = add(infos, {RESTARTED_INFO_KEY: note}, i)
        return infos if rows is None else rows_of_info(infos, rows)
