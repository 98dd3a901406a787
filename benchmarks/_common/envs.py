"""Benchmark environments: small, deterministic ``gymnasium.Env`` classes.

Each env isolates one cost a vector env manager has to deal with:

* :class:`NoopEnv` -- almost no work per step, so a benchmark measures the
  manager's own per-step overhead.
* :class:`ComputeEnv` -- a fixed amount of pure-Python CPU work per step
  (about 70 µs on the 2-core reference machine), the case where spreading envs
  over processes should pay off.
* :class:`ImageEnv` -- an 84x84x4 uint8 observation (Atari-sized), so the cost of
  moving observations between processes shows.
* :class:`StragglerEnv` -- mostly cheap steps (~20 µs) with a seeded 1-in-20
  slow step (~2 ms), so a batch waits for its slowest env.

CPU work is a fixed number of iterations of an integer LCG in pure Python: the
same work every step, on every machine, never ``time.sleep``. The iteration
counts below were calibrated once on the reference machine (about 75 ns per
iteration there) and are constants from then on; ``python -m benchmarks._common.envs``
prints what a step of each env costs on the current machine.

The module has no dependency on envmgr, and its factories (:data:`FACTORIES`)
are module-level functions. The harness registers this module with
``cloudpickle.register_pickle_by_value`` (see :func:`make_picklable`): worker processes
then get the classes by value and never need to import this package (which is not
installed), under ``fork``, ``forkserver`` and ``spawn`` alike.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np

__all__ = [
    "NoopEnv",
    "NoopInfoEnv",
    "ComputeEnv",
    "ImageEnv",
    "StragglerEnv",
    "make_cartpole",
    "FACTORIES",
    "VECTOR_FACTORIES",
    "ENV_IDS",
    "busy_work",
    "make_picklable",
    "register",
    "measure_step_cost",
]

#: Iterations of :func:`busy_work` per ComputeEnv step (~70 µs on the reference machine).
COMPUTE_ITERATIONS = 900
#: Iterations of a normal StragglerEnv step (~20 µs) ...
STRAGGLER_FAST_ITERATIONS = 270
#: ... and of its slow step (~2 ms), taken with probability STRAGGLER_SLOW_PROBABILITY.
STRAGGLER_SLOW_ITERATIONS = 27_000
STRAGGLER_SLOW_PROBABILITY = 1.0 / 20.0

EPISODE_LENGTH = 200


def busy_work(iterations: int, x: int = 1) -> int:
    """Deterministic pure-Python CPU work: ``iterations`` steps of a 31-bit LCG."""
    for _ in range(iterations):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
    return x


class _CountingEnv(gym.Env[np.ndarray, np.int64]):
    """Shared episode bookkeeping: truncates after ``EPISODE_LENGTH`` steps."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self) -> None:
        self._t = 0

    def bench_module_imported(self) -> bool:
        """Whether this module has been imported by name in the current process.

        False in a worker that got the classes by value (see :func:`make_picklable`).
        """
        return __name__ in sys.modules

    def _advance(self) -> bool:
        self._t += 1
        return self._t >= EPISODE_LENGTH


class NoopEnv(_CountingEnv):
    """Does nothing: Box(4,) float32 observations (one preallocated array), Discrete(2).

    Episodes last 200 steps (truncated); reward 1.0 per step.
    """

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(4, dtype=np.float32)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action):
        return self._obs, 1.0, False, self._advance(), {}


class NoopInfoEnv(NoopEnv):
    """:class:`NoopEnv` whose every step says what HalfCheetah-v5's does: four numeric info
    keys (numpy scalars), so an info's whole path through a manager is timed, not the env.
    """

    def step(self, action):
        t = np.float64(self._t)
        info = {"x_position": t, "x_velocity": t, "reward_forward": t, "reward_ctrl": -t}
        return self._obs, 1.0, False, self._advance(), info


class ComputeEnv(_CountingEnv):
    """A fixed ``COMPUTE_ITERATIONS`` of pure-Python work per step (~70 µs), deterministic.

    Box(4,) float32 observations carrying the LCG state (so the work is used), Discrete(2),
    200-step episodes.
    """

    def __init__(self, iterations: int = COMPUTE_ITERATIONS) -> None:
        super().__init__()
        self.iterations = iterations
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(4, dtype=np.float32)
        self._x = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        self._x = 1
        self._obs[:] = 0.0
        return self._obs, {}

    def step(self, action):
        self._x = busy_work(self.iterations, self._x + int(action))
        self._obs[0] = self._x / 2147483648.0
        return self._obs, 1.0, False, self._advance(), {}


class ImageEnv(_CountingEnv):
    """Atari-sized frames: 84x84x4 uint8 observations, Discrete(6), 200-step episodes.

    Each step overwrites one of the four channels with a value that changes every step
    (a ~7 KB fill): cheap, but every byte of the 28 KB observation has to travel.
    """

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Box(0, 255, shape=(84, 84, 4), dtype=np.uint8)
        self.action_space = gym.spaces.Discrete(6)
        self._obs = np.zeros((84, 84, 4), dtype=np.uint8)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        self._obs[:] = 0
        return self._obs, {}

    def step(self, action):
        truncated = self._advance()
        self._obs[:, :, self._t % 4] = (self._t * 7 + int(action)) & 0xFF
        return self._obs, 0.0, False, truncated, {}


