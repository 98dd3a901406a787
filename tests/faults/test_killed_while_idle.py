"""Workers SIGKILLed from outside while idle: replaced at the next step or reset (the
replacement carries out the reset asked for), or, without restarts, an error naming the
signal whichever call finds the dead worker; and recv() sleeps, not spins, meanwhile.

Shared layout and helpers: fault_cases.py; what a fault test asserts: test_faults.py.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import Backend, on_backends
from support.fault_cases import (
    CALLER_BLOCKS,
    EPW,
    NUM_ENVS,
    RAY_DEATHS,
    SEED,
    Tracker,
    action_batches,
    assert_closed_for_good,
    assert_rows_equal,
    kill_and_wait,
    make_manager,
    reference,
)

from envmgr import (
    WorkerDiedError,
)

pytestmark = pytest.mark.timeout(60)


@on_backends("context", local=["fork", "forkserver"], caller=["fork"], ray=RAY_DEATHS)
def test_worker_killed_while_idle_is_replaced_at_the_next_step(
    backend: Backend, context: str, tmp_path: Path
) -> None:
    sync, _ = reference()
    actions = action_batches(4, seed=2)
    with make_manager("none", context, tmp_path, max_restarts=1, backend=backend) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=SEED)
        assert_rows_equal(envs.step(actions[0]), sync.step(actions[0]), slice(None), "step 1")
        kill_and_wait(envs.worker_pids[0])
        obs, rew, term, trunc, infos = envs.step(actions[1])
        assert_rows_equal((obs, rew, term, trunc), sync.step(actions[1]), slice(2, 4), "worker 1")
        np.testing.assert_array_equal(trunc, [True, True, False, False])
        assert infos["envmgr_restarted"][0] == (
            "worker 0 (envs 0-1): it was killed by signal SIGKILL (exit code -9) during step"
        )
        assert envs.restarts == [1, 0]
        tracker.note_pids()
        for a in actions[2:]:
            assert_rows_equal(envs.step(a), sync.step(a), slice(2, 4), "worker 1 after")
    sync.close()
    tracker.assert_cleaned_up()


@on_backends(ray=RAY_DEATHS)
def test_worker_killed_while_idle_is_replaced_at_the_next_reset(
    backend: Backend, tmp_path: Path
) -> None:
    """The replacement carries out the reset that was asked for, seeds included."""
    sync, want_obs = reference(seed=3)
    with make_manager("none", "fork", tmp_path, max_restarts=1, backend=backend) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        kill_and_wait(envs.worker_pids[0])
        obs, infos = envs.reset(seed=3)
        np.testing.assert_array_equal(obs, want_obs)
        np.testing.assert_array_equal(infos["_envmgr_restarted"], [True, True, False, False])
        assert (
            "worker 0 (envs 0-1): it was killed by signal SIGKILL" in infos["envmgr_restarted"][0]
        )
        assert envs.restarts == [1, 0]
        tracker.note_pids()
        for a in action_batches(3, seed=4):
            assert_rows_equal(envs.step(a), sync.step(a), slice(None), "after the reset")
    sync.close()
    tracker.assert_cleaned_up()


@on_backends("call", local=["step", "reset", "get_attr", "send"], ray=RAY_DEATHS)
def test_worker_killed_while_idle_without_restarts_names_the_signal(
    backend: Backend, call: str, tmp_path: Path
) -> None:
    """However the dead worker is found, the error says how it died."""
    with make_manager("none", "fork", tmp_path, backend=backend) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        kill_and_wait(envs.worker_pids[0])
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        with pytest.raises(WorkerDiedError) as ei:
            if call == "step":
                envs.step(zeros)
            elif call == "reset":
                envs.reset(seed=1)
            elif call == "get_attr":
                envs.get_attr("tag")
            else:
                envs.send(zeros)
                envs.recv(batch_size=NUM_ENVS)
        tracker.assert_cleaned_up(at_once=True)
        assert_closed_for_good(envs, ei.value)
    exc = ei.value
    assert str(exc).startswith(
        "worker 0 (envs 0-1): it was killed by signal SIGKILL (exit code -9)"
    ), exc
    assert exc.exitcode == -signal.SIGKILL and exc.env_indices == (0, 1)


@on_backends(
    caller=CALLER_BLOCKS,
    ray="the spinning it guards against would be the local backend's wait",
)
def test_recv_does_not_spin_while_an_idle_worker_is_dead(backend: Backend, tmp_path: Path) -> None:
    """recv() waits for worker 1's slow step while worker 0, not in flight, is dead.

    The wait must sleep, not spin on the dead worker's sentinel. Measured in CPU
    seconds of this process (not wall time): a sleeping wait costs milliseconds,
    a spinning one most of the 1.5 s the slow step takes.
    """
    with make_manager("hang", "fork", tmp_path, hang_seconds=1.5, backend=backend) as envs:
        envs.reset(seed=0)
        envs.send(np.zeros(NUM_ENVS, dtype=np.int64))
        envs.recv(batch_size=NUM_ENVS)
        envs.send(np.zeros(NUM_ENVS, dtype=np.int64))  # worker 1 is slow in this step
        *_, ids = envs.recv()
        np.testing.assert_array_equal(ids, [0, 1])
        kill_and_wait(envs.worker_pids[0])
        cpu = time.process_time()
        *_, ids = envs.recv()
        cpu = time.process_time() - cpu
        np.testing.assert_array_equal(ids, [2, 3])
        assert cpu < 0.5, f"recv() used {cpu:.2f} CPU seconds waiting for a 1.5 s step"
        with pytest.raises(WorkerDiedError, match="SIGKILL"):
            envs.send(np.zeros(EPW, dtype=np.int64), [0, 1])
            envs.recv()
