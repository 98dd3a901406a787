"""README promises that no other test would notice losing (issue 9).

Each test here pins one sentence of README.md's "How it works" or "Failure
handling" section and was checked by taking the mechanism out of the package
and watching the test fail (the table in ``tests/README.md`` says what was
removed and how the test failed). Only public API and what the operating system
shows about the processes (``/proc/<pid>/io``, ``/proc/<pid>/maps``) are used,
so the tests survive a reorganisation of the package.

Byte counts: ``/proc/<pid>/io`` counts the bytes a process reads and writes
through system calls. A worker that is told to step through the shared-memory
command word and answers there reads nothing and writes only the one-byte
wake-up of the parent; anything pickled would add tens to hundreds of bytes per
step. The bounds below are per step and hold however slow the machine is.

Backends (``conftest.on_backends``): every test runs on the local manager, and on
the caller case (``caller_envs``) and Ray where the promise applies there; a skipped
case says why. Most promises here are about the local backend's own mechanism
(shared memory, the doorbell, start methods, bytes a worker process moves).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from envs import DictActionEnv, VariableObsEnv, assert_same
from fault_cases import (
    CALLER_BLOCKS,
    CALLER_DIES,
    CALLER_RAISES,
    RAY_DEATHS,
    RAY_HANG,
    WHERE,
    group_ids,
    wait_until,
)
from fault_envs import (
    InjectedFault,
    fault_env_fns,
    process_token,
    segment_of,
    segment_path,
    wait_gone,
)
from gymnasium.vector import SyncVectorEnv
from helpers import full_text

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


# Why a backend cannot run a test (the skipped case's reason), besides fault_cases.py's.
RAY_BYTES = "it counts the bytes worker processes move (/proc/<pid>/io): Ray's actors pickle"
RAY_DOORBELL = "the doorbell and its wake-ups are the local backend's"
LOCAL_ONLY = "start methods and the forkserver are the local workers' (caller_envs adds none)"


def faulty(backend: Backend, kind: str, tmp_path: Path, **kwargs: Any) -> Any:
    """2 groups x 2 FaultEnvs; env 3 (group 1) carries ``kind``."""
    env_kwargs = {k: kwargs.pop(k) for k in ("ready_file", "release_file") if k in kwargs}
    fns = fault_env_fns(kind, N, 3, at_step=2, state_dir=tmp_path, **env_kwargs)
    kwargs.setdefault("context", "fork")
    kwargs.setdefault("close_timeout", 1.0)
    return backend(fns, 2, 2, **kwargs)


def io_bytes(pid: int) -> tuple[int, int]:
    """``(rchar, wchar)``: bytes process ``pid`` has read and written through syscalls."""
    fields = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
    return int(fields["rchar"]), int(fields["wchar"])


def traffic(envs: Any, actions: list[Any]) -> tuple[int, int]:
    """Bytes all workers read and wrote while ``actions`` were stepped (summed)."""
    before = [io_bytes(p) for p in envs.worker_pids]
    for a in actions:
        envs.step(a)
    after = [io_bytes(p) for p in envs.worker_pids]
    read = sum(a[0] - b[0] for a, b in zip(after, before, strict=True))
    written = sum(a[1] - b[1] for a, b in zip(after, before, strict=True))
    return read, written


def nodes_named(tree: dict[str, Any], name: str) -> Iterator[dict[str, Any]]:
    """Every node called ``name`` anywhere in a timer tree (``get_timer_tree()``)."""
    for child_name, child in tree.get("children", {}).items():
        if child_name == name:
            yield child
        yield from nodes_named(child, name)


# ------------------------------------------------------------------ How it works


@on_backends(ray="Ray carries actions in its object store, not in envmgr's shared memory")
def test_dict_and_tuple_actions_travel_through_shared_memory(backend: Backend) -> None:
    """ "Shared memory ... holds the batched ... actions ... for Dict/Tuple of these": the
    results equal SyncVectorEnv's and the workers read no command bytes per step."""
    fns = [DictActionEnv] * N
    sync = SyncVectorEnv(fns)
    space = sync.action_space
    space.seed(0)
    actions = [space.sample() for _ in range(60)]
    want = [sync.reset(seed=1)] + [sync.step(a) for a in actions[:10]]
    sync.close()
    with backend(fns, 2, 2, context="fork", timer_interval=3600.0) as envs:
        got = [envs.reset(seed=1)] + [envs.step(a) for a in actions[:10]]
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"result {i}")
        read, _ = traffic(envs, actions[10:])
    # At most a 4-byte wake-up message per worker and step (a worker that fell
    # asleep); a pickled Dict action alone is over 300 bytes.
    assert read <= 4 * 2 * 50, f"workers read {read} bytes in 50 steps"


