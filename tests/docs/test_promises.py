"""README promises that no other test would notice losing.

Each test here pins one sentence of README.md's "How it works" section and was
checked by taking the mechanism out of the package and watching the test fail
(the table in ``tests/README.md`` says what was removed and how the test
failed). Only public API and what the operating system
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

This file holds the "How it works" promises; "Failure handling" is
``test_promises_failures.py``.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import SyncVectorEnv
from support.envs import DictActionEnv, VariableObsEnv, assert_same
from support.helpers import io_bytes, traffic

pytestmark = pytest.mark.timeout(60)

N = 4  # envs: 2 workers x 2


# Why a backend cannot run a test (the skipped case's reason), besides fault_cases.py's.
RAY_BYTES = "it counts the bytes worker processes move (/proc/<pid>/io): Ray's actors pickle"
RAY_DOORBELL = "the doorbell and its wake-ups are the local backend's"
LOCAL_ONLY = "start methods and the forkserver are the local workers' (caller_envs adds none)"


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

        zeros = np.zeros(8, dtype=np.int64)
        one_shipment = 0
        for _ in range(5):
            # A step leaves its timings with the workers, unless it was itself due to ship
            # them (as the reset is when starting took longer than the interval); then
            # the flush finds nothing to pull, and the next step, just after it, is not due.
            envs.step(zeros)
            before = written()
            envs.env_step_seconds()  # a flush: every worker ships its tree once
            one_shipment = written() - before
            if one_shipment:
                break
        time.sleep(1.5 * interval)  # past the first interval, where the bug began
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
        from support.envs import DictObsEnv
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
