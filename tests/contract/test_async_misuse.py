"""The same misuse against gymnasium's AsyncVectorEnv and envmgr: the same exception types,
and envmgr's message contains AsyncVectorEnv's (class name aside)."""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AsyncVectorEnv

from envmgr import SubprocessEnvManager

pytestmark = pytest.mark.timeout(120)

N = 4


class NappingEnv(gym.Env):  # type: ignore[type-arg]
    """Steps and resets take ``nap`` seconds (``reset(options={"nap": s})`` or ``set_attr``)."""

    observation_space = spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = spaces.Discrete(2)

    def __init__(self) -> None:
        self.nap = 0.0
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        time.sleep((options or {}).get("nap", 0.0))
        self.t = 0
        return self.np_random.uniform(-1, 1, 3).astype(np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        time.sleep(self.nap)
        self.t += 1
        obs = np.full(3, (self.t % 7) / 7 * (1 if action else -1), np.float32)
        return obs, float(action), False, self.t >= 50, {}


def _async(**kwargs: Any) -> Any:
    return AsyncVectorEnv([NappingEnv] * N, context="fork", **kwargs)


def _envmgr(**kwargs: Any) -> Any:
    return SubprocessEnvManager([NappingEnv] * N, n_workers=2, context="fork", **kwargs)


ZEROS = np.zeros(N, dtype=np.int64)


def _mask(**kw: Any) -> Callable[[Any], Any]:
    return lambda e: e.reset(options={"reset_mask": kw["mask"]})


#: name -> (setup, misuse). Each runs on a fresh, reset vector env.
MISUSE: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    "step_wait without step_async": (lambda e: None, lambda e: e.step_wait()),
    "reset_wait without reset_async": (lambda e: None, lambda e: e.reset_wait()),
    "call_wait without call_async": (lambda e: None, lambda e: e.call_wait()),
    "step_wait while a reset is pending": (lambda e: e.reset_async(), lambda e: e.step_wait()),
    "reset_wait while a step is pending": (
        lambda e: e.step_async(ZEROS),
        lambda e: e.reset_wait(),
    ),
    "step_async twice": (lambda e: e.step_async(ZEROS), lambda e: e.step_async(ZEROS)),
    "reset_async while a step is pending": (
        lambda e: e.step_async(ZEROS),
        lambda e: e.reset_async(),
    ),
    "reset while a call is pending": (
        lambda e: e.call_async("render"),
        lambda e: e.reset(seed=0),
    ),
    "call_async while a reset is pending": (
        lambda e: e.reset_async(),
        lambda e: e.call_async("render"),
    ),
    "set_attr while a step is pending": (
        lambda e: e.step_async(ZEROS),
        lambda e: e.set_attr("nap", 0.0),
    ),
    "reset_mask a list": (lambda e: None, _mask(mask=[True, False, True, False])),
    "reset_mask of the wrong shape": (lambda e: None, _mask(mask=np.ones(N + 1, dtype=bool))),
    "reset_mask of ints": (lambda e: None, _mask(mask=np.ones(N, dtype=np.int64))),
    "reset_mask all False": (lambda e: None, _mask(mask=np.zeros(N, dtype=bool))),
    "seeds of the wrong length": (lambda e: None, lambda e: e.reset(seed=[1, 2, 3])),
    "set_attr with the wrong number of values": (
        lambda e: None,
        lambda e: e.set_attr("nap", [0.0, 0.0]),
    ),
    "step after close": (lambda e: e.close(), lambda e: e.step(ZEROS)),
    "reset_async after close": (lambda e: e.close(), lambda e: e.reset_async()),
}


def _raised(make: Callable[..., Any], setup: Callable[[Any], Any], misuse: Any) -> BaseException:
    envs = make()
    try:
        envs.reset(seed=0)
        setup(envs)
        with pytest.raises(Exception) as info:
            misuse(envs)
        return info.value
    finally:
        envs.close(terminate=True) if isinstance(envs, AsyncVectorEnv) else envs.close()


# Both are closed with the misused call still pending, on purpose; the warning they
# give about that is expected here (test_async_compat pins it).
@pytest.mark.filterwarnings("ignore:.*Calling `close` while waiting for a pending call")
@pytest.mark.parametrize("case", list(MISUSE))
def test_misuse_raises_what_async_vector_env_raises(case: str) -> None:
    setup, misuse = MISUSE[case]
    expected = _raised(_async, setup, misuse)
    got = _raised(_envmgr, setup, misuse)
    assert isinstance(got, type(expected)), (case, repr(got), repr(expected))
    message = str(expected).replace("AsyncVectorEnv", "SubprocessEnvManager")
    assert message in str(got), (case, str(got), message)
    assert getattr(got, "name", None) == getattr(expected, "name", None), case


@pytest.mark.parametrize("call", ["step_wait", "reset_wait"])
def test_wait_timeouts_raise_the_same_type(call: str) -> None:
    def misuse(envs: Any) -> None:
        if call == "step_wait":
            envs.set_attr("nap", 10.0)
            envs.step_async(ZEROS)
            envs.step_wait(timeout=0.3)
        else:
            envs.reset_async(options={"nap": 10.0})
            envs.reset_wait(timeout=0.3)

    expected = _raised(_async, lambda e: None, misuse)
    # The napping worker is still inside its call when close() runs: a short
    # close_timeout ends that wait (test_shutdown covers the wait itself).
    got = _raised(lambda: _envmgr(close_timeout=0.2), lambda e: None, misuse)
    assert type(expected) is mp.TimeoutError
    assert isinstance(got, mp.TimeoutError), repr(got)


def test_copy_false_observations_are_writable_and_overwritten_by_the_next_step() -> None:
    actions = [np.array([t % 2, 1, 0, (t // 2) % 2]) for t in range(6)]
    seen = []
    for make in (_async, _envmgr):
        envs = make(copy=False)
        try:
            obs, _ = envs.reset(seed=3)
            assert obs.flags.writeable
            rows = []
            for a in actions:
                obs[...] = 0.5  # scribbling on the batch must not change what envs return
                obs, *_ = envs.step(a)
                rows.append(obs.copy())
            seen.append(np.stack(rows))
        finally:
            envs.close()
    np.testing.assert_array_equal(seen[1], seen[0])
