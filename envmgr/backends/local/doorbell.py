"""How the parent and its workers wake each other: spin briefly, then sleep.

A blocking wake-up through the kernel costs a context switch on each side, and a
pipe message costs a pickle on each side. So the per-step hand-off uses words in
the shared-memory control block instead:

* The parent announces a command by storing ``seq << 3 | kind`` in the worker's
  ``CMD`` word. A worker that finished its last command spins on that word for
  ``spin_seconds``, then marks itself ``SLEEPING`` and blocks on its pipe; the
  parent writes an empty wake-up message to the pipe only when it sees that mark.
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
  the ``SLEEPING`` words only when someone did. With many workers, the parent's
  per-worker work is what limits the batch rate; here it is one numpy store of
  the command words.

This module holds the words, the fence and the parent's side (:class:`ParentDoorbell`);
the worker's side is :class:`~envmgr.backends.local.worker_doorbell.WorkerDoorbell`.
Both sides wait through :func:`~envmgr.backends.local.wait.wait_until`, each with its
own sleeper (:class:`ParentSleeper`, and the worker doorbell itself).

Both "mark, then re-check" pairs (worker ``SLEEPING``/``SLEEPERS`` vs parent
``CMD``; parent ``WAITING`` vs worker ``ALL_DONE``/``DONE``) are the classic
Dekker pattern and need a full memory fence between the store and the load;
:func:`fence` provides one (a locked instruction). Every blocking wait also
has a short timeout that re-checks the words, so even a lost wake-up costs
milliseconds, never a hang.
"""

from __future__ import annotations

import math
import os
import select
import struct
import threading
from collections.abc import Callable, Mapping, Sequence
from multiprocessing.connection import Connection

import numpy as np

from envmgr.backends.local.wait import READY, WaitEnd, wait_until

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
    "ParentDoorbell",
    "ParentSleeper",
    "fence_lock",
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

#: The fence: ``with fence_lock: pass``, inlined by the per-step callers. Always a
#: ``with``, never ``acquire()`` then ``release()``: an exception raised by a signal
#: handler between those two calls (Ctrl-C's KeyboardInterrupt) would leave the lock
#: held, and the next fence (``close()`` runs one) would block for ever. ``with``
#: releases it on the way out, and no signal is handled between taking the lock and
#: entering the block (tests/test_interrupts.py).
fence_lock = threading.Lock()


def _free_fence_in_child() -> None:
    # Another thread of the parent (a second manager stepping) may hold the lock at the
    # moment of fork; the child would inherit it held, with nobody to release it. It is
    # released, not replaced, because other modules hold it by name; a plain Lock may be
    # released by any thread, and the child has only this one.
    if fence_lock.locked():
        fence_lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_free_fence_in_child)


def fence() -> None:
    """A full memory barrier: a locked read-modify-write orders stores before later loads."""
    with fence_lock:
        pass


def decode_command(word: int) -> tuple[int, int]:
    """Return the ``(seq, kind)`` of a ``CMD`` word.

    The word is ``seq << 3 | kind``, as stored by :meth:`ParentDoorbell.post_command`.
    """
    return word >> 3, word & _KIND_MASK


