"""How the parent and its workers wake each other: spin briefly, then sleep.

A blocking wake-up through the kernel costs about 20 µs per hop on the 2-core
machines this was tuned on, and a pipe message costs a pickle on each side. So
the per-step hand-off uses words in the shared-memory control block instead:

* The parent announces a command by storing ``seq << 3 | kind`` in the worker's
  ``CMD`` word. A worker that finished its last command spins on that word for
  ``spin_seconds`` (yielding its core with ``sched_yield`` every turn, so that
  processes outnumbering cores do not starve each other), then marks itself
  ``SLEEPING`` and blocks on its pipe; the parent writes an empty wake-up
  message to the pipe only when it sees that mark.
* Step commands need nothing more (the actions are already in shared memory).
  Other commands are pickled messages on the pipe; their word says so.
* A worker that finished a step stores ``seq << 1 | has_message`` in its
  ``DONE`` word; when there are infos or timers it also sends a
  :class:`~envmgr.protocol.messages.StepResponse` down its pipe and then stores ``seq`` in
  its ``SENT`` word. A small answer is sent before DONE (the parent, woken by it,
  finds the answer waiting); one larger than a pipe holds after DONE, as it can
  only be written while the parent reads it. The parent sleeps on one shared
  wake-up pipe, polled together with the worker sentinels, and only the *last*
  worker to finish writes to it: one wake-up per batch, not one per worker.
* The parent's per-step checks read one word each, whatever the number of
  workers: the finisher that sees every ``DONE`` word at ``seq`` stores it in the
  parent row's ``ALL_DONE``; a worker with a message stores its seq in
  ``MESSAGE``; a worker going to sleep sets ``SLEEPERS``, so the parent scans
  the ``SLEEPING`` words only when someone did. On 16-64 cores the parent's
  per-worker work is what limits the batch rate; here it is one numpy store of
  the command words.

Both "mark, then re-check" pairs (worker ``SLEEPING``/``SLEEPERS`` vs parent
``CMD``; parent ``WAITING`` vs worker ``ALL_DONE``/``DONE``) are the classic
Dekker pattern and need a full memory fence between the store and the load;
:func:`fence` provides one (a locked instruction). Every blocking wait also
has a short timeout that re-checks the words, so even a lost wake-up costs
milliseconds, never a hang.
"""

from __future__ import annotations

import os
import select
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection
from time import perf_counter

import numpy as np

__all__ = [
    "CMD",
    "DONE",
    "SLEEPING",
    "SENT",
    "WAITING",
    "ALL_DONE",
    "MESSAGE",
    "SLEEPERS",
    "WAIT_ALL",
    "WAIT_ANY",
    "KIND_STEP",
    "KIND_PIPE",
    "SHIP_TIMERS",
    "fence",
    "encode_command",
    "WorkerDoorbell",
]

# Columns of a worker's control row. ``SENT``: the last seq whose pipe answer is
# wholly written (before or after DONE, by size: see the module docstring).
CMD, DONE, SLEEPING, SENT = 0, 1, 2, 3
# Columns of the parent's row (the last one). ``WAITING``: the parent is not
# waiting, waits for every worker (a batch step), or for any worker (first-ready
# stepping). The other three are summaries the workers keep, so that the parent's
# per-step checks read one word whatever the number of workers: ``ALL_DONE``, the
# last batch seq every worker finished (stored by a finisher that sees all DONE
# words at that seq); ``MESSAGE``, the last seq a worker answered with a pipe
# message too; ``SLEEPERS``, set by a worker going to sleep (cleared by the parent
# when it looks for sleepers to wake).
WAITING, ALL_DONE, MESSAGE, SLEEPERS = 0, 1, 2, 3
NOT_WAITING, WAIT_ALL, WAIT_ANY = 0, 1, 2

KIND_STEP, KIND_PIPE, SHIP_TIMERS = 1, 2, 4
_KIND_MASK = 7
_ROW = 8  # int64 words per control row (one cache line)

#: ``Connection.send_bytes(b"")`` on the wire: a zero length, 4 bytes big-endian.
_EMPTY_MESSAGE = struct.pack("!i", 0)

#: The fence: ``with _fence_lock: pass``, inlined by the per-step callers. Always a
#: ``with``, never ``acquire()`` then ``release()``: an exception raised by a signal
#: handler between those two calls (Ctrl-C's KeyboardInterrupt) would leave the lock
#: held, and the next fence (``close()`` runs one) would block for ever. ``with``
#: releases it on the way out, and no signal is handled between taking the lock and
#: entering the block (tests/test_interrupts.py).
_fence_lock = threading.Lock()


def _fresh_fence_in_child() -> None:
    # Another thread of the parent (a second manager stepping) may hold the lock at the
    # moment of fork; the child would inherit it held, with nobody to release it.
    global _fence_lock
    _fence_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_fence_in_child)


