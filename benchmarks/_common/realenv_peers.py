"""The real envs of ``realenv.py`` and the peers ``peers.py`` does not build.

Importing this module adds the real envs to ``envs.FACTORIES`` (where ``ceiling.py``,
``peers.py`` and ``timing.py`` look envs up by name) and makes it travel by value to
worker processes, as ``envs.make_picklable`` does for the synthetic envs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np

from benchmarks._common import envs as bench_envs
from benchmarks._common import peers

ALL_ENVS = ["pong", "halfcheetah", "humanoid"]
#: Table order. ``peers.build`` builds the first six; this module the rest.
ALL_IMPLS = [
    "serial",
    "ceiling",
    "lockstep",
    "doorbell",
    "envmgr",
    "envmgr-firstready",
    "envmgr-caller",
    "async",
    "subproc",
    "puffer-2",
    "puffer-1",
    "envpool",
]
#: ale-py's own batched Atari env, run only when asked for (``--impls``): the same Pong
#: preprocessing done in C++, by itself and hosted in envmgr's workers (Pong only).
ALE_VECTOR_IMPLS = [
    "ale-vector-ceiling",
    "ale-vector",
    "envmgr-ale-vector",
    "envmgr-ale-vector-caller",
]
KNOWN_IMPLS = ALL_IMPLS + ALE_VECTOR_IMPLS
#: Implementations that time themselves (no reset or runner of the harness's).
OWN_TIMING = {"ceiling", "lockstep", "ale-vector-ceiling"}
ENVMGR_LAYOUTS = ["envmgr", "envmgr-firstready", "envmgr-caller"]
LABELS = {
    "serial": "serial",
    "ceiling": "ceiling",
    "lockstep": "lock-step",
    "doorbell": "lock-step, sleeping parent",
    "envmgr": "envmgr step",
    "envmgr-firstready": "first-ready",
    "envmgr-caller": "caller_envs",
    "async": "AsyncVectorEnv",
    "subproc": "SB3 SubprocVecEnv",
    "puffer-2": "PufferLib MP 2w",
    "puffer-1": "PufferLib MP 1w",
    "envpool": "EnvPool (own C++ port)",
    "ale-vector-ceiling": "ale-py vector: ceiling",
    "ale-vector": "ale-py vector, 2 threads",
    "envmgr-ale-vector": "envmgr hosting it",
    "envmgr-ale-vector-caller": "envmgr hosting it, caller_envs",
}
#: EnvPool's own C++ ports of each env (not the same code as the Python envs).
ENVPOOL_IDS = {"pong": "Pong-v5", "halfcheetah": "HalfCheetah-v4", "humanoid": "Humanoid-v4"}


def make_pong() -> gym.Env[Any, Any]:
    """Pong as issue 21 measures it: 4-frame skip in the wrapper, 84x84 grey, 4 stacked."""
    import ale_py

    gym.register_envs(ale_py)
    env = gym.make("ALE/Pong-v5", frameskip=1)
    env = gym.wrappers.AtariPreprocessing(
        env, frame_skip=4, screen_size=84, grayscale_obs=True, noop_max=30
    )
    return gym.wrappers.FrameStackObservation(env, 4)


def make_halfcheetah() -> gym.Env[Any, Any]:
    return gym.make("HalfCheetah-v5")


def make_humanoid() -> gym.Env[Any, Any]:
    return gym.make("Humanoid-v5")


def make_pong_vector(n: int, threads: int = 1) -> gym.vector.VectorEnv[Any, Any, Any]:
    """ale-py's own batched Pong (``AtariVectorEnv``, ``ALE/Pong-v5``'s vector entry point):
    ``pong``'s preprocessing (4-frame skip with max-pooling, 84x84 grey, 30 no-ops, 4 stacked)
    done in C++ over ``threads`` threads; one per process wherever processes share the cores."""
    import ale_py

    gym.register_envs(ale_py)
    return gym.make_vec(
        "ALE/Pong-v5", num_envs=n, vectorization_mode="vector_entry_point", num_threads=threads
    )


REAL_FACTORIES: dict[str, Callable[[], gym.Env[Any, Any]]] = {
    "pong": make_pong,
    "halfcheetah": make_halfcheetah,
    "humanoid": make_humanoid,
}
# Added at import; the ceiling's processes get the factory itself (ceiling.block_maker).
bench_envs.FACTORIES.update(REAL_FACTORIES)
bench_envs.VECTOR_FACTORIES["pong"] = make_pong_vector
# By value: forkserver and spawn workers need not find this file on their sys.path.

try:
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
except ValueError:
    pass  # already registered


class Sb3Subproc:
    """SB3's ``SubprocVecEnv``: one process per env, started with ``fork``.

    Its default, ``forkserver``, makes each of the ``n`` processes import torch again (SB3's
    worker function lives in a module that imports it): 4 s per process on a loaded 2-core
    machine, set-up time that says nothing about stepping. Forked, they start as Gymnasium's
    AsyncVectorEnv does here.
    """

    def __init__(self, factory: Callable[[], gym.Env[Any, Any]], n: int) -> None:
        from stable_baselines3.common.vec_env import SubprocVecEnv

        self.vec = SubprocVecEnv([factory] * n, start_method="fork")

    def reset(self, *, seed: int | None = None) -> Any:
        self.vec.seed(seed)  # SB3 takes the seed here, for the next reset
        return self.vec.reset()

    def step(self, actions: np.ndarray) -> Any:
        return self.vec.step(actions)

    def close(self) -> None:
        self.vec.close()


class PufferMultiprocessing:
    """PufferLib 3's ``Multiprocessing`` backend, ``workers`` processes, whole batches."""

    def __init__(self, factory: Callable[[], gym.Env[Any, Any]], n: int, workers: int) -> None:
        import pufferlib.emulation
        import pufferlib.vector

        def creator(*args: Any, **kwargs: Any) -> Any:
            return pufferlib.emulation.GymnasiumPufferEnv(env_creator=factory, **kwargs)

        # overwork=True: PufferLib refuses more workers than physical cores, and a 2-vCPU
        # VM may report one.
        self.vec = pufferlib.vector.make(
            creator,
            backend=pufferlib.vector.Multiprocessing,
            num_envs=n,
            num_workers=workers,
            batch_size=n,
            overwork=True,
        )

    def reset(self, *, seed: int | None = None) -> Any:
        return self.vec.reset(seed=0 if seed is None else seed)

    def step(self, actions: np.ndarray) -> Any:
        return self.vec.step(actions)

    def close(self) -> None:
        self.vec.close()


