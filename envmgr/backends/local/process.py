"""The local backend: one worker process per group, shared memory, and the doorbell.

Data flow of one step (see :mod:`envmgr.backends.local.doorbell` for the words)::

    parent                                    worker w (envmgr.backends.local.worker)
    ------                                    ------------------------
    post_step: actions -> shared memory
               CMD word[w] = seq|STEP   --->  doorbell.wait() sees the word
                                              serve(group, Step) -> envs stepped,
                                                results -> its rows of shared memory
    wait: sleeps on the wake-up pipe    <---  DONE word[w] = seq (+ pipe message if infos);
          and the worker sentinels            the last worker to finish writes the pipe
          reads the pipe of workers
          whose DONE word says "message"

Every other command is a pickled message on the worker's pipe, flagged in its
``CMD`` word, and answered the same way (``DONE`` word + message). A dead
worker is seen through its process sentinel, at once.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import threading
import types
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from time import monotonic, perf_counter
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.backends.base import Lost, Waited, group_shares, remote_exception
from envmgr.backends.local.doorbell import (
    KIND_PIPE,
    KIND_STEP,
    SHIP_TIMERS,
    WAIT_ALL,
    WAIT_ANY,
    ParentDoorbell,
)
from envmgr.backends.local.worker import worker_main
from envmgr.errors import RemoteTraceback, WorkerDiedError, WorkerTimeoutError
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import (
    Attach,
    Close,
    Command,
    ErrorResponse,
    Ready,
    Step,
    WorkerConfig,
)
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.protocol.trees import copy_tree, scatter_tree

__all__ = ["ProcessBackend"]


class _AnswerOverdue(Exception):
    """A worker's pipe answer did not arrive before the wait's deadline."""


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Keep spawn/forkserver children from re-running the user's ``__main__``.

    Workers need nothing from ``__main__``: env factories travel by value with
    cloudpickle. Hiding it means scripts without an ``if __name__ == "__main__"``
    guard work under every start method.
    """
    main = sys.modules.get("__main__")
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


#: The command word's seq for Close: above any command a manager can send.
_CLOSE_SEQ = 1 << 40


