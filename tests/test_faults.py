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

Also here: workers SIGKILLed from outside while idle, replacements that die
while starting, the first-ready API (``send``/``recv``) under faults, and bad
input / calls out of order.

Backends (``conftest.on_backends``): every test runs on the local manager, and on
the caller case (``caller_envs``: group 1, envs 2-3, stepped in this process) and
Ray where it applies; where it does not, its skipped case says why. Most faults
here end env 3's process, which in the caller case is the test's own, and most
assert what only a local worker shows (signal, exit code, pids, the segment). Ray
runs the few cases not pinned elsewhere (Ray's deaths, restarts and env errors are
``test_contract.py``'s and ``test_ray.py``'s); each Ray case costs seconds.
"""

from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from envs import BoxActionEnv
from fault_envs import (
    EXIT_CODE,
    InjectedFault,
    fault_env_fns,
    incarnations,
    process_state,
    process_token,
    segment_of,
    segment_path,
    wait_gone,
    wait_unlinked,
)
from gymnasium.vector import SyncVectorEnv
from helpers import full_text

from envmgr import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    ClosedManagerError,
    NoAsyncCallError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerFailure,
    WorkerTimeoutError,
)

pytestmark = pytest.mark.timeout(60)

N_WORKERS, EPW = 2, 2
NUM_ENVS = N_WORKERS * EPW
FAULT_ENV = 3  # the second env of worker 1
FAULT_WORKER = FAULT_ENV // EPW
AT_STEP = 2  # the fault fires on the env's 2nd step call
WHERE = "worker 1 (envs 2-3)"
STEP_TIMEOUT = 1.5  # only the hanging envs need one; healthy steps take microseconds
SEED = 7

# kind -> (exception type, message pattern, exit code) for faults that end the worker.
DEATHS: dict[str, tuple[type[WorkerFailure], str, int | None]] = {
    "segfault": (
        WorkerDiedError,
        r"was killed by signal SIGSEGV \(exit code -11\) during step",
        -11,
    ),
    "sigsegv": (
        WorkerDiedError,
        r"was killed by signal SIGSEGV \(exit code -11\) during step",
        -11,
    ),
    "exit": (WorkerDiedError, rf"exited with code {EXIT_CODE} during step", EXIT_CODE),
    "sigkill": (WorkerDiedError, r"was killed by signal SIGKILL \(exit code -9\) during step", -9),
    "leak": (WorkerDiedError, r"was killed by signal SIGKILL \(exit code -9\) during step", -9),
    "hang": (WorkerTimeoutError, rf"did not answer step within {STEP_TIMEOUT} s", None),
}
SPAWN_DEATHS = ("segfault", "exit", "hang")

# Why a backend cannot run a test (the skipped case's reason).
CALLER_DIES = "env 3's fault ends its process, and the caller case steps env 3 in this one"
CALLER_BLOCKS = "env 3 would block this process (the caller steps it), which must time it out"
CALLER_RAISES = (
    "the caller's envs raise in this process as they are: no pickling, no remote "
    "traceback to check (test_caller.py, test_contract.py[caller])"
)
RAY_DEATHS = (
    "Ray reports a dead actor without signal or exit code; actor deaths and restarts "
    "are pinned in test_contract.py[ray] and test_ray.py"
)
RAY_HANG = (
    "a hung actor's timeout can also blame the healthy actor: "
    "test_ray_late_replies.py (xfail) pins that"
)
FRONT_END = "the front end refuses it before any backend is reached: the local case covers all"
LOCAL = Backend("local")


def _cases(kinds: tuple[str, ...], spawn_kinds: tuple[str, ...]) -> list[Any]:
    cases = [pytest.param(k, m, id=f"{k}-{m}") for m in ("fork", "forkserver") for k in kinds]
    return cases + [pytest.param(k, "spawn", id=f"{k}-spawn") for k in spawn_kinds]


# ------------------------------------------------------------------ helpers


def action_batches(steps: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 2, size=NUM_ENVS).astype(np.int64) for _ in range(steps)]


def make_manager(
    kind: str,
    context: str,
    tmp_path: Path,
    *,
    backend: Backend = LOCAL,
    at_step: int = AT_STEP,
    **kwargs: Any,
) -> Any:
    """2 groups x 2 envs; env 3 carries ``kind`` (first incarnation only, unless ``fire_in``).

    ``backend`` defaults to the local manager: test_late_replies.py builds its managers here.
    """
    env_kwargs = {
        k: kwargs.pop(k)
        for k in (
            "fire_in",
            "rebuild_fault",
            "rebuild_in",
            "hang_seconds",
            "leak_bytes",
            "ready_file",
            "release_file",
            "step_log",
        )
        if k in kwargs
    }
    fns = fault_env_fns(
        kind, NUM_ENVS, FAULT_ENV, at_step=at_step, state_dir=tmp_path, **env_kwargs
    )
    kwargs.setdefault("close_timeout", 1.0)
    return backend(fns, N_WORKERS, EPW, context=context, **kwargs)


def group_ids(envs: Any) -> list[Any]:
    """What identifies each group's current incarnation: worker pids, or Ray actor ids."""
    if hasattr(envs, "actor_info"):
        return [info.actor_id for info in envs.actor_info]
    return list(envs.worker_pids)


