"""Small, real ``gymnasium.Env`` classes used by the envmgr tests.

Everything here is deterministic given the seed passed to ``reset`` (all
randomness comes from ``self.np_random``), so the same factories run in
worker processes and in a ``SyncVectorEnv`` give identical results.

The module is imported by name (``envs``) in worker processes: pytest puts
``tests/`` on ``sys.path`` and every start method hands the parent's
``sys.path`` to its children (checked by ``test_start_methods.py``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "assert_same_results",
    "DictObsEnv",
    "TextObsEnv",
    "TextActionEnv",
    "BoxActionEnv",
    "BigInfoEnv",
    "ExplodingEnv",
    "EnvBoom",
    "FactoryBoom",
    "UnloadableError",
    "UnloadableErrorEnv",
    "UnpicklableInfoEnv",
    "ExitingEnv",
    "SleepyEnv",
    "assert_same",
    "failing_factory",
    "detonate",
]


class EnvBoom(RuntimeError):
    """Raised by :class:`ExplodingEnv`; a custom type so the parent can tell it apart."""


class FactoryBoom(RuntimeError):
    """Raised by :func:`failing_factory`."""


class UnloadableError(Exception):
    """Pickles fine, but unpickling calls ``cls(message)`` and that needs two args."""

    def __init__(self, a: str, b: str) -> None:
        super().__init__(f"{a}/{b}")


def dict_obs_space() -> spaces.Dict:
    return spaces.Dict(
        {
            "pos": spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32),
            "mode": spaces.Discrete(5),
            "nested": spaces.Tuple(
                (
                    spaces.Box(0, 255, shape=(2, 2), dtype=np.uint8),
                    spaces.Discrete(3, start=-1),
                    spaces.MultiBinary(4),
                )
            ),
        }
    )


class DictObsEnv(gym.Env):  # type: ignore[type-arg]
    """Dict observations (Box + Discrete + a nested Tuple), MultiDiscrete actions.

    Episodes last between 2 and ``max_len`` steps (drawn at reset); they end by
    termination or truncation depending on the drawn length. Infos are present
    on some steps only and carry ints, floats, bools, arrays and a nested dict,
    so the vector infos exercise Gymnasium's ``_key`` masks.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, max_len: int = 9, tag: int = 0, render_mode: str | None = None) -> None:
        self.observation_space = dict_obs_space()
        self.action_space = spaces.MultiDiscrete([3, 4])
        self.max_len = max_len
        self.tag = tag
        self.render_mode = render_mode
        self.t = 0
        self.length = max_len
        self.episodes = 0

    def _obs(self) -> dict[str, Any]:
        r = self.np_random
        return {
            "pos": r.uniform(-1.0, 1.0, size=3).astype(np.float32),
            "mode": np.int64(r.integers(5)),
            "nested": (
                r.integers(0, 256, size=(2, 2), dtype=np.uint8),
                np.int64(r.integers(-1, 2)),
                r.integers(0, 2, size=4, dtype=np.int8),
            ),
        }

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, self.max_len + 1))
        self.episodes += 1
        info: dict[str, Any] = {}
        if self.length % 2 == 0:
            info["length"] = self.length
        if options and "note" in options:
            info["note"] = options["note"]
        return self._obs(), info

    def step(self, action: Any) -> tuple[dict[str, Any], float, bool, bool, dict[str, Any]]:
        assert self.action_space.contains(np.asarray(action, dtype=np.int64)), action
        self.t += 1
        noise = float(self.np_random.normal())
        reward = float(action[0]) + 0.5 * float(action[1]) + noise + self.tag
        done = self.t >= self.length
        terminated = done and self.length % 3 != 0
        truncated = done and not terminated
        info: dict[str, Any] = {}
        if self.t % 2 == 0:
            info["t"] = self.t
            info["score"] = reward
        if self.t % 3 == 0:
            info["vec"] = self.np_random.standard_normal(3)
        if done:
            info["detail"] = {"steps": self.t, "flag": True, "frac": np.float32(self.t / 10)}
        return self._obs(), reward, terminated, truncated, info

    def render(self) -> np.ndarray | None:
        if self.render_mode == "rgb_array":
            return np.full((2, 3, 3), self.tag, dtype=np.uint8)
        return None

    def scaled(self, k: int, offset: int = 0) -> int:
        """A method for ``call`` tests."""
        return self.tag * k + offset


class TextObsEnv(gym.Env):  # type: ignore[type-arg]
    """Text observations: no fixed shape, so envmgr carries them pickled (fallback)."""

    def __init__(self, max_len: int = 6, reset_obs: str | None = None) -> None:
        self.observation_space = spaces.Text(max_length=6, min_length=0, charset="abcde")
        self.action_space = spaces.Discrete(3)
        self.max_len = max_len
        self.reset_obs = reset_obs  # if set, every reset returns this observation
        self.t = 0
        self.length = max_len

    def _obs(self) -> str:
        n = int(self.np_random.integers(0, 7))
        return "".join("abcde"[int(i)] for i in self.np_random.integers(0, 5, size=n))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.length = int(self.np_random.integers(2, self.max_len + 1))
        obs = self._obs()
        return (obs if self.reset_obs is None else self.reset_obs), (
            {"length": self.length} if self.length % 2 else {}
        )

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self.t += 1
        obs = self._obs()
        terminated = self.t >= self.length
        info = {"text_len": len(obs)} if self.t % 2 else {}
        return obs, float(action) + len(obs), terminated, False, info


