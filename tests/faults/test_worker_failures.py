"""Dead and hung workers on SubprocessEnvManager: WorkerDiedError naming the signal or
exit code, WorkerTimeoutError (a TimeoutError), and replacement under ``max_restarts``
(the replaced envs truncated, showing their new episode). The fault matrix over
every start method is ``test_faults.py`` and the files it names.

(envmgr.backends.local.process, envmgr.frontend.restarts)
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import signal
import time
from pathlib import Path
from time import monotonic
from typing import Any

import numpy as np
import pytest
from support.envs import DictObsEnv, ExitingEnv, ExplodingEnv, TextActionEnv, TextObsEnv
from support.fault_envs import fault_env_fns, process_state, process_token
from support.helpers import pid_exists

from envmgr import (
    BrokenManagerError,
    BrokenWorkerError,
    SubprocessEnvManager,
    WorkerDiedError,
    WorkerTimeoutError,
)

pytestmark = pytest.mark.timeout(60)


def test_sigkilled_worker_raises_worker_died_error(start_method: str) -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, context=start_method) as envs:
        envs.reset(seed=0)
        action = envs.action_space.sample()
        envs.step(action)
        os.kill(envs.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerDiedError) as ei:
            envs.step(action)
        exc = ei.value
        assert "worker 0" in str(exc) and "SIGKILL" in str(exc)
        assert exc.worker_index == 0 and exc.env_indices == (0, 1)
        assert exc.exitcode == -signal.SIGKILL
        assert envs.closed
        with pytest.raises(BrokenManagerError):
            envs.step(action)
    envs.close()


@pytest.mark.parametrize("next_call", ["reset", "get_attr", "step-fallback-actions"])
def test_sigkilled_idle_worker_is_named_with_its_signal_by_any_next_call(next_call: str) -> None:
    """Whichever call meets the dead worker first (through the pipe rather than the
    shared-memory hand-off), the error names the worker and the signal."""
    env_fn = TextActionEnv if next_call == "step-fallback-actions" else DictObsEnv
    with SubprocessEnvManager(env_fn, 2, 2) as envs:
        envs.reset(seed=0)
        action = envs.action_space.sample()
        envs.step(action)
        pid = envs.worker_pids[0]
        os.kill(pid, signal.SIGKILL)
        deadline = monotonic() + 30  # let it die, so the next call meets a dead worker
        while pid_exists(pid) and monotonic() < deadline:
            time.sleep(0.01)
        with pytest.raises(WorkerDiedError) as ei:
            if next_call == "reset":
                envs.reset()
            elif next_call == "get_attr":
                envs.get_attr("t")
            else:
                envs.step(action)
        exc = ei.value
        assert "worker 0 (envs 0-1)" in str(exc)
        assert "SIGKILL" in str(exc), str(exc)
        assert exc.exitcode == -signal.SIGKILL
        assert envs.closed


def test_worker_exiting_inside_step_raises_worker_died_error() -> None:
    fns = [functools.partial(ExplodingEnv, explode_at=100)] * 2 + [
        functools.partial(ExitingEnv, explode_at=1, exit_code=3)
    ] * 2
    with SubprocessEnvManager(fns, n_workers=2) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(4, dtype=np.int64)
        envs.step(zeros)
        with pytest.raises(WorkerDiedError) as ei:
            envs.step(zeros)
    assert ei.value.worker_index == 1 and ei.value.exitcode == 3
    assert "worker 1 (envs 2-3)" in str(ei.value) and "code 3" in str(ei.value)


def hung_worker_1(tmp_path: Path, **kwargs: Any) -> SubprocessEnvManager:
    """2 workers x 1 env; env 1 (worker 1) sleeps for an hour in its 2nd step."""
    fns = fault_env_fns(
        "hang",
        2,
        1,
        at_step=2,
        state_dir=tmp_path,
        ready_file=str(tmp_path / "blocked"),
        step_log=str(tmp_path / "steps"),
    )
    # spin_seconds=0: a worker sleeps as soon as it has published its step.
    kwargs.setdefault("close_timeout", 0.5)
    return SubprocessEnvManager(fns, 2, 1, spin_seconds=0.0, **kwargs)


def start_the_hanging_step(envs: SubprocessEnvManager, tmp_path: Path) -> None:
    """step_async, then wait until worker 0 has finished (its env logged two steps and its
    process sleeps) and env 1 is blocked: only worker 1 can miss the deadline."""
    (tmp_path / "steps").touch()
    envs.step_async(np.zeros(2, dtype=np.int64))
    token = process_token(envs.worker_pids[0])
    deadline = monotonic() + 30  # a liveness bound
    while not (
        (tmp_path / "blocked").exists()
        and (tmp_path / "steps").read_text().split().count("0") == 2
        and token is not None
        and process_state(token) == "S"
    ):
        assert monotonic() < deadline, "worker 0 did not finish its step"
        time.sleep(0.01)


def test_hung_worker_raises_worker_timeout_error(tmp_path: Path) -> None:
    with hung_worker_1(tmp_path, step_timeout=0.5) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        start_the_hanging_step(envs, tmp_path)
        with pytest.raises(WorkerTimeoutError) as ei:
            envs.step_wait()
        exc = ei.value
        assert isinstance(exc, TimeoutError)
        assert str(exc) == "worker 1 (envs 1-1): it did not answer step within 0.5 s"
        assert exc.worker_index == 1 and exc.env_indices == (1,)
        with pytest.raises(BrokenManagerError):
            envs.step(np.zeros(2, dtype=np.int64))


@pytest.mark.timeout(30)
def test_a_worker_that_overran_is_killed_at_once(tmp_path: Path) -> None:
    """As the README's fault table says: killed when its time runs out. It used to be
    stopped only by the broken manager's shutdown, after ``close_timeout`` spent waiting
    for a clean exit that a hung worker never makes: here 120 s, past this test's limit.
    Worker 0, idle, still closes cleanly."""
    with hung_worker_1(tmp_path, step_timeout=0.5, close_timeout=120.0) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        start_the_hanging_step(envs, tmp_path)
        tokens = [process_token(pid) for pid in envs.worker_pids]
        with pytest.raises(WorkerTimeoutError, match="worker 1 "):
            envs.step_wait()
        # The manager is broken; both workers are gone, and it did not wait for either.
        assert all(process_state(t) is None for t in tokens if t is not None)


def test_killed_worker_is_restarted_under_a_restart_policy() -> None:
    with SubprocessEnvManager(DictObsEnv, 2, 2, max_restarts=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2), dtype=np.int64)
        envs.step(actions)
        old = envs.worker_pids[1]
        os.kill(old, signal.SIGKILL)
        obs, rew, term, trunc, infos = envs.step(actions)
        assert envs.observation_space.contains(obs)
        assert trunc[2:].all(), "the replaced worker's envs end their episodes"
        assert infos["_envmgr_restarted"].tolist() == [False, False, True, True]
        assert (
            "worker 1" in infos["envmgr_restarted"][2] and "SIGKILL" in infos["envmgr_restarted"][2]
        )
        assert envs.restarts == [0, 1] and envs.worker_pids[1] != old
        for _ in range(3):
            envs.step(actions)
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        with pytest.raises(BrokenWorkerError, match="max_restarts=1"):
            envs.step(actions)
        assert envs.closed


@pytest.mark.parametrize("transport", ["shared-memory", "fallback"])
def test_restarted_envs_return_their_new_episode_observation(transport: str) -> None:
    """After a worker is replaced mid-step, its envs (truncated) must show the
    observation their fresh episode starts with, whatever the transport."""
    if transport == "fallback":
        fns = [functools.partial(TextObsEnv, reset_obs="eeeeee")] * 4
    else:
        fns = [DictObsEnv] * 4
    with SubprocessEnvManager(fns, n_workers=2, max_restarts=1) as envs:
        envs.reset(seed=0)
        actions = np.zeros((4, 2) if transport == "shared-memory" else 4, dtype=np.int64)
        before, *_ = envs.step(actions)
        os.kill(envs.worker_pids[1], signal.SIGKILL)
        obs, _, _, trunc, _ = envs.step(actions)
        assert trunc.tolist() == [False, False, True, True]
        if transport == "fallback":
            assert obs[2:] == ("eeeeee", "eeeeee"), f"stale observations {obs[2:]}"
        else:
            for i in (2, 3):  # a fresh random episode, not the last observation
                assert not np.array_equal(obs["pos"][i], before["pos"][i])
            assert envs.observation_space.contains(obs)


def test_hung_worker_is_replaced_under_a_restart_policy(tmp_path: Path) -> None:
    with hung_worker_1(tmp_path, step_timeout=0.5, max_restarts=1) as envs:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
        start_the_hanging_step(envs, tmp_path)
        _, _, _, trunc, infos = envs.step_wait()  # worker 1 sleeps: replaced
        assert trunc.tolist() == [False, True]
        assert infos["_envmgr_restarted"].tolist() == [False, True]
        assert infos["envmgr_restarted"][1] == (
            "worker 1 (envs 1-1): it did not answer step within 0.5 s"
        )
        assert envs.restarts == [0, 1]
        envs.step(np.zeros(2, dtype=np.int64))


def test_worker_timeout_error_is_what_async_vector_env_code_catches() -> None:
    assert issubclass(WorkerTimeoutError, TimeoutError)
    assert issubclass(WorkerTimeoutError, mp.TimeoutError)
