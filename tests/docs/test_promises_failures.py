"""README promises of the "Failure handling" section that no other test would notice
losing: the restart timer node, env exceptions in reset and in first-ready
stepping, an unpicklable call result, ``reset_wait``/``call_wait`` timeouts, the
catchable bases ``UsageError`` / ``WorkerFailure``, and the finalizer.

As in ``test_promises.py`` (the "How it works" promises): each test was checked by
taking the mechanism out and watching it fail (``tests/README.md``), and runs over the
backends it applies to (``conftest.on_backends``), a skipped case saying why.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import SyncVectorEnv
from support.fault_cases import (
    CALLER_BLOCKS,
    CALLER_DIES,
    CALLER_RAISES,
    RAY_DEATHS,
    group_ids,
    wait_until,
)
from support.fault_envs import (
    InjectedFault,
    fault_env_fns,
    process_token,
    segment_of,
    segment_path,
    wait_gone,
)
from support.helpers import full_text

import envmgr
from envmgr import (
    AlreadyPendingCallError,
    ClosedManagerError,
    EnvMgrError,
    NoAsyncCallError,
    RemoteTraceback,
    UsageError,
    WorkerDiedError,
    WorkerFailure,
    WorkerTimeoutError,
    timers,
)

pytestmark = pytest.mark.timeout(60)

N = 4  # envs: 2 workers x 2
ZEROS = np.zeros(N, dtype=np.int64)


def faulty(backend: Backend, kind: str, tmp_path: Path, **kwargs: Any) -> Any:
    """2 groups x 2 FaultEnvs; env 3 (group 1) carries ``kind``."""
    env_kwargs = {k: kwargs.pop(k) for k in ("ready_file", "release_file") if k in kwargs}
    fns = fault_env_fns(kind, N, 3, at_step=2, state_dir=tmp_path, **env_kwargs)
    kwargs.setdefault("context", "fork")
    kwargs.setdefault("close_timeout", 1.0)
    return backend(fns, 2, 2, **kwargs)


def nodes_named(tree: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """Every node called ``name`` anywhere in a timer tree (``get_timer_tree()``)."""
    for child_name, child in tree.get("children", {}).items():
        if child_name == name:
            yield child
        yield from nodes_named(child, name)


@on_backends(
    caller=CALLER_DIES,
    ray=RAY_DEATHS,
)
def test_restart_adds_a_restart_worker_node_to_the_timer_tree(
    backend: Backend, tmp_path: Path, fresh_timers: None
) -> None:
    """ "the timer tree gets a ``restart_worker_<i>`` node"."""
    with faulty(backend, "exit", tmp_path, max_restarts=1) as envs:
        envs.reset(seed=0)
        with timers.hierarchical_timer("loop"):
            for _ in range(4):
                envs.step(ZEROS)
        assert envs.restarts == [0, 1]
        tree = timers.get_timer_tree()
    restarts = list(nodes_named(tree, "restart_worker_1"))
    assert [node["count"] for node in restarts] == [1], restarts
    assert not list(nodes_named(tree, "restart_worker_0"))


# Worth their seconds on Ray: an env's exception in reset, and in first-ready stepping,
# crosses Ray and must leave the actor in place.
@on_backends(caller=CALLER_RAISES)
def test_an_exception_in_env_reset_is_reraised_and_the_worker_lives_on(
    backend: Backend, tmp_path: Path
) -> None:
    """ "an exception in ``env.reset`` ... raised in the parent as its own type, with a note
    naming worker and env, ``worker_index`` / ``env_index``, the worker's traceback
    chained as ``__cause__``. The worker lives on"."""
    with faulty(backend, "raise_reset", tmp_path) as envs:
        pids = group_ids(envs)
        where = envs._where(1)  # WHERE, or the actor's name and node on Ray
        with pytest.raises(InjectedFault) as ei:
            envs.reset(seed=0)
        exc = ei.value
        assert str(exc) == "env 3 failed to reset"
        assert f"raised in envmgr {where}, env 3, during reset" in full_text(exc)
        assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
        assert isinstance(exc.__cause__, RemoteTraceback) and "reset" in str(exc.__cause__)
        assert not envs.closed and group_ids(envs) == pids
        obs, _ = envs.reset(seed=0)  # the env's fault fires once
        np.testing.assert_array_equal(obs[:, 0], np.zeros(N))
        envs.step(ZEROS)


