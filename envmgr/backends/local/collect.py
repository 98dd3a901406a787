"""The parent's side of an answer: wait for the workers' steps, then read what they said.

Every wait here goes through :func:`~envmgr.backends.local.wait.wait_until`, the one
wait, for one of three predicates:

* **all**: a batch step, every worker one seq; the workers' ``ALL_DONE`` summary says so
  in one word, and only the last worker to finish rings (the step loop's own wait,
  ``ParentDoorbell.wait_all`` in ``ProcessBackend.wait_step``, is this one; what else
  woke it is handed to :meth:`Collector.wait`);
* **at least k** of some groups, each with its own seq (first-ready's ``recv``; ``k=1``
  is "any"), every finishing worker ringing;
* a group's pipe answer still on its way (:meth:`Collector._answer_in_pipe`).

A wait ends ready, past its deadline, or with the sentinels of workers that exited.
Those are handled once, where the wait returns them: a dead worker is reported
lost, and the wait goes on for the others.
"""

from __future__ import annotations

import select
from collections.abc import Mapping
from time import monotonic

from envmgr.backends.base import LostGroup, WaitResult
from envmgr.backends.local.doorbell import WAIT_ALL, WAIT_ANY, ParentDoorbell
from envmgr.backends.local.pool import WorkerPool
from envmgr.backends.local.wait import DEADLINE, READY, UnrungSleeper, WaitEnd, wait_until
from envmgr.protocol.messages import ErrorResponse

__all__ = ["Collector"]


class _AnswerOverdue(Exception):
    """A worker's pipe answer did not arrive before the wait's deadline."""


