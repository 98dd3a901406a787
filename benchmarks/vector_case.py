"""The ``cartpole-vector`` case of ``throughput.py``: batched envs, thousands at a time.

The envs that reach millions of steps per second are batched: one object steps many envs
with array operations (Gymnasium's ``CartPoleVectorEnv``). The implementations compared:

* ``vector``: that env in this process,
  ``gymnasium.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")``;
* ``ceiling``: ``W`` independent processes, each stepping its ``n / W`` envs as such an
  in-process vector env at the same time (no communication): the machine's ceiling;
* ``envmgr-hosted``: envmgr hosting one vector env per worker,
  ``envmgr.make("CartPole-v1", num_envs=n, n_workers=W, vectorization_mode="vector_entry_point")``
  (only where envmgr has the feature; otherwise the column says why it is missing);
* ``envmgr``: envmgr with ``n`` single CartPole envs (up to :data:`SINGLE_ENV_LIMIT` envs;
  beyond that one sample takes too long to be worth it);
* ``envpool``: EnvPool's C++ CartPole where it is installed.
"""

from __future__ import annotations

import inspect
from typing import Any

import gymnasium as gym

import envmgr
from envmgr import SubprocessEnvManager

#: Vector benchmark envs -> (gymnasium id, the single-env benchmark env of the same dynamics).
VECTOR_ENVS = {"cartpole-vector": ("CartPole-v1", "cartpole")}
#: Implementations of the vector case, in table order.
VECTOR_IMPLS = ["vector", "ceiling", "envmgr-hosted", "envmgr", "envpool"]
#: envmgr with single envs runs up to this many envs.
SINGLE_ENV_LIMIT = 2048


def hosted_status() -> tuple[bool, str]:
    """Whether this envmgr can host a vector env per worker, and why not if it cannot."""
    make_params = inspect.signature(envmgr.make).parameters
    if "vectorization_mode" not in make_params:
        return False, "not available: envmgr.make() has no vectorization_mode (issue 11)"
    manager_params = inspect.signature(SubprocessEnvManager).parameters
    if "vector_env_fn" not in manager_params:
        return False, "not available: SubprocessEnvManager has no vector_env_fn (issue 11)"
    return True, "available"


def build_vector(env_id: str, n: int) -> Any:
    """The in-process batched env of ``n`` envs."""
    return gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point")


def build_hosted(env_id: str, n: int, workers: int) -> Any:
    """envmgr hosting one batched env of ``n / workers`` envs in each worker."""
    make: Any = envmgr.make  # the keyword arrives with issue 11; checked by hosted_status()
    return make(env_id, num_envs=n, n_workers=workers, vectorization_mode="vector_entry_point")


def skip_reason(impl: str, n: int, hosted: tuple[bool, str]) -> str | None:
    """``None`` if ``impl`` runs in the vector case at ``n`` envs; else why it is skipped."""
    if impl == "envmgr-hosted" and not hosted[0]:
        return f"envmgr hosting {hosted[1]}"
    if impl == "envmgr" and n > SINGLE_ENV_LIMIT:
        return f"single envs only up to {SINGLE_ENV_LIMIT} envs (too slow beyond)"
    return None
