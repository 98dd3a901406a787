"""The local backend's one wait (``envmgr.backends.local.wait``) and the doorbells over it.

* :func:`wait_until` itself: the order of its looks (ready before any sleep, again right
  after announcing one: the Dekker pair's load), its timeouts (doubling, capped by
  ``longest_sleep`` and by the deadline), and that whatever the sleeper reports ends the
  wait as is. Its sleepers here are small recording objects: the loop is what is tested.
* The doorbells over it with real processes and real shared memory: a batch in which
  every worker sleeps and every wake-up goes through the pipes (no spinning on either
  side), and a worker that exits, reported by its sentinel.
* Through a whole manager: when the batch wait finds a dead worker, the collector starts
  from that sentinel instead of spinning and sleeping again to find it.
"""

from __future__ import annotations

import functools
import multiprocessing as mp
import os
import select
import time
from collections.abc import Iterator
from pathlib import Path
from time import monotonic
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.fault_envs import EXIT_CODE, fault_env_fns

from benchmarks._common.floor import FloorPingPong
from envmgr import SubprocessEnvManager, WorkerDiedError
from envmgr.backends.local import doorbell
from envmgr.backends.local.wait import UnrungSleeper, WaitEnd, wait_until

pytestmark = pytest.mark.timeout(60)


class Recorder:
    """A sleeper that records what the wait asks of it.

    Args:
        on_announce: Run when the wait announces a sleep (the other side's store
            landing in that moment).
        report: What ``sleep`` returns, call by call (``None`` when the list runs out).
    """

    def __init__(self, on_announce: Any = None, report: list[Any] | None = None) -> None:
        self.on_announce = on_announce
        self.report = list(report or [])
        self.log: list[str] = []
        self.timeouts: list[float] = []

    def mark_sleeping(self) -> None:
        self.log.append("announce")
        if self.on_announce is not None:
            self.on_announce()

    def withdraw(self) -> None:
        self.log.append("withdraw")

    def sleep(self, seconds: float) -> Any:
        self.log.append("sleep")
        self.timeouts.append(seconds)
        return self.report.pop(0) if self.report else None


# ------------------------------------------------------------------ the loop


def test_a_ready_predicate_ends_the_wait_before_any_sleep() -> None:
    sleeper = Recorder()
    assert wait_until(lambda: True, sleeper, spin_seconds=1.0) is WaitEnd.READY
    assert sleeper.log == []


def test_the_predicate_is_looked_at_again_after_announcing_the_sleep() -> None:
    """The other side stored its word just before seeing our announcement (so it will
    not ring): the look after the announcement must find it, and not sleep."""
    done = [False]
    sleeper = Recorder(on_announce=lambda: done.__setitem__(0, True))
    assert wait_until(lambda: done[0], sleeper) is WaitEnd.READY
    assert sleeper.log == ["announce", "withdraw"]


@pytest.mark.parametrize(
    ("looked", "log"), [(False, ["announce", "withdraw"]), (True, ["announce", "sleep"])]
)
def test_a_caller_that_just_looked_skips_the_first_look(looked: bool, log: list[str]) -> None:
    """``looked=True`` (first-ready's recv and the batch wait look before they wait): the
    first look is the one after announcing the sleep, so a predicate that turns true on
    its second look is seen only after one sleep; without ``looked``, before any."""
    looks = [0]

    def second_look() -> bool:
        looks[0] += 1
        return looks[0] >= 2

    sleeper = Recorder()
    assert wait_until(second_look, sleeper, looked=looked) is WaitEnd.READY
    assert (sleeper.log, looks[0]) == (log, 2)


def test_spinning_finds_what_becomes_ready_without_sleeping() -> None:
    looks = [0]

    def third_look() -> bool:
        looks[0] += 1
        return looks[0] >= 3

    sleeper = Recorder()
    # A generous budget: the test ends at the third look, not when the budget runs out.
    assert wait_until(third_look, sleeper, spin_seconds=30.0) is WaitEnd.READY
    assert sleeper.log == []


def test_what_the_sleeper_reports_ends_the_wait_as_it_is() -> None:
    sentinels = [17, 23]
    sleeper = Recorder(report=[None, None, sentinels])
    got = wait_until(lambda: False, sleeper, first_sleep=0.001, longest_sleep=0.1)
    assert got is sentinels
    assert sleeper.log.count("sleep") == 3


def test_sleeps_double_up_to_the_longest() -> None:
    sleeper = Recorder(report=[None] * 5 + ["stop"])
    assert wait_until(lambda: False, sleeper, first_sleep=0.001, longest_sleep=0.004) == "stop"
    assert sleeper.timeouts == [0.001, 0.002, 0.004, 0.004, 0.004, 0.004]


def test_a_past_deadline_ends_the_wait_without_sleeping() -> None:
    sleeper = Recorder()
    got = wait_until(lambda: False, sleeper, spin_seconds=0.0, deadline=monotonic() - 1.0)
    assert got is WaitEnd.DEADLINE
    assert sleeper.log == []


def test_no_sleep_runs_past_the_deadline() -> None:
    """A real sleep (a pipe nobody writes): each timeout asked for is at most what was left
    of the deadline when the previous sleep returned, and the wait ends at the deadline."""
    r, w = os.pipe()
    asked: list[float] = []
    returned = [monotonic()]  # when the wait began, then when each sleep returned
    deadline = returned[0] + 0.05

    def block(seconds: float) -> None:
        asked.append(seconds)
        select.select([r], [], [], seconds)
        returned.append(monotonic())

    try:
        got = wait_until(
            lambda: False,
            UnrungSleeper(block),
            deadline=deadline,
            first_sleep=0.01,
            longest_sleep=1.0,
        )
    finally:
        os.close(r)
        os.close(w)
    assert got is WaitEnd.DEADLINE
    assert monotonic() >= deadline
    assert asked
    for seconds, since in zip(asked, returned, strict=False):
        assert seconds <= deadline - since, (asked, returned)


