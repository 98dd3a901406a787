"""The worker processes: starting them, their start-up answers, why one stopped, stopping them.

:class:`WorkerPool` owns the processes of a :class:`~envmgr.backends.local.process.ProcessBackend`
and their pipes, the poll set that watches their sentinels (with the shared wake-up
pipe), and what is known about a lost one (:meth:`WorkerPool.lost`). Nothing here
runs per step.
"""

from __future__ import annotations

import multiprocessing.process
import os
import select
import signal
import socket
import struct
import sys
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from time import monotonic
from typing import Any

from envmgr.backends.base import LostGroup, remote_exception, unsendable
from envmgr.backends.local.wait import DEADLINE, UnrungSleeper, wait_until
from envmgr.backends.local.worker import worker_main
from envmgr.errors import RemoteTraceback, WorkerDiedError, WorkerTimeoutError
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Close, ErrorResponse, WorkerConfig

__all__ = [
    "WorkerPool",
    "LostWorker",
    "ctrl_c_held",
    "pickled",
    "main_module_hidden",
]


class LostWorker(Exception):
    """A worker lost before it answered a start-up phase (it died, or overran).

    Attributes:
        lost: What was lost and the error to raise for it.
    """

    def __init__(self, lost: LostGroup) -> None:
        super().__init__(lost.reason)
        self.lost = lost


def pickled(cmd: Any) -> memoryview:
    """``cmd`` pickled for a worker's pipe, before anything is written to it.

    Raises:
        ValueError: Something the caller passed does not pickle; nothing was sent, so
            the workers and the manager are as they were.
    """
    try:
        return ForkingPickler.dumps(cmd)  # type: ignore[no-any-return]
    except Exception as exc:
        raise unsendable(cmd, exc) from exc


#: Held while ``sys.modules["__main__"]`` is swapped for a worker's start.
_MAIN_SWAP = threading.Lock()


@contextmanager
def main_module_hidden() -> Iterator[None]:
    """Keep spawn/forkserver children from re-running the user's ``__main__``.

    Workers need nothing from ``__main__``: env factories travel by value with
    cloudpickle. Hiding it means scripts without an ``if __name__ == "__main__"``
    guard work under every start method. Under a lock: two threads starting workers at
    once (a manager each) would otherwise each save the other's stand-in as the real
    module, and the last to finish would leave an empty ``__main__`` behind.
    """
    with _MAIN_SWAP:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is not None:
                sys.modules["__main__"] = main


@contextmanager
def ctrl_c_held() -> Iterator[None]:
    """Hold Ctrl-C back for the block, then deliver it: for starting and recording a process.

    A KeyboardInterrupt landing after the fork but before the new process is recorded
    leaves a process nobody knows of. It exits once its pipe's end here is gone, but
    stays a zombie until this process exits, and a spawn or forkserver child whose
    start-up data never came dies printing an ``EOFError``. So SIGINT's handler only
    notes the signal until the block ends; the handler it replaced then runs. Python
    runs signal handlers in the main thread alone: elsewhere nothing is held back.
    """
    previous = signal.getsignal(signal.SIGINT)
    # None: a handler not set from Python, which cannot be put back, so it is left alone.
    if threading.current_thread() is not threading.main_thread() or previous is None:
        yield
        return
    held: list[Any] = []
    try:
        # Swapped inside the try: an exception landing right after the swap (another
        # signal's handler) still puts the old handler back.
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(frame))
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        if held:
            if callable(previous):
                previous(signal.SIGINT, held[0])
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signal.SIGINT)


#: A test seam, ``None`` in envmgr itself: called with the group's index in
#: :meth:`WorkerPool.spawn` once the new process's pipe exists, before its config and
#: its process are made. A test sets it to raise there (a Ctrl-C, or an exception),
#: in the window between reaping a lost worker and recording its replacement, which
#: no env code can reach. Module-level, so a test sets it for the managers it makes.
spawn_setup_hook: Callable[[int], None] | None = None

