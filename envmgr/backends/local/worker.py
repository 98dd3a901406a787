"""The worker process: a thin loop around one :class:`~envmgr.envside.group.EnvGroup`.

:func:`worker_main` is a plain module-level function so every start method
(fork, forkserver, spawn) can run it. It builds its group, then per command::

    doorbell word (a step) or pipe message (anything else)
        -> envgroup.serve(group, cmd)       envs stepped, results in shared memory
        -> DONE word (+ a pipe message when there are infos, timers or an error)

A worker wakes once per batch command, not once per env; nothing but the small
answer crosses the pipe, and only when there is something to say.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
from multiprocessing.connection import Connection
from multiprocessing.reduction import ForkingPickler
from time import perf_counter
from typing import Any

import cloudpickle

from envmgr.backends.local.doorbell import SHIP_TIMERS
from envmgr.backends.local.wait import READY, UnrungSleeper, wait_until
from envmgr.backends.local.worker_doorbell import WorkerDoorbell
from envmgr.envside.build import build_group
from envmgr.envside.group import BuildFailed, EnvGroup, GroupSpec
from envmgr.envside.serve import (
    build_error,
    command_error,
    serve,
    serve_step,
    spec_error,
    unsendable_answer,
)
from envmgr.protocol.messages import Ack, Attach, AttachRagged, Close, Command, Step, WorkerConfig
from envmgr.protocol.ragged import RaggedStore
from envmgr.protocol.ragged_layout import RaggedLayout
from envmgr.protocol.shared_memory import SharedBuffers

__all__ = ["worker_main"]

#: While blocked, how often a worker checks that its manager still exists.
LIVENESS_INTERVAL = 0.25
#: How often the watchdog thread checks the same while the worker is busy.
WATCHDOG_INTERVAL = 0.5


def _attach_layout(
    group: EnvGroup,
    config: WorkerConfig,
    conn: Connection,
    wake: Connection,
    layout: Any,
    ragged: RaggedLayout | None,
    actions: RaggedLayout | None,
    mapped: list[Any],
) -> WorkerDoorbell:
    """Map the manager's segment, point the group at its rows, and make the doorbell."""
    buffers = SharedBuffers.attach(layout)
    mapped.append(buffers)
    group.attach(buffers.slice(group.offset, group.offset + group.n))
    if ragged is not None:
        _attach_ragged(group, ragged, mapped)
    if actions is not None:
        _attach_actions(group, actions, mapped)
    parent_pid = os.getppid()
    manager_pid = config.manager_pid
    return WorkerDoorbell(
        buffers.control,
        config.worker_index,
        conn,
        wake.fileno(),
        config.spin_seconds,
        lambda: not _manager_gone(manager_pid, parent_pid),
        LIVENESS_INTERVAL,
    )


def _attach_ragged(group: EnvGroup, layout: RaggedLayout, mapped: list[Any]) -> None:
    """Map the group's (re-laid) store and write into it from now on; unmap the old one."""
    old = group.ragged
    store = RaggedStore.attach(layout)
    mapped.append(store)
    group.attach_ragged(store)
    if old is not None:
        mapped.remove(old)
        old.close()


def _attach_actions(group: EnvGroup, layout: RaggedLayout, mapped: list[Any]) -> None:
    """Read actions from the group's (re-laid) action store from now on; unmap the old one."""
    old = group.views.get("actions")
    store = RaggedStore.attach(layout)
    mapped.append(store)
    group.views["actions"] = store
    if isinstance(old, RaggedStore):
        mapped.remove(old)
        old.close()


def _receive(conn: Connection, spin_seconds: float, parent_pid: int) -> Command | None:
    """Wait for the next command before the doorbell exists: spin briefly, then block.

    Returns ``None`` when the manager is gone (pipe closed or parent changed).
    """

    def block(seconds: float) -> bool | None:
        if conn.poll(seconds) or os.getppid() == parent_pid:
            return None
        return True  # the parent changed: the manager is gone

    got = wait_until(
        conn.poll,
        UnrungSleeper(block),
        spin_seconds=spin_seconds,
        first_sleep=LIVENESS_INTERVAL,
        longest_sleep=LIVENESS_INTERVAL,
    )
    if got is not READY:
        return None
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        return None


def _send(conn: Connection, config: WorkerConfig, message: Any, phase: str) -> bool:
    """Send ``message``; if it cannot be pickled, send the reason instead."""
    return _write(conn, _pickled(config, message, phase))


def _pickled(config: WorkerConfig, message: Any, phase: str) -> memoryview:
    """``message`` as ``Connection.send`` pickles it; the reason, if it cannot be pickled."""
    try:
        return ForkingPickler.dumps(message)  # type: ignore[no-any-return]
    except Exception as exc:  # unpicklable info, observation, or call result
        err = unsendable_answer(config.worker_index, message, phase, exc)
        return ForkingPickler.dumps(err)  # type: ignore[no-any-return]


def _write(conn: Connection, data: memoryview) -> bool:
    """Write one message; ``False`` if the parent's end is gone."""
    try:
        conn.send_bytes(data)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False


#: Answers up to this size are written before their DONE word: a pipe holds them
#: whole (64 kB on Linux, 16 kB at first on macOS), so the parent, woken by DONE,
#: finds the answer there. Larger ones are written after it, while the parent reads.
INLINE_ANSWER_BYTES = 16 * 1024 - 64


