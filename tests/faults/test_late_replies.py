"""Late replies: a worker that answers after its step timed out never touches a later batch.

README ("Failure handling"): *a late reply (after a timeout) is never mistaken for
a current one: every command carries a sequence number.* Here the late answer
is produced on purpose and deterministically: env 3 blocks inside its step until
the test creates a release file, which the test does only *after* the timeout
has fired. No sleep decides the order of events:

1. ``step_async`` (or ``send``), then wait until env 3 says it is blocked
   (``ready_file``), then wait with ``step_timeout``: worker 1 is timed out;
2. release env 3: a worker still alive would now finish the old step, write its
   slice of shared memory and answer on its pipe;
3. wait until the old worker process is gone (a liveness bound only: the manager
   kills a timed-out worker before it returns, so this is immediate);
4. check that nothing moved: the ``copy=False`` observation views of the batch
   we hold are unchanged, and every later batch equals the reference (worker 0
   against ``SyncVectorEnv``, worker 1 against the env's known dynamics from a
   fresh episode), with env 3's step count showing the abandoned step was never
   run again by its replacement.

With restarts the step returns a full batch (worker 1's envs truncated); without
restarts the timeout is fatal and a caller who retries gets the broken-manager
error, never a stale batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.fault_cases import (
    AT_STEP,
    FAULT_ENV,
    NUM_ENVS,
    SEED,
    STEP_TIMEOUT,
    WHERE,
    Tracker,
    action_batches,
    assert_batch_shapes,
    assert_rows_equal,
    make_manager,
    reference,
    wait_until,
)
from support.fault_envs import process_token, wait_gone

from envmgr import BrokenManagerError, SubprocessEnvManager, WorkerTimeoutError

pytestmark = pytest.mark.timeout(60)


def blocked_manager(context: str, tmp_path: Path, **kwargs: Any) -> SubprocessEnvManager:
    """2 x 2 envs; env 3 blocks in its 2nd step until ``tmp_path / "release"`` exists."""
    return make_manager(
        "hang",
        context,
        tmp_path,
        ready_file=str(tmp_path / "blocked"),
        release_file=str(tmp_path / "release"),
        copy=False,
        close_timeout=1.0,
        **kwargs,
    )


def release_and_wait_for_the_old_worker(tmp_path: Path, old_token: Any) -> None:
    """Let the blocked step finish, then wait until its process has exited (or never was)."""
    (tmp_path / "release").touch()
    left = wait_gone([old_token], timeout=20.0, zombie_ok=True)
    assert not left, f"the timed-out worker is still running: {left}"


def check_stepping_on(envs: SubprocessEnvManager, sync: Any, steps: int, api: str) -> None:
    """After worker 1's replacement: worker 0 follows the reference, worker 1 starts a new
    episode (next-step autoreset), then counts up; env 3 ran exactly those env steps."""
    actions = action_batches(steps, seed=5)
    for k, a in enumerate(actions):
        if api == "step":
            obs, rew, term, trunc, infos = envs.step(a)
        else:
            envs.send(a)
            obs, rew, term, trunc, infos, ids = envs.recv(batch_size=NUM_ENVS)
            np.testing.assert_array_equal(ids, np.arange(NUM_ENVS))
        obs = np.array(obs)
        assert_batch_shapes(obs, rew, term, trunc)
        assert_rows_equal((obs, rew, term, trunc), sync.step(a), slice(0, 2), f"worker 0, {k}")
        assert "envmgr_restarted" not in infos
        np.testing.assert_array_equal(obs[2:, 0], [k, k])  # t of the new episode
        if k:
            np.testing.assert_allclose(rew[2:], a[2:] + k / 10.0)
        assert not trunc.any()
    # The replacement never ran the abandoned step: its env.step calls are exactly
    # the steps sent since (the first one after the restart is the autoreset).
    calls = envs.get_attr("calls")
    assert calls[2:] == (steps - 1, steps - 1), calls
    assert calls[:2] == (AT_STEP + steps, AT_STEP + steps), calls


@pytest.mark.parametrize(
    ("api", "context"),
    [
        ("step", "fork"),
        ("step", "forkserver"),
        ("step", "spawn"),
        ("recv", "fork"),
        ("recv", "forkserver"),
    ],
)
def test_a_step_answered_after_its_timeout_is_dropped_with_restarts(
    api: str, context: str, tmp_path: Path
) -> None:
    sync, want_obs = reference()
    first, cut = action_batches(AT_STEP, seed=4)
    with blocked_manager(context, tmp_path, max_restarts=1, step_timeout=STEP_TIMEOUT) as envs:
        tracker = Tracker(envs)
        old = process_token(envs.worker_pids[1])
        obs, _ = envs.reset(seed=SEED)
        np.testing.assert_array_equal(obs, want_obs)
        assert_rows_equal(envs.step(first), sync.step(first), slice(None), "step 1")

        # Env 3 blocks in this step: worker 1 is timed out and replaced. The deadline
        # starts once env 3 is known to be blocked, so the healthy worker is never
        # the one to miss it however loaded the machine is.
        if api == "step":
            envs.step_async(cut)
            wait_until((tmp_path / "blocked").exists, "env 3 blocking")
            obs, rew, term, trunc, infos = envs.step_wait()
        else:
            envs.send(cut)
            wait_until((tmp_path / "blocked").exists, "env 3 blocking")
            *_, ids = envs.recv()  # worker 0 is done; worker 1 is not
            np.testing.assert_array_equal(ids, [0, 1])
            obs, rew, term, trunc, infos, ids = envs.recv()
            np.testing.assert_array_equal(ids, [2, 3])
        assert envs.restarts == [0, 1]
        assert infos["envmgr_restarted"][1 if api == "recv" else FAULT_ENV] == (
            f"{WHERE}: it did not answer step within {STEP_TIMEOUT} s"
        )
        held = [np.array(x) for x in (obs, rew, term, trunc)]
        sync.step(cut)

        # The abandoned step may now finish: nothing of it may reach us.
        release_and_wait_for_the_old_worker(tmp_path, old)
        for got, before in zip((obs, rew, term, trunc), held, strict=True):
            np.testing.assert_array_equal(got, before, err_msg="a late write changed a batch")
        tracker.note_pids()
        check_stepping_on(envs, sync, 5, api)
    sync.close()
    tracker.assert_cleaned_up(at_once=True)


@pytest.mark.parametrize("api", ["step_wait", "recv"])
def test_a_caller_retrying_after_a_timeout_gets_an_error_not_a_late_batch(
    api: str, tmp_path: Path
) -> None:
    """Without restarts a timeout is fatal: the retry raises, the late answer has nowhere
    to go, and the last batch we were given is left as it was."""
    sync, _ = reference()
    first, cut = action_batches(AT_STEP, seed=4)
    with blocked_manager("fork", tmp_path) as envs:  # no step_timeout: the caller's own
        tracker = Tracker(envs)
        old = process_token(envs.worker_pids[1])
        envs.reset(seed=SEED)
        got = envs.step(first)
        assert_rows_equal(got, sync.step(first), slice(None), "step 1")
        held = np.array(got[0])
        if api == "step_wait":
            envs.step_async(cut)
            wait_until((tmp_path / "blocked").exists, "env 3 blocking")
            with pytest.raises(WorkerTimeoutError) as ei:
                envs.step_wait(timeout=STEP_TIMEOUT)
        else:
            envs.send(cut)
            wait_until((tmp_path / "blocked").exists, "env 3 blocking")
            envs.recv()  # worker 0
            with pytest.raises(WorkerTimeoutError) as ei:
                envs.recv(timeout=STEP_TIMEOUT)
        assert str(ei.value) == f"{WHERE}: it did not answer step within {STEP_TIMEOUT} s"
        tracker.assert_cleaned_up(at_once=True)
        release_and_wait_for_the_old_worker(tmp_path, old)
        # Worker 0 legitimately wrote its rows of the cut step; worker 1's rows still
        # hold step 1, which only a late write could change.
        np.testing.assert_array_equal(got[0][2:], held[2:], err_msg="a late write changed a batch")
        for retry in (lambda: envs.step(cut), lambda: envs.step_wait(), lambda: envs.recv()):
            with pytest.raises(BrokenManagerError):
                retry()
    sync.close()