class ProcessBackend:
    """Worker processes over shared memory (see the module docstring).

    Args:
        layout: The groups.
        payloads: Each group's cloudpickled :class:`~envmgr.envside.group.GroupSpec`.
        ctx: The multiprocessing context.
        spin_seconds: How long workers spin for a command before sleeping.
        parent_spin_seconds: How long :meth:`wait` spins before sleeping.
        start_timeout: Seconds a worker may take to build its envs.
        close_timeout: Seconds :meth:`shutdown` waits for workers to exit.
        n_workers: Groups run as processes: the first ``n_workers`` of ``layout``
            (default all). The rest are the caller's
            (:mod:`envmgr.backends.local.caller_group`): they
            share the batch arrays but have no process and no control row.
    """

    def __init__(
        self,
        layout: Layout,
        payloads: list[bytes],
        ctx: Any,
        *,
        spin_seconds: float,
        parent_spin_seconds: float,
        start_timeout: float | None,
        close_timeout: float,
        n_workers: int | None = None,
    ) -> None:
        self.layout = layout
        self.n_workers = layout.n_groups if n_workers is None else n_workers
        self._payloads = payloads
        self._ctx = ctx
        self._fork = ctx.get_start_method() == "fork"
        self.spin_seconds = spin_seconds
        self.parent_spin_seconds = parent_spin_seconds
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.processes: list[Any] = []
        self.conns: list[Connection] = []
        self.buffers: SharedBuffers | None = None
        self.worker_pids: list[int] = []
        self._bell: ParentDoorbell | None = None
        self._seq = -1_000_000  # start-up commands; the front end's seqs are positive
        # One wake-up pipe for the whole manager: the last worker to finish a
        # step writes a byte, so the parent sleeps through the whole batch.
        self._wake_r, self._wake_w = ctx.Pipe(duplex=False)
        os.set_blocking(self._wake_r.fileno(), False)
        self._poller = select.poll()
        self._poller.register(self._wake_r.fileno(), select.POLLIN)
        self._owner: dict[int, int] = {}  # sentinel fd -> group
        self._cut: dict[int, str] = {}  # group -> why its pipe was given up (see _recv)

    # ================================================================ names

    def where(self, g: int) -> str:
        return self.layout.where("worker", g)

    def timer_name(self, g: int) -> str:
        return f"worker_{g}"

    # ================================================================ start-up

    def start(self) -> list[Ready]:
        # Start the resource tracker before any worker exists, so every worker
        # shares it and it unlinks our segment if this process is killed.
        resource_tracker.ensure_running()
        for g in range(self.n_workers):
            proc, conn = self._spawn(g, None)
            self.processes.append(proc)
            self.conns.append(conn)
        readies = self._handshake(range(self.n_workers), "start")
        self.worker_pids = [r.pid for r in readies]
        return readies

    def attach(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any]
    ) -> SharedBuffers:
        n = self.n_workers
        self.buffers = SharedBuffers.create(
            observation_space, action_space, self.layout.num_envs, n
        )
        for conn in self.conns:
            conn.send(Attach(-1, self.buffers.layout))
        self._handshake(range(n), "attach")
        self._bell = ParentDoorbell(self.buffers.control, self.conns, self._wake_r.fileno())
        buffers = self.buffers
        # The usual action batch is one array: placed without walking a tree.
        self._plain_actions = buffers.actions if type(buffers.actions) is np.ndarray else None
        self._group_actions = [
            buffers.slice(r.start, r.stop)["actions"] for r in map(self.layout.range, range(n))
        ]
        return buffers

    def _spawn(self, g: int, layout: Any) -> tuple[Any, Connection]:
        """Start worker ``g``'s process; with ``layout`` it attaches to shared memory at once."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        inherited = [parent_conn, self._wake_r, *(c for i, c in enumerate(self.conns) if i != g)]
        config = WorkerConfig(
            worker_index=g,
            group=self._payloads[g],
            spin_seconds=self.spin_seconds,
            manager_pid=os.getpid(),
            # A forked child inherits the parent's ends of the pipes; it closes
            # them so that a dead parent reads as end-of-file.
            fds_to_close=tuple(c.fileno() for c in inherited) if self._fork else (),
            layout=layout,
            death_signal=threading.current_thread() is threading.main_thread(),
        )
        proc = self._ctx.Process(
            target=worker_main,
            args=(child_conn, self._wake_w, config),
            name=f"envmgr-worker-{g}",
            daemon=True,
        )
        with _main_module_hidden():
            proc.start()
        child_conn.close()
        self._poller.register(proc.sentinel, select.POLLIN)
        self._owner[proc.sentinel] = g
        return proc, parent_conn

    def _handshake(self, groups: Sequence[int] | range, phase: str) -> list[Any]:
        """Read one pipe answer from each group before the doorbell exists (start-up)."""
        deadline = None if self.start_timeout is None else monotonic() + self.start_timeout
        answers: dict[int, Any] = {}
        pending = set(groups)
        while pending:
            for g in sorted(pending):
                conn = self.conns[g]
                if conn.poll():
                    try:
                        answers[g] = conn.recv()
                    except (EOFError, OSError):
                        answers[g] = None
                    pending.discard(g)
                elif self.processes[g].exitcode is not None and not conn.poll():
                    answers[g] = None
                    pending.discard(g)
            if not pending:
                break
            if deadline is not None and monotonic() > deadline:
                g = min(pending)
                raise self._lost(
                    g, f"it did not answer {phase} within {self.start_timeout} s", True
                ).failure
            select.select(
                [self.conns[g] for g in pending] + [self.processes[g].sentinel for g in pending],
                [],
                [],
                0.05,
            )
        errors = [a for a in answers.values() if isinstance(a, ErrorResponse)]
        if errors:
            err = errors[0]
            g = err.worker_index
            exc = remote_exception(err, self.where(g), self.layout.range(g))
            raise exc from RemoteTraceback(err.traceback)
        for g, a in sorted(answers.items()):
            if a is None:
                raise self._lost(g, self._exit_reason(g, phase)[0], False).failure
        return [answers[g] for g in sorted(answers)]

    # ================================================================ commands

    def post(self, commands: Mapping[int, Command]) -> None:
        """Send a pickled command to each group, then flag it in its command word."""
        seq = None
        for g, cmd in commands.items():
            seq = cmd.seq
            try:
                self.conns[g].send(cmd)
            except (BrokenPipeError, ConnectionResetError, OSError):
                # The worker is dead. The wait that follows sees its sentinel and
                # reports it; failing here would bypass the restart policy.
                pass
            except BaseException as exc:  # Ctrl-C: the message may be half written
                self._give_up_pipe(g, exc)
                raise
        if seq is not None and self._bell is not None:
            # A worker spinning on its command word looks there, not at the pipe.
            self._bell.announce(list(commands), seq, KIND_PIPE)

    def post_step(
        self, groups: Sequence[int], seq: int, ship: bool, actions: Any, ids: np.ndarray | None
    ) -> None:
        """Place the actions and wake the groups: through shared memory where the space fits."""
        buffers, bell = self.buffers, self._bell
        assert buffers is not None and bell is not None
        if buffers.actions is not None:
            if ids is None:
                plain = self._plain_actions
                if plain is not None:
                    plain[...] = actions
                else:
                    copy_tree(buffers.actions, actions)
            elif len(groups) == 1 and self.layout.group_with_ids(ids) == groups[0]:
                # One whole group in order (the usual recv-then-send loop): one slice.
                copy_tree(self._group_actions[groups[0]], actions)
            else:
                scatter_tree(buffers.actions, ids, actions)
            bell.announce(groups, seq, KIND_STEP | (SHIP_TIMERS if ship else 0))
            return
        space = buffers.layout.action_space
        shares = group_shares(space, actions, self.layout, groups, ids)
        self.post({g: Step(seq, ship, shares[g]) for g in groups})

    # ================================================================ waiting

    def wait(
        self, seqs: Mapping[int, int], timeout: float | None, need: int | None, phase: str
    ) -> Waited:
        """Sleep until the groups answered ``seqs`` (or ``need`` of them did), died or overran."""
        bell = self._bell
        assert bell is not None
        got = Waited()
        deadline = None if timeout is None else monotonic() + timeout
        want = len(seqs) if need is None else min(need, len(seqs))
        # A batch step: every group, one seq. Only the last worker to finish rings.
        batch = need is None and len(seqs) == self.n_workers and len(set(seqs.values())) == 1
        seq = next(iter(seqs.values())) if batch else None
        finished = seq is not None and (
            bell.all_done(seq)
            or (timeout is None and bell.sleep_all(seq, self._poller, self.parent_spin_seconds))
        )
        if not finished:
            self._sleep(seqs, want, timeout, phase, seq, got)
            if got.fatal is not None:
                return got
        if seq is not None and not got.lost:
            if not bell.any_message():  # the usual batch: every answer is in shared memory
                got.answers = dict.fromkeys(seqs)
                return got
            done = list(seqs)
        else:  # first come, first served: the commands sent earliest (lowest seq) first
            done = sorted(self.finished(seqs, got.lost), key=lambda g: (seqs[g], g))
        self._read_answers(done[: want - len(got.lost)], seqs, got, deadline, phase)
        return got

    def wait_step(self, seq: int, timeout: float | None) -> Waited | None:
        """:meth:`wait` for batch step ``seq`` of every worker; ``None`` if all is in the arrays."""
        bell = self._bell
        assert bell is not None
        # With a deadline, or when something else than the last worker's wake-up
        # arrives (a dead worker's sentinel), the general loop takes over.
        if (
            timeout is None
            and bell.sleep_all(seq, self._poller, self.parent_spin_seconds)
            and not bell.batch_said_more(seq)
        ):
            return None
        return self.wait(dict.fromkeys(range(self.n_workers), seq), timeout, None, "step")

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """First-ready's usual case: sleep until ``need`` groups of ``seqs`` finished.

        Returns those groups (earliest sent first when more are done) when their whole
        answer is in the batch arrays, else ``None``: a message, a dead worker's
        sentinel, anything else goes to :meth:`wait`, which sees it again.
        """
        bell = self._bell
        assert bell is not None
        need = min(need, len(seqs))
        done = bell.first_done(seqs, need)
        if len(done) < need:
            if self.parent_spin_seconds > 0.0:
                spin_end = perf_counter() + self.parent_spin_seconds
                while len(done) < need and perf_counter() < spin_end:
                    os.sched_yield()
                    done = bell.first_done(seqs, need)
            wait_ms = 5  # re-check every few ms even without a wake-up, as in _sleep
            while len(done) < need:
                if bell.wait(
                    lambda: len(bell.first_done(seqs, need)) >= need,
                    self._poller,
                    wait_ms,
                    WAIT_ANY,
                ):
                    return None
                done = bell.first_done(seqs, need)
                wait_ms = min(wait_ms * 2, 100)
        return None if bell.said_more(done) else done

    def finished(self, seqs: Mapping[int, int], lost: Mapping[int, Lost]) -> list[int]:
        """The groups of ``seqs`` whose step is done, except those in ``lost``."""
        is_done = self._bell.is_done  # type: ignore[union-attr]
        return [g for g, s in seqs.items() if is_done(g, s) and g not in lost]

    def _sleep(
        self,
        seqs: Mapping[int, int],
        want: int,
        timeout: float | None,
        phase: str,
        batch_seq: int | None,
        got: Waited,
    ) -> None:
        """Sleep on the wake-up pipe and the sentinels until ``want`` groups are done or lost.

        ``batch_seq``: every group was sent this one seq (a batch step); only the
        last worker to finish it wakes us.
        """
        bell = self._bell
        assert bell is not None
        deadline = None if timeout is None else monotonic() + timeout
        lost = got.lost
        mode = WAIT_ANY if batch_seq is None else WAIT_ALL

        def enough() -> bool:
            if batch_seq is not None and not lost:
                return bell.all_done(batch_seq)  # type: ignore[union-attr]
            return len(self.finished(seqs, lost)) + len(lost) >= want

        if self.parent_spin_seconds > 0.0:
            spin_end = perf_counter() + self.parent_spin_seconds
            while not enough() and perf_counter() < spin_end:
                os.sched_yield()
        # Wake-ups are not lost (see envmgr.backends.local.doorbell), but re-checking every few
        # milliseconds keeps even a lost one from costing more than that.
        wait_ms = 5
        muted: list[int] = []
        try:
            while not enough():
                if deadline is not None:
                    left = deadline - monotonic()
                    if left <= 0:
                        late = sorted(
                            (s, g)
                            for g, s in seqs.items()
                            if g not in lost and not bell.is_done(g, s)
                        )
                        short = want - len(self.finished(seqs, lost)) - len(lost)
                        for _, g in late[:short]:
                            why = f"it did not answer {phase} within {timeout} s"
                            lost[g] = self._lost(g, why, True)
                        return
                    wait_ms = min(wait_ms, int(left * 1000) + 1)
                for fd, _ in bell.wait(enough, self._poller, wait_ms, mode):
                    g = self._owner.get(fd, -1)
                    if g in seqs and g not in lost and not bell.is_done(g, seqs[g]):
                        reason, got.fatal = self._exit_reason(g, phase, seqs[g])
                        if got.fatal is not None:
                            return
                        lost[g] = self._lost(g, reason, False)
                    elif g >= 0 and g not in seqs:
                        # Died while idle: the next command to it finds out. Stop
                        # polling its sentinel meanwhile, or poll() returns at once.
                        self._poller.unregister(fd)
                        muted.append(fd)
                wait_ms = min(wait_ms * 2, 100)
        finally:
            for fd in muted:
                if fd in self._owner:
                    self._poller.register(fd, select.POLLIN)

    def _read_answers(
        self,
        groups: list[int],
        seqs: Mapping[int, int],
        got: Waited,
        deadline: float | None,
        phase: str,
    ) -> None:
        """The pipe answers of the groups whose DONE word says they send one."""
        bell = self._bell
        assert bell is not None
        with_message = bell.with_message()
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
                    msg = self._recv(g)
                except (EOFError, OSError):
                    got.lost[g] = self._lost(g, "its pipe closed", False)
                    break
                except _AnswerOverdue:
                    why = f"it did not finish its answer to {phase} in time"
                    got.lost[g] = self._lost(g, why, True)
                    break
                if getattr(msg, "seq", None) == seq:
                    if isinstance(msg, ErrorResponse):
                        got.errors.append(msg)
                    else:
                        got.answers[g] = msg
                    break  # older answers (after a timeout) are dropped

    def _answer_in_pipe(self, g: int, seq: int, deadline: float | None) -> bool:
        """Wait until group ``g``'s pipe holds an answer (or its end: a dead worker, which
        the read then reports); ``False`` if its answer to ``seq`` is wholly written and
        none is left. A worker writes an answer over 16 kB after its DONE word (see
        :mod:`envmgr.backends.local.doorbell`): this wait is such an answer still on its way.

        Raises:
            _AnswerOverdue: Past ``deadline``.
        """
        conn, bell = self.conns[g], self._bell
        assert bell is not None
        wait_s = 0.0
        while True:
            written = bell.sent(g) >= seq  # read first: then every byte is in the pipe
            if conn.poll(wait_s):
                return True
            if written:
                return False
            if deadline is not None and monotonic() > deadline:
                raise _AnswerOverdue
            wait_s = min(2 * wait_s or 1e-4, 0.05)

    def _recv(self, g: int) -> Any:
        """One message from group ``g``; a read cut off by an exception gives the pipe up.

        ``Connection.recv`` reads a message's length, then its bytes, in Python: an
        exception raised by a signal handler in between (Ctrl-C's KeyboardInterrupt)
        leaves the rest in the pipe, and the next read would take it for a length
        and wait for ever. The worker is stopped instead, so the next call meets a
        lost worker: replaced under the restart policy, or a clear failure.
        """
        try:
            return self.conns[g].recv()
        except (EOFError, OSError):
            raise
        except BaseException as exc:
            self._give_up_pipe(g, exc)
            raise

    def _give_up_pipe(self, g: int, exc: BaseException) -> None:
        """Stop group ``g``, whose pipe ``exc`` may have cut mid-message (see :meth:`_recv`)."""
        why = f"its pipe was cut mid-message by {type(exc).__name__} in this process"
        self._stop(g, f"{why}, so it was stopped")

    def _stop(self, g: int, why: str) -> None:
        """Kill group ``g``'s process; the next wait reports it lost, saying ``why``."""
        self._cut[g] = why
        proc = self.processes[g]
        if proc.is_alive():
            proc.kill()

    def _exit_reason(
        self, g: int, phase: str, seq: int | None = None
    ) -> tuple[str, ErrorResponse | None]:
        """Why worker ``g`` stopped answering; with the error it reported before exiting, if any."""
        if g in self._cut:
            return self._cut[g], None
        conn = self.conns[g]
        try:
            while conn.poll():
                msg = self._recv(g)
                if isinstance(msg, ErrorResponse) and msg.seq in (seq, -1):
                    return "", msg
        except (EOFError, OSError):
            pass
        proc = self.processes[g]
        proc.join(0.5)
        code = proc.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name} (exit code {code})"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"it {how} during {phase}", None

    def _lost(self, g: int, reason: str, timed_out: bool) -> Lost:
        message = f"{self.where(g)}: {reason}"
        envs = self.layout.range(g)
        if timed_out:
            return Lost(reason, WorkerTimeoutError(message, g, envs))
        code = self.processes[g].exitcode if g < len(self.processes) else None
        return Lost(reason, WorkerDiedError(message, g, envs, code))

    # ================================================================ replacing

    def replace(self, g: int, timeout: float | None) -> Ready | Lost:
        """A new process for group ``g``, attached to shared memory: its Ready, or its loss."""
        old = self.processes[g]
        if old.is_alive():
            old.kill()
        old.join(5.0)
        try:
            self._poller.unregister(old.sentinel)
        except (KeyError, ValueError):
            pass
        self._owner.pop(old.sentinel, None)
        self.conns[g].close()
        self._cut.pop(g, None)
        assert self.buffers is not None
        # Its command word may hold the step it never finished: the new process
        # reads the word as already seen, so it will not run it.
        proc, conn = self._spawn(g, self.buffers.layout)
        self.processes[g], self.conns[g] = proc, conn
        try:
            old.close()
        except ValueError:
            pass
        try:
            (ready,) = self._handshake([g], "restart")
        except (WorkerDiedError, WorkerTimeoutError) as exc:
            reason = str(exc).split(": ", 1)[-1]
            return self._lost(g, reason, isinstance(exc, WorkerTimeoutError))
        self.worker_pids[g] = ready.pid
        return ready  # type: ignore[no-any-return]

    def abandon(self, g: int, why: str) -> bool:
        # Whichever process the replacement left as group g's (the lost one, or its
        # replacement at any point of its start-up) is stopped and watched again, so
        # the next wait sees its sentinel and :meth:`replace` starts from the top
        # (each of its steps can be redone). A process started but not yet recorded
        # reads end-of-file on its pipe, whose end here is gone, and exits.
        self._stop(g, why)
        sentinel = self.processes[g].sentinel
        self._poller.register(sentinel, select.POLLIN)  # again, if it was unregistered
        self._owner[sentinel] = g
        return True

    # ================================================================ shutdown

    def shutdown(self, graceful: bool) -> None:
        """Stop every worker within ``close_timeout`` and unlink shared memory."""
        procs, conns = self.processes, self.conns
        self.processes, self.conns = [], []
        told = []
        for w, (proc, conn) in enumerate(zip(procs, conns, strict=True)):
            if proc.is_alive():
                try:
                    conn.send(Close(0))
                    told.append(w)
                except Exception:
                    pass
        if graceful and told and self._bell is not None and self.buffers is not None:
            # A worker spinning on its command word looks there, not at the pipe: flag
            # the message, with a seq above any command's, or it would notice only when
            # its spin budget ran out (a minute, for spin_seconds=60). Not from a
            # finalizer or a break (graceful=False): a manager collected in a reference
            # cycle may find its segment already unmapped by the segment's own
            # finalizer, and a store there would crash the process; its workers are
            # terminated after close_timeout instead.
            self._bell.announce(told, _CLOSE_SEQ, KIND_PIPE)
        deadline = monotonic() + self.close_timeout
        for proc in procs:
            proc.join(max(0.0, deadline - monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        wake = [self._wake_r, self._wake_w]
        self._wake_r = self._wake_w = None  # type: ignore[assignment]
        for pipe_end in [*conns, *wake]:
            if pipe_end is not None:
                try:
                    pipe_end.close()
                except OSError:
                    pass  # closed by its own finalizer first (a manager collected in a cycle)
        for proc in procs:
            try:
                proc.close()
            except ValueError:
                pass
        self._owner.clear()
        self._bell = None
        buffers, self.buffers = self.buffers, None
        if buffers is not None:
            buffers.close()