class ParentDoorbell:
    """The parent's side: post commands, sleep until a step has finished.

    Args:
        control: The control block.
        conns: The worker pipes (index = worker).
        wake_fd: Read end of the shared wake-up pipe (non-blocking).
        poller: Poll set holding ``wake_fd`` and the worker sentinels.
    """

    def __init__(
        self, control: np.ndarray, conns: list[Connection], wake_fd: int, poller: select.poll
    ) -> None:
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
        self._sleepers = {mode: ParentSleeper(self, poller, mode) for mode in (WAIT_ALL, WAIT_ANY)}

    def post_command(self, workers: Sequence[int], seq: int, kind: int) -> None:
        """Store the command word for each worker and ring those that sleep."""
        words = self.words
        word = (seq << 3) | kind  # the inverse of decode_command
        batch = len(workers) == self.n_workers
        if batch:  # every worker, in one store
            self._cmd_column[:] = word
        else:
            for w in workers:
                words[w * _ROW + CMD] = word
        with fence_lock:  # fence(), inlined: once per step
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
            with fence_lock:
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
        """Return up to ``need`` workers of ``seqs`` (worker -> seq) that finished their step.

        When more are done, the earliest sent (lowest seq) come first.
        """
        words = self.words
        done = [w for w, s in seqs.items() if words[w * _ROW + DONE] >> 1 == s]
        if len(done) > need:
            done.sort(key=lambda w: (seqs[w], w))
            del done[need:]
        return done

    def has_message(self, workers: Sequence[int]) -> bool:
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

    def with_message(self) -> list[int]:
        """The workers that sent a :class:`StepResponse` with their last step."""
        words = self.words
        return [w for w in range(self.n_workers) if words[w * _ROW + DONE] & 1]

    def sleep_until(
        self,
        ready: Callable[[], bool],
        mode: int,
        *,
        spin_seconds: float = 0.0,
        deadline: float | None = None,
        looked: bool = False,
    ) -> WaitEnd | list[int]:
        """:func:`~envmgr.backends.local.wait.wait_until` with the parent's sleep.

        Args:
            ready: Whether the wait is over.
            mode: ``WAIT_ALL`` (only the last worker of a batch rings) or ``WAIT_ANY``
                (every finishing worker does).
            spin_seconds: How long to spin first.
            deadline: A :func:`time.monotonic` time, or ``None``.
            looked: The caller has just seen ``ready()`` false (as ``wait_until``'s).

        Returns:
            ``READY``, ``DEADLINE``, or the poll events other than the
            wake-up pipe: the sentinels of workers that exited.
        """
        return wait_until(
            ready, self._sleepers[mode], spin_seconds=spin_seconds, deadline=deadline, looked=looked
        )

    def wait_all(
        self, seq: int, spin_seconds: float = 0.0, deadline: float | None = None
    ) -> WaitEnd | list[int]:
        """The batch step's wait: until every worker finished ``seq``, as :meth:`sleep_until`.

        Reads the workers' ``ALL_DONE`` summary: one word, whatever the worker count.
        """
        parent = self.parent
        if parent[ALL_DONE] < seq:
            got = wait_until(
                lambda: parent[ALL_DONE] >= seq,  # type: ignore[no-any-return]
                self._sleepers[WAIT_ALL],
                spin_seconds=spin_seconds,
                deadline=deadline,
                looked=True,  # just read above
            )
            if got is not READY:
                return got
        # Acquire side: the batch arrays are read after the word that says they are
        # written (a no-op ordering on x86, needed on weaker memory models).
        with fence_lock:
            pass
        return READY

    def batch_has_message(self, seq: int) -> bool:
        """After :meth:`wait_all`: whether a worker also sent a pipe message for ``seq``."""
        return self.parent[MESSAGE] == seq  # type: ignore[no-any-return]

    def drain(self) -> None:
        """Empty the wake-up pipe (usually one byte; a full read means more may be waiting)."""
        try:
            while len(os.read(self.wake_fd, 256)) == 256:
                pass
        except (BlockingIOError, InterruptedError):
            pass


class ParentSleeper:
    """The parent's sleep: ``poll`` on the wake-up pipe and the worker sentinels.

    A :class:`~envmgr.backends.local.wait.Sleeper`; the pipe is shared, and the sleep is
    announced in the ``WAITING`` word.

    Args:
        bell: The parent's doorbell.
        poller: Poll set holding the wake-up pipe and the worker sentinels.
        mode: What the parent waits for: ``WAIT_ALL`` or ``WAIT_ANY``.
    """

    def __init__(self, bell: ParentDoorbell, poller: select.poll, mode: int) -> None:
        self.parent = bell.parent
        self.wake_fd = bell.wake_fd
        self.drain = bell.drain
        self.poll = poller.poll
        self.mode = mode

    def mark_sleeping(self) -> None:
        """Store ``WAITING``, so that a finishing worker rings the wake-up pipe."""
        self.parent[WAITING] = self.mode
        with fence_lock:  # fence(), inlined: the store is seen before ALL_DONE is read
            pass

    def withdraw(self) -> None:
        """Clear ``WAITING``: no more wake-ups needed."""
        self.parent[WAITING] = NOT_WAITING

    def sleep(self, seconds: float) -> list[int] | None:
        """Sleep in ``poll``; the events other than the wake-up pipe, if any."""
        events = self.poll(math.ceil(seconds * 1000))
        self.parent[WAITING] = NOT_WAITING
        others = None
        for fd, _ in events:
            if fd == self.wake_fd:
                self.drain()
            elif others is None:
                others = [fd]
            else:
                others.append(fd)
        return others
