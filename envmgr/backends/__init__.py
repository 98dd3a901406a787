"""Backends that run envmgr's envs somewhere other than local worker processes.

* :mod:`envmgr.backends.ray` -- :class:`~envmgr.backends.ray.RayEnvManager`, the
  same batched ``VectorEnv`` with its envs in Ray actors spread over a cluster
  (``pip install "envmgr[ray]"``).

Importing this package (or :mod:`envmgr.backends.ray`) never imports Ray: Ray is
imported when a manager is built, so ``import envmgr`` works without it.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RayEnvManager"]


def __getattr__(name: str) -> Any:
    # Lazy, so ``import envmgr.backends`` costs nothing and needs no Ray.
    if name == "RayEnvManager":
        from envmgr.backends.ray import RayEnvManager

        return RayEnvManager
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
