"""What a call returns: a batch read out of the batch arrays and the groups' answers.

Also the restart note of every env of a replaced group.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import concatenate, create_empty_array

from envmgr.frontend.infos import InfoColumns, merge, merge_pairs
from envmgr.protocol.layout import Layout
from envmgr.protocol.ragged import RaggedSpill
from envmgr.protocol.ragged_layout import grown
from envmgr.protocol.ragged_read import read_stores
from envmgr.protocol.trees import rows_of_info, tree_map

__all__ = ["BatchReader", "RESTARTED_INFO_KEY"]

#: Info key of envs whose worker (or actor) was replaced during the call.
RESTARTED_INFO_KEY = "envmgr_restarted"


class BatchReader:
    """Reads a batch (or some groups' rows) out of a manager's batch arrays.

    Observations come from the arrays when their space has a fixed shape, else
    from the groups' answers (``StepResponse.observations``, one per env); infos
    are the groups' info columns and the answers' pickled per-env infos merged the
    Gymnasium way (:mod:`envmgr.frontend.infos`), plus the restart note of every env
    of a replaced group (built here, for both backends).

    Args:
        buffers: The batch arrays (``SharedBuffers``: shared or private memory).
        layout: The groups.
        space: The single-env observation space.
        copy: Return copies (else views the next step overwrites).
        add_info: Gymnasium's ``VectorEnv._add_info``.
        padded: Sequence/Graph parts as padded arrays
            (:func:`~envmgr.protocol.ragged_read.read_stores`).

    A space with Sequence/Graph parts is read from the groups' stores
    (``buffers.ragged``), with the rows a store could not hold taken from the answers'
    :class:`~envmgr.protocol.ragged.RaggedSpill`; those rows are kept until their group
    writes again, and the larger capacities they need are in :attr:`grows` for the
    session to re-lay.
    """

    def __init__(
        self,
        buffers: Any,
        layout: Layout,
        space: gym.Space[Any],
        copy: bool,
        add_info: Callable[[dict[str, Any], dict[str, Any], int], dict[str, Any]],
        padded: bool = False,
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
        self.columns = InfoColumns(buffers.info_arena, layout)
        self.per_env: list[Any] | None = None
        self.views: Any
        self.padded = padded
        #: Group -> the capacities its store should be re-laid at (rows spilled).
        self.grows: dict[int, tuple[int, ...]] = {}
        self.spills: list[dict[int, Any]] = [{} for _ in range(layout.n_groups)]
        if buffers.ragged is not None:
            # Chosen once, so a fixed-shape space's reads carry no check for this.
            self.read_shared = self._read_shared_ragged  # type: ignore[method-assign]
            self.read_group_rows = self._read_group_rows_ragged  # type: ignore[method-assign]
            self.observations = self._observations_ragged  # type: ignore[method-assign]
            self.views = None
        elif buffers.observations is not None:
            # Writable, as AsyncVectorEnv's shared-memory observations are: a write
            # changes only what the caller sees (groups keep their own copy of what
            # they need, and write every row they own at the next step or reset).
            self.views = tree_map(np.ndarray.view, buffers.observations)
        else:
            self.per_env = [None] * len(buffers.rewards)
            self.views = create_empty_array(space, len(buffers.rewards))

    def read_shared(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
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
        infos = self.columns.batch()
        if infos is None:
            infos = self._column_infos(None)
        return obs, b.rewards.copy(), b.terminations.copy(), b.truncations.copy(), infos

    def read_group_rows(
        self, groups: list[int]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Return ``recv``'s usual answer, in fresh arrays: the rows of ``groups`` and their infos.

        The rows of ``groups`` (ascending), their env ids and their column infos (no answers, so
        nothing pickled). Only with observations in the arrays (see :meth:`read_shared`).
        """
        b = self.buffers
        if len(groups) == 1:
            g = groups[0]
            rows, ids = self._rows[g]
            ids = ids.copy()
            views = self.views
            obs = (
                views[rows].copy()
                if type(views) is np.ndarray
                else tree_map(lambda a: a[rows].copy(), views)
            )
            rewards, terms = b.rewards[rows].copy(), b.terminations[rows].copy()
            truncs = b.truncations[rows].copy()
            # The group's own rows of each column: no batch-wide arrays to cut down.
            infos = self.columns.group_batch(g)
            return obs, rewards, terms, truncs, infos, ids
        ids = np.concatenate([self._rows[g][1] for g in sorted(groups)])
        obs = tree_map(lambda a: a[ids], self.views)  # fancy indexing copies
        rewards, terms, truncs = b.rewards[ids], b.terminations[ids], b.truncations[ids]
        infos = self._column_infos(groups)
        return obs, rewards, terms, truncs, infos if not infos else rows_of_info(infos, ids), ids

    # ================================================================ Sequence/Graph

    def _ragged(self, groups: Sequence[int], whole: bool = False) -> Any:
        """The observations of ``groups`` (ascending) out of their stores and spills.

        ``whole``: the batch of every env, which under ``copy=False`` may be views of the
        groups' block (``ragged="padded"``).
        """
        b = self.buffers
        if b.pending:
            b.settle()
        stores, sizes, spills = b.ragged, self.layout.sizes, self.spills
        parts = [(stores[g], range(sizes[g]), spills[g]) for g in groups]
        return read_stores(self.space, parts, self.padded, whole and not self.copy)

    def _read_shared_ragged(self) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """:meth:`read_shared` of a Sequence/Graph space: every group wrote, none spilled."""
        for spill in self.spills:
            spill.clear()
        b = self.buffers
        infos = self.columns.batch()
        if infos is None:
            infos = self._column_infos(None)
        obs = self._ragged(range(self.layout.n_groups), whole=True)
        return obs, b.rewards.copy(), b.terminations.copy(), b.truncations.copy(), infos

    def _read_group_rows_ragged(
        self, groups: list[int]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """:meth:`read_group_rows` of a Sequence/Graph space."""
        for g in groups:
            self.spills[g].clear()
        groups = sorted(groups)
        ids = np.concatenate([self._rows[g][1] for g in groups])
        b = self.buffers
        infos = self._column_infos(groups)
        rewards, terms, truncs = b.rewards[ids], b.terminations[ids], b.truncations[ids]
        obs = self._ragged(groups)
        return obs, rewards, terms, truncs, infos if not infos else rows_of_info(infos, ids), ids

    def _observations_ragged(self, answers: dict[int, Any], ids: np.ndarray | None) -> Any:
        """Return :meth:`observations` of a Sequence/Graph space.

        Each answering group's spilled rows replace what its store holds, and what they need is
        noted in :attr:`grows`.
        """
        stores = self.buffers.ragged
        for g, a in answers.items():
            spill = None if a is None else a.observations
            if not isinstance(spill, RaggedSpill):
                self.spills[g] = {}
                continue
            self.spills[g] = dict(spill.rows)
            store = stores[g]
            caps = store.layout.capacities
            if any(w > c for w, c in zip(spill.wants, caps, strict=True)):
                self.grows[g] = tuple(
                    grown(c, w) if w > c else c for w, c in zip(spill.wants, caps, strict=True)
                )
        if ids is None:
            return self._ragged(range(self.layout.n_groups), whole=True)
        return self._ragged(sorted(set(self.layout.group_of(ids).tolist())))

    def _column_infos(self, groups: list[int] | None) -> dict[str, Any]:
        """The infos of a batch whose groups sent no answer: their columns only."""
        columns = self.columns
        if not columns.any:
            return {}
        return merge(columns.read_columns(groups), (), self.layout.num_envs, self.add_info)

    def adopt(self, g: int, answer: Any) -> None:
        """Take in group ``g``'s replacement, made between calls (recycled).

        Its info columns are forgotten, then laid out as its replacement's ``answer`` (``None``:
        none yet) says.
        """
        self.columns.forget(g)
        if answer is not None and answer.info_schema is not None:
            self.columns.update(g, answer.info_schema)

    def read_answers(
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
        """Return the batch's observations, or those of the envs ``ids`` when given."""
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
        """Return Gymnasium's vector infos of the columns and answers, then the restart notes.

        The infos are cut to ``rows``.

        Only the answering groups' columns are read; a replaced group's columns are
        forgotten first.
        """
        starts, columns = self.starts, self.columns
        for g in replaced:
            columns.forget(g)
        pairs = []
        for g, a in sorted(answers.items()):
            if a is None:
                continue
            if a.info_schema is not None:
                columns.update(g, a.info_schema)
            if a.infos:
                start = starts[g]
                pairs += [(start + i, info) for i, info in a.infos]
        n = self.layout.num_envs
        if columns.any:
            # Only the groups that answered: a reset may tell some groups only, and
            # first-ready's other groups may be writing their rows.
            groups = None if len(answers) == self.layout.n_groups else sorted(answers)
            infos = merge(columns.read_columns(groups), pairs, n, self.add_info)
        else:
            infos = merge_pairs({}, pairs, n, self.add_info)
        notes = [(i, {RESTARTED_INFO_KEY: note}) for envs, note in replaced.values() for i in envs]
        if notes:
            infos = merge_pairs(infos, notes, n, self.add_info)
        return infos if rows is None else rows_of_info(infos, rows)
