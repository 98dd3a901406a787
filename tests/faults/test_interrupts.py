"""The fence's lock is never left held where a later fence would wait for it for ever.

An exception raised by a signal handler (Ctrl-C's KeyboardInterrupt) can land between
any two bytecodes of the step path. Nothing it cuts off may leave state that makes a
later call block: above all the memory fence, a lock taken and released at once, which
``close()`` runs too (before this was pinned, about 1 Ctrl-C in 50 in a step loop left
the lock held and the ``with`` block's close hung for ever). And a fork while another
thread is inside a fence must not hand the child a held lock.

The last test storms a whole step loop: a caller who catches the interrupt and steps on
(a notebook user pressing Ctrl-C, then running the next cell) must get a working
manager, and their own timer tree back.
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from support.fault_envs import process_token, slow_to_restart, wait_gone

from envmgr import NoAsyncCallError, SubprocessEnvManager, timers
from envmgr.backends.local import doorbell as signalling
from envmgr.backends.local.worker_doorbell import WorkerDoorbell
from envmgr.frontend.results import RESTARTED_INFO_KEY

pytestmark = pytest.mark.timeout(60)


class _Interrupt(BaseException):
    """What the test's signal handler raises, as Ctrl-C's handler raises KeyboardInterrupt:
    not an ``Exception``, which library code may catch (numpy's ``array_equal`` does)."""


class InterruptStorm:
    """Raise :class:`_Interrupt` from a signal handler every ``every_s`` of CPU time,
    but only inside :meth:`run`'s call (the test's own loop must not be cut off).

    SIGPROF (CPU time), not SIGALRM: pytest-timeout's signal method owns SIGALRM.

    Where envmgr holds Ctrl-C back (it swaps SIGINT's handler while it starts and
    records a process), a Ctrl-C would wait, so the storm does too: cut there, a
    forkserver start is left half-sent, and CPython's forkserver dies of it.
    """

    def __init__(self, every_s: float = 1e-4) -> None:
        self.every_s = every_s
        self.armed = False
        self.ctrl_c: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed and signal.getsignal(signal.SIGINT) is self.ctrl_c:
            self.armed = False
            raise _Interrupt

    def run(self, call: Callable[..., Any], *args: Any) -> bool:
        """Call ``call(*args)``; whether an interrupt cut it off."""
        try:
            self.armed = True
            call(*args)
            self.armed = False
        except _Interrupt:
            return True
        return False

    @contextmanager
    def raging(self) -> Iterator[InterruptStorm]:
        self.ctrl_c = signal.getsignal(signal.SIGINT)
        old = signal.signal(signal.SIGPROF, self._handler)
        # An interrupt raised inside a gc callback (hypothesis installs one) is printed and
        # dropped by Python: none runs during the storm.
        callbacks = gc.callbacks[:]
        gc.callbacks.clear()
        signal.setitimer(signal.ITIMER_PROF, self.every_s, self.every_s)
        try:
            yield self
        finally:
            signal.setitimer(signal.ITIMER_PROF, 0.0, 0.0)
            signal.signal(signal.SIGPROF, old)
            gc.callbacks[:] = callbacks


@pytest.fixture
def doorbells() -> Iterator[tuple[signalling.ParentDoorbell, WorkerDoorbell, Any]]:
    """A parent's and a worker's doorbell over one control block, no processes: two
    workers that never sleep, and every batch already done (nothing here waits)."""
    n = 2
    control = np.zeros((n + 1, signalling._ROW), dtype=np.int64)
    control[-1, signalling.ALL_DONE] = 1 << 40
    wake_r, wake_w = os.pipe()
    poller = select.poll()
    poller.register(wake_r, select.POLLIN)
    bell = signalling.ParentDoorbell(control, [], wake_r, poller)
    worker = WorkerDoorbell(
        control,
        0,
        None,  # type: ignore[arg-type]
        wake_w,
        spin_seconds=0.0,
        parent_alive=lambda: True,
    )
    yield bell, worker, poller
    os.close(wake_r)
    os.close(wake_w)


def fence_is_free() -> bool:
    """Whether the next fence can run: its lock can be taken without waiting."""
    free = signalling.fence_lock.acquire(blocking=False)
    if free:
        signalling.fence_lock.release()
    return free


def fence_is_free_elsewhere() -> list[bool]:
    """:func:`fence_is_free`, asked from another thread (no signal handler runs there)."""
    answer: list[bool] = []
    probe = threading.Thread(target=lambda: answer.append(fence_is_free()))
    probe.start()
    probe.join(5.0)
    return answer


@pytest.fixture(autouse=True)
def _free_the_fence() -> Iterator[None]:
    """A failing test leaves the lock held: free it, or the rest of the session blocks."""
    yield
    if not fence_is_free():
        signalling.fence_lock.release()


@pytest.mark.parametrize("path", ["fence", "announce", "wait_all", "step_done"])
def test_an_exception_from_a_signal_handler_never_leaves_a_fence_half_done(
    path: str, doorbells: tuple[signalling.ParentDoorbell, WorkerDoorbell, Any]
) -> None:
    bell, worker, poller = doorbells
    calls: dict[str, Callable[[int], Any]] = {
        "fence": lambda seq: signalling.fence(),
        "announce": lambda seq: bell.post_command([0, 1], seq, signalling.KIND_STEP),
        "wait_all": lambda seq: bell.wait_all(seq),
        "step_done": lambda seq: worker.step_done(seq, False),
    }
    call = calls[path]
    interrupted = calls_made = 0
    with InterruptStorm().raging() as storm:
        while interrupted < 100:
            calls_made += 1
            if not storm.run(call, calls_made):
                continue
            interrupted += 1
            assert fence_is_free_elsewhere() == [True], (
                f"interrupt {interrupted} in {path}() after {calls_made} calls left the "
                "fence's lock held: the next fence (close() runs one) would block for ever"
            )
    assert fence_is_free()


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_child_forked_while_another_thread_holds_the_fence_can_fence() -> None:
    held, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with signalling.fence_lock:
            held.set()
            leave.wait(30.0)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert held.wait(10.0)
        pid = os.fork()
        if pid == 0:  # the child: one fence, then out (status 0 only if it got through)
            try:
                signalling.fence()
            finally:
                os._exit(0)
        deadline = time.monotonic() + 10.0
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.01)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child blocked in its first fence: it inherited a held lock")
        assert os.waitstatus_to_exitcode(status) == 0
    finally:
        leave.set()
        holder.join(10.0)


