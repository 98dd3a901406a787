"""A step cut off by Ctrl-C leaves answers in the workers' pipes; later calls must not take them.

The caller catches the ``KeyboardInterrupt`` and steps on, as the README allows. The
step it gave up on still runs to its end in the workers: each answer that does not
fit the shared arrays (here: a string info, which no info column holds) is written
to the worker's pipe and never read.
The next call reads that pipe first, so the parent has to drop any answer whose
sequence number is not the current command's - in the answer reading, and in the
reading of a dead worker's last words.

The slow env waits for a file the test writes, not for a clock, and sends the
SIGINT itself once the healthy env has finished the same step: the interrupt then
always finds the parent waiting in ``step()`` with one answer in a pipe.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envmgr import SubprocessEnvManager, WorkerDiedError, WorkerTimeoutError

pytestmark = pytest.mark.timeout(60)

# The envs below travel by value: a forkserver or spawn worker cannot import a test module.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: The step (1-based) in which env 1 is slow: the one the interrupt cuts off.
SLOW_STEP = 3
EXIT_CODE = 3
#: A liveness bound on the env's waits for files, so a broken test cannot hang a worker.
_FILE_WAIT_S = 30.0


class InjectedStepError(RuntimeError):
    """What env 1 raises at the end of its slow step in the exit-reason test."""


def _wait_for(path: Path) -> None:
    deadline = time.monotonic() + _FILE_WAIT_S
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)


class CountingEnv(gym.Env):  # type: ignore[type-arg]
    """Observation ``[t]`` and infos ``{"t": t, "step": "step <t>"}``, ``t`` the step
    calls so far: ``t`` travels in shared memory (an info column), the string pickled.

    Env 1 (``slow``) in step :data:`SLOW_STEP`: waits until env 0 has finished that
    step, sends SIGINT to the manager, then waits for ``marks/release``; with
    ``raise_when_released`` it then raises. With ``exit_at``, env 1 exits at that step.
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        tag: int,
        marks: str,
        manager_pid: int,
        raise_when_released: bool = False,
        exit_at: int | None = None,
    ) -> None:
        self.tag = tag
        self.marks = Path(marks)
        self.manager_pid = manager_pid
        self.raise_when_released = raise_when_released
        self.exit_at = exit_at
        self.observation_space = spaces.Box(0, 1e6, shape=(1,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, dtype=np.float32), {"t": 0}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.tag == 1 and self.t == self.exit_at:
            os._exit(EXIT_CODE)
        if self.tag == 1 and self.t == SLOW_STEP:
            _wait_for(self.marks / f"env0.step{SLOW_STEP}")
            os.kill(self.manager_pid, signal.SIGINT)
            _wait_for(self.marks / "release")
            if self.raise_when_released:
                raise InjectedStepError(f"env 1 failed at step {self.t}")
        if self.tag == 0:
            (self.marks / f"env0.step{self.t}").touch()
        info = {"t": self.t, "step": f"step {self.t}"}
        return np.array([self.t], dtype=np.float32), 0.0, False, False, info


def counting_fns(marks: Path, **env1: Any) -> list[Callable[[], CountingEnv]]:
    """Env 0 healthy, env 1 slow in step :data:`SLOW_STEP` (keyword arguments: env 1's)."""
    pid = os.getpid()

    def make(tag: int) -> Callable[[], CountingEnv]:
        kwargs = env1 if tag == 1 else {}
        return lambda: CountingEnv(tag, str(marks), pid, **kwargs)

    return [make(0), make(1)]


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises KeyboardInterrupt in this process, as in a plain ``python`` run."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


def _interrupted_step(envs: SubprocessEnvManager, marks: Path) -> None:
    """Steps 1 and 2, then step 3 cut off by the SIGINT env 1 sends; env 1 then let go."""
    actions = np.zeros(2, dtype=np.int64)
    for _ in range(1, SLOW_STEP):
        envs.step(actions)
    with pytest.raises(KeyboardInterrupt):
        envs.step(actions)
    (marks / "release").touch()


@pytest.mark.usefixtures("sigint_raises")
def test_steps_after_an_interrupted_step_return_their_own_infos(tmp_path: Path) -> None:
    """Both workers finish step 3 after the caller gave up on it, and their answers
    (the string infos go through the pipe) wait there. Without the seq check in the
    answer reading, step 4 took step 3's pickled infos, and every later step the one
    before its own, while what travels in shared memory (observations, ``t``) was right."""
    with SubprocessEnvManager(counting_fns(tmp_path), 2, 1) as envs:
        envs.reset(seed=0)
        _interrupted_step(envs, tmp_path)
        assert not envs.closed
        assert envs.restarts == [0, 0]  # nothing was cut mid-message: no worker given up
        for t in range(SLOW_STEP + 1, SLOW_STEP + 4):
            obs, _, _, _, infos = envs.step(np.zeros(2, dtype=np.int64))
            assert obs[:, 0].tolist() == [t, t]
            assert infos["t"].tolist() == [t, t]
            assert infos["step"].tolist() == [f"step {t}"] * 2, f"step {t} got another's infos"


@pytest.mark.usefixtures("sigint_raises")
def test_a_dead_workers_stale_error_is_not_taken_for_why_it_died(tmp_path: Path) -> None:
    """Env 1 raises at the end of the step the caller gave up on, so its error answer
    waits in its pipe; in the next step it exits. The parent reads a dead worker's
    pipe for the error it may have sent before exiting: that error must be this
    step's, and step 3's is not (the filter in the exit-reason path)."""
    fns = counting_fns(tmp_path, raise_when_released=True, exit_at=SLOW_STEP + 1)
    with SubprocessEnvManager(fns, 2, 1) as envs:
        envs.reset(seed=0)
        _interrupted_step(envs, tmp_path)
        with pytest.raises(WorkerDiedError, match=f"worker 1.*exited with code {EXIT_CODE}"):
            envs.step(np.zeros(2, dtype=np.int64))


@pytest.mark.usefixtures("sigint_raises")
def test_a_command_a_busy_worker_cannot_take_in_times_out(tmp_path: Path) -> None:
    """After the interrupt env 1 stays in step 3 (not released), so worker 1 reads no
    command. A ``set_attr`` value far larger than a pipe holds cannot be written to it:
    with ``step_timeout`` the call fails as one whose answer never came, naming worker
    1, instead of blocking in the write until the worker is free (with a hung env: for
    ever). Worker 0, free, takes it in."""
    with SubprocessEnvManager(counting_fns(tmp_path), 2, 1, step_timeout=1.0) as envs:
        envs.reset(seed=0)
        actions = np.zeros(2, dtype=np.int64)
        for _ in range(1, SLOW_STEP):
            envs.step(actions)
        with pytest.raises(KeyboardInterrupt):
            envs.step(actions)
        big = np.zeros(1_000_000)  # 8 MB
        took_in = r"worker 1 .*did not take in a [\d,]+-byte command within 1.0 s"
        with pytest.raises(WorkerTimeoutError, match=took_in):
            envs.set_attr("payload", big)