#: Action spaces for :class:`ActionTypeEnv`, by name.
ACTION_SPACES: dict[str, Callable[[], spaces.Space[Any]]] = {
    "discrete": lambda: spaces.Discrete(3),
    "multi-discrete": lambda: spaces.MultiDiscrete([2, 3]),
    "box": lambda: spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
    "multi-binary": lambda: spaces.MultiBinary(3),
    "text": lambda: spaces.Text(max_length=4, min_length=0, charset="ab"),
}


class ActionTypeEnv(gym.Env):  # type: ignore[type-arg]
    """Reports in its info the Python type and dtype of each action it is given, so a
    comparison with SyncVectorEnv sees whether envs get the same kind of value."""

    def __init__(self, action_space: str = "discrete") -> None:
        self.observation_space = spaces.Box(0.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = ACTION_SPACES[action_space]()
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        info = {"action_type": type(action).__name__, "dtype": str(getattr(action, "dtype", ""))}
        return np.zeros(1, dtype=np.float32), 0.0, self.t >= 3, False, info


class TextActionEnv(ActionTypeEnv):
    """Text actions: they travel pickled inside the step command (fallback transport)."""

    def __init__(self) -> None:
        super().__init__("text")
        self.observation_space = spaces.Box(0.0, 10.0, shape=(1,), dtype=np.float32)

    def step(self, action: str) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        obs = np.array([len(action)], dtype=np.float32)
        return obs, float(action.count("a")), self.t >= 3, False, {"action": action}


class BoxActionEnv(gym.Env):  # type: ignore[type-arg]
    """Box(-1, 1, (2,)) actions, for NaN/out-of-bounds action checks."""

    def __init__(self) -> None:
        self.observation_space = spaces.Box(-10.0, 10.0, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.state = self.np_random.uniform(-1, 1, size=2).astype(np.float32)
        return self.state.copy(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.state = np.clip(self.state + np.asarray(action, dtype=np.float32), -10, 10)
        return self.state.copy(), float(-np.abs(self.state).sum()), False, False, {}


class BigInfoEnv(gym.Env):  # type: ignore[type-arg]
    """Every step's info holds ``size`` float64s (2.4 MB by default): answers many times
    a pipe's buffer (64 KB on Linux). ``frame(n)`` returns ``n`` of them, for ``call``."""

    observation_space = spaces.Box(-np.inf, np.inf, shape=(2,), dtype=np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, size: int = 300_000) -> None:
        self.size = size
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        self.x = float(self.np_random.uniform())
        return np.array([self.t, self.x]), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        info = {"frame": self.frame(self.size)}
        return np.array([self.t, self.x]), float(action), False, self.t >= 5, info

    def frame(self, n: int) -> np.ndarray:
        return np.full(n, self.t + self.x)


def detonate(t: int) -> None:
    """The frame that raises; tests look for its name in the remote traceback."""
    raise EnvBoom(f"boom at step {t}")


class ExplodingEnv(gym.Env):  # type: ignore[type-arg]
    """Raises :class:`EnvBoom` in ``step`` once it has taken ``explode_at`` steps."""

    def __init__(self, explode_at: int = 2) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.explode_at = explode_at
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.t >= self.explode_at:
            detonate(self.t)
        self.t += 1
        return np.zeros(1, dtype=np.float32), 1.0, False, False, {}


class UnloadableErrorEnv(ExplodingEnv):
    """Raises an exception that can be pickled but not unpickled (-> ``WorkerError``)."""

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        raise UnloadableError("left", "right")


class UnpicklableInfoEnv(ExplodingEnv):
    """From step ``explode_at`` on, returns an info holding a lock (standard pickle refuses)."""

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        info: dict[str, Any] = {}
        if self.t >= self.explode_at:
            info["lock"] = threading.Lock()
        return np.zeros(1, dtype=np.float32), 1.0, False, False, info


class ExitingEnv(ExplodingEnv):
    """Ends its worker process with ``os._exit(exit_code)`` at step ``explode_at``."""

    def __init__(self, explode_at: int = 2, exit_code: int = 3) -> None:
        super().__init__(explode_at)
        self.exit_code = exit_code

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.t >= self.explode_at:
            os._exit(self.exit_code)
        return super().step(action)


class SleepyEnv(ExplodingEnv):
    """Sleeps ``seconds`` in ``step`` from step ``explode_at`` on (for step timeouts)."""

    def __init__(self, explode_at: int = 1, seconds: float = 60.0) -> None:
        super().__init__(explode_at)
        self.seconds = seconds

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.t >= self.explode_at:
            time.sleep(self.seconds)
        self.t += 1
        return np.zeros(1, dtype=np.float32), 1.0, False, False, {}


def failing_factory() -> gym.Env:  # type: ignore[type-arg]
    """An env factory that raises."""
    raise FactoryBoom("factory refused to build the env")


# --------------------------------------------------------------------------- comparison


def assert_same_results(got: list[Any], want: list[Any]) -> None:
    """Two runs' results (resets and steps) equal one by one (:func:`assert_same`)."""
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"result {i}")


def assert_same(a: Any, b: Any, path: str = "value") -> None:
    """Assert two nested dict/tuple/list/array structures are exactly equal.

    Types, dict keys, array dtypes and shapes must match; object arrays (like
    Gymnasium's ``final_obs``) are compared element by element; NaN equals NaN.
    """
    if isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{path}: {type(a)} vs {type(b)}"
        assert a.keys() == b.keys(), (
            f"{path}: keys differ: only left {sorted(a.keys() - b.keys())}, "
            f"only right {sorted(b.keys() - a.keys())}"
        )
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (tuple, list)):
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        assert len(a) == len(b), f"{path}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        assert isinstance(b, np.ndarray), f"{path}: ndarray vs {type(b).__name__}"
        assert a.dtype == b.dtype, f"{path}: dtype {a.dtype} vs {b.dtype}"
        assert a.shape == b.shape, f"{path}: shape {a.shape} vs {b.shape}"
        if a.dtype == object:
            for idx in np.ndindex(a.shape):
                assert_same(a[idx], b[idx], f"{path}[{idx}]")
        else:
            assert np.array_equal(a, b, equal_nan=a.dtype.kind in "fc"), f"{path}: {a!r} != {b!r}"
    else:
        assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
        both_nan = isinstance(a, float) and a != a and b != b
        assert both_nan or a == b, f"{path}: {a!r} != {b!r}"


# --------------------------------------------------------------------------- appended by
# the promise tests (tests/test_promises.py): spaces the README names one by one.


def dict_action_space() -> spaces.Dict:
    return spaces.Dict(
        {
            "move": spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
            "pick": spaces.Discrete(3),
            "pair": spaces.Tuple((spaces.Discrete(2), spaces.MultiBinary(3))),
        }
    )


class DictActionEnv(gym.Env):  # type: ignore[type-arg]
    """Dict actions (a Box, a Discrete and a nested Tuple) echoed in a Box observation.

    The observation is the flattened action plus a seeded draw, so equality with
    ``SyncVectorEnv`` proves every action leaf arrived intact. No infos: a step's
    only traffic is the batch itself (the shared-memory transport test counts it).
    ``step_seconds`` makes each step sleep, so the parent is surely asleep when the
    workers finish.
    """

    def __init__(self, step_seconds: float = 0.0) -> None:
        self.action_space = dict_action_space()
        self.observation_space = spaces.Box(-10.0, 10.0, shape=(8,), dtype=np.float32)
        self.step_seconds = step_seconds

    def _obs(self, action: Any) -> np.ndarray:
        if action is None:
            parts = [np.zeros(7, dtype=np.float32)]
        else:
            parts = [
                np.asarray(action["move"], dtype=np.float32),
                np.array([action["pick"], action["pair"][0]], dtype=np.float32),
                np.asarray(action["pair"][1], dtype=np.float32),
            ]
        draw = np.array([self.np_random.uniform(-1.0, 1.0)], dtype=np.float32)
        return np.concatenate([*parts, draw])

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return self._obs(None), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self.step_seconds:
            time.sleep(self.step_seconds)
        reward = float(action["pick"]) + float(np.sum(action["pair"][1]))
        return self._obs(action), reward, False, False, {}


class VariableObsEnv(gym.Env):  # type: ignore[type-arg]
    """Observations of a space without a fixed shape: ``"graph"``, ``"sequence"`` or
    ``"oneof"`` (envmgr must carry them pickled); seeded, episodes of 3 steps."""

    def __init__(self, kind: str = "graph") -> None:
        if kind == "graph":
            self.observation_space: spaces.Space[Any] = spaces.Graph(
                node_space=spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32),
                edge_space=spaces.Discrete(4),
            )
        elif kind == "sequence":
            self.observation_space = spaces.Sequence(spaces.Discrete(5))
        elif kind == "oneof":
            self.observation_space = spaces.OneOf(
                (spaces.Discrete(3), spaces.Box(-1.0, 1.0, shape=(2,), dtype=np.float32))
            )
        else:
            raise ValueError(f"unknown kind {kind!r}")
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def _obs(self) -> Any:
        self.observation_space.seed(int(self.np_random.integers(2**31)))
        return self.observation_space.sample()

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        self.t += 1
        return self._obs(), float(action) + self.t, self.t >= 3, False, {"t": self.t}
