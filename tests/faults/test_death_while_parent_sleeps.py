"""A worker that dies while the parent sleeps waiting for it is reported within a bound.

The parent sleeps in ``poll`` on the wake-up pipe and every worker's sentinel; a dead
worker rings nothing, so its sentinel alone can end that sleep. Without it the parent
would sleep on for ever (no ``step_timeout``): a test of it met only pytest-timeout. Here
the call runs in a thread of its own and the test waits for it with a deadline: the
error must come within :data:`NOTICED_WITHIN` seconds, a liveness bound (the death is
noticed at all), not a speed expectation.

Env 1 dies in step :data:`DIES_AT` once the parent's stepping thread sleeps in the
kernel (its ``/proc`` entry says so), so the death always finds the parent asleep.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces

from envmgr import SubprocessEnvManager, WorkerDiedError

pytestmark = pytest.mark.timeout(60)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

#: Seconds within which the error must reach the caller.
NOTICED_WITHIN = 10.0
DIES_AT = 2
EXIT_CODE = 3
#: A liveness bound on the env's wait for the parent to sleep.
_ASLEEP_WAIT_S = 20.0


def _asleep(pid: int, tid: int) -> bool:
    """Whether thread ``tid`` of process ``pid`` sleeps in the kernel (in ``poll`` where
    the kernel names the function it waits in)."""
    task = Path(f"/proc/{pid}/task/{tid}")
    try:
        state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
        wchan = (task / "wchan").read_text().strip()
    except (OSError, IndexError):
        return False
    return state == "S" and ("poll" in wchan or wchan in ("", "0"))


class DiesWhileTheParentSleeps(gym.Env):  # type: ignore[type-arg]
    """Env 1, in step :data:`DIES_AT`: waits until the thread named in ``marks/tid``
    sleeps, then exits with :data:`EXIT_CODE`. Env 0 steps at once."""

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(self, tag: int, marks: str, manager_pid: int) -> None:
        self.tag, self.marks, self.manager_pid = tag, Path(marks), manager_pid
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
        if self.tag == 1 and self.t == DIES_AT:
            tid = int((self.marks / "tid").read_text())
            deadline = time.monotonic() + _ASLEEP_WAIT_S
            while not _asleep(self.manager_pid, tid) and time.monotonic() < deadline:
                time.sleep(0.01)
            os._exit(EXIT_CODE)
        return np.array([self.t], dtype=np.float32), 0.0, False, False, {}


def _call_within(fn: Any, seconds: float) -> BaseException | None:
    """Run ``fn`` in a thread; what it raised, or fail if it is not done within ``seconds``."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, name="stepper", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        return None
    return raised[0] if raised else AssertionError("the call returned without an error")


@pytest.mark.parametrize("how", ["step", "recv"])
def test_a_worker_dying_while_the_parent_sleeps_is_reported_within_a_bound(
    tmp_path: Path, how: str
) -> None:
    pid = os.getpid()
    fns = [
        (lambda tag=tag: DiesWhileTheParentSleeps(tag, str(tmp_path), pid))  # type: ignore[misc]
        for tag in (0, 1)
    ]
    actions = np.zeros(2, dtype=np.int64)
    # The parent sleeps at once (no spin) and has no step_timeout to end its wait.
    with SubprocessEnvManager(fns, 2, 1, parent_spin_seconds=0.0, max_restarts=0) as envs:
        envs.reset(seed=0)

        def call() -> None:
            (tmp_path / "tid").write_text(str(threading.get_native_id()))
            for _ in range(DIES_AT):
                if how == "step":
                    envs.step(actions)
                else:
                    envs.send(actions)
                    envs.recv(batch_size=2)

        raised = _call_within(call, NOTICED_WITHIN)
        if raised is None:
            envs.close()  # ends the call inside (ClosedManagerError in its thread)
            pytest.fail(f"worker 1's death was not noticed within {NOTICED_WITHIN} s")
        assert isinstance(raised, WorkerDiedError), repr(raised)
        assert f"exited with code {EXIT_CODE}" in str(raised)
