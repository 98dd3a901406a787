"""Code written against gymnasium's AsyncVectorEnv runs unchanged on envmgr (both managers),
except for the three differences the README lists, each pinned at the end of this file."""

from __future__ import annotations

import functools
import multiprocessing as mp
import re
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium.error import AlreadyPendingCallError, ClosedEnvironmentError, NoAsyncCallError
from gymnasium.vector import AsyncVectorEnv
from support.fault_cases import group_ids

from envmgr import SubprocessEnvManager

pytestmark = pytest.mark.timeout(90)


class _Frames(gym.Wrapper):  # type: ignore[type-arg]
    """CartPole whose render returns a small frame (no pygame needed)."""

    @property
    def render_mode(self) -> str:
        return "rgb_array"

    def render(self) -> np.ndarray:
        return np.full((4, 6, 3), int(self.env.unwrapped.steps_beyond_terminated or 0), np.uint8)


def _cartpole() -> gym.Env:  # type: ignore[type-arg]
    return _Frames(gym.make("CartPole-v1"))


def written_for_async_vector_env(make: Callable[..., Any]) -> dict[str, Any]:
    """A user's loop using AsyncVectorEnv's own API and errors, returning what it saw."""
    seen: dict[str, Any] = {}
    envs = make([_cartpole] * 4, shared_memory=True, copy=True, context="fork", daemon=True)
    try:
        envs.reset_async(seed=11)
        obs, infos = envs.reset_wait(timeout=30)
        seen["reset"] = obs
        rewards = []
        for t in range(60):
            envs.step_async(np.array([t % 2, 1, 0, (t // 3) % 2]))
            obs, rew, term, trunc, infos = envs.step_wait(timeout=30)
            rewards.append(rew)
        seen["last_obs"] = obs
        seen["rewards"] = np.stack(rewards)
        envs.call_async("get_wrapper_attr", "gravity")
        seen["gravity"] = envs.call_wait(timeout=30)
        seen["spec_ids"] = [s.id for s in envs.get_attr("spec")]
        envs.set_attr("gravity", [9.0, 9.5, 10.0, 10.5])
        seen["gravity_after"] = envs.get_attr("gravity")
        seen["frames"] = [f.shape for f in envs.render()]
        with pytest.raises(NoAsyncCallError):
            envs.step_wait()
        envs.step_async(np.zeros(4, dtype=np.int64))
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(np.zeros(4, dtype=np.int64))
        envs.step_wait(timeout=30)
    finally:
        envs.close()
    with pytest.raises(ClosedEnvironmentError):
        envs.step(np.zeros(4, dtype=np.int64))
    return seen


def test_asyncvectorenv_code_runs_unchanged_and_sees_the_same_results(backend: Backend) -> None:
    expected = written_for_async_vector_env(AsyncVectorEnv)
    got = written_for_async_vector_env(backend)
    for key in ("reset", "last_obs", "rewards"):
        np.testing.assert_array_equal(got[key], expected[key], err_msg=key)
    for key in ("gravity", "spec_ids", "gravity_after", "frames"):
        assert list(got[key]) == list(expected[key]), key


def test_step_wait_timeout_is_a_multiprocessing_timeout_error(backend: Backend) -> None:
    # AsyncVectorEnv raises multiprocessing.TimeoutError; except clauses for it still work.
    from support.envs import SleepyEnv

    # The worker still sleeps when the block closes the manager: close_timeout bounds
    # that wait (test_shutdown covers the wait itself).
    sleepy = lambda: SleepyEnv(explode_at=1, seconds=30)  # noqa: E731
    with backend(sleepy, 1, 1, context="fork", close_timeout=0.2) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(1, dtype=np.int64))
        envs.step_async(np.zeros(1, dtype=np.int64))
        with pytest.raises(mp.TimeoutError):
            envs.step_wait(timeout=0.5)


def test_unsupported_asyncvectorenv_arguments_say_so() -> None:
    with pytest.raises(TypeError, match="worker="):
        SubprocessEnvManager([_cartpole] * 2, worker=lambda *a: None)
    with pytest.raises(ValueError, match="observation_mode"):
        SubprocessEnvManager([_cartpole] * 2, observation_mode="different")
    with pytest.raises(ValueError, match="max_concurrency=1 is not supported.*n_workers=1"):
        SubprocessEnvManager([_cartpole] * 2, max_concurrency=1)
    with SubprocessEnvManager([_cartpole] * 2, max_concurrency=None) as envs:
        envs.reset(seed=0)  # Gymnasium 1.4's default, accepted as AsyncVectorEnv takes it


def _start(call: str, envs: Any) -> None:
    """Leave ``call`` pending on ``envs`` (``"none"``: leave nothing pending)."""
    envs.reset(seed=0)
    if call == "step":
        envs.step_async(np.zeros(2, dtype=np.int64))
    elif call == "reset":
        envs.reset_async(seed=1)
    elif call == "call":
        envs.call_async("get_wrapper_attr", "gravity")


def _close_warnings(envs: Any) -> list[tuple[type[Warning], str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs.close()
    return [(w.category, str(w.message)) for w in caught]


@pytest.mark.parametrize("call", ["step", "reset", "call", "none"])
def test_close_with_a_call_pending_warns_as_async_vector_env(backend: Backend, call: str) -> None:
    reference = AsyncVectorEnv([_cartpole] * 2, context="fork")
    _start(call, reference)
    expected = _close_warnings(reference)
    envs = backend([_cartpole] * 2, 2, 1, context="fork")
    try:
        _start(call, envs)
    finally:
        got = _close_warnings(envs)
    if call != "none":
        assert len(expected) == 1, expected
        assert (
            f"Calling `close` while waiting for a pending call to `{call}` to complete."
            in (expected[0][1])
        )
    assert got == expected
    assert envs.closed


def _pendulum() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("Pendulum-v1")


def test_envs_whose_spaces_differ_raise_a_runtime_error_naming_both(backend: Backend) -> None:
    with pytest.raises(RuntimeError):
        AsyncVectorEnv([_cartpole, _pendulum], context="fork")
    with pytest.raises(RuntimeError) as ei:
        backend([_cartpole, _cartpole, _pendulum, _pendulum], 2, 2, context="fork")
    message = str(ei.value)
    cartpole, pendulum = _cartpole().observation_space, _pendulum().observation_space
    # Ray names its actor's node and pid between the envs and the space.
    theirs = re.escape(f"has observation_space {pendulum}, but ")
    assert re.search(rf"1 \(envs 2-3\).* {theirs}", message), message
    assert f" 0 (env 0) has {cartpole}" in message
    assert isinstance(ei.value, ValueError)  # what envmgr's own callers catch


# The three deliberate differences (README, "Differences from AsyncVectorEnv").
# Each test runs the same code on both and asserts the difference, so a change on
# either side (envmgr growing AsyncVectorEnv's behaviour, or Gymnasium changing its own)
# fails here and the README's list is revisited.


class _Words(gym.Space):  # type: ignore[type-arg]
    """A space Gymnasium has no shared-memory layout for: short strings."""

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        return "w" * int(self.np_random.integers(1, 4))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str)

    def __eq__(self, other: object) -> bool:  # the managers check every env's spaces agree
        return isinstance(other, _Words)


class _EchoWords(gym.Env):  # type: ignore[type-arg]
    """Observes the word it was last given."""

    def __init__(self) -> None:
        self.observation_space = _Words()
        self.action_space = _Words()

    def reset(self, *, seed: int | None = None, options: Any = None) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        return "start", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return f"got {action}", 0.0, False, False, {}


def test_a_custom_space_travels_pickled_where_async_vector_env_refuses_shared_memory() -> None:
    with pytest.raises(ValueError):
        AsyncVectorEnv([_EchoWords] * 2, shared_memory=True, context="fork").close()
    with SubprocessEnvManager([_EchoWords] * 2, 2, shared_memory=True, context="fork") as envs:
        assert envs.reset(seed=0)[0] == ("start", "start")
        assert envs.step(("a", "bb"))[0] == ("got a", "got bb")


def test_actions_reach_the_env_in_the_action_spaces_dtype() -> None:
    from support.envs import ActionTypeEnv

    # float64 values a float32 Box holds exactly: nothing is refused, only the dtype differs.
    actions = np.full((2, 2), 0.5, dtype=np.float64)
    seen = {}
    for name, make in [("async", AsyncVectorEnv), ("envmgr", SubprocessEnvManager)]:
        envs = make([functools.partial(ActionTypeEnv, "box")] * 2, context="fork")
        try:
            envs.reset(seed=0)
            seen[name] = list(envs.step(actions)[4]["dtype"])
        finally:
            envs.close()
    assert seen == {"async": ["float64"] * 2, "envmgr": ["float32"] * 2}


def test_an_env_error_keeps_its_worker_alive_where_async_vector_env_shuts_it_down() -> None:
    from support.envs import EnvBoom, ExplodingEnv

    make = functools.partial(ExplodingEnv, explode_at=0)
    reference = AsyncVectorEnv([make] * 2, context="fork")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reference.reset(seed=0)
        with pytest.raises(EnvBoom):
            reference.step(np.zeros(2, dtype=np.int64))
        reference.close()
    assert any("Shutting it down" in str(w.message) for w in caught)

    with SubprocessEnvManager([make] * 2, 2, context="fork") as envs:
        pids = group_ids(envs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            envs.reset(seed=0)
            with pytest.raises(EnvBoom):
                envs.step(np.zeros(2, dtype=np.int64))
        assert [str(w.message) for w in caught] == []
        envs.reset(seed=1)  # the same workers answer
        assert group_ids(envs) == pids
