"""What the fault-injection tests share: the 2 x 2 layout with env 3 carrying the
fault, the expected death messages, the managers (``make_manager``, on any backend),
the cleanup ``Tracker``, the SyncVectorEnv reference, the reasons a backend cannot
run a test (for ``conftest.on_backends``), and polling helpers.

Used by test_faults.py, test_killed_while_idle.py, test_restart_budget.py,
test_first_ready_faults.py, test_bad_input.py, test_promises.py and the late-reply
tests. See test_faults.py for what every fault test asserts.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend
from gymnasium.vector import SyncVectorEnv

from envmgr import (
    BrokenManagerError,
    ClosedManagerError,
    WorkerDiedError,
    WorkerFailure,
    WorkerTimeoutError,
)
from support.fault_envs import (
    EXIT_CODE,
    fault_env_fns,
    process_state,
    process_token,
    segment_of,
    segment_path,
    wait_gone,
    wait_unlinked,
)

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
FRONT_END = "the front end refuses it before any backend is reached: the local case covers all"
LOCAL = Backend("local")


def start_method_cases(kinds: tuple[str, ...], spawn_kinds: tuple[str, ...]) -> list[Any]:
    cases = [pytest.param(k, m, id=f"{k}-{m}") for m in ("fork", "forkserver") for k in kinds]
    return cases + [pytest.param(k, "spawn", id=f"{k}-spawn") for k in spawn_kinds]


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


def kill_and_wait(pid: int) -> None:
    """SIGKILL a worker and wait for it to exit (a zombie until the manager reaps it)."""
    tok = process_token(pid)
    assert tok is not None
    os.kill(pid, signal.SIGKILL)
    assert not wait_gone([tok], timeout=5.0, zombie_ok=True)


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