def fence() -> None:
    """A full memory barrier: a locked read-modify-write orders stores before later loads."""
    with _fence_lock:
        pass


def encode_command(seq: int, kind: int) -> int:
    """The ``CMD`` word announcing command ``seq`` of ``kind`` (``KIND_*`` | ``SHIP_TIMERS``)."""
    return (seq << 3) | kind


def decode_command(word: int) -> tuple[int, int]:
    """Inverse of :func:`encode_command`: ``(seq, kind)``."""
    return word >> 3, word & _KIND_MASK


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
        row = self.row
        word = int(row[CMD])
        if word >> 3 > self.last_seq:
            return self._take(word)
        while self.conn.poll():  # a command sent without a word (close), or stale wake-ups
            got = self._read_pipe()
            if got != b"":
                return got
        spin = self.spin_seconds
        if spin > 0.0:
            deadline = perf_counter() + spin
            while True:
                os.sched_yield()
                word = int(row[CMD])
                if word >> 3 > self.last_seq:
                    return self._take(word)
                if perf_counter() > deadline:
                    break
        backoff = 0.001
        parent = self.parent
        while True:
            row[SLEEPING] = 1
            parent[SLEEPERS] = 1  # after SLEEPING: a parent that sees this sees that
            fence()
            word = int(row[CMD])
            if word >> 3 > self.last_seq:
                row[SLEEPING] = 0
                return self._take(word)
            ready = self.conn.poll(backoff)
            row[SLEEPING] = 0
            if ready:
                got = self._read_pipe()
                if got != b"":
                    return got
                continue  # a wake-up: the command word has changed
            backoff = min(backoff * 2, self.liveness)
            if backoff >= self.liveness and not self.parent_alive():
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
        with _fence_lock:  # fence(), inlined: once per step
            pass
        if self._all_done(seq):
            parent[ALL_DONE] = seq
            with _fence_lock:  # ALL_DONE stored before WAITING is read (the parent's Dekker pair)
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


