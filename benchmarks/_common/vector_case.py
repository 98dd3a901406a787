"""The ``cartpole-vector`` case of ``throughput.py``: batched envs, thousands at a time.

The envs that reach millions of steps per second are batched: one object steps many envs
with array operations (Gymnasium's ``CartPoleVectorEnv``). The implementations compared:

* ``vector``: that env in this process,
  ``gymnasium.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")``;
* ``ceiling``: ``W`` independent processes, each stepping its ``n / W`` envs as such an
  in-process vector env at the same time (no communication): the machine's ceiling;
* ``lockstep``: the same ``W`` processes stepping in lock-step through a bare
  shared-memory barrier (this process is one of them), nothing else exchanged: the most a
  step-then-wait design can reach here (``ceiling.LockStep``);
* ``envmgr-hosted``: envmgr hosting one vector env per worker,
  ``envmgr.make("CartPole-v1", num_envs=n, n_workers=W, vectorization_mode="vector_entry_point")``;
* ``envmgr-hosted-caller``: the same with the caller hosting the last block
  (``n_workers=W - 1``, ``vector_kwargs={"caller_envs": n // W}``);
* ``envmgr``: envmgr with ``n`` single CartPole envs (up to :data:`SINGLE_ENV_LIMIT` envs;
  beyond that one sample takes too long to be worth it);
* ``envpool``: EnvPool's C++ CartPole where it is installed.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

import envmgr

#: Vector benchmark envs -> (gymnasium id, the single-env benchmark env of the same dynamics).
VECTOR_ENVS = {"cartpole-vector": ("CartPole-v1", "cartpole")}
#: Implementations of the vector case, in table order.
VECTOR_IMPLS = [
    "vector",
    "ceiling",
    "lockstep",
    "envmgr-hosted",
    "envmgr-hosted-caller",
    "envmgr",
    "envpool",
]
#: envmgr with single envs runs up to this many envs.
SINGLE_ENV_LIMIT = 2048


def build_vector(env_id: str, n: int) -> Any:
    """The in-process batched env of ``n`` envs."""
    return gym.make_vec(env_id, num_envs=n, vectorization_mode="vector_entry_point")


def build_hosted(env_id: str, n: int, workers: int, caller: bool = False) -> Any:
    """envmgr hosting one batched env of ``n / workers`` envs per worker, the way users ask.

    ``caller``: the calling process hosts the last block itself (``caller_envs``), so
    ``workers - 1`` worker processes host the others.
    """
    share = n // workers
    return envmgr.make(
        env_id,
        num_envs=n,
        n_workers=workers - 1 if caller else workers,
        vectorization_mode="vector_entry_point",
        vector_kwargs={"caller_envs": share} if caller else None,
    )


def skip_reason(impl: str, n: int) -> str | None:
    """``None`` if ``impl`` runs in the vector case at ``n`` envs; else why it is skipped."""
    if impl == "envmgr" and n > SINGLE_ENV_LIMIT:
        return f"single envs only up to {SINGLE_ENV_LIMIT} envs (too slow beyond)"
    return None
