"""How a batch of envs is cut into groups (worker processes or Ray actors).

One helper for both managers and for :func:`envmgr.make`. A layout is the list
of group sizes and the index of each group's first env. Splits may be uneven:
``num_envs`` envs over ``n`` groups give each ``num_envs // n`` envs and the
first ``num_envs % n`` groups one more, in order, so env ``i`` is always the
``i``-th env of the batch whatever the split.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import Any, TypeVar

import numpy as np

from envmgr.validation import check_env_fns

__all__ = ["Layout", "resolve_layout", "split_counts"]

_F = TypeVar("_F", bound=Callable[..., Any])


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
        return sum(self.sizes)

    @cached_property
    def n_groups(self) -> int:
        return len(self.sizes)

    @cached_property
    def largest(self) -> int:
        """The size of the largest group."""
        return max(self.sizes)

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
        """The group whose envs are exactly ``env_ids`` (an int64 array, as :meth:`recv`
        returns them), else ``None``: the per-``send`` shortcut past :meth:`whole_groups`."""
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
        ids = np.arange(n) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
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


def _check_count(name: str, value: Any) -> None:
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
        raise ValueError(f"{name} must be a positive int, got {value!r}")


def split_counts(
    num_envs: int,
    n_groups: int | None,
    per_group: int | None,
    *,
    default_groups: int | None = None,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
    what: str = "num_envs={n}",
) -> Layout:
    """The layout of ``num_envs`` envs given a group count and/or a group size.

    ``per_group`` asks for an even split; ``n_groups`` alone allows an uneven one.
    Neither: as many groups as ``default_groups`` (else the core count), capped at
    ``num_envs``.
    """
    g_name, e_name = names
    _check_count(g_name, n_groups)
    _check_count(e_name, per_group)
    label = what.format(n=num_envs)
    if per_group is not None:
        if n_groups is not None and n_groups * per_group != num_envs:
            raise ValueError(
                f"{g_name} * {e_name} = {n_groups} * {per_group} = "
                f"{n_groups * per_group} does not match {label}"
            )
        if num_envs % per_group:
            raise ValueError(f"{label} cannot be split into groups of {e_name}={per_group}")
        return Layout.of([per_group] * (num_envs // per_group))
    if n_groups is None:
        # Nothing says: as many groups as cores (or default_groups), but only a
        # count that splits the envs evenly.
        limit = min(num_envs, max(1, default_groups or os.cpu_count() or 1))
        n_groups = max(d for d in range(1, limit + 1) if num_envs % d == 0)
    if n_groups > num_envs:
        raise ValueError(f"{label}, fewer than {g_name}={n_groups}: every group needs an env")
    return Layout.split(num_envs, n_groups)


def resolve_layout(
    env_fns: _F | Sequence[_F],
    n_groups: int | None,
    per_group: int | None,
    *,
    num_envs: int | None = None,
    default_groups: int | None = None,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
) -> tuple[list[_F], Layout]:
    """The constructor's arguments as (one factory per env, layout).

    Args:
        env_fns: One factory (called once per env) or one per env.
        n_groups: Worker processes (or actors).
        per_group: Envs per group (an even split).
        num_envs: Total envs, with a single factory (else implied by the sequence).
        default_groups: Groups when nothing says; else ``min(2, cores)`` for a single
            factory, the core count for a sequence.
        names: The caller's argument names, for messages.
    """
    _check_count(names[0], n_groups)
    _check_count(names[1], per_group)
    checked: Any = check_env_fns(env_fns)  # a factory, or a list of them
    if callable(checked):
        if num_envs is None:
            g = (
                n_groups
                if n_groups is not None
                else (default_groups or min(2, os.cpu_count() or 1))
            )
            layout = Layout.of([per_group or 1] * g)
        else:
            _check_count("num_envs", num_envs)
            layout = split_counts(
                num_envs,
                n_groups,
                per_group,
                names=names,
                default_groups=default_groups or min(2, os.cpu_count() or 1),
            )
        return [checked] * layout.num_envs, layout
    fns: list[_F] = checked
    if num_envs is not None and num_envs != len(fns):
        raise ValueError(f"num_envs={num_envs}, but {len(fns)} env factories were given")
    layout = split_counts(
        len(fns),
        n_groups,
        per_group,
        default_groups=default_groups,
        names=names,
        what="{n} env factories were given",
    )
    return fns, layout
