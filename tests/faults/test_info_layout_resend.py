"""A column layout lost with a dropped answer is sent again, end to end.

A worker puts its info layout (:class:`~envmgr.protocol.info_columns.Schema`) in every
answer until the parent writes that layout's version into the group's ack word. Two
ways drop an answer that carries a new layout while the caller steps on: another env
raises in the same step (the caller catches it), or Ctrl-C cuts the step off. Had the
layout been sent once, the key's column would be written for the rest of the run and
never read: the key vanishes from the infos.

Two workers of one env each. Env 0 returns ``{"x": float(t)}`` from step
:data:`X_FROM` on, the step in which env 1 fails; the step after must give ``x``
for env 0 alone (``_x == [True, False]``), and so must every later one.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envmgr import SubprocessEnvManager

pytestmark = pytest.mark.timeout(60)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The step (1-based) in which env 0's "x" first appears and env 1 fails.
X_FROM = 2
#: A liveness bound on the env's wait for a file, so a broken test cannot hang a worker.
_FILE_WAIT_S = 30.0


class StepFailure(RuntimeError):
    """What env 1 raises in step :data:`X_FROM` (the ``raise`` case)."""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + _FILE_WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


class NewKeyEnv(gym.Env):  # type: ignore[type-arg]
    """Env 0: info ``{"x": float(t)}`` from step :data:`X_FROM`, marking each step done
    with a file. Env 1: no infos; in step :data:`X_FROM` it raises (``how="raise"``), or
    waits for env 0 to finish that step, sends the manager SIGINT, and waits for the
    test's ``release`` file (``how="interrupt"``)."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, tag: int, how: str, marks: str, manager_pid: int) -> None:
        self.tag, self.how = tag, how
        self.marks = Path(marks)
        self.manager_pid = manager_pid
        self.observation_space = spaces.Box(0, 1e6, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        obs = np.array([self.t], dtype=np.float32)
        if self.tag == 0:
            (self.marks / f"env0.step{self.t}").touch()
            return obs, 0.0, False, False, ({"x": float(self.t)} if self.t >= X_FROM else {})
        if self.t == X_FROM:
            if self.how == "raise":
                raise StepFailure(f"env 1 failed at step {self.t}")
            _wait_for(self.marks / f"env0.step{self.t}")
            os.kill(self.manager_pid, signal.SIGINT)
            _wait_for(self.marks / "release")
        return obs, 0.0, False, False, {}


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, as in a plain ``python`` run."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("how", ["raise", "interrupt"])
def test_a_layout_dropped_with_its_answer_is_sent_again(tmp_path: Path, how: str) -> None:
    pid = os.getpid()
    fns = [
        (lambda tag=tag: NewKeyEnv(tag, how, str(tmp_path), pid))  # type: ignore[misc]
        for tag in (0, 1)
    ]
    actions = np.zeros(2, dtype=np.int64)
    with SubprocessEnvManager(fns, 2, 1) as envs:
        envs.reset(seed=0)
        for _ in range(1, X_FROM):
            assert envs.step(actions)[4] == {}
        dropped: type[BaseException] = StepFailure if how == "raise" else KeyboardInterrupt
        with pytest.raises(dropped):
            envs.step(actions)  # env 0's answer, the first with "x"'s column, is dropped
        (tmp_path / "release").touch()
        assert not envs.closed and envs.restarts == [0, 0]
        for t in range(X_FROM + 1, X_FROM + 4):
            infos = envs.step(actions)[4]
            assert sorted(infos) == ["_x", "x"], f"step {t}: 'x' lost with its layout: {infos}"
            assert infos["_x"].tolist() == [True, False]
            assert infos["x"][0] == float(t)
