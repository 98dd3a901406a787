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

The parts live in their own modules: the processes and their pipes in
:mod:`~envmgr.backends.local.pool`, the waits for answers in
:mod:`~envmgr.backends.local.collect`; this class puts them together over the
shared memory and places the actions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from multiprocessing import resource_tracker
from time import monotonic
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.backends.base import LostGroup, WaitResult, group_shares
from envmgr.backends.local.collect import Collector
from envmgr.backends.local.doorbell import KIND_PIPE, KIND_STEP, SHIP_TIMERS, ParentDoorbell
from envmgr.backends.local.pool import LostWorker, WorkerPool, ctrl_c_held, pickled
from envmgr.backends.local.wait import READY
from envmgr.backends.memory import resident_bytes
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Attach, Close, Command, Ready, Step
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.protocol.trees import copy_tree, scatter_tree

__all__ = ["ProcessBackend"]

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
        send_timeout: Seconds :meth:`post` waits for a worker to take in a command
            larger than its pipe holds (the manager's ``step_timeout``; ``None``: no
            limit). See :meth:`WorkerPool.send`.
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
        send_timeout: float | None = None,
        n_workers: int | None = None,
    ) -> None:
        self.layout = layout
        self.n_workers = layout.n_groups if n_workers is None else n_workers
        self.parent_spin_seconds = parent_spin_seconds
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.send_timeout = send_timeout
        self.pool = WorkerPool(layout, payloads, ctx, spin_seconds)
        self.buffers: SharedBuffers | None = None
        self.worker_pids: list[int] = []
        self._bell: ParentDoorbell | None = None
        self._collector: Collector | None = None

    # ================================================================ names

    def where(self, g: int) -> str:
        """Return group ``g``'s name in messages (``"worker 1 (envs 2-3)"``)."""
        return self.pool.where(g)

    def timer_name(self, g: int) -> str:
        """Return the name of group ``g``'s node in the timer tree: ``worker_<g>``."""
        return f"worker_{g}"

    # ================================================================ start-up

    def start(self) -> list[Ready]:
        """Start every worker process and return their start-up answers."""
        # Start the resource tracker before any worker exists, so every worker
        # shares it and it unlinks our segment if this process is killed.
        with ctrl_c_held():  # an interrupt right after its fork would leave a zombie
            resource_tracker.ensure_running()
        pool = self.pool
        for g in range(self.n_workers):
            pool.spawn(g, None)
        readies = self._handshake(range(self.n_workers), "start")
        self.worker_pids = [r.pid for r in readies]
        return readies

    def attach(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ragged: Any = None,
        info_row_bytes: int = ROW_BYTES,
    ) -> SharedBuffers:
        """Make the batch arrays in shared memory and attach every worker to them."""
        n, pool = self.n_workers, self.pool
        self.buffers = buffers = SharedBuffers.create(
            observation_space, action_space, self.layout.num_envs, n, info_row_bytes
        )
        buffers.add_ragged(self.layout.sizes[:n], ragged, shared=True)
        for g, conn in enumerate(pool.conns):
            conn.send(Attach(-1, buffers.layout, buffers.ragged_layout(g), self._actions_layout(g)))
        self._handshake(range(n), "attach")
        self._bell = ParentDoorbell(buffers.control, pool.conns, pool.wake_r.fileno(), pool.poller)
        self._collector = Collector(pool, self._bell, n, self.parent_spin_seconds)
        # The usual action batch is one array: placed without walking a tree.
        self._plain_actions = buffers.actions if type(buffers.actions) is np.ndarray else None
        self._group_actions = [
            buffers.slice(r.start, r.stop)["actions"] for r in map(self.layout.range, range(n))
        ]
        return buffers

    def _handshake(self, groups: Sequence[int] | range, phase: str) -> list[Any]:
        """Each group's start-up answer; a group lost on the way raises its failure."""
        try:
            return self.pool.handshake(groups, phase, self.start_timeout)
        except LostWorker as exc:
            raise exc.lost.failure from None

    # ================================================================ commands

    def post(self, commands: Mapping[int, Command]) -> None:
        """Send a pickled command to each group, then flag it in its command word."""
        seq = None
        pool, timeout = self.pool, self.send_timeout
        # All pickled first: an argument that does not pickle is the caller's error, and
        # no worker may have been sent its command (or half of it) when it is raised.
        payloads = {g: pickled(cmd) for g, cmd in commands.items()}
        deadline = monotonic() + (timeout or 0.0)
        for g, cmd in commands.items():
            seq = cmd.seq
            try:
                pool.send(g, payloads[g], timeout, deadline)
            except (BrokenPipeError, ConnectionResetError, OSError):
                # The worker is dead. The wait that follows sees its sentinel and
                # reports it; failing here would bypass the restart policy.
                pass
            except BaseException as exc:  # Ctrl-C: the message may be half written
                pool.give_up_pipe(g, exc)
                raise
        if seq is not None and self._bell is not None:
            # A worker spinning on its command word looks there, not at the pipe.
            self._bell.post_command(list(commands), seq, KIND_PIPE)

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
            bell.post_command(groups, seq, KIND_STEP | (SHIP_TIMERS if ship else 0))
            return
        stores = buffers.action_stores
        if stores is not None:
            # Every group's rows written before any group is woken: a bad action raises here.
            stores.place(actions, groups, ids)
            unmapped = stores.unmapped(groups)
            if unmapped:  # a re-laid store: the step's message says which to map
                self.post({g: Step(seq, ship, None, stores.layout(g)) for g in unmapped})
                groups = [g for g in groups if g not in unmapped]
            if groups:
                bell.post_command(groups, seq, KIND_STEP | (SHIP_TIMERS if ship else 0))
            return
        space = buffers.layout.action_space
        shares = group_shares(space, actions, self.layout, groups, ids)
        self.post({g: Step(seq, ship, shares[g]) for g in groups})

    def _actions_layout(self, g: int) -> Any:
        """The layout of group ``g``'s store of a Sequence/Graph action space, if it has one."""
        assert self.buffers is not None
        stores = self.buffers.action_stores
        return None if stores is None else stores.layout(g)

    # ================================================================ waiting

    def wait(
        self, seqs: Mapping[int, int], timeout: float | None, need: int | None, phase: str
    ) -> WaitResult:
        """Sleep until the groups answered ``seqs`` (or ``need`` of them did), died or overran."""
        assert self._collector is not None
        return self._collector.wait(seqs, timeout, need, phase)

    def wait_step(self, seq: int, timeout: float | None) -> WaitResult | None:
        """:meth:`wait` for batch step ``seq`` of every worker; ``None`` if all is in the arrays.

        The hot path, here rather than in the collector to save a call per step: one
        word read when the batch is done, one sleep otherwise, nothing built. What else
        woke the wait (a dead worker's sentinel) is where the collector starts.
        """
        bell = self._bell
        assert bell is not None
        if timeout is None:
            woke = bell.wait_all(seq, self.parent_spin_seconds)
            if woke is READY and not bell.batch_has_message(seq):
                return None
        else:
            woke = None
        collector = self._collector
        assert collector is not None
        seqs = dict.fromkeys(range(self.n_workers), seq)
        return collector.wait(seqs, timeout, None, "step", woke)

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """First-ready's usual case (:meth:`Collector.ready`)."""
        assert self._collector is not None
        return self._collector.ready(seqs, need)

    def finished(self, seqs: Mapping[int, int], lost: Mapping[int, LostGroup]) -> list[int]:
        """The groups of ``seqs`` whose step is done, except those in ``lost``."""
        assert self._collector is not None
        return self._collector.finished(seqs, lost)

    # ================================================================ replacing

    def replace(self, g: int, timeout: float | None) -> Ready | LostGroup:
        """A new process for group ``g``, attached to shared memory: its Ready, or its loss."""
        pool = self.pool
        old = pool.forget(g)
        assert self.buffers is not None and self._collector is not None
        self._collector.forget_woken()
        # Its command word may hold the step it never finished: the new process
        # reads the word as already seen, so it will not run it.
        # The new process maps the newest stores: a re-laid one the lost worker never
        # moved to is taken up once the new one says it maps it.
        buffers = self.buffers
        pool.spawn(g, buffers.layout, buffers.ragged_layout(g), self._actions_layout(g))
        old.close()
        try:
            (ready,) = pool.handshake([g], "restart", self.start_timeout)
        except LostWorker as exc:
            return exc.lost
        self.worker_pids[g] = ready.pid
        return ready  # type: ignore[no-any-return]

    def recyclable(self) -> range:
        """The groups that may be recycled: every worker."""
        return range(self.n_workers)

    def retire(self, g: int, seq: int) -> None:
        """Tell worker ``g`` to close its envs and exit, and give it ``close_timeout``."""
        self.post({g: Close(seq)})
        self.pool.processes[g].join(self.close_timeout)

    def resident_bytes(self, g: int) -> int | None:
        """Worker ``g``'s resident set size, read from ``/proc/<pid>/statm``."""
        return resident_bytes(self.worker_pids[g])

    def abandon(self, g: int, why: str) -> bool:
        """Leave group ``g`` lost, to be replaced from the top at the next call."""
        # Whichever process the replacement left as group g's (the lost one, or its
        # replacement at any point of its start-up) is stopped and watched again, so
        # the next wait sees its sentinel and :meth:`replace` starts from the top
        # (each of its steps can be redone). Ctrl-C is held back between a process's
        # start and its record (:meth:`WorkerPool.spawn`).
        self.pool.stop(g, why)
        self.pool.watch(g, self.pool.processes[g].sentinel)
        return True

    # ================================================================ shutdown

    def disown(self) -> None:
        """Forget the workers in a forked child: they are the parent's."""
        self.pool.disown()

    def shutdown(self, graceful: bool) -> None:
        """Stop every worker within ``close_timeout`` and unlink shared memory."""
        bell = self._bell if graceful and self.buffers is not None else None

        def flag_close(told: list[int]) -> None:
            # A worker spinning on its command word looks there, not at the pipe: flag
            # the message, with a seq above any command's, or it would notice only when
            # its spin budget ran out (a minute, for spin_seconds=60). Not from a
            # finalizer or a break (graceful=False): a manager collected in a reference
            # cycle may find its segment already unmapped by the segment's own
            # finalizer, and a store there would crash the process; its workers are
            # terminated after close_timeout instead.
            if bell is not None:
                bell.post_command(told, _CLOSE_SEQ, KIND_PIPE)

        self.pool.shutdown(self.close_timeout, flag_close)
        self._bell = self._collector = None
        # Views into the segment: kept, they would keep it mapped (and its fd open) for as
        # long as the manager object lives.
        self._plain_actions = None
        self._group_actions = []
        buffers, self.buffers = self.buffers, None
        if buffers is not None:
            buffers.close()