def worker_main(conn: Connection, wake: Connection, config: WorkerConfig) -> None:
    """Run one worker until told to close or until its manager is gone.

    Args:
        conn: The worker's end of its duplex pipe to the manager.
        wake: Write end of the manager's shared wake-up pipe.
        config: Start-up settings and the cloudpickled group spec.
    """
    began = perf_counter()  # the start-up tree's clock (shipped in Ready) runs from here
    # Ctrl-C goes to the whole process group; the manager alone handles it and
    # closes workers in order, so a worker must not die half-way through a step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in config.fds_to_close:
        try:
            os.close(fd)
        except OSError:
            pass
    parent_pid = os.getppid()
    if config.death_signal:
        _set_death_signal()
    _start_watchdog(config.manager_pid, parent_pid)
    try:
        spec: GroupSpec = cloudpickle.loads(config.group)
    except Exception as exc:  # a factory from a module this process cannot import
        _send(conn, config, spec_error(config.worker_index, exc), "make")
        return
    try:
        group = build_group(spec, began)
    except BuildFailed as failed:
        _send(conn, config, build_error(spec, failed), "make")
        return
    mapped: list[Any] = []  # segments closed on the way out, however the loop ends
    try:
        bell = None
        if config.layout is not None:
            bell = _attach_layout(
                group, config, conn, wake, config.layout, config.ragged, config.actions, mapped
            )
        if _send(conn, config, group.ready(os.getpid()), "start"):
            _serve_forever(group, conn, wake, config, parent_pid, bell, mapped)
    finally:
        group.attach({})
        for buffers in mapped:
            buffers.close()
        group.close()


def _serve_forever(
    group: EnvGroup,
    conn: Connection,
    wake: Connection,
    config: WorkerConfig,
    parent_pid: int,
    bell: WorkerDoorbell | None,
    mapped: list[Any],
) -> None:
    """The command loop: wait, serve, answer (in the DONE word, and the pipe if needed)."""
    timers = group.timers
    while True:
        t0 = perf_counter()
        got: Any = _receive(conn, config.spin_seconds, parent_pid) if bell is None else bell.wait()
        timers.wait.add_time(perf_counter() - t0)
        if got is None:
            return
        cmd: Command | None = None
        if isinstance(got, tuple):  # a step announced in shared memory: the hot path
            seq = got[0]
        else:
            cmd = pickle.loads(got) if isinstance(got, bytes) else got
            seq = cmd.seq
            if bell is not None:
                bell.saw(seq)
            if isinstance(cmd, Close):
                _send(conn, config, Ack(config.worker_index, seq), "close")
                return
            if isinstance(cmd, Attach):
                bell = _attach_layout(
                    group, config, conn, wake, cmd.layout, cmd.ragged, cmd.actions, mapped
                )
                _send(conn, config, Ack(config.worker_index, seq), "attach")
                # The wait for Attach is the manager's start-up (it waits for every
                # worker to be ready), timed in the parent's start node: not the
                # first command's.
                group.timers.restart()
                continue
        try:
            if cmd is None:
                answer: Any = serve_step(group, seq, bool(got[1] & SHIP_TIMERS), None)
            elif isinstance(cmd, AttachRagged):
                _attach_ragged(group, cmd.layout, mapped)
                answer = Ack(config.worker_index, seq)
            else:
                if isinstance(cmd, Step) and cmd.actions_layout is not None:
                    _attach_actions(group, cmd.actions_layout, mapped)
                answer = serve(group, cmd)
        except BaseException as exc:
            answer = command_error(group, Step(seq) if cmd is None else cmd, exc)
        t2 = perf_counter()
        # A step or reset whose whole result is in shared memory (no answer) is
        # answered by its DONE word alone; the pipe carries a message only when
        # there is something to say.
        ok = True
        if answer is None:
            if bell is not None:
                bell.step_done(seq, False)
        else:
            data = _pickled(config, answer, "step" if cmd is None else type(cmd).__name__.lower())
            if bell is None:
                ok = _write(conn, data)
            elif len(data) <= INLINE_ANSWER_BYTES:
                ok = _write(conn, data)
                bell.sent(seq)
                bell.step_done(seq, True)
            else:
                # Larger than a pipe holds: written only as the parent reads it, and
                # the parent reads once DONE says there is an answer.
                bell.step_done(seq, True)
                ok = _write(conn, data)
                bell.sent(seq)
        timers.send.add_time(perf_counter() - t2)
        if not ok:
            return


def _manager_gone(manager_pid: int, parent_pid: int) -> bool:
    """Whether the manager process has exited (a zombie counts as exited)."""
    if os.getppid() != parent_pid:
        return True
    try:
        os.kill(manager_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{manager_pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def _start_watchdog(manager_pid: int, parent_pid: int) -> None:
    """Exit this worker soon after the manager dies, even if an env is stuck in Python code.

    The pipe's end-of-file covers a worker waiting for a command; this thread
    covers one busy in a long step. Under fork and spawn the kernel's parent
    death signal (:func:`_set_death_signal`) also covers code that holds the GIL.
    """

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_INTERVAL)
            if _manager_gone(manager_pid, parent_pid):
                os._exit(0)

    threading.Thread(target=watch, name="envmgr-watchdog", daemon=True).start()


def _set_death_signal() -> None:
    """Have Linux SIGKILL this process when the process (thread) that created it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