class StragglerEnv(_CountingEnv):
    """Uneven steps: ~20 µs usually, ~2 ms with probability 1/20, from the env's seeded RNG.

    ``reset(seed=s)`` fixes which steps are slow, so every implementation seeded the same
    way sees the same slow steps. Box(4,) float32 observations, Discrete(2), 200-step
    episodes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.observation_space = gym.spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._obs = np.zeros(4, dtype=np.float32)
        self._x = 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        self._t = 0
        self._x = 1
        return self._obs, {}

    def step(self, action):
        slow = self.np_random.random() < STRAGGLER_SLOW_PROBABILITY
        n = STRAGGLER_SLOW_ITERATIONS if slow else STRAGGLER_FAST_ITERATIONS
        self._x = busy_work(n, self._x + int(action))
        self._obs[0] = self._x / 2147483648.0
        return self._obs, 1.0, False, self._advance(), {}


def make_noop() -> gym.Env:
    return NoopEnv()


def make_noop_info() -> gym.Env:
    return NoopInfoEnv()


def make_compute() -> gym.Env:
    return ComputeEnv()


def make_image() -> gym.Env:
    return ImageEnv()


def make_straggler() -> gym.Env:
    return StragglerEnv()


def make_cartpole() -> gym.Env:
    """Gymnasium's CartPole-v1 with its standard wrappers (TimeLimit 500, checkers)."""
    return gym.make("CartPole-v1")


#: Short benchmark name -> zero-argument factory.
FACTORIES: dict[str, Callable[[], gym.Env]] = {
    "noop": make_noop,
    "noop-info": make_noop_info,
    "cartpole": make_cartpole,
    "compute": make_compute,
    "image": make_image,
    "straggler": make_straggler,
}

#: Short benchmark name -> ``n -> VectorEnv``: a batched env of its own (filled at import by
#: ``realenv_peers``, as it adds its real envs to :data:`FACTORIES`).
VECTOR_FACTORIES: dict[str, Callable[[int], gym.vector.VectorEnv]] = {}

#: Gymnasium ids registered by :func:`register` (CartPole keeps its own id).
ENV_IDS = {
    "noop": "envmgr-bench/Noop-v0",
    "compute": "envmgr-bench/Compute-v0",
    "image": "envmgr-bench/Image-v0",
    "straggler": "envmgr-bench/Straggler-v0",
}


def register() -> None:
    """Register the benchmark envs with gymnasium (idempotent); ``gym.make(ENV_IDS[...])``."""
    classes = {"noop": NoopEnv, "compute": ComputeEnv, "image": ImageEnv, "straggler": StragglerEnv}
    for name, env_id in ENV_IDS.items():
        if env_id not in gym.registry:
            gym.register(id=env_id, entry_point=classes[name])


def make_picklable() -> None:
    """Make this module's factories and classes travel by value to worker processes.

    ``benchmarks`` is not an installed package, so a spawn/forkserver worker might not
    import this module by name. With ``register_pickle_by_value`` cloudpickle (used by
    envmgr and by ``AsyncVectorEnv`` for env factories) ships the code itself.
    """
    import cloudpickle

    module = sys.modules[__name__]
    if module.__name__ == "__main__":
        return  # run as a script: cloudpickle already pickles __main__ by value
    try:
        cloudpickle.register_pickle_by_value(module)
    except ValueError:
        pass  # already registered


def measure_step_cost(name: str, steps: int = 2000, seed: int = 0) -> float:
    """Median µs of one ``env.step`` of env ``name`` in this process (autoresetting)."""
    env = FACTORIES[name]()
    env.reset(seed=seed)
    env.action_space.seed(seed)
    times = []
    for _ in range(steps):
        a = env.action_space.sample()
        t0 = time.perf_counter()
        _, _, term, trunc, _ = env.step(a)
        times.append(time.perf_counter() - t0)
        if term or trunc:
            env.reset()
    env.close()
    return float(np.median(times) * 1e6)


def _mean_step_cost(name: str, steps: int = 2000, seed: int = 0) -> float:
    env = FACTORIES[name]()
    env.reset(seed=seed)
    t0 = time.perf_counter()
    for _ in range(steps):
        _, _, term, trunc, _ = env.step(0)
        if term or trunc:
            env.reset()
    dt = time.perf_counter() - t0
    env.close()
    return dt / steps * 1e6


if __name__ == "__main__":
    print("per-step cost in this process (µs): median / mean over 2000 steps")
    for env_name in FACTORIES:
        print(
            f"  {env_name:10s} {measure_step_cost(env_name):8.1f}"
            f" / {_mean_step_cost(env_name):8.1f}"
        )
    t0 = time.perf_counter()
    busy_work(STRAGGLER_SLOW_ITERATIONS)
    print(f"  straggler slow step: {(time.perf_counter() - t0) * 1e6:.0f} µs")
