"""The worker's side of the doorbell: wait for the next command word, report a finished step.

The words and the protocol are described in :mod:`envmgr.backends.local.doorbell`.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable
from multiprocessing.connection import Connection

import numpy as np

from envmgr.backends.local.doorbell import (
    ALL_DONE,
    CMD,
    DONE,
    KIND_PIPE,
    MESSAGE,
    NOT_WAITING,
    SENT,
    SLEEPERS,
    SLEEPING,
    WAIT_ANY,
    WAITING,
    decode_command,
    fence,
    fence_lock,
)
from envmgr.backends.local.wait import READY, wait_until

__all__ = ["WorkerDoorbell"]


class Gone(enum.Enum):
    """What a worker's sleep reports when its manager is gone."""

    PARENT = "the manager is gone"


#: The member, bound once (the sleep returns it).
PARENT_GONE = Gone.PARENT


class WorkerDoorbell:
    """The worker's side: wait for the next command word, report a finished step.

    Args:
        control: The whole control block (``int64[n_workers + 1, 8]``).
        worker_index: This worker's row.
        conn: The worker's pipe (wake-ups and pickled commands arrive here).
        wake_fd: Write end of the parent's shared wake-up pipe.
        spin_seconds: How long to spin before sleeping.
        parent_alive: Called while asleep, every ``liveness`` seconds at most.
        liveness: Longest single sleep.
    """

    def __init__(
        self,
        control: np.ndarray,
        worker_index: int,
        conn: Connection,
        wake_fd: int,
        spin_seconds: float,
        parent_alive: Callable[[], bool],
        liveness: float = 0.25,
    ) -> None:
        # Plain memoryviews: reading one word costs half what numpy indexing does.
        self.row = memoryview(control[worker_index])
        self.words = memoryview(control.reshape(-1))  # type: ignore[arg-type]
        self.n_workers = control.shape[0] - 1
        self.parent = memoryview(control[-1])
        self._done = memoryview(control[: self.n_workers, DONE])  # type: ignore[arg-type]
        self._done_column = control[: self.n_workers, DONE] if self.n_workers > 16 else None
        self.conn = conn
        self.wake_fd = wake_fd
        self.spin_seconds = spin_seconds
        self.parent_alive = parent_alive
        self.liveness = liveness
        self.last_seq = int(self.row[CMD]) >> 3

    def wait(self) -> tuple[int, int] | bytes | None:
        """Block until a new command.

        Returns:
            ``(seq, kind)`` for a step announced in shared memory, the raw bytes
            of a pickled command that arrived on the pipe, or ``None`` when the
            parent is gone.
        """
        word = int(self.row[CMD])
        if word >> 3 > self.last_seq:
            return self._take(word)
        while self.conn.poll():  # a command sent without a word (close), or stale wake-ups
            got = self._read_pipe()
            if got != b"":
                return got
        woke = wait_until(
            self._new_command,
            self,
            spin_seconds=self.spin_seconds,
            first_sleep=0.001,
            longest_sleep=self.liveness,
        )
        if woke is READY:
            return self._take(int(self.row[CMD]))
        return woke if isinstance(woke, bytes) else None

    def _new_command(self) -> bool:
        return int(self.row[CMD]) >> 3 > self.last_seq  # type: ignore[no-any-return]

    # The worker's Sleeper (envmgr.backends.local.wait): marked SLEEPING, on its pipe.

    def mark_sleeping(self) -> None:
        """Mark this worker asleep, so that the parent's next command rings its pipe."""
        self.row[SLEEPING] = 1
        self.parent[SLEEPERS] = 1  # after SLEEPING: a parent that sees this sees that
        fence()

    def withdraw(self) -> None:
        """Clear the mark: the command word changed after all."""
        self.row[SLEEPING] = 0

    def sleep(self, seconds: float) -> bytes | Gone | None:
        """Block on the pipe: a pickled command's bytes, the parent gone, or ``None``.

        ``None`` is a wake-up, or a timeout: the command word is looked at again.
        """
        ready = self.conn.poll(seconds)
        self.row[SLEEPING] = 0
        if ready:
            got = self._read_pipe()
            if got is None:
                return PARENT_GONE
            return got or None  # b"": a wake-up
        if seconds >= self.liveness and not self.parent_alive():
            return PARENT_GONE
        return None

    def _take(self, word: int) -> tuple[int, int] | bytes | None:
        seq, kind = decode_command(word)
        if kind & KIND_PIPE:
            # The message was sent before the word was stored, so it is there.
            while True:
                got = self._read_pipe()
                if got != b"":
                    return got
        self.last_seq = seq
        return seq, kind

    def _read_pipe(self) -> bytes | None:
        try:
            data = self.conn.recv_bytes()
        except (EOFError, OSError):
            return None
        return data

    def saw(self, seq: int) -> None:
        """Record that command ``seq`` (which arrived on the pipe) is being handled."""
        if seq > self.last_seq:
            self.last_seq = seq

    def _all_done(self, seq: int) -> bool:
        # min() over a memoryview is cheapest for a few workers; one numpy reduction
        # beyond (the memoryview makes an int object per word).
        if self._done_column is not None:
            return int(self._done_column.min()) >> 1 >= seq
        return min(self._done) >> 1 >= seq  # type: ignore[no-any-return]

    def step_done(self, seq: int, has_message: bool) -> None:
        """Publish that step ``seq`` finished; wake the parent if it waits for this.

        A worker that finds every DONE word at ``seq`` stores ``ALL_DONE``, so the
        parent's check for a whole batch reads one word. Two workers finishing at
        once each fence before looking at the other's word, so at least one of them
        sees both (and both may store it: the same value).
        """
        row, parent = self.row, self.parent
        if has_message:
            parent[MESSAGE] = seq  # stored before DONE: seen by whoever sees DONE
        row[DONE] = (seq << 1) | int(has_message)
        with fence_lock:  # fence(), inlined: once per step
            pass
        if self._all_done(seq):
            parent[ALL_DONE] = seq
            with fence_lock:  # ALL_DONE stored before WAITING is read (the parent's Dekker pair)
                pass
            wake = parent[WAITING] != NOT_WAITING
        else:
            wake = parent[WAITING] == WAIT_ANY
        if wake:
            try:
                os.write(self.wake_fd, b"!")
            except OSError:
                pass

    def sent(self, seq: int) -> None:
        """Publish that the pipe answer to ``seq`` is wholly written."""
        self.row[SENT] = seq
