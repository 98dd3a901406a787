"""The first-ready API (``send``/``recv``) under faults: a worker dying or hanging while
its step is in flight, partial batches around a hung worker, and a finished worker
never passed over for one sent later.

Shared layout and helpers: fault_cases.py; what a fault test asserts: test_faults.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from conftest import Backend, on_backends
from support.fault_cases import (
    CALLER_BLOCKS,
    CALLER_DIES,
    DEATHS,
    EPW,
    NUM_ENVS,
    RAY_DEATHS,
    STEP_TIMEOUT,
    WHERE,
    Tracker,
    assert_batch_shapes,
    assert_closed_for_good,
    make_manager,
    wait_until,
    workers_asleep,
)

from envmgr import (
    WorkerTimeoutError,
)

pytestmark = pytest.mark.timeout(60)


@on_backends(
    "kind, context, max_restarts",
    local=[
        pytest.param(k, m, r, id=f"{k}-{m}-restarts{r}")
        for k, m in (("segfault", "fork"), ("segfault", "forkserver"), ("hang", "fork"))
        for r in (0, 1)
    ]
    + [pytest.param("exit", "spawn", 0, id="exit-spawn-restarts0")],
    caller=CALLER_DIES,
    ray=RAY_DEATHS,
)
def test_worker_death_during_recv(
    backend: Backend, kind: str, context: str, max_restarts: int, tmp_path: Path
) -> None:
    error_type, pattern, _ = DEATHS[kind]
    with make_manager(kind, context, tmp_path, max_restarts=max_restarts, backend=backend) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        timeout = STEP_TIMEOUT if kind == "hang" else None
        envs.send(zeros)
        *_, ids = envs.recv(batch_size=NUM_ENVS, timeout=timeout)
        np.testing.assert_array_equal(ids, np.arange(NUM_ENVS))
        envs.send(zeros)
        if not max_restarts:
            with pytest.raises(error_type) as ei:
                envs.recv(batch_size=NUM_ENVS, timeout=timeout)
            assert re.fullmatch(rf"{re.escape(WHERE)}: it {pattern}", str(ei.value)), str(ei.value)
            tracker.assert_cleaned_up(at_once=True)
            assert_closed_for_good(envs, ei.value)
            return
        obs, rew, term, trunc, infos, ids = envs.recv(batch_size=NUM_ENVS, timeout=timeout)
        np.testing.assert_array_equal(ids, np.arange(NUM_ENVS))
        assert_batch_shapes(obs, rew, term, trunc)
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        np.testing.assert_array_equal(infos["_envmgr_restarted"], [False, False, True, True])
        assert re.fullmatch(rf"{re.escape(WHERE)}: it {pattern}", infos["envmgr_restarted"][3])
        np.testing.assert_array_equal(obs[:, 0], [2.0, 2.0, 0.0, 0.0])
        assert envs.restarts == [0, 1]
        tracker.note_pids()
        # And on: worker 1 autoresets, then counts up with worker 0.
        for t in range(3):
            envs.send(zeros)
            obs, rew, term, trunc, infos, ids = envs.recv(batch_size=NUM_ENVS, timeout=timeout)
            np.testing.assert_array_equal(obs[:, 0], [3 + t, 3 + t, t, t])
            assert not trunc.any() and "envmgr_restarted" not in infos
    tracker.assert_cleaned_up()


# On Ray, the restart case only: test_call_wait_timeout[ray] checks the timeout's message.
@on_backends("max_restarts", local=[0, 1], caller=CALLER_BLOCKS, ray=[1])
def test_hang_in_recv_with_partial_batches(
    backend: Backend, max_restarts: int, tmp_path: Path
) -> None:
    """A hung worker is timed out by the recv that waits for it, not by others."""
    with make_manager(
        "hang",
        "fork",
        tmp_path,
        max_restarts=max_restarts,
        step_timeout=STEP_TIMEOUT,
        backend=backend,
    ) as envs:
        where = envs._where(1)  # WHERE, or the actor's name and node on Ray
        envs.reset(seed=0)
        zeros2 = np.zeros(EPW, dtype=np.int64)
        envs.send(np.zeros(NUM_ENVS, dtype=np.int64))
        for _ in range(2):  # both workers' first steps
            *_, ids = envs.recv()
            assert len(ids) == EPW
        envs.send(zeros2, [2, 3])  # worker 1 hangs in this step
        envs.send(zeros2, [0, 1])
        *_, ids = envs.recv()
        np.testing.assert_array_equal(ids, [0, 1])  # the healthy worker comes first
        if not max_restarts:
            with pytest.raises(WorkerTimeoutError, match=re.escape(where)) as ei:
                envs.recv()
            assert_closed_for_good(envs, ei.value)
            return
        _, _, _, trunc, infos, ids = envs.recv()
        np.testing.assert_array_equal(ids, [2, 3])
        np.testing.assert_array_equal(trunc, [True, True])
        assert "did not answer step" in infos["envmgr_restarted"][1]
        assert envs.restarts == [0, 1]


@pytest.mark.timeout(30)
@on_backends(
    caller="it orders two worker processes by when they finished; group 1 is this process",
    ray="it waits until worker processes sleep (/proc), which Ray's actors do not show",
)
def test_recv_returns_a_finished_worker_before_one_sent_later(
    backend: Backend, tmp_path: Path
) -> None:
    """First-ready means first *finished*, and among finished steps the one sent first:
    a finished worker is never passed over for a lower-numbered worker sent after it.

    Each round sends worker 1, then worker 0, and waits until both have finished:
    their envs logged the step and both processes sleep (with ``spin_seconds=0``
    a worker sleeps only after publishing). ``recv()`` must then return worker 1.
    """
    log = tmp_path / "steps.log"
    log.touch()
    with make_manager(
        "none", "fork", tmp_path, step_log=str(log), spin_seconds=0.0, backend=backend
    ) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(EPW, dtype=np.int64)
        pids = list(envs.worker_pids)
        for r in range(1, 11):
            envs.send(zeros, [2, 3])
            envs.send(zeros, [0, 1])
            wait_until(
                lambda r=r: log.read_text().count("\n") == NUM_ENVS * r and workers_asleep(pids),
                f"round {r}: both workers finishing",
            )
            *_, first = envs.recv()
            *_, second = envs.recv()
            assert (first.tolist(), second.tolist()) == ([2, 3], [0, 1]), f"round {r}"
