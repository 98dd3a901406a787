"""The implementations ``throughput.py`` times side by side, and how each is built."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv

from benchmarks._common import envs as bench_envs
from benchmarks._common import vector_case
from benchmarks._common.ceiling import Ceiling, LockStep, SerialLoop
from envmgr import SubprocessEnvManager

#: Every implementation, in table order.
ALL_IMPLS = [
    "serial",
    "ceiling",
    "lockstep",
    "sync",
    "async",
    "envmgr",
    "envmgr-nocopy",
    "envmgr-firstready",
    "envmgr-caller",
    "envmgr-hosted",
    "envmgr-hosted-caller",
    "vector",
    "envpool",
]
#: What runs when ``--impls`` is not given (the vector case adds its own two). First-ready
#: is in: issue 13 compares both of envmgr's modes with the ceiling.
DEFAULT_IMPLS = [
    "serial",
    "ceiling",
    "lockstep",
    "sync",
    "async",
    "envmgr",
    "envmgr-firstready",
    "envmgr-caller",
    "envpool",
]
#: The envmgr variants whose ratios to the peers are reported, and the peers.
MINE = [
    "envmgr",
    "envmgr-nocopy",
    "envmgr-firstready",
    "envmgr-caller",
    "envmgr-hosted",
    "envmgr-hosted-caller",
]
PEERS = ["serial", "ceiling", "lockstep", "sync", "async", "envpool", "vector"]
#: Implementations that exist only in the vector case.
VECTOR_ONLY = ["vector", "envmgr-hosted", "envmgr-hosted-caller"]
ENVPOOL_ENVS = {"cartpole": "CartPole-v1", "cartpole-vector": "CartPole-v1"}


class FirstReady:
    """envmgr's first-ready mode: each ``step`` call does one batch's worth of env
    steps through ``send``/``recv``, serving whichever worker finishes first."""

    def __init__(self, factory: Any, n: int, workers: int) -> None:
        self.mgr = SubprocessEnvManager(factory, n_workers=workers, envs_per_worker=n // workers)
        self.workers = workers
        self.per_worker = n // workers
        self.started = False

    def reset(self, seed: int | None = None) -> Any:
        return self.mgr.reset(seed=seed)

    def step(self, actions: np.ndarray) -> None:
        mgr = self.mgr
        if not self.started:
            mgr.send(actions)
            self.started = True
        for _ in range(self.workers):
            *_, ids = mgr.recv(batch_size=self.per_worker)
            mgr.send(actions[ids], ids)

    def close(self) -> None:
        self.mgr.close()


class EnvpoolCartPole:
    """envpool's C++ CartPole-v1, seeded at construction (envpool's reset takes no seed)."""

    def __init__(self, n: int, threads: int, seed: int = 0) -> None:
        import envpool

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.env = envpool.make(
                "CartPole-v1", env_type="gymnasium", num_envs=n, num_threads=threads, seed=seed
            )

    def reset(self, *, seed: int | None = None) -> Any:
        return self.env.reset()

    def step(self, actions: np.ndarray) -> Any:
        return self.env.step(actions)

    def close(self) -> None:
        self.env.close()


def envpool_status() -> tuple[bool, str]:
    """Whether envpool works here (a real make + reset + step), and why not if it does not."""
    try:
        import envpool  # noqa: F401

        e = EnvpoolCartPole(4, 1)
        e.reset(seed=0)
        e.step(np.zeros(4, dtype=np.int64))
        e.close()
        return True, f"envpool {envpool.__version__}"
    except Exception as exc:  # ImportError, missing shared libraries, ABI mismatch ...
        return False, f"{type(exc).__name__}: {exc}".strip()[:300]


def base_env(env: str) -> str:
    """The single-env benchmark env behind ``env`` (itself, unless ``env`` is a vector case)."""
    return vector_case.VECTOR_ENVS[env][1] if env in vector_case.VECTOR_ENVS else env


def build(impl: str, env: str, n: int, workers: int, actions: np.ndarray) -> Any:
    """Construct implementation ``impl`` stepping ``n`` copies of benchmark env ``env``.

    ``actions`` (the configuration's action batches) go to the ceiling's processes.
    """
    factory = bench_envs.FACTORIES[base_env(env)]
    if impl == "ceiling":
        if env in vector_case.VECTOR_ENVS:
            return Ceiling("vector", vector_case.VECTOR_ENVS[env][0], actions, workers)
        return Ceiling("serial", env, actions, workers)
    if impl == "lockstep":
        if env in vector_case.VECTOR_ENVS:
            return LockStep("vector", vector_case.VECTOR_ENVS[env][0], actions, workers)
        return LockStep("serial", env, actions, workers)
    if impl == "vector":
        return vector_case.build_vector(vector_case.VECTOR_ENVS[env][0], n)
    if impl == "envmgr-hosted":
        return vector_case.build_hosted(vector_case.VECTOR_ENVS[env][0], n, workers)
    if impl == "envmgr-hosted-caller":
        return vector_case.build_hosted(vector_case.VECTOR_ENVS[env][0], n, workers, caller=True)
    if impl == "serial":
        return SerialLoop(factory, n)
    if impl == "sync":
        return SyncVectorEnv([factory] * n)
    if impl == "async":
        return AsyncVectorEnv([factory] * n, shared_memory=True)
    if impl in ("envmgr", "envmgr-nocopy"):
        return SubprocessEnvManager(
            factory, n_workers=workers, envs_per_worker=n // workers, copy=(impl == "envmgr")
        )
    if impl == "envmgr-firstready":
        return FirstReady(factory, n, workers)
    if impl == "envmgr-caller":
        # Two cores, two processes: the caller steps one block itself (caller_envs), as
        # in the ceiling; workers - 1 worker processes step the others.
        share = n // workers
        return SubprocessEnvManager(
            factory, n_workers=workers - 1, envs_per_worker=share, caller_envs=share
        )
    if impl == "envpool":
        return EnvpoolCartPole(n, threads=workers)
    raise ValueError(f"unknown implementation {impl!r}")


def wanted(env: str, impls: list[str], nocopy_envs: list[str]) -> list[str]:
    """The implementations asked for on ``env``, in table order."""
    if env in vector_case.VECTOR_ENVS:
        always = [*VECTOR_ONLY, "lockstep"]
        return [i for i in vector_case.VECTOR_IMPLS if i in impls or i in always]
    return [
        i
        for i in ALL_IMPLS
        if i not in VECTOR_ONLY and (i in impls or (i == "envmgr-nocopy" and env in nocopy_envs))
    ]


def skip_reason(impl: str, env: str, n: int, workers: int, envpool_ok: bool) -> str | None:
    """``None`` if ``impl`` runs on (env, n); else the reason it is skipped."""
    if impl in MINE and n % workers:
        return f"n_envs={n} is not a multiple of --workers={workers}"
    if impl == "envmgr-caller" and workers < 2:
        return "needs --workers >= 2 (one block is the caller's)"
    if impl in ("ceiling", "lockstep") and n < workers:
        return f"n_envs={n} is below --workers={workers}"
    if env in vector_case.VECTOR_ENVS:
        reason = vector_case.skip_reason(impl, n)
        if reason is not None:
            return reason
    if impl == "envpool":
        if env not in ENVPOOL_ENVS:
            return "envpool has no equivalent of this env"
        if not envpool_ok:
            return "envpool unavailable"
    return None