class EnvpoolPort:
    """EnvPool's own C++ port of ``env`` (``ENVPOOL_IDS``), ``threads`` threads, seeded once."""

    def __init__(self, env: str, n: int, threads: int, seed: int = 0) -> None:
        import warnings

        import envpool

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # its gym/gymnasium compatibility notices
            self.vec = envpool.make(
                ENVPOOL_IDS[env], env_type="gymnasium", num_envs=n, num_threads=threads, seed=seed
            )

    def reset(self, *, seed: int | None = None) -> Any:
        return self.vec.reset()

    def step(self, actions: np.ndarray) -> Any:
        return self.vec.step(actions)

    def close(self) -> None:
        self.vec.close()


def build(impl: str, env: str, n: int, workers: int, actions: np.ndarray) -> Any:
    """Implementation ``impl`` stepping ``n`` copies of ``env``."""
    factory = REAL_FACTORIES[env]
    if impl == "subproc":
        return Sb3Subproc(factory, n)
    if impl.startswith("puffer-"):
        return PufferMultiprocessing(factory, n, int(impl.split("-")[1]))
    if impl == "envpool":
        return EnvpoolPort(env, n, workers)
    if impl in ALE_VECTOR_IMPLS:
        return _ale_vector(impl, n, workers, actions)
    if impl == "doorbell":
        from benchmarks._common.floor import FloorPingPong
        from envmgr.managers.local import DEFAULT_SPIN_SECONDS

        return FloorPingPong(workers, DEFAULT_SPIN_SECONDS, 0.0, work=(env, actions))
    return peers.build(impl, env, n, workers, actions)


def _ale_vector(impl: str, n: int, workers: int, actions: np.ndarray) -> Any:
    """One of :data:`ALE_VECTOR_IMPLS` over ``n`` Pong envs."""
    from benchmarks._common.ceiling import Ceiling
    from envmgr import SubprocessEnvManager

    if impl == "ale-vector-ceiling":  # W processes, each its n / W envs on one thread
        return Ceiling("vector", "pong", actions, workers)
    if impl == "ale-vector":  # ale-py's own threads in this process, one per worker
        return make_pong_vector(n, threads=workers)
    caller = impl == "envmgr-ale-vector-caller"
    return SubprocessEnvManager(
        None,
        workers - 1 if caller else workers,
        vector_fn=make_pong_vector,
        num_envs=n,
        caller_envs=n // workers if caller else 0,
    )


def skip_reason(impl: str, n: int, workers: int, env: str = "pong") -> str | None:
    """``None`` if ``impl`` runs with ``n`` envs of ``env``; else why it is skipped."""
    if impl in ALE_VECTOR_IMPLS:
        if env != "pong":
            return "ale-py's batched env is Atari's"
        if n % workers or (impl == "envmgr-ale-vector-caller" and workers < 2):
            return f"needs n_envs a multiple of the {workers} workers (and 2 for caller_envs)"
        return None
    if impl.startswith("puffer-") and n % int(impl.split("-")[1]):
        return f"n_envs={n} is not a multiple of PufferLib's workers"
    # peers' rules (n a multiple of the workers, enough envs for the ceiling) for its own
    # implementations; envpool is checked by building it, as is every other peer.
    if impl == "doorbell":
        impl = "lockstep"  # the same processes, woken another way
    mapped = impl if impl in peers.ALL_IMPLS and impl != "envpool" else "serial"
    return peers.skip_reason(mapped, "", n, workers, True)