class Collector:
    """Waits for the workers of ``pool`` through ``bell`` and reads their answers.

    Args:
        pool: The worker processes.
        bell: The parent's doorbell over their control rows.
        n_workers: How many workers (a batch step is sent to all of them).
        spin_seconds: How long a wait spins before it sleeps.
    """

    def __init__(
        self, pool: WorkerPool, bell: ParentDoorbell, n_workers: int, spin_seconds: float
    ) -> None:
        self.pool = pool
        self.bell = bell
        self.n_workers = n_workers
        self.spin_seconds = spin_seconds
        # Sentinels a wait without a way to report them (ready) woke on: the next
        # wait starts from them instead of sleeping to find them again.
        self._woken: WaitEnd | list[int] | None = None

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """First-ready's usual case: sleep until ``need`` groups of ``seqs`` finished.

        Returns those groups (earliest sent first when more are done) when their whole
        answer is in the batch arrays, else ``None``: the caller then calls :meth:`wait`,
        which starts from what this wait found.
        """
        bell = self.bell
        first_done = bell.first_done
        need = min(need, len(seqs))
        done = first_done(seqs, need)
        if len(done) < need:

            def enough() -> bool:
                # Keeps what it found: the wait's last look is the answer, not looked
                # up again (each look scans every group in flight).
                nonlocal done
                done = first_done(seqs, need)
                return len(done) >= need

            woke = bell.sleep_until(enough, WAIT_ANY, spin_seconds=self.spin_seconds, looked=True)
            if woke is not READY:
                self._woken = woke
                return None
        return None if bell.has_message(done) else done

    def forget_woken(self) -> None:
        """Drop what :meth:`ready` found.

        A process is being replaced, and a new one may get a closed sentinel's number.
        """
        self._woken = None

    def finished(self, seqs: Mapping[int, int], lost: Mapping[int, LostGroup]) -> list[int]:
        """The groups of ``seqs`` whose step is done, except those in ``lost``."""
        is_done = self.bell.is_done
        return [g for g, s in seqs.items() if is_done(g, s) and g not in lost]

    def wait(
        self,
        seqs: Mapping[int, int],
        timeout: float | None,
        need: int | None,
        phase: str,
        woke: WaitEnd | list[int] | None = None,
    ) -> WaitResult:
        """Sleep until the groups answered ``seqs`` (or ``need`` of them did), died or overran.

        Args:
            seqs: Group -> the seq of the command it was sent.
            timeout: Seconds to wait, or ``None``.
            need: How many groups to wait for (``None``: all).
            phase: What the groups were asked to do, for error messages.
            woke: What a wait for these groups just found, to start from.
        """
        got = WaitResult()
        deadline = None if timeout is None else monotonic() + timeout
        want = len(seqs) if need is None else min(need, len(seqs))
        # A batch step: every group, one seq. Only the last worker to finish rings.
        batch = need is None and len(seqs) == self.n_workers and len(set(seqs.values())) == 1
        seq = next(iter(seqs.values())) if batch else None
        stashed, self._woken = self._woken, None
        if woke is None:
            woke = stashed
        self._collect(seqs, want, deadline, timeout, phase, seq, got, woke)
        if got.fatal is not None:
            return got
        if seq is not None and not got.lost:
            if not self.bell.any_message():  # the usual batch: every answer is in the arrays
                got.answers = dict.fromkeys(seqs)
                return got
            done = list(seqs)
        else:  # first come, first served: the commands sent earliest (lowest seq) first
            done = sorted(self.finished(seqs, got.lost), key=lambda g: (seqs[g], g))
        self._read_answers(done[: want - len(got.lost)], seqs, got, deadline, phase)
        return got

    def _collect(
        self,
        seqs: Mapping[int, int],
        want: int,
        deadline: float | None,
        timeout: float | None,
        phase: str,
        batch_seq: int | None,
        got: WaitResult,
        woke: WaitEnd | list[int] | None,
    ) -> None:
        """Wait until ``want`` groups are done or lost; record the lost in ``got``.

        ``batch_seq``: every group was sent this one seq (a batch step); until one is
        lost, only the last worker to finish it wakes us.
        """
        bell, pool = self.bell, self.pool
        lost = got.lost

        def enough() -> bool:
            if batch_seq is not None and not lost:
                return bell.all_done(batch_seq)
            return len(self.finished(seqs, lost)) + len(lost) >= want

        # What woke a wait for these groups came after its spin: do not spin again.
        spin = self.spin_seconds if woke is None else 0.0
        muted: list[int] = []
        try:
            while True:
                if woke is None:
                    mode = WAIT_ALL if batch_seq is not None and not lost else WAIT_ANY
                    woke = bell.sleep_until(enough, mode, spin_seconds=spin, deadline=deadline)
                    spin = 0.0  # spun once already: a later sleep follows a death
                if woke is READY:
                    return
                if woke is DEADLINE:
                    late = sorted(
                        (s, g) for g, s in seqs.items() if g not in lost and not bell.is_done(g, s)
                    )
                    short = want - len(self.finished(seqs, lost)) - len(lost)
                    for _, g in late[:short]:
                        why = f"it did not answer {phase} within {timeout} s"
                        lost[g] = pool.overran(g, why)
                    return
                for fd in woke:
                    g = pool.owner.get(fd, -1)
                    if g in seqs and g not in lost and not bell.is_done(g, seqs[g]):
                        reason, got.fatal = pool.exit_reason(g, phase, seqs[g])
                        if got.fatal is not None:
                            return
                        lost[g] = pool.lost(g, reason, False)
                    elif g >= 0 and g not in seqs and fd not in muted:
                        # Died while idle: the next command to it finds out. Stop
                        # polling its sentinel meanwhile, or poll() returns at once.
                        try:
                            pool.poller.unregister(fd)
                        except (KeyError, ValueError):
                            continue
                        muted.append(fd)
                woke = None
        finally:
            for fd in muted:
                if fd in pool.owner:
                    pool.poller.register(fd, select.POLLIN)

    def _read_answers(
        self,
        groups: list[int],
        seqs: Mapping[int, int],
        got: WaitResult,
        deadline: float | None,
        phase: str,
    ) -> None:
        """The pipe answers of the groups whose DONE word says they send one."""
        with_message = self.bell.with_message()
        pool = self.pool
        for g in groups:
            seq = seqs[g]
            if g not in with_message:
                got.answers[g] = None
                continue
            while True:
                try:
                    if not self._answer_in_pipe(g, seq, deadline):
                        # Wholly written, yet not in the pipe: read already, by a call
                        # an interrupt cut off between the read and its use (CPython
                        # 3.10 can run a signal handler there). Its infos went with it.
                        got.answers[g] = None
                        break
                    msg = pool.recv(g)
                except (EOFError, OSError):
                    got.lost[g] = pool.lost(g, "its pipe closed", False)
                    break
                except _AnswerOverdue:
                    why = f"it did not finish its answer to {phase} in time"
                    got.lost[g] = pool.overran(g, why)
                    break
                if getattr(msg, "seq", None) == seq:
                    if isinstance(msg, ErrorResponse):
                        got.errors.append(msg)
                    else:
                        got.answers[g] = msg
                    break  # older answers (after a timeout) are dropped

    def _answer_in_pipe(self, g: int, seq: int, deadline: float | None) -> bool:
        """Wait until group ``g``'s pipe holds an answer (or its end).

        The end of the pipe is a dead worker, which the read then reports. ``False`` if its
        answer to ``seq`` is wholly written and none is left. A worker writes an answer larger
        than a pipe holds after its DONE word (see :mod:`envmgr.backends.local.doorbell`): this
        waits for such an answer.

        Raises:
            _AnswerOverdue: Past ``deadline``.
        """
        conn, bell = self.pool.conns[g], self.bell

        def there() -> bool:
            written = bell.sent(g) >= seq  # read first: then every byte is in the pipe
            return conn.poll() or written

        def block(seconds: float) -> None:
            conn.poll(seconds)

        got = wait_until(
            there, UnrungSleeper(block), deadline=deadline, first_sleep=1e-4, longest_sleep=0.05
        )
        if got is DEADLINE:
            raise _AnswerOverdue
        # Ready: bytes are there, or every byte was written and none is left.
        return conn.poll()
