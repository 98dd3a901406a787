"""The restart budget: ``max_restarts`` spent raises BrokenWorkerError, failures older
than ``restart_window`` do not count, and replacements that fail while starting (their
factory raises, or they die before they are ready) are handled under the same budget.

Shared layout and helpers: fault_cases.py; what a fault test asserts: test_faults.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from conftest import Backend, on_backends
from support.fault_cases import (
    CALLER_DIES,
    FAULT_ENV,
    NUM_ENVS,
    RAY_DEATHS,
    WHERE,
    Tracker,
    assert_closed_for_good,
    make_manager,
)
from support.fault_envs import (
    EXIT_CODE,
    InjectedFault,
    incarnations,
)
from support.helpers import full_text

from envmgr import (
    BrokenWorkerError,
    RemoteTraceback,
    WorkerFailure,
)

pytestmark = pytest.mark.timeout(60)


@on_backends(
    "context, window",
    local=[pytest.param(c, w, id=f"{w}-{c}") for w in (None, 60.0) for c in ("fork", "forkserver")],
    caller=CALLER_DIES,
    ray=RAY_DEATHS,
)
def test_failures_beyond_max_restarts_raise_broken_worker_error(
    backend: Backend, context: str, window: float | None, tmp_path: Path
) -> None:
    """The env exits at its 2nd step in every incarnation: 2 restarts, then the 3rd failure."""
    with make_manager(
        "exit",
        context,
        tmp_path,
        fire_in=None,
        max_restarts=2,
        restart_window=window,
        backend=backend,
    ) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        flagged = 0
        with pytest.raises(BrokenWorkerError) as ei:
            for _ in range(20):
                *_, trunc, infos = envs.step(zeros)
                tracker.note_pids()
                if "envmgr_restarted" in infos:
                    flagged += 1
                    np.testing.assert_array_equal(trunc, [False, False, True, True])
        assert flagged == 2 and envs.restarts == [0, 2]
        tracker.assert_cleaned_up(at_once=True)
        assert_closed_for_good(envs, ei.value)
    exc = ei.value
    within = "" if window is None else f" within {window:g} s"
    assert str(exc) == (
        f"{WHERE} failed (it exited with code {EXIT_CODE} during step) after 2 restarts{within}; "
        "max_restarts=2 is spent, so the manager is closed"
    )
    assert exc.worker_index == 1 and exc.env_indices == (2, 3)
    assert isinstance(exc, WorkerFailure)
    assert incarnations(tmp_path, FAULT_ENV) == 3


@on_backends(caller=CALLER_DIES, ray=RAY_DEATHS)
def test_restarts_older_than_restart_window_do_not_count(backend: Backend, tmp_path: Path) -> None:
    """With a window, failures spaced further apart than it never use up the budget."""
    window = 0.2
    with make_manager(
        "exit",
        "fork",
        tmp_path,
        fire_in=None,
        max_restarts=1,
        restart_window=window,
        backend=backend,
    ) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        for restarts in range(1, 4):
            # The fault fires on the env's 2nd step call: step, step (dies), then
            # the autoreset step of the new incarnation, which is no step call.
            time.sleep(window * 2)  # the previous restart is out of the window
            envs.step(zeros)
            *_, trunc, infos = envs.step(zeros)
            assert "envmgr_restarted" in infos and trunc[2:].all()
            assert envs.restarts == [0, restarts]
            envs.step(zeros)  # autoreset
        assert incarnations(tmp_path, FAULT_ENV) == 4


@on_backends(caller=CALLER_DIES, ray=RAY_DEATHS)
def test_a_replacement_whose_factory_raises_closes_the_manager(
    backend: Backend, tmp_path: Path
) -> None:
    """As at start-up, a factory's own exception is raised as itself and is fatal."""
    with make_manager(
        "segfault", "fork", tmp_path, rebuild_fault="init_raise", max_restarts=3, backend=backend
    ) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        envs.step(zeros)
        with pytest.raises(InjectedFault) as ei:
            envs.step(zeros)
        tracker.assert_cleaned_up(at_once=True)
        assert_closed_for_good(envs, ei.value)
    exc = ei.value
    assert str(exc) == "env 3 refused to be built (incarnation 1)"
    assert f"{WHERE}, env 3, during make" in full_text(exc)
    # The death that made the restart is named too, not only kept in `failures`.
    assert f"raised while envmgr built a replacement, after: {envs.failures[0]}" in full_text(exc)
    assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
    assert isinstance(exc.__cause__, RemoteTraceback)
    assert incarnations(tmp_path, FAULT_ENV) == 2


@on_backends("rebuild_fault", local=["init_exit", "reset_exit"], caller=CALLER_DIES, ray=RAY_DEATHS)
def test_a_replacement_that_dies_while_starting_is_replaced_again(
    backend: Backend, rebuild_fault: str, tmp_path: Path
) -> None:
    """A replacement can be killed too (the OOM killer, a soak test's SIGKILL) before
    it has finished starting. That is one more failure of the worker, to be handled
    under the restart policy like the first, not a reason to close the manager
    while the budget lasts. Here incarnation 1 dies while starting; 2 is healthy."""
    with make_manager(
        "segfault",
        "fork",
        tmp_path,
        rebuild_fault=rebuild_fault,
        rebuild_in=(1,),
        max_restarts=3,
        backend=backend,
    ) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        envs.step(zeros)
        _, _, _, trunc, infos = envs.step(zeros)
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        # The step reports why its worker was replaced in the first place.
        assert "SIGSEGV" in infos["envmgr_restarted"][FAULT_ENV]
        assert envs.restarts == [0, 2]
        assert incarnations(tmp_path, FAULT_ENV) == 3
        tracker.note_pids()
        for _ in range(3):
            *_, trunc, infos = envs.step(zeros)
            assert not trunc.any() and "envmgr_restarted" not in infos
    tracker.assert_cleaned_up()


@on_backends(caller=CALLER_DIES, ray=RAY_DEATHS)
def test_replacements_that_keep_dying_while_starting_use_up_the_budget(
    backend: Backend, tmp_path: Path
) -> None:
    with make_manager(
        "segfault", "fork", tmp_path, rebuild_fault="init_exit", max_restarts=2, backend=backend
    ) as envs:
        tracker = Tracker(envs)
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        envs.step(zeros)
        with pytest.raises(BrokenWorkerError) as ei:
            envs.step(zeros)
        tracker.assert_cleaned_up(at_once=True)
        assert_closed_for_good(envs, ei.value)
    message = str(ei.value)
    assert message.startswith(f"{WHERE} failed (") and "after 2 restarts" in message, message
    assert f"exited with code {EXIT_CODE}" in message, message
    assert incarnations(tmp_path, FAULT_ENV) == 3
