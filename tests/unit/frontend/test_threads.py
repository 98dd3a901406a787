"""A manager called from two threads: the second caller is refused (BusyManagerError)
instead of the two threads silently reading each other's batches, and close() from
another thread ends the call inside (ClosedManagerError) without leaving a process.

(envmgr.frontend.vector_env.one_thread_at_a_time, Session.close_under_call)
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium import spaces

from envmgr import BusyManagerError, ClosedManagerError, SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)


class MarkedSleepEnv(gym.Env):  # type: ignore[type-arg]
    """Action 1 touches ``marker`` (the step has reached the worker) and sleeps ``seconds``;
    every step's reward is the action taken, so a batch tells whose actions it ran."""

    def __init__(self, marker: str, seconds: float) -> None:
        self.observation_space = spaces.Box(-1.0, 1.0, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(3)
        self.marker, self.seconds = marker, seconds

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if int(action) == 1:
            Path(self.marker).touch()
            time.sleep(self.seconds)
        return np.zeros(1, dtype=np.float32), float(action), False, False, {}


def _in_thread(fn: Callable[[], Any]) -> tuple[threading.Thread, dict[str, Any]]:
    """Run ``fn`` in a thread; the dict gets its result or its exception."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["result"] = fn()
        except BaseException as exc:  # noqa: BLE001  # handed to the test to assert on
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_for(marker: Path, thread: threading.Thread) -> None:
    deadline = time.monotonic() + 30
    while not marker.exists():
        assert thread.is_alive() and time.monotonic() < deadline, "the step never reached an env"
        time.sleep(0.01)


def test_a_second_thread_is_refused_while_one_steps(tmp_path: Path) -> None:
    marker = tmp_path / "stepping"
    with SubprocessEnvManager(lambda: MarkedSleepEnv(str(marker), 1.0), 2, 1) as envs:
        envs.reset(seed=0)
        ones = np.ones(2, dtype=np.int64)
        thread, out = _in_thread(lambda: envs.step(ones))
        _wait_for(marker, thread)

        twos = np.full(2, 2, dtype=np.int64)
        refusals: list[tuple[str, Callable[[], Any]]] = [
            ("step", lambda: envs.step(twos)),
            ("step_async", lambda: envs.step_async(twos)),
            ("reset", lambda: envs.reset(seed=1)),
            ("get_attr", lambda: envs.get_attr("seconds")),
            ("send", lambda: envs.send(twos)),
            ("env_step_seconds", envs.env_step_seconds),
        ]
        for name, call in refusals:
            with pytest.raises(BusyManagerError, match=rf"cannot {name}: another thread is in"):
                call()
        thread.join(30)
        assert not thread.is_alive()
        # The first thread got the batch of its own actions, and nothing was left pending.
        assert "error" not in out, out
        np.testing.assert_array_equal(out["result"][1], [1.0, 1.0])
        np.testing.assert_array_equal(envs.step(twos)[1], [2.0, 2.0])


def test_the_refusal_names_the_call_the_other_thread_is_in(tmp_path: Path) -> None:
    marker = tmp_path / "stepping"
    with SubprocessEnvManager(lambda: MarkedSleepEnv(str(marker), 1.0), 2, 1) as envs:
        envs.reset(seed=0)
        envs.step_async(np.ones(2, dtype=np.int64))
        thread, out = _in_thread(envs.step_wait)
        _wait_for(marker, thread)
        with pytest.raises(BusyManagerError, match=r"inside step_wait\(\) of this Subprocess"):
            envs.render()
        thread.join(30)
        assert "result" in out, out


@pytest.mark.parametrize("max_restarts", [0, 2], ids=["no-restarts", "restarts"])
def test_close_from_another_thread_ends_the_call_inside(
    tmp_path: Path, backend: Backend, max_restarts: int
) -> None:
    """The call inside (an env sleeping a minute) ends in ClosedManagerError as soon as
    close() returns; with restarts allowed, none is attempted after close; the leak
    check finds no process or segment left."""
    marker = tmp_path / "stepping"
    envs = backend(lambda: MarkedSleepEnv(str(marker), 60.0), 2, 1, max_restarts=max_restarts)
    with envs:
        envs.reset(seed=0)
        thread, out = _in_thread(lambda: envs.step(np.ones(2, dtype=np.int64)))
        _wait_for(marker, thread)
        envs.close()
        thread.join(30)  # well short of the env's minute: close ended the wait
    assert not thread.is_alive()
    assert isinstance(out.get("error"), ClosedManagerError), out
    assert "closed by another thread while its step waited" in str(out["error"])
    assert envs.closed
    with pytest.raises(ClosedManagerError):
        envs.step(np.zeros(2, dtype=np.int64))


class SlowCloseEnv(MarkedSleepEnv):
    """Touches ``marker`` when its close() starts, then sleeps ``seconds`` there."""

    def close(self) -> None:
        Path(self.marker).touch()
        time.sleep(self.seconds)


def test_a_call_during_close_from_another_thread_names_close(tmp_path: Path) -> None:
    marker = tmp_path / "closing"
    envs = SubprocessEnvManager(lambda: SlowCloseEnv(str(marker), 1.0), 2, 1)
    envs.reset(seed=0)
    thread, out = _in_thread(envs.close)
    _wait_for(marker, thread)
    with pytest.raises(BusyManagerError, match=r"inside close\(\) of this"):
        envs.step(np.zeros(2, dtype=np.int64))
    thread.join(30)
    assert envs.closed and "error" not in out, out


def test_managers_opened_in_two_threads_leave_main_as_it_was() -> None:
    """Starting a worker hides ``__main__`` for a moment; two threads doing it at once each
    saved the other's stand-in, and an empty module was left as ``__main__``."""
    import sys

    main = sys.modules["__main__"]

    def open_and_close() -> None:
        for _ in range(4):
            SubprocessEnvManager(lambda: MarkedSleepEnv("unused", 0.0), 2, 1).close()

    threads = [_in_thread(open_and_close) for _ in range(2)]
    for thread, out in threads:
        thread.join(50)
        assert not thread.is_alive() and "error" not in out, out
    assert sys.modules["__main__"] is main
