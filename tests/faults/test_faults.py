"""Fault injection: workers that crash, exit, raise, hang, leak or cannot be built.

Every fault fires in one env (env 3, the second env of worker 1, with 2 workers
x 2 envs) at a chosen step; see ``fault_envs.py``. Each case asserts:

* the error's type, message (worker index, env range or env index, signal name
  or exit code, phase) and attributes;
* with ``max_restarts=0``, that the manager is closed when the error reaches
  the caller: its worker processes are gone (reaped, not zombies) and its
  shared-memory segment is unlinked at that moment (checked without waiting),
  and later calls raise the manager's "broken" error (``BrokenManagerError``);
* with restarts on, that the step returns a full batch of the right shapes, the
  replaced worker's envs flagged (``truncated`` and ``infos["envmgr_restarted"]``),
  the healthy envs identical to a ``SyncVectorEnv`` reference, and the restarted
  envs following the env's (predictable) dynamics from a fresh episode;
* and, through the autouse fixture in ``conftest.py``, that no process or
  ``/dev/shm/envmgr_*`` entry outlives the test.

Start methods: every fault under ``fork`` and ``forkserver``; a representative
subset under ``spawn``, whose workers take about a second each to start here.
No assertion depends on how fast the machine is. The clocks used are polling
deadlines, ``step_timeout`` against envs that block until the test releases
them (never a slow step racing a timeout), sleeps longer than a
``restart_window`` (to step outside it), and, once, this process's CPU time
(a wait that sleeps costs milliseconds of it however loaded the machine is).
Orderings are observed through the envs themselves (``step_log``,
``ready_file``), not through sleeps.

Elsewhere, with the same layout and helpers (``fault_cases.py``): workers SIGKILLed
from outside while idle (``test_killed_while_idle.py``), the restart budget and
replacements that die while starting (``test_restart_budget.py``), the first-ready
API under faults (``test_first_ready_faults.py``), and bad input / calls out of
order (``test_bad_input.py``).

Backends (``conftest.on_backends``), here and in those files: every test runs on
the local manager, and on the caller case (``caller_envs``: group 1, envs 2-3,
stepped in this process) and Ray where it applies; where it does not, its skipped
case says why. Most faults end env 3's process, which in the caller case is the
test's own, and most assert what only a local worker shows (signal, exit code,
pids, the segment). Ray runs the few cases not pinned elsewhere (Ray's deaths,
restarts and env errors are ``test_contract.py``'s and ``test_ray.py``'s); each
Ray case costs seconds.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Backend, on_backends
from support.fault_cases import (
    AT_STEP,
    CALLER_DIES,
    CALLER_RAISES,
    DEATHS,
    FAULT_ENV,
    FAULT_WORKER,
    NUM_ENVS,
    RAY_DEATHS,
    SEED,
    SPAWN_DEATHS,
    STEP_TIMEOUT,
    WHERE,
    Tracker,
    action_batches,
    assert_batch_shapes,
    assert_closed_for_good,
    assert_rows_equal,
    group_ids,
    make_manager,
    reference,
    start_method_cases,
)
from support.fault_envs import (
    EXIT_CODE,
    InjectedFault,
    incarnations,
    wait_gone,
)
from support.helpers import full_text

from envmgr import (
    RemoteTraceback,
    WorkerDiedError,
)

pytestmark = pytest.mark.timeout(60)


@on_backends(
    "kind, context",
    local=start_method_cases(tuple(DEATHS), SPAWN_DEATHS),
    caller=CALLER_DIES,
    ray=RAY_DEATHS,
)
def test_worker_death_closes_the_manager_and_names_the_worker(
    backend: Backend, kind: str, context: str, tmp_path: Path
) -> None:
    error_type, pattern, exitcode = DEATHS[kind]
    timeout = STEP_TIMEOUT if kind == "hang" else None
    sync, want_obs = reference()
    actions = action_batches(AT_STEP)
    with make_manager(
        kind, context, tmp_path, step_timeout=timeout, close_timeout=0.5, backend=backend
    ) as envs:
        tracker = Tracker(envs)
        obs, _ = envs.reset(seed=SEED)
        np.testing.assert_array_equal(obs, want_obs)
        for a in actions[:-1]:
            got = envs.step(a)
            assert_rows_equal(got, sync.step(a), slice(None), "before the fault")
        with pytest.raises(error_type) as ei:
            envs.step(actions[-1])
        exc = ei.value
        # The manager released everything before the error reached us.
        assert envs.closed
        tracker.assert_cleaned_up(at_once=True)
        assert_closed_for_good(envs, exc)
    sync.close()
    assert re.fullmatch(rf"{re.escape(WHERE)}: it {pattern}", str(exc)), str(exc)
    assert exc.worker_index == FAULT_WORKER
    assert exc.env_indices == (2, 3)
    if isinstance(exc, WorkerDiedError):
        assert exc.exitcode == exitcode
    else:
        assert isinstance(exc, TimeoutError)


@on_backends(
    "kind, context",
    local=start_method_cases(tuple(DEATHS), ("segfault", "hang")),
    caller=CALLER_DIES,
    ray=RAY_DEATHS,
)
def test_worker_death_with_restarts_replaces_the_worker_and_flags_its_envs(
    backend: Backend, kind: str, context: str, tmp_path: Path
) -> None:
    _, pattern, _ = DEATHS[kind]
    hang = kind == "hang"
    extra: dict[str, Any] = {}
    release = tmp_path / "release"
    if hang:
        # A step that would answer late rather than never: it blocks until the
        # test releases it (after the timeout), so no clock decides the order.
        # Were the old worker's answer ever taken for a later step's, the
        # comparisons below would catch it (tests/test_late_replies.py goes further).
        extra = {"step_timeout": STEP_TIMEOUT, "release_file": str(release)}
    sync, _ = reference()
    actions = action_batches(40, seed=1)
    with make_manager(kind, context, tmp_path, max_restarts=2, **extra, backend=backend) as envs:
        tracker = Tracker(envs)
        pids = list(envs.worker_pids)
        envs.reset(seed=SEED)
        for a in actions[: AT_STEP - 1]:
            assert_rows_equal(envs.step(a), sync.step(a), slice(None), "before the fault")

        # The step in which worker 1 dies returns a full batch.
        obs, rew, term, trunc, infos = envs.step(actions[AT_STEP - 1])
        want = sync.step(actions[AT_STEP - 1])
        assert_batch_shapes(obs, rew, term, trunc)
        assert_rows_equal((obs, rew, term, trunc), want, slice(0, 2), "worker 0 at the fault")
        np.testing.assert_array_equal(trunc[2:], [True, True])
        np.testing.assert_array_equal(term[2:], [False, False])
        np.testing.assert_array_equal(obs[2:, 0], [0.0, 0.0])  # freshly reset: t = 0
        np.testing.assert_array_equal(infos["_envmgr_restarted"], [False, False, True, True])
        for i in (2, 3):
            reason = infos["envmgr_restarted"][i]
            assert re.fullmatch(rf"{re.escape(WHERE)}: it {pattern}", reason), reason
        assert envs.restarts == [0, 1]
        assert envs.worker_pids[0] == pids[0] and envs.worker_pids[1] != pids[1]
        assert not wait_gone([tracker.tokens[pids[1]]]), "the replaced worker is still there"
        assert incarnations(tmp_path, FAULT_ENV) == 2
        tracker.note_pids()

        # Stepping goes on. Worker 0's envs never notice; worker 1's envs start a
        # new episode (next-step autoreset after the truncation), then count up.
        # With the blocked step, half-way through release it: had its worker
        # lived, its answer would now meet a later step.
        t_restarted = 0
        for k in range(AT_STEP, AT_STEP + 6):
            if hang and k == AT_STEP + 2:
                release.touch()
            a = actions[k]
            obs, rew, term, trunc, infos = envs.step(a)
            want = sync.step(a)
            assert_batch_shapes(obs, rew, term, trunc)
            assert_rows_equal((obs, rew, term, trunc), want, slice(0, 2), f"worker 0, step {k + 1}")
            assert "envmgr_restarted" not in infos
            if k == AT_STEP:  # the autoreset step
                np.testing.assert_array_equal(rew[2:], [0.0, 0.0])
            else:
                t_restarted += 1
                np.testing.assert_allclose(rew[2:], a[2:] + t_restarted / 10.0)
            np.testing.assert_array_equal(obs[2:, 0], [t_restarted, t_restarted])
            assert not term.any() and not trunc.any()
        assert envs.restarts == [0, 1]
    sync.close()
    tracker.assert_cleaned_up()


@on_backends(caller=CALLER_DIES, ray=RAY_DEATHS)
def test_leaking_worker_reports_growing_rss_until_it_is_killed(
    backend: Backend, tmp_path: Path
) -> None:
    """The leak is visible in the infos; the OOM-style SIGKILL is a restart like any other."""
    leak = 4 << 20
    with make_manager(
        "leak", "fork", tmp_path, at_step=6, leak_bytes=leak, max_restarts=1, backend=backend
    ) as envs:
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        rss = []
        for _ in range(5):
            _, _, _, trunc, infos = envs.step(zeros)
            np.testing.assert_array_equal(infos["_rss"], [False, False, False, True])
            rss.append(int(infos["rss"][FAULT_ENV]))
            assert infos["leaked"][FAULT_ENV] == leak * len(rss)
            assert not trunc.any()
        assert rss[-1] - rss[0] >= 4 * leak * 0.9, rss  # the leak is resident memory
        _, _, _, trunc, infos = envs.step(zeros)  # killed here
        assert "SIGKILL" in infos["envmgr_restarted"][FAULT_ENV]
        np.testing.assert_array_equal(trunc, [False, False, True, True])
        for _ in range(3):
            _, _, _, trunc, infos = envs.step(zeros)
            assert "rss" not in infos  # the new incarnation does not leak
            assert not trunc.any()
        assert envs.restarts == [0, 1]


@on_backends(
    "kind, context, max_restarts",
    local=[
        pytest.param(k, m, r, id=f"{k}-{m}-restarts{r}")
        for k in ("raise", "unpicklable")
        for m in ("fork", "forkserver")
        for r in (0, 2)
    ]
    + [
        pytest.param("raise", "spawn", 0, id="raise-spawn-restarts0"),
        pytest.param("unpicklable", "spawn", 0, id="unpicklable-spawn-restarts0"),
    ],
    caller=CALLER_RAISES,
    # Worth its seconds on Ray: under restarts, an env's exception must not be taken
    # for the actor's failure (no replacement), and the traceback crosses Ray.
    ray=[pytest.param("raise", "fork", 2, id="raise-restarts2")],
)
def test_env_exception_is_reraised_and_the_worker_survives(
    backend: Backend, kind: str, context: str, max_restarts: int, tmp_path: Path
) -> None:
    with make_manager(kind, context, tmp_path, max_restarts=max_restarts, backend=backend) as envs:
        tracker = Tracker(envs)
        pids = group_ids(envs)
        where = envs._where(FAULT_WORKER)  # WHERE, or the actor's name and node on Ray
        envs.reset(seed=0)
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        envs.step(zeros)
        if kind == "raise":
            with pytest.raises(InjectedFault) as ei:
                envs.step(zeros)
            exc: BaseException = ei.value
            assert str(exc) == f"env 3 failed at step {AT_STEP}"
            assert f"raised in envmgr {where}, env 3, during step" in full_text(exc)
            assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
            assert isinstance(exc.__cause__, RemoteTraceback)
            remote = str(exc.__cause__)
            assert "fault_envs.py" in remote and "_fire" in remote and "InjectedFault" in remote
        else:
            # The info cannot be pickled: pickle's own error, naming what could not
            # be pickled, with a note naming the worker and what it was sending.
            with pytest.raises(TypeError) as ei:
                envs.step(zeros)
            exc = ei.value
            assert str(exc) == "cannot pickle '_thread.lock' object"
            assert f"raised in envmgr {where}, during step (sending the result)" in full_text(exc)
            assert exc.worker_index == 1  # type: ignore[attr-defined]
            assert isinstance(exc.__cause__, RemoteTraceback)
        # Not a worker failure: nothing was replaced and the manager is usable.
        assert not envs.closed
        assert group_ids(envs) == pids and envs.restarts == [0, 0]
        sync, want_obs = reference(seed=11)
        obs, _ = envs.reset(seed=11)
        np.testing.assert_array_equal(obs, want_obs)
        for a in action_batches(5, seed=3):
            assert_rows_equal(envs.step(a), sync.step(a), slice(None), "after the reset")
        sync.close()
    tracker.assert_cleaned_up()


@on_backends(
    "kind, context, max_restarts",
    local=[
        pytest.param(k, m, r, id=f"{k}-{m}-restarts{r}")
        for k in ("init_raise", "init_exit")
        for m, r in (("fork", 0), ("fork", 2), ("forkserver", 0), ("spawn", 0))
    ],
    caller=f"init_exit: {CALLER_DIES}; init_raise: {CALLER_RAISES}",
    ray="a factory's error on Ray: test_ray.py::test_factory_error_is_raised_and_leaves_nothing",
)
def test_env_that_cannot_be_built_fails_construction(
    backend: Backend, kind: str, context: str, max_restarts: int, tmp_path: Path
) -> None:
    """Restarts never apply at start-up: the factory's failure is the constructor's."""
    expected = InjectedFault if kind == "init_raise" else WorkerDiedError
    with pytest.raises(expected) as ei:
        make_manager(kind, context, tmp_path, max_restarts=max_restarts, backend=backend)
    exc = ei.value
    if kind == "init_raise":
        assert str(exc) == "env 3 refused to be built (incarnation 0)"
        assert f"{WHERE}, env 3, during make" in full_text(exc)
        assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
        assert "FaultEnv" in str(exc.__cause__) or "__init__" in str(exc.__cause__)
    else:
        assert str(exc) == f"{WHERE}: it exited with code {EXIT_CODE} during start"
        assert exc.exitcode == EXIT_CODE and exc.worker_index == 1  # type: ignore[attr-defined]
    assert incarnations(tmp_path, FAULT_ENV) == 1
