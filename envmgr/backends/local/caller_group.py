"""Caller envs (``caller_envs=K``): the calling process steps the batch's last K envs itself.

While the workers step, the parent would otherwise sleep. :class:`CallerBackend`
wraps the :class:`~envmgr.backends.local.process.ProcessBackend` and adds one more
group, the *caller group*: an ordinary :class:`~envmgr.envside.group.EnvGroup` built
in this process, writing its rows of the same batch arrays, served by the same
:func:`~envmgr.envside.serve.serve`. So autoreset, seeds, masks, calls and infos are the
workers' code, not a copy of it. One step::

    post_step: actions -> shared memory, workers woken; the caller's Step is kept
    wait:      serve(caller group, Step)      <- the parent steps its K envs here,
                                                 while the workers step theirs
               ProcessBackend.wait(workers)   <- then collects the workers

Commands are served inside :meth:`CallerBackend.wait`, not when posted: an
exception from a caller env then surfaces from ``step_wait``/``recv``/
``call_wait`` (after the workers' answers are collected, so no step is left in
flight), raised directly as the env's own exception with a note naming the env.
``recv`` counts the caller group as ready as soon as it is served.

The caller group is the last group and owns the last K envs, so worker ``w``
keeps the envs it would have without the option and env indices stay those of
``SyncVectorEnv``. It runs on its own timer stack (env code's timers nest under
its ``step`` node, as in a worker), shipped as ``worker_caller``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr import timers
from envmgr.backends.base import LostGroup, WaitResult, group_shares
from envmgr.backends.local.process import ProcessBackend
from envmgr.envside.build import build_group
from envmgr.envside.group import BuildFailed, EnvGroup, GroupSpec
from envmgr.envside.serve import serve, serve_step
from envmgr.errors import add_note
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Call, Command, Ready, Step
from envmgr.protocol.shared_memory import SharedBuffers

__all__ = ["CallerBackend", "CALLER_TIMER_NAME"]

#: The caller group's node under ``workers`` in the timer tree.
CALLER_TIMER_NAME = "worker_caller"


class CallerBackend:
    """The process backend plus one in-process group (see the module docstring).

    Args:
        inner: The workers' backend; its layout is the whole batch and its
            ``n_workers`` the groups before the caller's.
        spec: The caller group's spec (index ``inner.n_workers``, the last envs).
    """

    def __init__(self, inner: ProcessBackend, spec: GroupSpec) -> None:
        self.inner = inner
        self.layout: Layout = inner.layout
        self.caller = spec.index
        self._spec = spec
        # The group's timers (and env code timing itself through envmgr.timers) land in
        # this stack, as they would in a worker's, and building the group leaves the
        # user's tree alone: the group runs in it through timers.run_in_stack.
        self._stack = timers.TimerStack()
        self._workers = list(range(inner.n_workers))
        self._group: EnvGroup | None = None
        self._queued: Command | None = None

    @property
    def worker_pids(self) -> list[int]:
        """The worker processes' ids (the caller's group has none)."""
        return self.inner.worker_pids

    # ================================================================ names

    def where(self, g: int) -> str:
        """Return group ``g``'s name in messages; the caller's group is named by its envs."""
        if g != self.caller:
            return self.inner.where(g)
        r = self.layout.range(g)
        return f"caller (envs {r.start}-{r.stop - 1})"

    def timer_name(self, g: int) -> str:
        """Return the name of group ``g``'s node in the timer tree (the caller's has its own)."""
        return CALLER_TIMER_NAME if g == self.caller else self.inner.timer_name(g)

    # ================================================================ start-up

    def start(self) -> list[Ready]:
        """Build the caller's envs (their exception raised as is), then start the workers."""
        spec = self._spec
        try:
            self._group = timers.run_in_stack(self._stack, build_group, spec)
        except BuildFailed as failed:
            env = None if failed.env is None else spec.offset + failed.env
            add_note(failed.exc, self._where_env(env, "make"))
            raise failed.exc from None
        readies = self.inner.start()
        return [*readies, self._group.ready(os.getpid())]

    def attach(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ragged: Any = None,
        info_row_bytes: int = ROW_BYTES,
    ) -> SharedBuffers:
        """Make the workers' batch arrays and attach the caller's group to its rows of them.

        Its store of a Sequence/Graph space is private to this process: it grows in place and
        never spills.
        """
        buffers = self.inner.attach(observation_space, action_space, ragged, info_row_bytes)
        r = self.layout.range(self.caller)
        assert self._group is not None
        views = buffers.slice(r.start, r.stop)
        # Its store is this process's memory, read by the front end as it is: it grows
        # in place and never spills.
        buffers.add_ragged([len(r)], ragged, shared=False)
        if buffers.ragged is not None:
            views["observations"] = buffers.ragged[self.caller]
        self._group.attach(views)
        return buffers

    # ================================================================ commands

    def post(self, commands: Mapping[int, Command]) -> None:
        """Send the workers' commands; the caller's is kept, to be served in ``wait``."""
        workers = {g: c for g, c in commands.items() if g != self.caller}
        if workers:
            self.inner.post(workers)
        if self.caller in commands:
            self._queued = commands[self.caller]

    def post_step(
        self, groups: Sequence[int], seq: int, ship: bool, actions: Any, ids: np.ndarray | None
    ) -> None:
        """Place the actions and wake the worker groups; the caller's step is served in ``wait``."""
        caller = self.caller
        mine = caller in groups
        if len(groups) == self.layout.n_groups:
            workers: Sequence[int] = self._workers  # a batch step: every group
        else:
            workers = [g for g in groups if g != caller] if mine else groups
        buffers = self.inner.buffers
        assert buffers is not None
        share: Any = None  # actions already placed in shared memory, the caller's rows too
        if mine and buffers.actions is None:
            stores = buffers.action_stores
            if stores is not None:
                # Its store is this process's: written (and checked) before any worker wakes.
                stores.place(actions, [caller], ids)
                share = stores.stores[caller]
            else:
                space = buffers.layout.action_space
                share = group_shares(space, actions, self.layout, [caller], ids)[caller]
        self.inner.post_step(workers, seq, ship, actions, ids)
        if mine:
            self._queued = Step(seq, ship, share)

    def wait(
        self, seqs: Mapping[int, int], timeout: float | None, need: int | None, phase: str
    ) -> WaitResult:
        """Serve the caller's command (the workers step meanwhile), then collect the workers."""
        caller = self.caller
        workers = {g: s for g, s in seqs.items() if g != caller}
        if caller not in seqs or (need is not None and self._behind(seqs, workers, need)):
            return self.inner.wait(workers, timeout, need, phase)
        answer, raised = self._serve()
        rest = None if need is None else need - 1
        # A batch waits for its workers even when the caller's env raised, so no
        # step stays in flight; first-ready (``need``) takes only what it needs
        # and leaves the others in flight for the next recv.
        if workers and (rest is None or (rest > 0 and raised is None)):
            got = self.inner.wait(workers, timeout, rest, phase)
        else:
            got = WaitResult()
        got.answers[caller] = answer
        got.raised = raised
        return got

    def wait_step(self, seq: int, timeout: float | None) -> WaitResult | None:
        """:meth:`wait` for batch step ``seq``; ``None`` if nothing but the arrays was said."""
        answer, raised = self._serve()
        got = self.inner.wait_step(seq, timeout)  # collected even if the caller's env raised
        if got is None:
            if answer is None and raised is None:
                return None
            got = WaitResult(answers=dict.fromkeys(range(self.inner.n_workers)))
        got.answers[self.caller] = answer
        got.raised = raised
        return got

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """The caller group takes its turn in :meth:`wait`: no shortcut here."""
        return None

    def _behind(self, seqs: Mapping[int, int], workers: Mapping[int, int], need: int) -> bool:
        """First-ready: whether ``need`` finished workers were sent their step before the caller.

        ``recv`` returns the earliest-sent groups among those ready; the caller
        group is ready whenever the parent steps it, so it takes its turn by seq
        like a worker, or a loop that sends it back at once would starve the workers.
        """
        mine = (seqs[self.caller], self.caller)
        done = self.inner.finished(workers, {})
        return sum((workers[g], g) < mine for g in done) >= need

    def _serve(self) -> tuple[Any, BaseException | None]:
        """The caller group's answer to its queued command, or the exception an env raised."""
        cmd, self._queued = self._queued, None
        group = self._group
        assert group is not None
        if cmd is None:  # its answer was taken by a wait that raised: nothing is owed
            return None, None
        try:
            if type(cmd) is Step:  # the batch step: serve()'s dispatch, skipped
                step = (group, cmd.seq, cmd.ship_timers, cmd.actions)
                return timers.run_in_stack(self._stack, serve_step, *step), None
            return timers.run_in_stack(self._stack, serve, group, cmd), None
        except Exception as exc:
            env = group.current_env
            group.current_env = None
            phase = f"call({cmd.name!r})" if isinstance(cmd, Call) else type(cmd).__name__.lower()
            add_note(exc, self._where_env(None if env is None else group.offset + env, phase))
            return None, exc

    def _where_env(self, env: int | None, phase: str) -> str:
        at = "" if env is None else f", env {env}"
        return f"raised in envmgr {self.where(self.caller)}{at}, during {phase}"

    # ================================================================ failures, shutdown

    def replace(self, g: int, timeout: float | None) -> Ready | LostGroup:
        """Replace worker group ``g``: the caller's group has no process to lose."""
        return self.inner.replace(g, timeout)

    def abandon(self, g: int, why: str) -> bool:
        """Leave worker group ``g`` lost, as the workers' backend does."""
        return self.inner.abandon(g, why)

    def recyclable(self) -> list[int]:
        """The worker groups: the caller's group runs in this process, with nothing to recycle."""
        return self._workers

    def retire(self, g: int, seq: int) -> None:
        """Stop worker group ``g`` for a planned replacement."""
        self.inner.retire(g, seq)

    def resident_bytes(self, g: int) -> int | None:
        """Return worker group ``g``'s resident set size in bytes (``None`` for the caller's)."""
        return None if g == self.caller else self.inner.resident_bytes(g)

    def disown(self) -> None:
        """Forget the workers in a forked child, as the workers' backend does."""
        self.inner.disown()

    def shutdown(self, graceful: bool) -> None:
        """Close the caller's group (its envs, in its own timer stack), then stop the workers."""
        group, self._group = self._group, None
        self._queued = None
        try:
            if group is not None:
                group.attach({})
                timers.run_in_stack(self._stack, group.close)
        finally:
            self.inner.shutdown(graceful)