def ray_actors_dead(actor_ids: list[Any], timeout: float) -> list[Any]:
    """The actors of ``actor_ids`` that are not DEAD within ``timeout`` s (a liveness bound)."""
    from ray._private import state

    deadline = time.monotonic() + timeout
    while True:
        table = state.actors()
        alive = [a for a in actor_ids if table.get(a, {}).get("State") != "DEAD"]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


class Tracker:
    """Remembers every worker process and the segment of one manager, to check cleanup
    (on Ray: every actor, which must be dead)."""

    def __init__(self, envs: Any) -> None:
        self.envs = envs
        self.actors: list[Any] = []
        self.tokens: dict[int, Any] = {}
        if hasattr(envs, "actor_info"):
            self.actors = group_ids(envs)
            return
        self.tokens = {pid: process_token(pid) for pid in envs.worker_pids}
        self.segment = segment_of(envs.worker_pids)
        assert segment_path(self.segment).exists()

    def note_pids(self) -> None:
        """Record replacement workers (or actors) too."""
        if self.actors:
            self.actors += [a for a in group_ids(self.envs) if a not in self.actors]
            return
        for pid in self.envs.worker_pids:
            if pid not in self.tokens:
                self.tokens[pid] = process_token(pid)

    def assert_cleaned_up(self, at_once: bool = False) -> None:
        """Every worker ever started is gone (reaped, not a zombie); the segment is unlinked.

        Args:
            at_once: Check without waiting: for a manager that must have cleaned
                up before its error reached the caller (or before close() returned).
        """
        self.note_pids()
        timeout = 0.0 if at_once else 5.0
        if self.actors:
            # Ray reports an actor DEAD a little after it is killed: allow for that.
            left_actors = ray_actors_dead(self.actors, timeout=max(timeout, 20.0))
            assert not left_actors, f"actors not dead: {left_actors}"
            return
        left = wait_gone(list(self.tokens.values()), timeout=timeout)
        assert not left, f"worker processes still present (pid: state): {left}"
        assert wait_unlinked(self.segment, timeout=timeout), f"/dev/shm/{self.segment} still exists"


def assert_closed_for_good(envs: Any, failure: BaseException | None = None) -> None:
    """Every further call raises: ``ClosedManagerError`` after close(), and after a
    worker ``failure`` the broken-manager error, chained to that failure where the
    package has a separate type for it. Both are a gym ClosedEnvironmentError or a
    ``WorkerFailure``, so callers' ``except`` clauses keep working."""
    assert envs.closed
    expected: type[Exception] = ClosedManagerError if failure is None else BrokenManagerError
    actions = np.zeros(NUM_ENVS, dtype=np.int64)
    for name, call in (
        ("step", lambda: envs.step(actions)),
        ("reset", lambda: envs.reset(seed=0)),
        ("step_async", lambda: envs.step_async(actions)),
        ("step_wait", lambda: envs.step_wait()),
        ("send", lambda: envs.send(actions)),
        ("recv", lambda: envs.recv()),
        ("call", lambda: envs.get_attr("tag")),
    ):
        with pytest.raises(expected) as ei:
            call()
        err = ei.value
        assert isinstance(err, (gym.error.ClosedEnvironmentError, WorkerFailure)), name
        if failure is not None and expected is not ClosedManagerError:
            chain = []
            link: BaseException | None = err
            while link is not None and len(chain) < 10:
                chain.append(link)
                link = link.__cause__ or link.__context__
            assert failure in chain, f"{name}: {err!r} is not chained to {failure!r}"
    envs.close()  # still idempotent
    envs.close()


def reference(seed: int = SEED) -> tuple[SyncVectorEnv, Any]:
    """A SyncVectorEnv of well-behaved envs with the same dynamics, reset with ``seed``."""
    sync = SyncVectorEnv(fault_env_fns("none", NUM_ENVS, FAULT_ENV))
    obs, _ = sync.reset(seed=seed)
    return sync, obs