# ------------------------------------------------------------------ the doorbells, real processes


@pytest.fixture
def two_workers() -> Iterator[FloorPingPong]:
    """A parent doorbell and two worker processes answering through theirs, never spinning
    (``benchmarks._common.floor``'s rig: the floor the benchmarks time is the one tested here)."""
    # As the manager does (managers/local.py): whichever test starts the forkserver
    # first decides what every later worker finds imported already.
    mp.get_context("forkserver").set_forkserver_preload(["envmgr.backends.local.worker"])
    bells = FloorPingPong(2, spin_seconds=0.0, context="forkserver")
    try:
        yield bells
    finally:
        bells.close()


def test_a_batch_of_sleeping_workers_is_woken_and_wakes_the_parent(
    two_workers: FloorPingPong,
) -> None:
    """Neither side spins: each worker marks itself asleep and blocks on its pipe until the
    parent rings it; the parent sleeps in poll until the last worker to finish rings the
    wake-up pipe. Every step is announced only once both workers are marked asleep."""
    bell = two_workers.bell
    deadline = monotonic() + 30.0
    for seq in range(1, 41):
        while not all(two_workers.control[:2, doorbell.SLEEPING]):
            assert monotonic() < deadline, "the workers never went to sleep"
            os.sched_yield()
        bell.post_command([0, 1], seq, doorbell.KIND_STEP)
        assert bell.wait_all(seq, deadline=deadline) is WaitEnd.READY
        assert list(two_workers.control[:2, doorbell.DONE] >> 1) == [seq, seq]
        assert two_workers.control[-1, doorbell.ALL_DONE] == seq


def test_the_sentinel_of_a_worker_that_exits_ends_the_parents_wait(
    two_workers: FloorPingPong,
) -> None:
    bell = two_workers.bell
    two_workers.procs[1].kill()
    bell.post_command([0, 1], 1, doorbell.KIND_STEP)
    deadline = monotonic() + 30.0
    got = bell.wait_all(1, deadline=deadline)
    assert got == [two_workers.procs[1].sentinel]
    while not bell.is_done(0, 1):  # the live worker answers all the same
        assert monotonic() < deadline, "worker 0 never answered"
        os.sched_yield()
    assert bell.first_done({0: 1, 1: 1}, 2) == [0]


# ------------------------------------------------------------------ through a manager


def test_a_dead_worker_found_by_the_batch_wait_is_not_looked_for_again(tmp_path: Path) -> None:
    """The batch wait (spin, then sleep) wakes on the dead worker's sentinel; the collector
    takes it from there: no second batch wait, no second spin."""
    fns = fault_env_fns("exit", 4, fault_env=3, at_step=3, state_dir=tmp_path)
    with SubprocessEnvManager(
        fns,
        n_workers=2,
        envs_per_worker=2,
        context="forkserver",
        parent_spin_seconds=0.01,
        max_restarts=0,
        close_timeout=1.0,
    ) as envs:
        envs.reset(seed=0)
        bell = envs._backend._collector.bell  # type: ignore[union-attr,attr-defined]
        calls: list[tuple[str, float]] = []
        batch_wait, general_wait = bell.wait_all, bell.sleep_until

        def spy_batch(seq: int, spin_seconds: float = 0.0, deadline: Any = None) -> Any:
            got = batch_wait(seq, spin_seconds, deadline)
            calls.append(("wait_all", spin_seconds) if got is WaitEnd.READY else ("died", 0.0))
            return got

        def spy_general(ready: Any, mode: int, *, spin_seconds: float = 0.0, **kw: Any) -> Any:
            calls.append(("sleep_until", spin_seconds))
            return general_wait(ready, mode, spin_seconds=spin_seconds, **kw)

        bell.wait_all, bell.sleep_until = spy_batch, spy_general
        actions = np.zeros(4, dtype=np.int64)
        envs.step(actions)
        envs.step(actions)
        with pytest.raises(WorkerDiedError, match=f"exited with code {EXIT_CODE} during step"):
            envs.step(actions)
    assert calls[:2] == [("wait_all", 0.01), ("wait_all", 0.01)]
    assert calls[2] == ("died", 0.0)
    assert calls[3:] == [("sleep_until", 0.0)], calls


def _slow_cartpole(seconds: float) -> gym.Env[Any, Any]:
    time.sleep(seconds)
    return gym.make("CartPole-v1")


def test_the_start_up_wait_sleeps_while_a_slow_worker_builds() -> None:
    """Worker 0 answers at once; worker 1 takes 3 s to build its env. The wait for their
    start-up answers must sleep on what is still missing, not spin on the answer already
    there. Measured in CPU seconds of this process, as test_faults does: a sleeping wait
    costs milliseconds, a spinning one a good part of the 3 s."""
    fns = [functools.partial(gym.make, "CartPole-v1"), functools.partial(_slow_cartpole, 3.0)]
    cpu = time.process_time()
    with SubprocessEnvManager(fns, n_workers=2, envs_per_worker=1, context="forkserver") as envs:
        cpu = time.process_time() - cpu
        assert envs.num_envs == 2
    assert cpu < 0.5, f"starting the manager used {cpu:.2f} CPU seconds"
