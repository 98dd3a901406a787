"""The variable-size benchmark's synthetic entity env, and the plain loop its ceiling runs.

::

    EntityBenchEnv: obs {"global": Box(8), "entities": Sequence(Box(16), stack=True)}
                    8-64 entities a step, ~20 us of work, 500-step episodes
    EntityLoop(n):  n of them stepped one after another, autoreset by hand, nothing kept
                    (one ceiling process; Ceiling.of_blocks runs two)
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "FEATURES",
    "MAX_ENTITIES",
    "MIN_ENTITIES",
    "WORK_SECONDS",
    "EntityBenchEnv",
    "EntityLoop",
    "sample_actions",
]

FEATURES = 16
MIN_ENTITIES, MAX_ENTITIES = 8, 64
WORK_SECONDS = 20e-6
#: Action batches drawn per configuration, walked cyclically.
N_ACTION_BATCHES = 64
EPISODE_STEPS = 500


class EntityBenchEnv(gym.Env):  # type: ignore[type-arg]
    """Entities of 16 features, 8 to 64 of them per step; ``padded`` pads them to 64 in
    a fixed Box (for SB3, which stacks observations)."""

    def __init__(self, padded: bool = False) -> None:
        entities: spaces.Space[Any]
        entities = spaces.Sequence(spaces.Box(-1, 1, (FEATURES,), np.float32), stack=True)
        self.padded = padded
        if padded:
            entities = spaces.Box(-1, 1, (MAX_ENTITIES, FEATURES), np.float32)
        self.observation_space = spaces.Dict(
            {"global": spaces.Box(-1, 1, (8,), np.float32), "entities": entities}
        )
        self.action_space = spaces.Discrete(4)
        self._pool = np.random.default_rng(0).uniform(-1, 1, (256, FEATURES)).astype(np.float32)
        self._global = np.zeros(8, np.float32)
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        n = int(self.np_random.integers(MIN_ENTITIES, MAX_ENTITIES + 1))
        start = int(self.np_random.integers(0, 256 - n))
        entities = self._pool[start : start + n].copy()
        if self.padded:
            full = np.zeros((MAX_ENTITIES, FEATURES), np.float32)
            full[:n] = entities
            entities = full
        return {"global": self._global.copy(), "entities": entities}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        end = time.perf_counter() + WORK_SECONDS
        while time.perf_counter() < end:
            pass
        self.t += 1
        return self._obs(), 0.0, False, self.t >= EPISODE_STEPS, {}


class EntityLoop:
    """``n`` :class:`EntityBenchEnv` stepped in a loop, autoreset by hand on the step an
    episode ends; observations are dropped (the ceiling's work is the envs' alone)."""

    def __init__(self, n: int) -> None:
        self.envs = [EntityBenchEnv() for _ in range(n)]

    def reset(self, *, seed: int | None = None) -> None:
        for i, env in enumerate(self.envs):
            env.reset(seed=None if seed is None else seed + i)

    def step(self, actions: np.ndarray) -> None:
        for env, action in zip(self.envs, actions, strict=True):
            _, _, term, trunc, _ = env.step(action)
            if term or trunc:
                env.reset()

    def close(self) -> None:
        for env in self.envs:
            env.close()


def sample_actions(n: int, seed: int) -> np.ndarray:
    """``(N_ACTION_BATCHES, n)`` random actions of :class:`EntityBenchEnv`."""
    return np.random.default_rng(seed).integers(0, 4, size=(N_ACTION_BATCHES, n))