class ParentDoorbell:
    """The parent's side: announce commands, sleep until a step has finished.

    Args:
        control: The control block.
        conns: The worker pipes (index = worker).
        wake_fd: Read end of the shared wake-up pipe (non-blocking).
    """

    def __init__(self, control: np.ndarray, conns: list[Connection], wake_fd: int) -> None:
        self.control = control
        self.words = memoryview(control.reshape(-1))  # type: ignore[arg-type]
        self.n_workers = control.shape[0] - 1
        self.parent = memoryview(control[-1])
        self.conns = conns
        self.wake_fd = wake_fd
        n = self.n_workers
        # One column per word over every worker, so a batch is one numpy store or
        # one C-level scan (min/max/any over a memoryview), not a Python loop per
        # worker: the parent's per-worker cost is what limits many-core machines.
        self._cmd_column = control[:n, CMD]
        self._done = memoryview(control[:n, DONE])  # type: ignore[arg-type]
        self._sleeping = memoryview(control[:n, SLEEPING])  # type: ignore[arg-type]

    def announce(self, workers: Sequence[int], seq: int, kind: int) -> None:
        """Store the command word for each worker and ring those that sleep."""
        words = self.words
        word = (seq << 3) | kind  # encode_command, inlined
        batch = len(workers) == self.n_workers
        if batch:  # every worker, in one store
            self._cmd_column[:] = word
        else:
            for w in workers:
                words[w * _ROW + CMD] = word
        with _fence_lock:  # fence(), inlined: once per step
            pass
        if kind & KIND_PIPE:
            return  # the pipe message itself wakes a sleeping worker
        if batch:
            parent = self.parent
            if not parent[SLEEPERS]:
                return  # nobody went to sleep: one word read, whatever the worker count
            # Cleared before looking: a worker that marks itself later sees the new
            # command word itself (it fences before its last look), so none is missed.
            parent[SLEEPERS] = 0
            with _fence_lock:
                pass
        for w in workers:
            if words[w * _ROW + SLEEPING]:
                try:
                    # An empty message, framed as Connection.send_bytes(b"") frames it
                    # (a 4-byte length), in one write instead of its Python layers:
                    # with more workers than cores, most batches wake several.
                    os.write(self.conns[w].fileno(), _EMPTY_MESSAGE)
                except OSError:
                    pass  # a dead worker is reported by the wait, with its exit code

    def first_done(self, seqs: Mapping[int, int], need: int) -> list[int]:
        """Up to ``need`` workers of ``seqs`` (worker -> seq) that finished their step:
        the earliest sent (lowest seq) first when more are done."""
        words = self.words
        done = [w for w, s in seqs.items() if words[w * _ROW + DONE] >> 1 == s]
        if len(done) > need:
            done.sort(key=lambda w: (seqs[w], w))
            del done[need:]
        return done

    def said_more(self, workers: Sequence[int]) -> bool:
        """Whether any of ``workers`` sent a message with its last step."""
        words = self.words
        return any(words[w * _ROW + DONE] & 1 for w in workers)

    def is_done(self, w: int, seq: int) -> bool:
        """Whether worker ``w`` finished step ``seq``."""
        return self.words[w * _ROW + DONE] >> 1 == seq  # type: ignore[no-any-return]

    def all_done(self, seq: int) -> bool:
        """Whether every worker finished step ``seq``.

        No worker can be past the newest command, so "every DONE word at least
        ``seq``" is one ``min`` over the column.
        """
        return min(self._done) >> 1 >= seq  # type: ignore[no-any-return]

    def any_message(self) -> bool:
        """Whether some worker sent a message with its last step (after :meth:`all_done`).

        Every DONE word then holds the same seq, so the largest has the message
        bit if any does: one C-level ``max``, not a loop over the workers.
        """
        return max(self._done) & 1 == 1  # type: ignore[no-any-return]

    def sent(self, w: int) -> int:
        """The last seq whose pipe answer worker ``w`` has wholly written."""
        return self.words[w * _ROW + SENT]  # type: ignore[no-any-return]

    def done_words(self) -> list[int]:
        """The sequence number each worker last finished."""
        words = self.words
        return [words[w * _ROW + DONE] >> 1 for w in range(self.n_workers)]

    def with_message(self) -> list[int]:
        """The workers that sent a :class:`StepResponse` with their last step."""
        words = self.words
        return [w for w in range(self.n_workers) if words[w * _ROW + DONE] & 1]

    def wait(
        self,
        finished: Callable[[], bool],
        poller: select.poll,
        timeout_ms: int,
        mode: int = WAIT_ALL,
    ) -> list[tuple[int, int]]:
        """Sleep until ``finished()``, a poll event, or ``timeout_ms``.

        Args:
            finished: Re-checked after announcing the wait (no lost wake-up).
            poller: Poll set holding the wake-up pipe and the worker sentinels.
            timeout_ms: Longest sleep.
            mode: ``WAIT_ALL`` (the last worker of a batch wakes us) or
                ``WAIT_ANY`` (every finishing worker does).

        Returns:
            The poll events other than the wake-up pipe (sentinels of dead workers).
        """
        parent = self.parent
        parent[WAITING] = mode
        fence()
        if finished():
            parent[WAITING] = NOT_WAITING
            return []
        return self._poll(poller, timeout_ms)

    def sleep_all(self, seq: int, poller: select.poll, spin_seconds: float = 0.0) -> bool:
        """The batch step's wait: until every worker finished ``seq`` (``True``), or a
        poll event other than the wake-up pipe, such as a dead worker's sentinel
        (``False``: the caller's general loop sees it again).

        Reads the workers' ``ALL_DONE`` summary: one word, whatever the worker count.
        Spins (yielding the core) for ``spin_seconds`` first, then sleeps in ``poll``
        until the finisher rings, re-checking every few ms even without a wake-up.
        The hot path: one function, its names bound locally.
        """
        parent = self.parent
        if parent[ALL_DONE] < seq:
            if spin_seconds > 0.0:
                spin_end = perf_counter() + spin_seconds
                while parent[ALL_DONE] < seq and perf_counter() < spin_end:
                    os.sched_yield()
            wake_fd, poll = self.wake_fd, poller.poll
            wait_ms = 5
            while parent[ALL_DONE] < seq:
                parent[WAITING] = WAIT_ALL
                with _fence_lock:  # fence(), inlined
                    pass
                if parent[ALL_DONE] >= seq:
                    parent[WAITING] = NOT_WAITING
                    break
                events = poll(wait_ms)
                parent[WAITING] = NOT_WAITING
                other = False
                for fd, _ in events:
                    if fd == wake_fd:
                        self._drain()
                    else:
                        other = True
                if other:
                    return False
                wait_ms = min(wait_ms * 2, 100)
        # Acquire side: the batch arrays are read after the word that says they are
        # written (a no-op ordering on x86, needed on weaker memory models).
        with _fence_lock:
            pass
        return True

    def batch_said_more(self, seq: int) -> bool:
        """After :meth:`sleep_all`: whether a worker also sent a pipe message for ``seq``."""
        return self.parent[MESSAGE] == seq  # type: ignore[no-any-return]

    def _drain(self) -> None:
        """Empty the wake-up pipe (usually one byte; a full read means more may be waiting)."""
        try:
            while len(os.read(self.wake_fd, 256)) == 256:
                pass
        except (BlockingIOError, InterruptedError):
            pass

    def _poll(self, poller: select.poll, timeout_ms: int) -> list[tuple[int, int]]:
        """Sleep in ``poll``, stop waiting, drain the wake-up pipe; the other events."""
        events = poller.poll(timeout_ms)
        self.parent[WAITING] = NOT_WAITING
        self._drain()
        return [e for e in events if e[0] != self.wake_fd]