@on_backends(caller=CALLER_RAISES)
def test_an_env_error_during_send_recv_is_raised_by_recv(backend: Backend, tmp_path: Path) -> None:
    """The same as for ``step``, through first-ready stepping: ``recv`` raises the env's
    exception; the worker lives on and, after a reset, stepping goes on."""
    with faulty(backend, "raise", tmp_path) as envs:
        pids = group_ids(envs)
        where = envs._where(1)
        envs.reset(seed=0)
        envs.send(ZEROS)
        envs.recv(batch_size=N)
        envs.send(ZEROS)
        with pytest.raises(InjectedFault) as ei:
            envs.recv(batch_size=N)
        exc = ei.value
        assert str(exc) == "env 3 failed at step 2"
        assert f"raised in envmgr {where}, env 3, during step" in full_text(exc)
        assert exc.worker_index == 1 and exc.env_index == 3  # type: ignore[attr-defined]
        assert isinstance(exc.__cause__, RemoteTraceback)
        assert not envs.closed and group_ids(envs) == pids and envs.restarts == [0, 0]
        envs.reset(seed=1)
        envs.send(ZEROS)
        *_, ids = envs.recv(batch_size=N)
        np.testing.assert_array_equal(ids, np.arange(N))


@on_backends(caller="env 3's result never leaves this process: nothing is pickled")
def test_an_unpicklable_call_result_names_the_worker(backend: Backend, tmp_path: Path) -> None:
    """ "an unpicklable info or call result: an error naming the worker and what could
    not be pickled"; the manager stays usable."""
    with faulty(backend, "none", tmp_path) as envs:
        pids = group_ids(envs)
        where = envs._where(1)
        with pytest.raises(TypeError) as ei:
            envs.call("make_lock", 3)  # env 3 returns a lock, the others their tag
        exc = ei.value
        assert str(exc) == "cannot pickle '_thread.lock' object"
        assert f"raised in envmgr {where}, during call (sending the result)" in full_text(exc)
        assert exc.worker_index == 1  # type: ignore[attr-defined]
        assert not envs.closed and group_ids(envs) == pids
        assert envs.get_attr("tag") == (0, 1, 2, 3)


@pytest.mark.timeout(30)
# On Ray, the restart case only: test_call_wait_timeout[ray] checks the timeout's message.
@on_backends("max_restarts", local=[0, 1], caller=CALLER_BLOCKS, ray=[1])
def test_reset_wait_timeout(backend: Backend, max_restarts: int, tmp_path: Path) -> None:
    """``reset_wait(timeout)``: a reset that does not answer in time is a worker failure
    (``WorkerTimeoutError``), or under restarts a replacement that does the reset."""
    with faulty(
        backend,
        "hang_reset",
        tmp_path,
        ready_file=str(tmp_path / "blocked"),
        max_restarts=max_restarts,
    ) as envs:
        where = envs._where(1)  # WHERE, or the actor's name and node on Ray
        envs.reset_async(seed=5)
        wait_until((tmp_path / "blocked").exists, "env 3 blocking in reset")
        if not max_restarts:
            with pytest.raises(WorkerTimeoutError) as ei:
                envs.reset_wait(timeout=1.0)
            assert str(ei.value) == f"{where}: it did not answer reset within 1.0 s"
            assert envs.closed
            return
        obs, infos = envs.reset_wait(timeout=1.0)
        assert infos["envmgr_restarted"][3] == f"{where}: it did not answer reset within 1.0 s"
        assert envs.restarts == [0, 1]
        sync = SyncVectorEnv(fault_env_fns("none", N, 3))
        want, _ = sync.reset(seed=5)  # the replacement carried out the seeded reset
        sync.close()
        np.testing.assert_array_equal(obs, want)