def assert_rows_equal(got: tuple[Any, ...], want: tuple[Any, ...], rows: slice, where: str) -> None:
    for name, g, w in zip(
        ("obs", "rewards", "terminations", "truncations"), got, want, strict=False
    ):
        assert g.shape == w.shape and g.dtype == w.dtype, f"{where}: {name} {g.shape}/{g.dtype}"
        np.testing.assert_array_equal(g[rows], w[rows], err_msg=f"{where}: {name}")


def assert_batch_shapes(obs: Any, rew: Any, term: Any, trunc: Any) -> None:
    assert obs.shape == (NUM_ENVS, 2) and obs.dtype == np.float32
    assert rew.shape == (NUM_ENVS,) and rew.dtype == np.float64
    assert term.shape == (NUM_ENVS,) and term.dtype == np.bool_
    assert trunc.shape == (NUM_ENVS,) and trunc.dtype == np.bool_


# ------------------------------------------------------------------ workers that die, no restarts


@on_backends(
    "kind, context",
    local=_cases(tuple(DEATHS), SPAWN_DEATHS),
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


# ------------------------------------------------------------------ workers that die, restarts on


@on_backends(
    "kind, context",
    local=_cases(tuple(DEATHS), ("segfault", "hang")),
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


# ------------------------------------------------------------------ workers killed from outside


def kill_and_wait(pid: int) -> None:
    """SIGKILL a worker and wait for it to exit (a zombie until the manager reaps it)."""
    tok = process_token(pid)
    assert tok is not None
    os.kill(pid, signal.SIGKILL)
    assert not wait_gone([tok], timeout=5.0, zombie_ok=True)


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


# ------------------------------------------------------------------ restart budget


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


# ------------------------------------------------------------------ exceptions inside envs


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


# ------------------------------------------------------------------ envs that cannot be built


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
    # No process or segment left: checked by conftest's fixture.


# ------------------------------------------------------------------ first-ready API (send/recv)


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


@on_backends("max_restarts", local=[0, 1], caller=CALLER_BLOCKS, ray=RAY_HANG)
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
            with pytest.raises(WorkerTimeoutError, match=re.escape(WHERE)) as ei:
                envs.recv()
            assert_closed_for_good(envs, ei.value)
            return
        _, _, _, trunc, infos, ids = envs.recv()
        np.testing.assert_array_equal(ids, [2, 3])
        np.testing.assert_array_equal(trunc, [True, True])
        assert "did not answer step" in infos["envmgr_restarted"][1]
        assert envs.restarts == [0, 1]


def wait_until(done: Any, what: str, timeout: float = 20.0) -> None:
    """Poll ``done()``; ``timeout`` is a liveness bound, not a speed expectation."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout} s"
        time.sleep(0.005)


def workers_asleep(pids: list[int]) -> bool:
    """Whether every worker sleeps (``S``): with ``spin_seconds=0`` a worker sleeps only
    once it has published its step and waits for the next command."""
    states = [process_state(tok) for tok in map(process_token, pids) if tok is not None]
    return len(states) == len(pids) and all(s == "S" for s in states)


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


# ------------------------------------------------------------------ bad input and call order


@on_backends("context", local=["fork", "forkserver", "spawn"], caller=FRONT_END, ray=FRONT_END)
def test_bad_actions_raise_value_error_and_the_manager_stays_usable(
    backend: Backend, context: str, tmp_path: Path
) -> None:
    # "strict": the default ("safe") passes the range and sign cases on to the env.
    with make_manager("none", context, tmp_path, check_actions="strict", backend=backend) as envs:
        envs.reset(seed=0)
        good = np.array([0, 1, 0, 1])
        bad = {
            "shape": (np.array([0, 1, 0]), r"shape \(3,\).*\(4,\)"),
            "2-d": (np.zeros((4, 1), dtype=np.int64), r"shape"),
            "dtype": (
                np.array([0.0, 1.0, 0.5, 1.0]),
                r"float.*env 2 \(worker 1\)|env 2 \(worker 1\).*float",
            ),
            "range": (np.array([0, 1, 2, 0]), r"env 2 \(worker 1\)"),
            "negative": (np.array([-1, 1, 0, 0]), r"env 0 \(worker 0\)"),
            "strings": (np.array(["a", "b", "c", "d"]), r"dtype"),
        }
        for name, (actions, pattern) in bad.items():
            with pytest.raises(ValueError, match=pattern):
                envs.step(actions)
            obs, *_ = envs.step(good)  # nothing was sent: the manager is in step
            assert obs.shape == (NUM_ENVS, 2), name
            with pytest.raises(ValueError):
                envs.send(actions)
        # env_ids must be whole workers.
        with pytest.raises(ValueError, match="whole workers"):
            envs.send(np.array([0, 1]), [1, 2])
        with pytest.raises(NoAsyncCallError):
            envs.recv()  # none of those was sent
        envs.send(good)
        envs.recv(batch_size=NUM_ENVS)
    with pytest.raises(ClosedManagerError):
        envs.step(good)


@on_backends(caller=FRONT_END, ray=FRONT_END)
def test_send_names_the_env_a_bad_action_was_meant_for(backend: Backend, tmp_path: Path) -> None:
    """send() checks a sub-batch; its message must name the global env id, not the position."""
    with make_manager("none", "fork", tmp_path, check_actions="strict", backend=backend) as envs:
        envs.reset(seed=0)
        with pytest.raises(ValueError) as ei:
            envs.send(np.array([0, 5]), [2, 3])  # env 3's action is out of Discrete(2)
        envs.send(np.array([0, 1]), [2, 3])  # the manager is usable
        envs.recv()
    assert "env 3 (worker 1)" in str(ei.value), str(ei.value)


@on_backends(caller=FRONT_END, ray=FRONT_END)
def test_nan_and_out_of_bounds_box_actions(backend: Backend, tmp_path: Path) -> None:
    fns = [BoxActionEnv] * NUM_ENVS
    with backend(fns, N_WORKERS, EPW, context="fork", check_actions="strict") as envs:
        envs.reset(seed=0)
        actions = np.zeros((NUM_ENVS, 2), dtype=np.float32)
        for value, pattern in (
            (np.nan, "not finite"),
            (np.inf, "not finite|outside"),
            (1.5, "outside"),
        ):
            actions[3, 1] = value
            with pytest.raises(ValueError, match=rf"env 3 \(worker 1\).*({pattern})"):
                envs.step(actions)
        actions[3, 1] = 0.5
        obs, *_ = envs.step(actions)
        assert obs.shape == (NUM_ENVS, 2)
        with pytest.raises(ValueError):
            envs.step(np.zeros((NUM_ENVS, 3), dtype=np.float32))


@on_backends("context", local=["fork", "forkserver", "spawn"], caller=FRONT_END, ray=FRONT_END)
def test_calls_out_of_order(backend: Backend, context: str, tmp_path: Path) -> None:
    with make_manager("none", context, tmp_path, backend=backend) as envs:
        zeros = np.zeros(NUM_ENVS, dtype=np.int64)
        envs.reset(seed=0)
        with pytest.raises(NoAsyncCallError) as ei:
            envs.step_wait()
        assert isinstance(ei.value, gym.error.NoAsyncCallError)
        with pytest.raises(NoAsyncCallError):
            envs.reset_wait()
        with pytest.raises(NoAsyncCallError, match="send"):
            envs.recv()
        # A pending step_async blocks everything else until step_wait.
        envs.step_async(zeros)
        with pytest.raises(AlreadyPendingCallError):
            envs.step_async(zeros)
        with pytest.raises(AlreadyPendingCallError):
            envs.send(zeros)
        with pytest.raises(NoAsyncCallError):
            envs.reset_wait()
        envs.step_wait()
        # Steps in flight through send() block the batch API until recv.
        envs.send(zeros[:2], [0, 1])
        with pytest.raises(AlreadyPendingCallError):
            envs.step(zeros)
        with pytest.raises(AlreadyPendingCallError):
            envs.reset()
        with pytest.raises(
            AlreadyPendingCallError, match=r"in flight.*worker 0|worker 0.*in flight"
        ):
            envs.send(zeros[:2], [0, 1])
        *_, ids = envs.recv()
        np.testing.assert_array_equal(ids, [0, 1])
        with pytest.raises(NoAsyncCallError):
            envs.recv()
        envs.step(zeros)
    assert_closed_for_good(envs)


@on_backends(ray="closing Ray actors: test_ray.py::test_close_leaves_no_actors")
def test_close_with_a_step_in_flight_then_calls_raise_closed(
    backend: Backend, tmp_path: Path
) -> None:
    envs = make_manager("none", "fork", tmp_path, backend=backend)
    tracker = Tracker(envs)
    envs.reset(seed=0)
    envs.send(np.zeros(NUM_ENVS, dtype=np.int64))
    envs.close()
    tracker.assert_cleaned_up()
    assert_closed_for_good(envs)