@on_backends(
    "kind",
    local=["graph", "sequence", "oneof"],
    ray="Ray pickles every answer: there is no fallback to tell apart from the usual path",
)
def test_spaces_without_a_fixed_shape_fall_back_to_pickles(backend: Backend, kind: str) -> None:
    """ "Spaces without a fixed shape (Text, Graph, Sequence, OneOf) fall back to pickled
    transport automatically": results equal SyncVectorEnv's, autoresets included."""
    fns = [functools.partial(VariableObsEnv, kind)] * N
    actions = [np.array([0, 1, 1, 0])] * 7
    sync = SyncVectorEnv(fns)
    want = [sync.reset(seed=3)] + [sync.step(a) for a in actions]
    sync.close()
    with backend(fns, 2, 2, context="fork") as envs:
        got = [envs.reset(seed=3)] + [envs.step(a) for a in actions]
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same(g, w, f"{kind} result {i}")


@on_backends(ray=RAY_BYTES)
def test_a_cartpole_step_pickles_nothing(backend: Backend) -> None:
    """ "A StepResponse ... is pickled only when there is something to say; a CartPole
    step pickles nothing": per step, workers read nothing but wake-ups and write
    nothing but the parent's one-byte wake-up."""
    with backend(
        lambda: gym.make("CartPole-v1"), 2, 4, context="fork", timer_interval=3600.0
    ) as envs:
        envs.reset(seed=0)
        actions = [envs.action_space.sample() for _ in range(200)]
        traffic(envs, actions[:5])  # warm up
        read, written = traffic(envs, actions)
    # At most the wake-up byte per batch, or two when both workers finish at the same
    # instant and each sees itself last (see the next test); a pickled StepResponse
    # alone would be ~100 bytes.
    assert written <= 2 * 200, f"workers wrote {written} bytes in 200 steps"
    assert read <= 4 * 2 * 200, f"workers read {read} bytes in 200 steps"


@on_backends(
    caller="with caller_envs the parent spins and is never woken "
    "(test_with_caller_envs_the_parent_spins_by_default)",
    ray=RAY_DOORBELL,
)
def test_the_parent_is_woken_once_per_batch(backend: Backend) -> None:
    """ "The *last* worker to finish a batch writes one byte to a wake-up pipe": 4 workers
    whose envs sleep 2 ms per step (so the parent is asleep when they finish) write
    about one byte per batch together, not one per worker. Workers finishing at the
    same instant may each see themselves last (the parent drains both bytes with one
    read), hence the bound of two per batch rather than one; every worker waking the
    parent would write four."""
    fns = [functools.partial(DictActionEnv, step_seconds=0.002)] * 4
    with backend(fns, 4, 1, context="fork", timer_interval=3600.0) as envs:
        envs.reset(seed=0)
        envs.action_space.seed(0)
        actions = [envs.action_space.sample() for _ in range(60)]
        _, written = traffic(envs, actions)
    assert 0 < written <= 2 * 60, f"workers wrote {written} wake-up bytes in 60 batches"


