"""Exceptions raised by env code in a worker: re-raised in the parent as their own
type (with the remote traceback and a note naming worker and env), or as
WorkerError when they cannot be rebuilt; a factory's exception at construction.

(envmgr.errors, envmgr.envside)
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium import spaces
from support.envs import (
    DictObsEnv,
    EnvBoom,
    ExplodingEnv,
    FactoryBoom,
    UnloadableErrorEnv,
    UnpicklableInfoEnv,
    failing_factory,
)
from support.helpers import full_text

from envmgr import RemoteTraceback, SubprocessEnvManager, WorkerError

pytestmark = pytest.mark.timeout(60)


def test_env_exception_in_step_is_reraised_as_its_own_type(start_method: str) -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=100)] * 3 + [
        functools.partial(ExplodingEnv, explode_at=2)
    ]
    with SubprocessEnvManager(fns, n_workers=2, context=start_method) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(4, dtype=np.int64)
        envs.step(zeros)
        envs.step(zeros)
        with pytest.raises(EnvBoom, match="boom at step 2") as ei:
            envs.step(zeros)
    exc = ei.value
    assert isinstance(exc.__cause__, RemoteTraceback)
    remote = str(exc.__cause__)
    assert "detonate" in remote and "envs.py" in remote and "EnvBoom" in remote
    assert exc.worker_index == 1  # type: ignore[attr-defined]
    assert exc.env_index == 3  # type: ignore[attr-defined]
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert "worker 1" in notes and "env 3" in notes and "step" in notes


def test_exception_that_cannot_be_recreated_becomes_worker_error() -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=100), UnloadableErrorEnv]
    with SubprocessEnvManager(fns, n_workers=1) as envs:
        envs.reset(seed=0)
        with pytest.raises(WorkerError) as ei:
            envs.step(np.zeros(2, dtype=np.int64))
    exc = ei.value
    assert exc.worker_index == 0 and exc.env_index == 1
    assert "UnloadableError" in exc.remote_type
    assert "left/right" in str(exc) and "env 1" in str(exc)
    assert isinstance(exc.__cause__, RemoteTraceback)


def test_factory_exception_surfaces_at_construction() -> None:
    fns = [DictObsEnv] * 3 + [failing_factory]
    with pytest.raises(FactoryBoom, match="refused") as ei:
        SubprocessEnvManager(fns, n_workers=2)
    exc = ei.value
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert "failing_factory" in str(exc.__cause__)
    assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
    notes = "\n".join(getattr(exc, "__notes__", []))
    assert "worker 1" in notes and "env 3" in notes


def test_unpicklable_info_raises_an_error_naming_the_worker() -> None:
    fns = [functools.partial(UnpicklableInfoEnv, explode_at=100)] * 2 + [UnpicklableInfoEnv] * 2
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(4, dtype=np.int64)
        envs.step(zeros)
        with pytest.raises(TypeError) as ei:
            envs.step(zeros)
    exc = ei.value
    assert str(exc) == "cannot pickle '_thread.lock' object"
    assert "raised in envmgr worker 1 (envs 2-3), during step (sending the result)" in full_text(
        exc
    )
    assert exc.worker_index == 1  # type: ignore[attr-defined]


class WrongDtypeObsEnv(gym.Env):  # type: ignore[type-arg]
    """A ``uint8`` Box whose env ``bad`` returns ``int64`` values, one out of range (an
    env bug numpy would wrap: 300 -> 44)."""

    observation_space = spaces.Box(0, 255, (2,), np.uint8)
    action_space = spaces.Discrete(2)

    def __init__(self, bad: bool = False) -> None:
        self.bad = bad

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        return np.array([1, 2], np.uint8), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        obs = np.array([300, -1]) if self.bad else np.array([3, 4], np.uint8)
        return obs, 0.0, False, False, {}


class ShortRewardsVectorEnv(gym.vector.VectorEnv):  # type: ignore[type-arg]
    """A batched env that returns one reward for all its envs."""

    def __init__(self, n: int) -> None:
        self.num_envs = n
        self.single_observation_space = spaces.Box(0, 1, (1,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(self.single_observation_space, n)
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, n)

    def reset(self, *, seed: Any = None, options: Any = None) -> tuple[Any, dict[str, Any]]:
        return np.zeros((self.num_envs, 1), np.float32), {}

    def step(self, actions: Any) -> Any:
        n = self.num_envs
        zeros = np.zeros(n, np.bool_)
        return np.zeros((n, 1), np.float32), np.array([7.0]), zeros, zeros, {}


@on_backends()
def test_an_observation_its_dtype_would_change_is_refused_naming_the_env(
    backend: Backend,
) -> None:
    """As SyncVectorEnv refuses it, instead of handing on a wrapped value."""
    fns = [WrongDtypeObsEnv] * 3 + [functools.partial(WrongDtypeObsEnv, bad=True)]
    with backend(fns, 2, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="env 3 returned an observation that is not in"):
            envs.step(np.zeros(4, np.int64))


def test_a_hosted_vector_env_returning_one_reward_for_all_is_refused() -> None:
    with SubprocessEnvManager(vector_fn=ShortRewardsVectorEnv, num_envs=4, n_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match=r"returned rewards of shape \(1,\), expected \(2,\)"):
            envs.step(np.zeros(4, np.int64))


class BadResultEnv(WrongDtypeObsEnv):
    """Env ``bad`` returns a string reward (``what="reward"``) or a list as its info."""

    def __init__(self, bad: bool = False, what: str = "reward") -> None:
        super().__init__()
        self.wrong, self.what = bad, what

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, Any]:
        obs, reward, term, trunc, info = super().step(action)
        if self.wrong and self.what == "reward":
            return obs, "one", term, trunc, info
        if self.wrong:
            return obs, reward, term, trunc, ["not", "a", "dict"]
        return obs, reward, term, trunc, info


@on_backends(
    "what, error, message",
    local=[
        pytest.param(
            "reward",
            ValueError,
            "env 3 returned reward 'one' of type str: one number per env",
            id="reward",
        ),
        pytest.param(
            "info",
            TypeError,
            "env 3 returned an info of type list: an env's info is a dict",
            id="info",
        ),
    ],
)
def test_a_result_that_is_no_number_or_dict_is_refused_naming_the_env(
    backend: Backend, what: str, error: type[Exception], message: str
) -> None:
    """numpy's and Gymnasium's own errors for these name no env; the type is numpy's,
    as SyncVectorEnv raises it."""
    fns = [WrongDtypeObsEnv] * 3 + [functools.partial(BadResultEnv, True, what)]
    with backend(fns, 2, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(error, match=message) as ei:
            envs.step(np.zeros(4, np.int64))
        assert getattr(ei.value, "env_index", 3) == 3  # the caller's envs raise as they are


class ListInfosVectorEnv(ShortRewardsVectorEnv):
    """A batched env whose step returns its infos as a list, one dict per env."""

    def step(self, actions: Any) -> Any:
        n = self.num_envs
        zeros = np.zeros(n, np.bool_)
        return np.zeros((n, 1), np.float32), np.zeros(n), zeros, zeros, [{}] * n


def test_a_hosted_vector_env_returning_a_list_of_infos_is_refused() -> None:
    with SubprocessEnvManager(vector_fn=ListInfosVectorEnv, num_envs=4, n_workers=2) as envs:
        envs.reset(seed=0)
        with pytest.raises(TypeError, match="the VectorEnv returned infos of type list"):
            envs.step(np.zeros(4, np.int64))


class BaseExceptionEnv(WrongDtypeObsEnv):
    """Raises ``SystemExit(3)`` or ``KeyboardInterrupt`` from ``step`` when ``bad``."""

    def __init__(self, bad: bool = False, kind: str = "exit") -> None:
        super().__init__()
        self.raising, self.kind = bad, kind

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        if self.raising:
            raise SystemExit(3) if self.kind == "exit" else KeyboardInterrupt()
        return super().step(action)


@pytest.mark.parametrize("kind", ["exit", "interrupt"])
def test_a_base_exception_from_env_code_is_a_worker_error_in_the_caller(kind: str) -> None:
    """Raised as itself, SystemExit ended the caller's program without a word, and a
    KeyboardInterrupt looked like the user's own Ctrl-C."""
    bad = functools.partial(BaseExceptionEnv, True, kind)
    with SubprocessEnvManager([BaseExceptionEnv] * 3 + [bad], 2, 2) as envs:
        envs.reset(seed=0)
        with pytest.raises(WorkerError, match=r"env 3, during step: builtins\.(SystemExit|Key)"):
            envs.step(np.zeros(4, np.int64))
