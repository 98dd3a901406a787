"""The wake-up floor: a parent and worker processes ping-ponging on envmgr's doorbell alone.

:class:`FloorPingPong` is the least a batch round trip can cost with envmgr's wake-up
mechanism (:mod:`envmgr.backends.local.doorbell`: command and done words in shared memory,
the worker spinning then sleeping on its pipe, the last worker waking the parent through
the shared wake-up pipe), with nothing else: no envs, no actions, no observations. With
``work``, each worker also steps a block of envs first: the default layout's structure
with nothing crossing (``realenv.py``'s ``doorbell`` column).

``handoff.py floor`` times it against envmgr; ``tests/test_wait.py`` drives the doorbells
through it with workers that never spin. So this module imports nothing from the
benchmarks at its top (the tests have an ``envs`` module of their own); a worker given
``work`` gets its block's maker from ``ceiling.block_maker``, resolved in the parent.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import select
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

_ROW = 8  # int64 words per control row, as in envmgr.backends.local.doorbell
#: Longest wait for a floor worker to start (spawn imports numpy and envmgr).
START_TIMEOUT = 60.0


def _floor_worker(
    conn: Connection,
    wake: Connection,
    shm_name: str,
    rows: int,
    index: int,
    spin: float,
    work: tuple[Callable[[int], Any], int, np.ndarray] | None = None,
) -> None:
    """Answer every announced step through envmgr's WorkerDoorbell: at once, or after
    stepping a block of ``work = (make, seed, actions)`` envs (:class:`FloorPingPong`)."""
    shm = SharedMemory(name=shm_name)
    block = None
    try:
        try:
            from envmgr.backends.local.worker_doorbell import WorkerDoorbell

            if work is not None:
                make, seed, actions = work
                block = make(actions.shape[1])
                block.reset(seed=seed)

            control: np.ndarray = np.ndarray((rows, _ROW), dtype=np.int64, buffer=shm.buf)
            parent = os.getppid()
            bell = WorkerDoorbell(
                control, index, conn, wake.fileno(), spin, lambda: os.getppid() == parent
            )
        except Exception:  # the signalling interface changed: tell the parent why
            conn.send_bytes(traceback.format_exc().encode())
            return
        # The doorbell takes the command word it finds as already seen: the parent must
        # not announce anything before this point, so say when it is reached.
        conn.send_bytes(b"ready")
        step = None if block is None else block.step
        k = 0
        while True:
            got = bell.wait()
            if not isinstance(got, tuple):  # None: parent gone; bytes: told to stop
                break
            if step is not None:
                step(actions[k % len(actions)])
                k += 1
            bell.step_done(got[0], False)
        del bell, control
    finally:
        if block is not None:
            block.close()
        shm.close()


class FloorPingPong:
    """A parent and ``n_workers`` processes ping-ponging on envmgr's doorbell, nothing else.

    ``step(_)`` is one batch round trip: announce a step to every worker, sleep until the
    last one has answered, exactly as the manager's step path does around its real work.

    With ``work``, each worker also steps its block of envs (``ceiling.py``'s plain loop,
    its own columns of the actions) before it answers: the default layout's lock-step
    bound. The structure is envmgr's (a sleeping parent woken by the last worker, three
    processes on two cores for two workers); no actions, observations or infos cross.

    Args:
        n_workers: Worker processes.
        spin_seconds: The workers' spin budget (use the manager's).
        parent_spin_seconds: How long the parent busy-polls before sleeping (the manager's).
        work: ``(env name in envs.FACTORIES, actions (batches, n_envs, ...))``; the envs
            are split between the workers in order, env ``i`` reset with seed ``i``.
        context: The workers' start method.
    """

    def __init__(
        self,
        n_workers: int,
        spin_seconds: float,
        parent_spin_seconds: float = 0.0,
        work: tuple[str, np.ndarray] | None = None,
        context: str = "spawn",
    ) -> None:
        from envmgr.backends.local.doorbell import KIND_STEP, ParentDoorbell
        from envmgr.backends.local.wait import WaitEnd

        self.kind = KIND_STEP
        self.ready = WaitEnd.READY
        self.parent_spin = parent_spin_seconds
        rows = n_workers + 1
        self.shm = SharedMemory(create=True, size=rows * _ROW * 8)
        self.control: np.ndarray = np.ndarray((rows, _ROW), dtype=np.int64, buffer=self.shm.buf)
        self.control[:] = 0
        ctx = mp.get_context(context)
        self.wake_r, self.wake_w = ctx.Pipe(duplex=False)
        os.set_blocking(self.wake_r.fileno(), False)
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        try:
            shares: list[tuple[Callable[[int], Any], int, np.ndarray] | None] = [None] * n_workers
            if work is not None:
                from benchmarks._common.ceiling import block_maker

                name, actions = work
                make = block_maker("serial", name)
                n = actions.shape[1]
                sizes = [n // n_workers + (1 if w < n % n_workers else 0) for w in range(n_workers)]
                starts = np.cumsum([0, *sizes])
                shares = [
                    (make, int(a), np.ascontiguousarray(actions[:, a : a + size]))
                    for a, size in zip(starts, sizes, strict=False)
                ]
            for w in range(n_workers):
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_floor_worker,
                    args=(theirs, self.wake_w, self.shm.name, rows, w, spin_seconds, shares[w]),
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
            for w, conn in enumerate(self.conns):
                if not conn.poll(START_TIMEOUT):
                    raise TimeoutError(f"floor worker {w} did not start in {START_TIMEOUT} s")
                got = conn.recv_bytes()
                if got != b"ready":
                    raise RuntimeError(f"floor worker {w} failed: {got.decode()[-600:]}")
            self.poller = select.poll()
            self.poller.register(self.wake_r.fileno(), select.POLLIN)
            for proc in self.procs:
                self.poller.register(proc.sentinel, select.POLLIN)
            self.bell = ParentDoorbell(self.control, self.conns, self.wake_r.fileno(), self.poller)
            self.workers = range(n_workers)
            self.seq = 0
        except BaseException:
            self.close()
            raise

    def reset(self, *, seed: int | None = None) -> None:
        """Nothing: the workers reset their envs when they build them."""

    def step(self, _actions: Any = None) -> None:
        bell, seq = self.bell, self.seq + 1
        self.seq = seq
        bell.post_command(self.workers, seq, self.kind)
        # The manager's own batch wait (spin for parent_spin_seconds, then sleep until the
        # finisher rings); anything but READY is a poll event other than the wake-up: a
        # sentinel.
        while bell.wait_all(seq, self.parent_spin) is not self.ready:
            if not all(p.is_alive() for p in self.procs):
                raise RuntimeError("a floor worker died")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send_bytes(b"stop")
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for c in (*self.conns, self.wake_r, self.wake_w):
            c.close()
        self.conns, self.procs = [], []
        # The doorbell's memoryviews pin the segment's buffer: drop them before closing it.
        self.bell = None  # type: ignore[assignment]
        self.control = np.empty(0)
        self.shm.close()
        self.shm.unlink()
