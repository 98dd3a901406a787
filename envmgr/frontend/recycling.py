"""Recycling: a healthy group replaced once it reaches a step or memory limit.

A group is replaced once it has stepped ``max_worker_steps`` batches or its resident memory
passed ``max_worker_memory``. A planned restart::

    step() returns batch t  -> Recycler.end_of_step(batch): the step counted; at most every
                               MEMORY_READ_SECONDS, the groups' RSS (backend.resident_bytes)
                               a group over a limit is due: in batch t its envs whose
                               episode did not end come back truncated, and every one of
                               its envs carries infos["envmgr_recycled"]
    next step() or reset()  -> Session.recycle_due: backend.retire(g) (its envs closed),
                               then the restart path's replacement (Session.replace_group,
                               timed as recycle_<noun>_<g>, not charged to the budget);
                               its envs reset, unless this reset resets them all

The truncation is told in the batch where the limit was found passed, so that its
observations are still those of the episode the flag ends, as for any truncation; the
replacement then starts the next episodes where an autoreset would.
"""

from __future__ import annotations

from time import monotonic
from typing import Any

from envmgr.backends.base import Backend
from envmgr.frontend.infos import merge_pairs

__all__ = ["Recycler", "RECYCLED_INFO_KEY", "MEMORY_READ_SECONDS"]

#: Info key of the envs of a group found over its limit in this batch.
RECYCLED_INFO_KEY = "envmgr_recycled"
#: Seconds between two reads of the groups' resident memory, at most one per step.
MEMORY_READ_SECONDS = 0.25


def _megabytes(size: int) -> str:
    return f"{size / 1e6:,.1f} MB"


class Recycler:
    """Which groups are due for a planned replacement, and how many were replaced.

    Args:
        backend: The backend; its :meth:`~envmgr.backends.base.Backend.recyclable`
            groups are watched (the caller's envs have no process to replace).
        max_steps: Batches a group may step (``None``: no limit).
        max_memory: Bytes of resident memory a group may hold (``None``: no limit).
    """

    def __init__(self, backend: Backend, max_steps: int | None, max_memory: int | None) -> None:
        self.backend = backend
        self.layout = backend.layout
        self.max_steps = max_steps
        self.max_memory = max_memory
        self.groups = list(backend.recyclable())
        n = self.layout.n_groups
        #: Planned replacements so far, per group.
        self.recycles = [0] * n
        #: Batches stepped by each group's current process.
        self.steps = [0] * n
        #: Groups found over a limit and not yet replaced, with the note their envs carry.
        self.due: dict[int, str] = {}
        self._next_read = monotonic() + MEMORY_READ_SECONDS

    def started(self, g: int) -> None:
        """Group ``g`` has a new process (recycled or restarted): its count starts over."""
        self.steps[g] = 0
        self.due.pop(g, None)

    def end_of_step(self, batch: Any, add_info: Any) -> Any:
        """Count a batch step of every group; truncate the envs of those now over a limit.

        Args:
            batch: ``(obs, rewards, terminations, truncations, infos)``, its flags fresh
                arrays (changed in place).
            add_info: Gymnasium's ``VectorEnv._add_info``, to add the notes.
        """
        steps, due, limit = self.steps, self.due, self.max_steps
        over: dict[int, str] = {}
        for g in self.groups:
            if g not in due:
                steps[g] += 1
                if limit is not None and steps[g] >= limit:
                    over[g] = f"after {steps[g]} steps (max_worker_steps={limit})"
        if self.max_memory is not None:
            now = monotonic()
            if now >= self._next_read:
                self._next_read = now + MEMORY_READ_SECONDS
                over.update(self._over_memory(over))
        if not over:
            return batch
        return self._truncate(batch, over, add_info)

    def _over_memory(self, over: dict[int, str]) -> dict[int, str]:
        limit = self.max_memory
        assert limit is not None
        found = {}
        for g in self.groups:
            if g in self.due or g in over:
                continue
            rss = self.backend.resident_bytes(g)
            if rss is not None and rss > limit:
                found[g] = (
                    f"as its resident memory, {_megabytes(rss)}, passed "
                    f"max_worker_memory ({_megabytes(limit)})"
                )
        return found

    def _truncate(self, batch: Any, over: dict[int, str], add_info: Any) -> Any:
        obs, rewards, terms, truncs, infos = batch
        notes = []
        for g, why in sorted(over.items()):
            r = self.layout.range(g)
            rows = slice(r.start, r.stop)
            truncs[rows] |= ~terms[rows]  # an episode that ended stays as it ended
            note = f"{self.backend.where(g)}: recycled {why}"
            self.due[g] = note
            notes += [(i, {RECYCLED_INFO_KEY: note}) for i in r]
        infos = merge_pairs(infos, notes, self.layout.num_envs, add_info)
        return obs, rewards, terms, truncs, infos
