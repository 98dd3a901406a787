"""Envs whose observations change size from step to step (Sequence and Graph spaces)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

FEATURES = 4


def entity_space() -> spaces.Dict:
    """``Dict(global=Box, entities=Dict(type_a=Sequence(Box), type_b=Sequence(Box)))``."""
    return spaces.Dict(
        {
            "global": spaces.Box(-1.0, 1.0, (3,), np.float32),
            "entities": spaces.Dict(
                {
                    "type_a": spaces.Sequence(
                        spaces.Box(-1.0, 1.0, (FEATURES,), np.float32), stack=True
                    ),
                    "type_b": spaces.Sequence(spaces.Box(-1.0, 1.0, (2,), np.float32), stack=True),
                }
            ),
        }
    )


class EntityEnv(gym.Env):  # type: ignore[type-arg]
    """Seeded entity lists of 0 to ``max_len - 1`` entities; from step ``jump_at`` on,
    ``type_a`` has ``jump`` more (past any capacity set so far). Episodes of 5 steps."""

    def __init__(self, max_len: int = 6, jump_at: int | None = None, jump: int = 40) -> None:
        self.observation_space = entity_space()
        self.action_space = spaces.Discrete(2)
        self.max_len, self.jump_at, self.jump = max_len, jump_at, jump
        self.t = 0
        self.total = 0  # steps over every episode: the jump lasts across resets

    def _obs(self) -> dict[str, Any]:
        r = self.np_random
        la, lb = (int(x) for x in r.integers(0, self.max_len, 2))
        if self.jump_at is not None and self.total >= self.jump_at:
            la += self.jump
        return {
            "global": r.uniform(-1, 1, 3).astype(np.float32),
            "entities": {
                "type_a": r.uniform(-1, 1, (la, FEATURES)).astype(np.float32),
                "type_b": r.uniform(-1, 1, (lb, 2)).astype(np.float32),
            },
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        self.total += 1
        return self._obs(), float(action), self.t >= 5, False, {}


class GraphEnv(gym.Env):  # type: ignore[type-arg]
    """A seeded ``Graph(Box(2), Discrete(4))`` of 1-7 nodes and 0-11 edges; episodes of 4."""

    def __init__(self) -> None:
        self.observation_space = spaces.Graph(
            spaces.Box(-1.0, 1.0, (2,), np.float32), spaces.Discrete(4)
        )
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> Any:
        r = self.np_random
        n, m = int(r.integers(1, 8)), int(r.integers(0, 12))
        return spaces.GraphInstance(
            r.uniform(-1, 1, (n, 2)).astype(np.float32),
            r.integers(0, 4, m),
            r.integers(0, n, (m, 2)).astype(np.int32),
        )

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), float(action), self.t >= 4, False, {}


class BadEntityEnv(EntityEnv):
    """From step ``at`` on, ``type_b``'s elements have 3 features instead of 2."""

    def __init__(self, at: int = 2) -> None:
        super().__init__()
        self.at = at

    def _obs(self) -> dict[str, Any]:
        obs = super()._obs()
        if self.total >= self.at:
            obs["entities"]["type_b"] = np.zeros((2, 3), np.float32)
        return obs


def hosted_entities(n: int) -> gym.vector.VectorEnv:  # type: ignore[type-arg]
    """A SyncVectorEnv of ``n`` entity envs (a VectorEnv hosted by each group)."""
    return gym.vector.SyncVectorEnv([EntityEnv] * n)


def order_space(nested: bool = True) -> spaces.Space[Any]:
    """One order per entity: ``Dict(move=Discrete, targets=Sequence(Box), picks=Sequence(
    Discrete, stack=False))``, or (``nested=False``) the bare ``Sequence(Box)``."""
    targets = spaces.Sequence(spaces.Box(-1.0, 1.0, (2,), np.float32), stack=True)
    if not nested:
        return targets
    return spaces.Dict(
        {
            "move": spaces.Discrete(3),
            "targets": targets,
            "picks": spaces.Sequence(spaces.Discrete(5), stack=False),
        }
    )


class OrdersEnv(gym.Env):  # type: ignore[type-arg]
    """Takes one order per entity (a Sequence action space) and observes them back.

    Its observation echoes the targets it was given and its reward sums the orders, so a
    batch tells whether each env got exactly its own orders; it refuses an order of any
    other type than Gymnasium's batch form gives an env (an array of the element dtype for
    ``stack=True``, a tuple of numpy integers for ``stack=False``). Episodes of 6 steps.
    """

    def __init__(self, nested: bool = True) -> None:
        self.nested = nested
        self.action_space = order_space(nested)
        self.observation_space = spaces.Dict(
            {
                "echo": spaces.Sequence(spaces.Box(-1.0, 1.0, (2,), np.float32), stack=True),
                "seen": spaces.Box(0, 1 << 20, (1,), np.int64),
            }
        )
        self.t = 0
        self.seen = 0

    def _obs(self, targets: np.ndarray) -> dict[str, Any]:
        return {"echo": targets.copy(), "seen": np.array([self.seen], np.int64)}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(np.zeros((0, 2), np.float32)), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        targets = action["targets"] if self.nested else action
        if type(targets) is not np.ndarray or targets.dtype != np.float32 or targets.ndim != 2:
            raise TypeError(f"targets arrived as {type(targets).__name__} {targets!r}")
        reward = float(targets.sum())
        if self.nested:
            picks, move = action["picks"], action["move"]
            if type(picks) is not tuple or any(type(p) is not np.int64 for p in picks):
                raise TypeError(f"picks arrived as {picks!r}")
            if type(move) is not np.int64:
                raise TypeError(f"move arrived as {type(move).__name__}")
            reward += sum(int(p) for p in picks) + 10 * int(move)
        self.t += 1
        self.seen += len(targets)
        return self._obs(targets), reward, self.t >= 6, False, {}


def orders(
    n: int, steps: int, nested: bool = True, jump: tuple[int, int] | None = None, seed: int = 0
) -> list[Any]:
    """``steps`` batches of orders for ``n`` envs, in Gymnasium's batch form: 0-3 entities
    each; ``jump=(step, env)``: that env gives 40 from that step on."""
    rng = np.random.default_rng(seed)
    out: list[Any] = []
    for t in range(steps):
        lengths = rng.integers(0, 4, n)
        if jump is not None and t >= jump[0]:
            lengths[jump[1]] += 40
        targets = tuple(rng.uniform(-1, 1, (k, 2)).astype(np.float32) for k in lengths)
        if not nested:
            out.append(targets)
            continue
        picks = tuple(tuple(np.int64(p) for p in rng.integers(0, 5, k)) for k in lengths)
        out.append({"move": rng.integers(0, 3, n), "targets": targets, "picks": picks})
    return out


def hosted_orders(n: int) -> gym.vector.VectorEnv:  # type: ignore[type-arg]
    """A SyncVectorEnv of ``n`` order-taking envs (a VectorEnv hosted by each group)."""
    return gym.vector.SyncVectorEnv([OrdersEnv] * n)