# An interrupt inside one of the caller's own envs may land between its step and the
# group's note that the episode ended: gymnasium then warns that it is stepped on.
@pytest.mark.filterwarnings("ignore:.*even though this environment has already returned")
@pytest.mark.parametrize("layout", ["workers", "caller_envs", "send_recv"])
def test_a_step_loop_interrupted_again_and_again_keeps_working(layout: str) -> None:
    """Never a hang, and afterwards a working manager, whatever the interrupts cut off
    (restarts included: the group is then replaced at the next call).

    Before the fixes, one 2-s storm in five or so hung: in caller_envs layout a cut-off
    exit left the caller group's timer stack as the user's, a timer flush nested in a
    flush took the outer one's answers and the outer one read a pipe for ever; in any
    layout a read cut between a message's length and its bytes left the rest in the
    pipe, read next as a length."""
    # A read or write cut off mid-message costs its worker (the pipe cannot be trusted
    # again): with restarts it is replaced, and the loop goes on.
    kwargs: dict[str, Any] = {"max_restarts": 10_000}
    if layout == "caller_envs":
        kwargs["caller_envs"] = 2
    mine = timers.get_default_stack()
    with SubprocessEnvManager(lambda: gym.make("CartPole-v1"), 2, 2, **kwargs) as envs:
        actions = np.zeros(envs.num_envs, dtype=np.int64)
        envs.reset(seed=0)
        storm = InterruptStorm(every_s=1e-3)

        def one_step() -> None:
            if layout == "send_recv":
                envs.send(actions)
                envs.recv(batch_size=envs.num_envs)
            else:
                envs.step(actions)

        interrupted = 0
        deadline = time.monotonic() + 2.0
        with storm.raging():
            while time.monotonic() < deadline and not envs.closed:
                if storm.run(one_step):
                    interrupted += 1
                    if layout == "send_recv" and not envs.closed:  # what recv left behind
                        with contextlib.suppress(NoAsyncCallError):
                            while True:
                                envs.recv()
        assert interrupted > 0
        assert timers.get_default_stack() is mine
        with timers.hierarchical_timer("after_the_storm"):
            _, rewards, *_ = envs.step(actions)
        assert rewards.shape == (envs.num_envs,)
        assert "after_the_storm" in timers.get_timer_tree()["children"]


@pytest.mark.parametrize(("part", "caller_envs"), [("build", 0), ("build", 1), ("reset", 0)])
def test_a_restart_cut_off_by_an_interrupt_is_redone_at_the_next_call(
    part: str, caller_envs: int, tmp_path: Path
) -> None:
    """Ctrl-C while a lost worker is being replaced: the interrupt reaches the caller,
    the half-started replacement is stopped, and the next step replaces the worker
    again and goes on (the manager is not broken)."""
    flag = str(tmp_path / "slow")
    factory = slow_to_restart(flag, part)
    old_handler = signal.signal(signal.SIGUSR1, _raise_interrupt)
    with SubprocessEnvManager(factory, 2, 1, caller_envs=caller_envs, max_restarts=3) as envs:
        actions = np.zeros(envs.num_envs, dtype=np.int64)
        envs.reset(seed=0)
        victim = envs.worker_pids[1]
        Path(flag).touch()
        os.kill(victim, signal.SIGKILL)
        assert not wait_gone([process_token(victim)], zombie_ok=True)
        # The step finds worker 1 dead and starts its replacement, which stalls in its
        # build or its reset while the flag exists: the interrupt comes while the parent
        # waits for it.
        ring = threading.Timer(0.5, os.kill, (os.getpid(), signal.SIGUSR1))
        ring.start()
        try:
            with pytest.raises(_Interrupt):
                envs.step(actions)
        finally:
            ring.cancel()
            signal.signal(signal.SIGUSR1, old_handler)
        assert not envs.closed
        (cut_off,) = (int(p) for p in Path(flag + ".pids").read_text().split())
        assert not wait_gone([process_token(cut_off)], zombie_ok=True), "left running"
        os.unlink(flag)
        _, rewards, _, truncs, infos = envs.step(actions)
        assert rewards.shape == (envs.num_envs,)
        assert truncs[1] and not truncs[0]  # the replaced worker's env starts afresh
        assert "cut off by an interrupt" in infos[RESTARTED_INFO_KEY][1]
        assert envs.worker_pids[1] not in (victim, cut_off)
        children = {p.pid for p in multiprocessing.active_children()}
        assert set(envs.worker_pids) <= children and cut_off not in children


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise _Interrupt