@on_backends(ray=RAY_BYTES)
def test_first_ready_workers_ship_timers_once_per_interval_not_every_step(
    backend: Backend,
) -> None:
    """Workers ship their trees "once a second" (``timer_interval``) in first-ready
    stepping too, where the groups are never all answered at once: each group has its
    own shipping deadline. (A single clock reset only when every group had answered
    made every send() ship a tree once the first interval had passed.) Measured in the
    bytes the workers write, against the size of one shipment (a flush)."""
    interval = 0.2
    with backend(
        lambda: gym.make("CartPole-v1"), 2, 4, context="fork", timer_interval=interval
    ) as envs:
        envs.reset(seed=0)

        def written() -> int:
            return sum(io_bytes(p)[1] for p in envs.worker_pids)

        before = written()
        envs.env_step_seconds()  # a flush: every worker ships its tree once
        one_shipment = written() - before
        time.sleep(1.5 * interval)  # past the first interval, where the bug began
        zeros = np.zeros(8, dtype=np.int64)
        before, t0 = written(), time.perf_counter()
        envs.send(zeros)
        for _ in range(200):
            *_, ids = envs.recv(batch_size=4)
            envs.send(zeros[ids], ids)
        envs.recv(batch_size=8)
        elapsed, sent = time.perf_counter() - t0, written() - before
    # At most one shipment per worker per interval (and one at the start), plus the
    # one-byte wake-ups; every send shipping would be about 100 shipments per worker.
    bound = (elapsed / interval + 2) * one_shipment + 4 * 202
    assert one_shipment > 0
    assert sent <= bound, (
        f"workers wrote {sent} bytes in {elapsed:.2f} s of 202 sends each "
        f"(a shipment of both trees is {one_shipment} bytes; at most {bound:.0f} expected)"
    )


@on_backends(
    caller="its bound counts two sleeping workers a batch; the caller case has one, and "
    "the parent steps its own envs while that one falls asleep",
    ray=RAY_DOORBELL,
)
def test_a_sleeping_worker_is_rung_not_left_to_its_backoff(backend: Backend) -> None:
    """Workers that sleep (``spin_seconds=0``: at once after every step) mark themselves
    in the parent's SLEEPERS word, so the parent writes each one a wake-up per batch
    instead of leaving it to notice the command at the end of its sleep."""

    def write_syscalls() -> int:
        fields = dict(line.split(": ") for line in Path("/proc/self/io").read_text().splitlines())
        return int(fields["syscw"])

    with backend(lambda: gym.make("CartPole-v1"), 2, 2, context="fork", spin_seconds=0.0) as envs:
        envs.reset(seed=0)
        actions = np.zeros(4, dtype=np.int64)
        for _ in range(5):
            envs.step(actions)
        before = write_syscalls()
        for _ in range(50):
            envs.step(actions)
        rung = write_syscalls() - before
    # Two sleepers per batch; a worker still on its way to sleep when the command comes
    # needs no ring, so allow some, but not none.
    assert rung >= 50, f"the parent wrote {rung} wake-ups in 50 batches of 2 sleeping workers"


@on_backends(
    caller="caller_envs changes the default: test_with_caller_envs_the_parent_spins_by_default",
    ray=RAY_DOORBELL,
)
def test_parent_spin_seconds_keeps_the_parent_awake(backend: Backend) -> None:
    """``parent_spin_seconds``: step_wait busy-polls for the workers instead of sleeping,
    so no worker ever has to wake it (no wake-up byte is written); by default it
    sleeps and is woken."""
    written = {}
    for spin in (0.0, 60.0):
        with backend(
            lambda: gym.make("CartPole-v1"),
            2,
            4,
            context="fork",
            timer_interval=3600.0,
            parent_spin_seconds=spin,
        ) as envs:
            envs.reset(seed=0)
            actions = [envs.action_space.sample() for _ in range(100)]
            written[spin] = traffic(envs, actions)[1]
    assert written[60.0] == 0, written
    assert written[0.0] > 0, written