#: Commands up to this size are written in one blocking send: the socket of a worker's
#: duplex pipe takes far more (``SO_SNDBUF``, about 200 kB on Linux), and a worker
#: reads each command before it answers, so nothing of an earlier one is left there.
_ROOMY = 64 * 1024


class WorkerPool:
    """One process per group, each with a duplex pipe; the sentinels in one poll set.

    Args:
        layout: The groups.
        payloads: Each group's cloudpickled :class:`~envmgr.envside.group.GroupSpec`.
        ctx: The multiprocessing context.
        spin_seconds: How long workers spin for a command before sleeping.
    """

    def __init__(
        self, layout: Layout, payloads: list[bytes], ctx: Any, spin_seconds: float
    ) -> None:
        self.layout = layout
        self._payloads = payloads
        self._ctx = ctx
        self._fork = ctx.get_start_method() == "fork"
        self.spin_seconds = spin_seconds
        self.processes: list[Any] = []
        self.conns: list[Connection] = []
        # One wake-up pipe for the whole manager: the last worker to finish a
        # step writes a byte, so the parent sleeps through the whole batch.
        self.wake_r, self.wake_w = ctx.Pipe(duplex=False)
        os.set_blocking(self.wake_r.fileno(), False)
        self.poller = select.poll()
        self.poller.register(self.wake_r.fileno(), select.POLLIN)
        self.owner: dict[int, int] = {}  # sentinel fd -> group
        self._cut: dict[int, str] = {}  # group -> why it was stopped (see stop)
        self._late: set[int] = set()  # groups stopped for not taking a command in time

    def where(self, g: int) -> str:
        """Group ``g``'s name in messages (``"worker 1 (envs 2-3)"``)."""
        return self.layout.where("worker", g)

    # ================================================================ starting

    def spawn(self, g: int, layout: Any, ragged: Any = None, actions: Any = None) -> None:
        """Start worker ``g``'s process and record it as group ``g``'s.

        It takes the place of the one there, or becomes the next group; with ``layout`` it
        attaches to shared memory at once.

        Ctrl-C is held back from the fork until the process, its pipe and its sentinel
        are recorded (:func:`ctrl_c_held`), so an interrupt always finds them where
        :meth:`stop`, the waits and the shutdown look. Before the fork, an interrupt or
        an exception leaves group ``g``'s old process recorded (:meth:`forget` leaves
        it unclosed for that) and closes the new pipe. ``ragged``, ``actions``: the group's
        stores of a Sequence/Graph observation and action space, mapped with ``layout``.
        """
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        try:
            if spawn_setup_hook is not None:
                spawn_setup_hook(g)
            inherited = [parent_conn, self.wake_r, *(c for i, c in enumerate(self.conns) if i != g)]
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
                ragged=ragged,
                actions=actions,
            )
            proc = self._ctx.Process(
                target=worker_main,
                args=(child_conn, self.wake_w, config),
                name=f"envmgr-worker-{g}",
                daemon=True,
            )
        except BaseException:  # nothing started: the new pipe is nobody's
            parent_conn.close()
            child_conn.close()
            raise
        with ctrl_c_held():
            with main_module_hidden():
                proc.start()
            if g == len(self.processes):
                self.processes.append(proc)
                self.conns.append(parent_conn)
            else:
                self.processes[g], self.conns[g] = proc, parent_conn
            child_conn.close()
            self.watch(g, proc.sentinel)

    # ================================================================ sending

    def send(self, g: int, data: memoryview, timeout: float | None, deadline: float) -> None:
        """Send a pickled command (:func:`pickled`) to group ``g``.

        It waits at most until ``deadline`` (``monotonic()``, ``timeout`` after the command was
        posted to all its groups) for the command to be taken in.

        A command larger than the socket's buffer (a big ``set_attr`` value, say) is
        only written as the worker reads it, and a worker still busy with a step that
        an interrupt dropped does not read. Past ``timeout`` the worker is stopped (its
        pipe holds part of a message) and the wait that follows reports it timed out,
        as it would report a worker that took the command but did not answer.
        With ``timeout`` ``None`` there is no limit, and ``deadline`` is not looked at.

        Raises:
            OSError: The worker is gone (the wait that follows reports it).
        """
        conn = self.conns[g]
        if timeout is None or len(data) <= _ROOMY:
            conn.send_bytes(data)
            return
        # Connection's framing: a 4-byte length, or -1 and an 8-byte one past 2 GiB.
        n = len(data)
        header = struct.pack("!i", n) if n <= 0x7FFFFFFF else struct.pack("!iQ", -1, n)
        # A duplicate of the socket: MSG_DONTWAIT writes what fits now, and the
        # connection's own descriptor stays blocking for everything else.
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            for part in (header, data):
                view = memoryview(part)
                while view:
                    try:
                        view = view[sock.send(view, socket.MSG_DONTWAIT) :]
                        continue
                    except BlockingIOError:
                        pass
                    left = deadline - monotonic()
                    if left <= 0 or not select.select([], [sock], [], left)[1]:
                        why = f"it did not take in a {n:,}-byte command within {timeout} s"
                        self._late.add(g)
                        self.stop(g, f"{why}, so it was stopped")
                        return

    def watch(self, g: int, sentinel: int) -> None:
        """Poll ``sentinel`` as group ``g``'s (again, if it was unregistered)."""
        self.poller.register(sentinel, select.POLLIN)
        self.owner[sentinel] = g

    def forget(self, g: int) -> BaseProcess:
        """Kill group ``g``'s process if alive, stop watching it, close its pipe.

        Returns:
            The old process, reaped but not closed: it stays group ``g``'s until a
            replacement is recorded, so an interrupt before then (Ctrl-C while the
            replacement starts) finds a process :meth:`stop` and :meth:`watch` can use.
            The caller closes it once the replacement is in its place.
        """
        old = self.processes[g]
        if old.is_alive():
            old.kill()
        old.join(5.0)
        try:
            self.poller.unregister(old.sentinel)
        except (KeyError, ValueError):
            pass
        self.owner.pop(old.sentinel, None)
        self.conns[g].close()
        self._cut.pop(g, None)
        self._late.discard(g)
        return old

    def handshake(
        self, groups: Sequence[int] | range, phase: str, timeout: float | None
    ) -> list[Any]:
        """Read one pipe answer from each group before the doorbell exists (start-up).

        Raises:
            LostWorker: A group exited or overran ``timeout`` before answering.
        """
        deadline = None if timeout is None else monotonic() + timeout
        pending = sorted(set(groups))
        conns, processes = self.conns, self.processes

        def missing() -> list[int]:
            # Neither an answer nor an exit yet: all the wait may sleep on (an answer
            # already there or an exited process would end every sleep at once).
            return [g for g in pending if not conns[g].poll() and processes[g].exitcode is None]

        def block(seconds: float) -> None:
            waiting = missing()
            if not waiting:
                return
            watched = [conns[g] for g in waiting] + [processes[g].sentinel for g in waiting]
            select.select(watched, [], [], seconds)

        got = wait_until(
            lambda: not missing(),
            UnrungSleeper(block),
            deadline=deadline,
            first_sleep=0.05,
            longest_sleep=0.05,
        )
        if got is DEADLINE:
            late = missing()
            if late:
                why = f"it did not answer {phase} within {timeout} s"
                raise LostWorker(self.overran(late[0], why))
        answers: dict[int, Any] = {}
        for g in pending:
            try:
                answers[g] = conns[g].recv() if conns[g].poll() else None
            except (EOFError, OSError):
                answers[g] = None
        errors = [a for a in answers.values() if isinstance(a, ErrorResponse)]
        if errors:
            err = errors[0]
            g = err.worker_index
            exc = remote_exception(err, self.where(g), self.layout.range(g))
            raise exc from RemoteTraceback(err.traceback)
        for g, a in answers.items():
            if a is None:
                raise LostWorker(self.lost(g, self.exit_reason(g, phase)[0], False))
        return [answers[g] for g in pending]

    # ================================================================ losing

    def recv(self, g: int) -> Any:
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
            self.give_up_pipe(g, exc)
            raise

    def give_up_pipe(self, g: int, exc: BaseException) -> None:
        """Stop group ``g``, whose pipe ``exc`` may have cut mid-message (see :meth:`recv`)."""
        why = f"its pipe was cut mid-message by {type(exc).__name__} in this process"
        self.stop(g, f"{why}, so it was stopped")

    def stop(self, g: int, why: str) -> None:
        """Kill group ``g``'s process; the next wait reports it lost, saying ``why``."""
        self._cut[g] = why
        proc = self.processes[g]
        if proc.is_alive():
            proc.kill()

    def exit_reason(
        self, g: int, phase: str, seq: int | None = None
    ) -> tuple[str, ErrorResponse | None]:
        """Why worker ``g`` stopped answering; with the error it reported before exiting, if any."""
        if g in self._cut:
            return self._cut[g], None
        conn = self.conns[g]
        try:
            while conn.poll():
                msg = self.recv(g)
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

    def overran(self, g: int, why: str) -> LostGroup:
        """Mark group ``g`` lost for overrunning its time, killing it at once.

        This is what the README's fault table says. It may be hung, so a graceful close (a
        broken manager's survivors get ``close_timeout``) would only wait for it.
        """
        proc = self.processes[g]
        if proc.is_alive():
            proc.kill()
        return self.lost(g, why, True)

    def lost(self, g: int, reason: str, timed_out: bool) -> LostGroup:
        """Group ``g`` lost for ``reason``, with the error to raise if it is not replaced."""
        message = f"{self.where(g)}: {reason}"
        envs = self.layout.range(g)
        if timed_out or g in self._late:
            return LostGroup(reason, WorkerTimeoutError(message, g, envs))
        code = self.processes[g].exitcode if g < len(self.processes) else None
        return LostGroup(reason, WorkerDiedError(message, g, envs, code))

    # ================================================================ stopping

    def disown(self) -> None:
        """Forget the workers in a forked child: they are the parent's children, not this process's.

        They are taken off multiprocessing's list of children, which a plain ``os.fork()`` child
        inherits and whose exit handler would otherwise terminate every daemon on it (a child
        started by multiprocessing clears that list itself).
        """
        for proc in self.processes:
            multiprocessing.process._children.discard(proc)  # type: ignore[attr-defined]

    def shutdown(self, close_timeout: float, told: Callable[[list[int]], None]) -> None:
        """Tell every live worker to close, let ``told`` flag it, and stop them all.

        Args:
            close_timeout: Seconds to wait for the workers to exit before killing them.
            told: Called with the workers sent ``Close`` (flags it in their command words).
        """
        procs, conns = self.processes, self.conns
        self.processes, self.conns = [], []
        sent = []
        for w, (proc, conn) in enumerate(zip(procs, conns, strict=True)):
            if proc.is_alive():
                try:
                    conn.send(Close(0))
                    sent.append(w)
                except Exception:
                    pass
        if sent:
            told(sent)
        deadline = monotonic() + close_timeout
        for proc in procs:
            proc.join(max(0.0, deadline - monotonic()))
        # Then every straggler at once, each step bounded for all of them together: one
        # at a time, close() took a second per worker that ignored SIGTERM.
        for stop in (BaseProcess.terminate, BaseProcess.kill):
            left = [proc for proc in procs if proc.is_alive()]
            for proc in left:
                stop(proc)
            deadline = monotonic() + 1.0
            for proc in left:
                proc.join(max(0.0, deadline - monotonic()))
        wake = [self.wake_r, self.wake_w]
        self.wake_r = self.wake_w = None  # type: ignore[assignment]
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
        self.owner.clear()
