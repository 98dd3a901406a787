"""Checks on a batch of actions, done in the parent before anything is sent.

A bad action caught here names the env and worker it was meant for and what
was expected; caught in a worker it would surface as an env-specific assertion,
or not at all (a float fed to a Discrete env may be silently truncated).
The checks are compiled once per manager into one small function per leaf of
the action space, so the hot path is a few numpy reductions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = ["ActionChecker", "reset_arguments", "whole_groups"]

_LeafCheck = Callable[[Any, str], None]
_UNSIGNED = {k: np.dtype(f"u{k}") for k in (1, 2, 4, 8)}


class ActionChecker:
    """Validates batched actions against a single-env action space.

    Args:
        space: The single-env action space.
        num_envs: Batch size.
        envs_per_worker: Used to name the worker in messages.
    """

    def __init__(self, space: gym.Space[Any], num_envs: int, envs_per_worker: int) -> None:
        self.space = space
        self.num_envs = num_envs
        self.envs_per_worker = envs_per_worker
        self._check = self._compile(space, "actions")

    def check(self, actions: Any, env_ids: Any = None) -> None:
        """Raise ``ValueError`` naming the env if ``actions`` does not fit the batched space.

        Args:
            actions: The batch.
            env_ids: Global env index of each row, when the batch is a subset of
                the envs (``send``); messages name those envs.
        """
        self._env_ids = env_ids
        try:
            self._check(actions, "actions")
        finally:
            self._env_ids = None

    # ------------------------------------------------------------------ compile

    _env_ids: Any = None

    def _where(self, flat_index: int) -> str:
        if self._env_ids is not None:
            flat_index = int(self._env_ids[flat_index])
        return f"env {flat_index} (worker {flat_index // self.envs_per_worker})"

    def _compile(self, space: gym.Space[Any], path: str) -> _LeafCheck:
        if isinstance(space, gym.spaces.Dict):
            parts = {k: self._compile(s, f"{path}[{k!r}]") for k, s in space.spaces.items()}

            def check_dict(x: Any, p: str) -> None:
                if not isinstance(x, dict) or x.keys() != parts.keys():
                    keys = sorted(x) if isinstance(x, dict) else type(x).__name__
                    raise ValueError(f"{p} must be a dict with keys {sorted(parts)}, got {keys}")
                for k, c in parts.items():
                    c(x[k], f"{p}[{k!r}]")

            return check_dict
        if isinstance(space, gym.spaces.Tuple):
            items = [self._compile(s, f"{path}[{i}]") for i, s in enumerate(space.spaces)]

            def check_tuple(x: Any, p: str) -> None:
                if not isinstance(x, (tuple, list)) or len(x) != len(items):
                    raise ValueError(
                        f"{p} must be a tuple of {len(items)} batches, got {type(x).__name__}"
                    )
                for i, (c, v) in enumerate(zip(items, x, strict=True)):
                    c(v, f"{p}[{i}]")

            return check_tuple
        if isinstance(space, gym.spaces.Discrete):
            return self._integer_leaf(space, (), int(space.start), int(space.start + space.n) - 1)
        if isinstance(space, gym.spaces.MultiDiscrete):
            return self._integer_leaf(space, space.shape, space.start, space.start + space.nvec - 1)
        if isinstance(space, gym.spaces.MultiBinary):
            return self._integer_leaf(space, space.shape, 0, 1)
        if isinstance(space, gym.spaces.Box):
            return self._box_leaf(space)
        # Text, Graph, Sequence, custom: no batch array to check cheaply; let
        # gymnasium's own membership test speak per env.
        return self._generic_leaf(space)

    def _shape_array(
        self, x: Any, p: str, shape: tuple[int, ...], space: gym.Space[Any]
    ) -> np.ndarray:
        a = np.asarray(x)
        expected = (self.num_envs, *shape)
        if a.shape != expected:
            raise ValueError(
                f"{p} has shape {a.shape}, expected {expected} = (num_envs,) + shape of {space}"
            )
        return a

    def _first_bad(self, bad: np.ndarray) -> int:
        flat = np.flatnonzero(bad.reshape(self.num_envs, -1).any(axis=1))
        return int(flat[0])

    def _integer_leaf(
        self, space: gym.Space[Any], shape: tuple[int, ...], low: Any, high: Any
    ) -> _LeafCheck:
        lo, hi = np.asarray(low), np.asarray(high)
        scalar = lo.ndim == 0 and hi.ndim == 0
        span = int(hi - lo) if scalar else 0

        def check(x: Any, p: str) -> None:
            a = self._shape_array(x, p, shape, space)
            if a.dtype.kind not in "iub":
                where = ""
                if a.dtype.kind == "f" and a.size:
                    fractional = ~np.isfinite(a) | (a != np.round(a))
                    first = self._first_bad(fractional) if fractional.any() else 0
                    where = f"; the action for {self._where(first)} is {a[first].tolist()}"
                raise ValueError(f"{p} has dtype {a.dtype}, expected integers for {space}{where}")
            if scalar:
                if not a.size:
                    return
                if a.dtype.kind == "i":
                    # One reduction instead of min() and max(): shifted to start at
                    # 0 and read as unsigned, a value below the range wraps to a
                    # huge one, so max() alone finds both kinds of offender.
                    shifted = a - lo if lo else a
                    if shifted.view(_UNSIGNED[shifted.dtype.itemsize]).max() <= span:
                        return
                elif a.min() >= lo and a.max() <= hi:
                    return
                bad = (a < lo) | (a > hi)
            else:
                bad = (a < lo) | (a > hi)
                if not bad.any():
                    return
            i = self._first_bad(bad)
            raise ValueError(
                f"{p}: the action for {self._where(i)} is {a[i].tolist()}, outside {space}"
            )

        return check

    def _box_leaf(self, space: gym.spaces.Box) -> _LeafCheck:
        lo, hi = space.low, space.high
        bounded = bool(np.any(np.isfinite(lo)) or np.any(np.isfinite(hi)))
        is_float = np.issubdtype(space.dtype, np.floating)

        def check(x: Any, p: str) -> None:
            a = self._shape_array(x, p, space.shape, space)
            if a.dtype.kind not in "iufb":
                raise ValueError(f"{p} has dtype {a.dtype}, expected numbers for {space}")
            if not is_float and a.dtype.kind == "f":
                # Written into an integer array, 2.5 would become 2 and NaN garbage.
                fractional = ~np.isfinite(a) | (a != np.round(a))
                if fractional.any():
                    i = self._first_bad(fractional)
                    raise ValueError(
                        f"{p} has dtype {a.dtype}: the action for {self._where(i)} is "
                        f"{a[i].tolist()}, not an integer for {space}"
                    )
            if is_float and a.dtype.kind == "f" and not np.isfinite(a).all():
                i = self._first_bad(~np.isfinite(a))
                raise ValueError(
                    f"{p}: the action for {self._where(i)} is {a[i].tolist()}, not finite"
                )
            if bounded:
                bad = (a < lo) | (a > hi)
                if bad.any():
                    i = self._first_bad(bad)
                    raise ValueError(
                        f"{p}: the action for {self._where(i)} is {a[i].tolist()}, outside {space} "
                        "(clip actions to the bounds, or pass check_actions=False)"
                    )

        return check

    def _generic_leaf(self, space: gym.Space[Any]) -> _LeafCheck:
        def check(x: Any, p: str) -> None:
            items = list(x)
            if len(items) != self.num_envs:
                raise ValueError(f"{p} has {len(items)} entries, expected num_envs={self.num_envs}")
            for i, item in enumerate(items):
                if not space.contains(item):
                    raise ValueError(
                        f"{p}: the action for {self._where(i)} is {item!r}, outside {space}"
                    )

        return check


def reset_arguments(
    seed: int | Sequence[int | None] | None, options: dict[str, Any] | None, num_envs: int
) -> tuple[list[int | None], dict[str, Any] | None, np.ndarray | None]:
    """Check ``reset``'s arguments and spread them over the envs, as ``SyncVectorEnv`` does.

    Args:
        seed: ``None`` (random), an int ``s`` (env ``i`` gets ``s + i``), or one per env.
        options: Passed to every env; a ``"reset_mask"`` entry selects the envs to reset.
        num_envs: Batch size.

    Returns:
        One seed per env, the options without ``"reset_mask"`` (the caller's dict is
        not modified), and the mask (``None``: reset all).

    Raises:
        ValueError: A seed list of the wrong length, or a mask that is not a bool
            array of shape ``(num_envs,)`` with at least one ``True``.
    """
    if seed is None:
        seeds: list[int | None] = [None] * num_envs
    elif isinstance(seed, (int, np.integer)):
        seeds = [int(seed) + i for i in range(num_envs)]
    else:
        seeds = list(seed)
        if len(seeds) != num_envs:
            raise ValueError(f"got {len(seeds)} seeds for num_envs={num_envs}: pass one per env")
    mask: np.ndarray | None = None
    if options is not None and "reset_mask" in options:
        options = dict(options)
        mask = options.pop("reset_mask")
        if not isinstance(mask, np.ndarray) or mask.dtype != np.bool_ or mask.shape != (num_envs,):
            raise ValueError(
                f"options['reset_mask'] must be a bool numpy array of shape ({num_envs},), got "
                f"{type(mask).__name__} {getattr(mask, 'dtype', '')} "
                f"{getattr(mask, 'shape', '')}"
            )
        if not mask.any():
            raise ValueError("options['reset_mask'] has no True entry: nothing to reset")
    return seeds, options, mask


def whole_groups(
    env_ids: Sequence[int] | np.ndarray | None, num_envs: int, per_group: int, noun: str
) -> tuple[np.ndarray, list[int]]:
    """Check that ``env_ids`` (for ``send``) cover whole groups of envs; return ids and groups.

    Args:
        env_ids: Global env indices, ``None`` for all.
        num_envs: Batch size.
        per_group: Envs per worker (or per actor).
        noun: ``"workers"`` or ``"actors"``, for the message.

    Raises:
        ValueError: Ids out of range, or ids that split a group.
    """
    ids = np.arange(num_envs) if env_ids is None else np.asarray(env_ids, dtype=np.int64)
    if ids.ndim != 1 or ids.size == 0 or ids.min() < 0 or ids.max() >= num_envs:
        raise ValueError(
            f"env_ids must be a non-empty list of env indices in [0, {num_envs}), "
            f"got {ids.tolist()}"
        )
    groups = sorted(set((ids // per_group).tolist()))
    expected = np.concatenate([np.arange(g * per_group, (g + 1) * per_group) for g in groups])
    if not np.array_equal(np.sort(ids), expected):
        raise ValueError(
            f"env_ids must cover whole {noun} ({per_group} consecutive envs each, as recv "
            f"returns them), got {ids.tolist()}"
        )
    return ids, groups