@pytest.mark.timeout(30)
@on_backends(caller=CALLER_BLOCKS)
def test_call_wait_timeout(backend: Backend, tmp_path: Path) -> None:
    """``call_wait(timeout)``: a call that does not answer in time raises
    ``WorkerTimeoutError`` naming the worker and the call."""
    with faulty(backend, "none", tmp_path, ready_file=str(tmp_path / "blocked")) as envs:
        where = envs._where(1)
        envs.call_async("pause", 3600.0, 3)  # env 3 sleeps, the others return at once
        wait_until((tmp_path / "blocked").exists, "env 3 blocking in the call")
        with pytest.raises(WorkerTimeoutError) as ei:
            envs.call_wait(timeout=1.0)
        assert str(ei.value) == f"{where}: it did not answer call('pause') within 1.0 s"
        assert isinstance(ei.value, TimeoutError) and envs.closed


@on_backends(caller=CALLER_DIES, ray=RAY_DEATHS)
def test_usage_error_and_worker_failure_are_the_catchable_bases(
    backend: Backend, tmp_path: Path
) -> None:
    """ "Errors are split like trio's: ``UsageError`` (misuse) versus ``WorkerFailure``":
    ``except UsageError`` catches every misuse a real manager raises, and not a
    worker's death, which ``except WorkerFailure`` catches."""
    caught: list[type[BaseException]] = []
    with faulty(backend, "exit", tmp_path) as envs:
        envs.reset(seed=0)
        misuses = [
            envs.step_wait,
            envs.recv,
            lambda: (envs.step_async(ZEROS), envs.step_async(ZEROS)),
            lambda: envs.reset_wait(),
        ]
        for misuse in misuses:
            try:
                misuse()
            except UsageError as exc:
                caught.append(type(exc))
        envs.step_wait()
        try:
            envs.step(ZEROS)  # env 3 exits: a worker failure, not a misuse
        except UsageError:  # pragma: no cover - the point of the test
            pytest.fail("a worker failure was caught as a UsageError")
        except WorkerFailure as exc:
            caught.append(type(exc))
        try:
            envs.step(ZEROS)
        except (UsageError, WorkerFailure) as exc:
            caught.append(type(exc))
    assert caught[:5] == [
        NoAsyncCallError,
        NoAsyncCallError,
        AlreadyPendingCallError,
        NoAsyncCallError,
        WorkerDiedError,
    ], caught
    broken = getattr(envmgr.errors, "BrokenManagerError", ClosedManagerError)
    assert caught[5:] == [broken], caught
    for cls in caught:
        assert issubclass(cls, EnvMgrError)


@on_backends(
    caller="its manager lives in a child interpreter; the caller's envs die with that",
    ray="Ray's actors are no child of the manager: test_ray.py::test_close_leaves_no_actors",
)
def test_an_unreferenced_manager_is_cleaned_up_by_its_finalizer(backend: Backend) -> None:
    """ "An ``atexit`` hook and ``__del__`` are the safety net": a manager dropped without
    close() stops its workers and unlinks its segment when it is collected. Run in a fresh
    interpreter: whether the last reference goes at ``del`` must not depend on what earlier
    tests (or coverage's tracer) left in this one; the child stays alive while we look, so
    its atexit hook cannot be what cleaned up."""
    script = textwrap.dedent(
        f"""
        import gc, json, sys
        sys.path.insert(0, {str(Path(__file__).parents[1])!r})
        from support.envs import DictObsEnv
        from envmgr import SubprocessEnvManager
        envs = SubprocessEnvManager(DictObsEnv, 2, 1, context="fork")
        envs.reset(seed=0)
        print(json.dumps(envs.worker_pids), flush=True)
        sys.stdin.readline()
        del envs
        gc.collect()
        print("collected", flush=True)
        sys.stdin.readline()
        """
    )
    with subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    ) as child:
        assert child.stdin is not None and child.stdout is not None
        pids = json.loads(child.stdout.readline())
        tokens = [process_token(p) for p in pids]
        segment = segment_of(pids)
        child.stdin.write("go\n")
        child.stdin.flush()
        assert child.stdout.readline().strip() == "collected"
        assert not wait_gone(tokens, timeout=0.0), "workers outlived their collected manager"
        assert not segment_path(segment).exists(), "the collected manager's segment is still there"
        child.stdin.write("done\n")
        child.stdin.flush()
        assert child.wait(30) == 0
