"""``reset``'s arguments, checked and spread over the envs before any group is asked."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["reset_arguments"]


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

    The errors are ``AsyncVectorEnv``'s, with its types and messages.

    Raises:
        ValueError: A seed list of the wrong length, a mask of the wrong shape or
            without a ``True`` entry.
        TypeError: A mask that is not a numpy array, or not of dtype ``bool``.
    """
    if seed is None:
        seeds: list[int | None] = [None] * num_envs
    elif isinstance(seed, (int, np.integer)):
        seeds = [int(seed) + i for i in range(num_envs)]
    else:
        seeds = list(seed)
        if len(seeds) != num_envs:
            raise ValueError(
                "If seeds are passed as a list the length must match "
                f"num_envs={num_envs} but got length={len(seeds)}."
            )
    mask: np.ndarray | None = None
    if options is not None and "reset_mask" in options:
        options = dict(options)
        mask = options.pop("reset_mask")
        what = "`options['reset_mask']`"
        if not isinstance(mask, np.ndarray):
            raise TypeError(f"{what} must be a numpy array, got {type(mask)}")
        if mask.shape != (num_envs,):
            raise ValueError(f"{what} must have shape `({num_envs},)`, got {mask.shape}")
        if mask.dtype != np.bool_:
            raise TypeError(f"{what} must have `dtype=np.bool_`, got {mask.dtype}")
        if not mask.any():
            raise ValueError(
                f"{what} must contain a boolean array with at least one True value, "
                f"got reset_mask={mask}"
            )
    return seeds, options, mask