@on_backends(caller="it is the caller case: it builds its own", ray=RAY_DOORBELL)
def test_with_caller_envs_the_parent_spins_by_default(backend: Backend) -> None:
    """With ``caller_envs`` the parent steps envs on its own core, so by default it
    spins for its workers as long as they spin for it (``spin_seconds``) and is
    never woken; an explicit ``parent_spin_seconds=0`` still makes it sleep."""
    written = {}
    for spin in (None, 0.0):
        with backend(
            lambda: gym.make("CartPole-v1"),
            1,  # one worker and the caller: no more spinning processes than cores
            4,
            context="fork",
            timer_interval=3600.0,
            spin_seconds=60.0,
            parent_spin_seconds=spin,
            caller_envs=2,
        ) as envs:
            assert envs.parent_spin_seconds == (60.0 if spin is None else 0.0)
            envs.reset(seed=0)
            actions = [envs.action_space.sample() for _ in range(100)]
            written[spin] = traffic(envs, actions)[1]
    assert written[None] == 0, written
    assert written[0.0] > 0, written


@on_backends(caller=LOCAL_ONLY, ray=LOCAL_ONLY)
def test_default_start_method_is_forkserver_with_a_preloaded_server(
    backend: Backend, run_python: Any
) -> None:
    """ "the default is forkserver ...; its server preloads numpy and gymnasium": in a fresh
    interpreter, the default manager's forkserver has numpy's extension mapped."""
    proc = run_python(
        """
        import multiprocessing as mp, os
        from envs import DictObsEnv
        from envmgr import SubprocessEnvManager

        assert "forkserver" in mp.get_all_start_methods()
        with SubprocessEnvManager(DictObsEnv, 1, 1) as envs:
            print("context", envs.context)
            me = str(os.getpid())
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    stat = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                    cmd = open(f"/proc/{pid}/cmdline").read()
                except OSError:
                    continue
                if stat[1] == me and "forkserver" in cmd:
                    maps = open(f"/proc/{pid}/maps").read()
                    print("server has numpy", "_multiarray_umath" in maps)
        """
    )
    assert proc.returncode == 0, proc.stderr
    assert "context forkserver" in proc.stdout, proc.stdout
    assert "server has numpy True" in proc.stdout, proc.stdout


# ------------------------------------------------------------------ Failure handling


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


@on_backends(
    caller="env 3's result never leaves this process: nothing is pickled",
    ray=[
        pytest.param(
            marks=pytest.mark.xfail(
                strict=True,
                reason="on Ray the note says call('make_lock'), not 'call (sending the "
                "result)': EnvActor.run pickles its answer (pack) after the try that "
                "would name that phase",
            )
        )
    ],
)
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
@on_backends("max_restarts", local=[0, 1], caller=CALLER_BLOCKS, ray=RAY_HANG)
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
        envs.reset_async(seed=5)
        wait_until((tmp_path / "blocked").exists, "env 3 blocking in reset")
        if not max_restarts:
            with pytest.raises(WorkerTimeoutError) as ei:
                envs.reset_wait(timeout=1.0)
            assert str(ei.value) == f"{WHERE}: it did not answer reset within 1.0 s"
            assert envs.closed
            return
        obs, infos = envs.reset_wait(timeout=1.0)
        assert infos["envmgr_restarted"][3] == f"{WHERE}: it did not answer reset within 1.0 s"
        assert envs.restarts == [0, 1]
        sync = SyncVectorEnv(fault_env_fns("none", N, 3))
        want, _ = sync.reset(seed=5)  # the replacement carried out the seeded reset
        sync.close()
        np.testing.assert_array_equal(obs, want)


@pytest.mark.timeout(30)
@on_backends(caller=CALLER_BLOCKS, ray=RAY_HANG)
def test_call_wait_timeout(backend: Backend, tmp_path: Path) -> None:
    """``call_wait(timeout)``: a call that does not answer in time raises
    ``WorkerTimeoutError`` naming the worker and the call."""
    with faulty(backend, "none", tmp_path, ready_file=str(tmp_path / "blocked")) as envs:
        envs.call_async("pause", 3600.0, 3)  # env 3 sleeps, the others return at once
        wait_until((tmp_path / "blocked").exists, "env 3 blocking in the call")
        with pytest.raises(WorkerTimeoutError) as ei:
            envs.call_wait(timeout=1.0)
        assert str(ei.value) == f"{WHERE}: it did not answer call('pause') within 1.0 s"
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
        sys.path.insert(0, {str(Path(__file__).parent)!r})
        from envs import DictObsEnv
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
