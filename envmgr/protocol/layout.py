"""How a batch of envs is cut into groups (worker processes or Ray actors).

One helper for both managers and for :func:`envmgr.make`. A layout is the list
of group sizes and the index of each group's first env. Splits may be uneven:
``num_envs`` envs over ``n`` groups give each ``num_envs // n`` envs and the
first ``num_envs % n`` groups one more, in order, so env ``i`` is always the
``i``-th env of the batch whatever the split.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

__all__ = ["Layout", "env_indices"]


@dataclass(frozen=True)
class Layout:
    """Group sizes and starts.

    Attributes:
        sizes: Envs per group, in group order.
        starts: Global index of each group's first env.
    """

    sizes: tuple[int, ...]
    starts: tuple[int, ...]

    @classmethod
    def of(cls, sizes: Sequence[int]) -> Layout:
        """The layout with these group sizes."""
        starts = tuple(int(s) for s in np.cumsum([0, *sizes[:-1]]))
        return cls(tuple(int(s) for s in sizes), starts)

    @classmethod
    def split(cls, num_envs: int, n_groups: int) -> Layout:
        """``num_envs`` envs over ``n_groups`` groups, the first ones one env larger."""
        base, extra = divmod(num_envs, n_groups)
        return cls.of([base + (g < extra) for g in range(n_groups)])

    # Cached: read on every batch step.
    @cached_property
    def num_envs(self) -> int:
        """The number of envs, over all groups."""
        return sum(self.sizes)

    @cached_property
    def n_groups(self) -> int:
        """The number of groups."""
        return len(self.sizes)

    @property
    def even(self) -> bool:
        """All groups have the same size."""
        return len(set(self.sizes)) == 1

    def range(self, g: int) -> range:
        """Global indices of group ``g``'s envs."""
        return range(self.starts[g], self.starts[g] + self.sizes[g])

    def group_of(self, env_ids: np.ndarray) -> np.ndarray:
        """The group owning each of ``env_ids``."""
        return np.searchsorted(np.asarray(self.starts), env_ids, side="right") - 1

    @cached_property
    def _group_by_ids(self) -> dict[bytes, int]:
        return {
            np.arange(start, start + size, dtype=np.int64).tobytes(): g
            for g, (start, size) in enumerate(zip(self.starts, self.sizes, strict=True))
        }

    def group_with_ids(self, env_ids: Any) -> int | None:
        """Return the group whose envs are exactly ``env_ids``, else ``None``.

        ``env_ids`` is an int64 array, as :meth:`recv` returns them: the per-``send`` shortcut
        past :meth:`whole_groups`.
        """
        if type(env_ids) is not np.ndarray or env_ids.dtype != np.int64 or env_ids.ndim != 1:
            return None
        return self._group_by_ids.get(env_ids.tobytes())

    def whole_groups(
        self, env_ids: Sequence[int] | np.ndarray | None, noun: str
    ) -> tuple[np.ndarray, list[int]]:
        """Check that ``env_ids`` (for ``send``) cover whole groups; return the ids and groups.

        Raises:
            ValueError: Ids out of range, or ids that split a group.
        """
        n = self.num_envs
        ids = np.arange(n) if env_ids is None else env_indices(env_ids)
        if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= n:
            raise ValueError(
                f"env_ids must be a non-empty list of env indices in [0, {n}), got {ids.tolist()}"
            )
        groups = sorted(set(self.group_of(ids).tolist()))
        expected = np.concatenate(
            [np.arange(self.starts[g], self.starts[g] + self.sizes[g]) for g in groups]
        )
        if not np.array_equal(np.sort(ids), expected):
            sizes = (
                f"{self.sizes[0]} consecutive envs each"
                if self.even
                else f"sizes {list(self.sizes)}"
            )
            raise ValueError(
                f"env_ids must cover whole {noun} ({sizes}, as recv returns them), "
                f"got {ids.tolist()}"
            )
        return ids, groups

    def where(self, noun: str, g: int) -> str:
        """``"worker 1 (envs 2-3)"``: how messages name group ``g``."""
        r = self.range(g)
        return f"{noun} {g} (envs {r.start}-{r.stop - 1})"


def env_indices(env_ids: Any) -> np.ndarray:
    """Return ``env_ids`` as an ``int64`` array, refusing what is not integers.

    A boolean mask would be read as indices 0 and 1, and floats or strings would be cut to ints.

    Raises:
        TypeError: ``env_ids`` holds something other than integers.
    """
    ids = np.asarray(env_ids)
    if ids.dtype.kind not in "iu" and ids.size:
        hint = " (a mask? pass np.flatnonzero(mask))" if ids.dtype.kind == "b" else ""
        raise TypeError(
            f"env_ids must be integer env indices, got {ids.dtype} {ids.tolist()}{hint}"
        )
    return ids.astype(np.int64, copy=False)
