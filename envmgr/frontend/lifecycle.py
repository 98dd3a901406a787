"""Opening and closing a manager: how :class:`ManagerLifecycle` starts and stops its groups.

The part of :class:`~envmgr.frontend.vector_env.BatchedVectorEnv` that owns its
backend from start-up to shutdown, and the registry of open managers that a fork
and the local managers' exit hook walk::

    manager's __init__ -> builds its backend -> _open(backend, options)
      backend.start()           every group's Ready (a node of its own in the timers)
      _adopt(readies)           spaces and metadata, which every group must agree on
      backend.attach(spaces)    the batch arrays
      Session.opened            the manager takes calls; _OPEN holds it
    close() / __exit__      -> _close: a pending call warned about, timings pulled (clean
                               exit only), Session.release (backend.shutdown), off _OPEN
    another thread inside   -> Session.close_under_call: its wait ends, then the arrays go
    os.fork() child         -> every manager in _OPEN disowned: its groups are the parent's
    __del__                 -> _shutdown(graceful=False): a safety net only
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any, TypeVar

from gymnasium import logger
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envmgr import timers
from envmgr.backends.base import Backend
from envmgr.errors import SpaceMismatchError, WorkerFailure
from envmgr.frontend.action_checks import ActionChecks
from envmgr.frontend.calls import Calls
from envmgr.frontend.first_ready import FirstReady
from envmgr.frontend.options import (
    DEFAULT_START_TIMEOUT,
    DEFAULT_TIMER_INTERVAL,
    FrontEndOptions,
    count,
    hosted_autoreset_mode,
    memory_size,
    ragged_options,
)
from envmgr.frontend.recycling import Recycler
from envmgr.frontend.restarts import RestartBudget
from envmgr.frontend.results import BatchReader
from envmgr.frontend.session import Session
from envmgr.frontend.state import CLOSED, IDLE, State
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.messages import Ready

__all__ = ["ManagerLifecycle", "open_managers"]

#: Every manager opened in this process and not closed (for the fork hook below, and
#: the local managers' exit hook).
_OPEN: weakref.WeakSet[ManagerLifecycle] = weakref.WeakSet()

_Manager = TypeVar("_Manager", bound="ManagerLifecycle")


def open_managers(kind: type[_Manager]) -> list[_Manager]:
    """The managers of class ``kind`` opened in this process and not closed."""
    return [m for m in list(_OPEN) if isinstance(m, kind)]


def _disown_after_fork() -> None:
    """Disown every inherited manager in a forked child: each is the parent's.

    Calls are then refused and nothing here may stop its workers or free its segment (an exit's
    ``close()`` would otherwise end the parent's workers).
    """
    for manager in list(_OPEN):
        manager._session.state = State.forked_copy(type(manager).__name__, manager._owner_pid)
        if manager._backend is not None:
            manager._backend.disown()


os.register_at_fork(after_in_child=_disown_after_fork)


class ManagerLifecycle(VectorEnv):  # type: ignore[type-arg]
    """A manager's start-up and shutdown; the base of ``BatchedVectorEnv``.

    A subclass builds its backend and calls :meth:`_open` with it; :meth:`close` (or
    leaving a ``with`` block) stops every group, whichever thread calls it.
    """

    #: What several groups are called in messages ("workers", "actors").
    group_noun = "workers"
    #: What one group is called in messages and timer names ("worker", "actor").
    group_noun_singular = "worker"
    _backend: Backend | None = None
    #: Set by :meth:`_open`; the manager is closed until its groups have all started.
    _session: Session
    #: Held by the thread inside a public call (see ``one_thread_at_a_time``).
    _turn: threading.RLock
    #: The public call the thread holding ``_turn`` entered last, for the refusal message.
    _busy_with = ""
    #: The process that opened the manager: only it may stop the groups.
    _owner_pid = -1

    # ================================================================ start-up

    def _open(
        self,
        backend: Backend,
        options: FrontEndOptions,
        *,
        autoreset_mode: str | AutoresetMode,
        step_timeout: float | None,
    ) -> None:
        """Start ``backend``'s groups and take their spaces; the caller shuts down on failure."""
        self._turn = threading.RLock()
        self._owner_pid = os.getpid()
        self._backend = backend
        layout = backend.layout
        self.num_envs = layout.num_envs
        self.copy = copy = options.get("copy", True)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.check_actions = check_actions = options.get("check_actions", "safe")
        self.max_restarts = options.get("max_restarts", 0)
        self.restart_window = options.get("restart_window")
        self._budget = RestartBudget(layout.n_groups, self.max_restarts, self.restart_window)
        self.step_timeout = step_timeout
        self.start_timeout = options.get("start_timeout", DEFAULT_START_TIMEOUT)
        self.max_worker_steps = count("max_worker_steps", options.get("max_worker_steps"))
        self.max_worker_memory = memory_size("max_worker_memory", options.get("max_worker_memory"))
        limits = (self.max_worker_steps, self.max_worker_memory)
        recycler = None if limits == (None, None) else Recycler(backend, *limits)
        self._session = session = Session(
            backend,
            owner=type(self).__name__,
            noun=self.group_noun_singular,
            nouns=self.group_noun,
            budget=self._budget,
            step_timeout=step_timeout,
            start_timeout=self.start_timeout,
            timer_interval=options.get("timer_interval", DEFAULT_TIMER_INTERVAL),
            shutdown=self._shutdown,
            recycler=recycler,
        )
        self.failures: list[WorkerFailure] = session.failures
        # Start-up is a node of its own, so it is not charged to the first reset or step.
        with timers.hierarchical_timer(f"start_{self.group_noun}") as started:
            readies = backend.start()
            self._adopt(readies, options)
            buffers = backend.attach(
                self.single_observation_space,
                self.single_action_space,
                ragged_options(options),
                options.get("info_bytes_per_env", ROW_BYTES),
            )
        session.merge_start(started, dict(enumerate(readies)))
        #: How Sequence/Graph parts of the observations come back (``"gymnasium"``/``"padded"``).
        self.ragged = options.get("ragged", "gymnasium")
        reader = BatchReader(
            buffers,
            layout,
            self.single_observation_space,
            copy,
            self._add_info,
            padded=self.ragged == "padded",
        )
        self._actions = ActionChecks(
            self.single_action_space, layout, self.group_noun_singular, check_actions
        )
        self._calls = Calls(session)
        self._first_ready = FirstReady(session, self._actions)
        session.opened(buffers, reader, self.autoreset_mode)
        _OPEN.add(self)

    def _adopt(self, readies: list[Ready], options: FrontEndOptions) -> None:
        """Take the spaces and metadata the groups reported; they must agree."""
        first = readies[0]
        for g, r in enumerate(readies[1:], 1):
            for kind in ("observation_space", "action_space"):
                if getattr(r, kind) != getattr(first, kind):
                    raise SpaceMismatchError(
                        f"{self._where(g)} has {kind} {getattr(r, kind)}, "
                        f"but {self.group_noun_singular} 0 (env 0) has {getattr(first, kind)}"
                    )
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(first.metadata)
        if options.get("vector_fn") is not None:
            self.autoreset_mode = hosted_autoreset_mode(first.metadata, options)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        self.spec = first.spec

    # ================================================================ state

    @property
    def closed(self) -> bool:  # type: ignore[override]  # Gymnasium's is a plain attribute
        """Whether the manager takes no more calls (closed by the user, or broken)."""
        session = getattr(self, "_session", None)
        return session is None or session.state.closed

    def _where(self, g: int) -> str:
        assert self._backend is not None
        return self._backend.where(g)

    # ================================================================ shutdown

    def close(self, **kwargs: Any) -> None:
        """Stop every group and free the batch arrays. Idempotent; safe after failures.

        Closing with a call pending warns as ``AsyncVectorEnv`` does; the call is dropped.
        """
        self._close(clean=True)

    def _close(self, clean: bool) -> None:
        """Stop everything.

        ``clean``: no exception is leaving a ``with`` block, so a pending call is warned about
        (an exception says more) and unshipped timings are pulled.
        """
        session: Session | None = getattr(self, "_session", None)
        if self._forked_copy():
            if session is not None and not session.state.closed:
                session.state = State.forked_copy(type(self).__name__, self._owner_pid)
            return
        turn: threading.RLock | None = getattr(self, "_turn", None)
        held = turn is not None and turn.acquire(False)
        if held:
            self._busy_with = "close"  # what another thread's refused call is told
        try:
            if session is None:
                return
            if turn is not None and not held:
                # close() is never refused. Another thread is inside a call: its groups
                # are stopped under it, so that its wait ends (in ClosedManagerError),
                # and the arrays it reads are freed only once it has left, or after
                # close_timeout if it does not.
                session.close_under_call()
                held = turn.acquire(timeout=self._close_timeout())
                return
            if not clean:
                return
            pending = session.state.call
            if pending is not None:
                # stacklevel: the warning points at the caller of close() or of __exit__.
                logger.warn(
                    f"Calling `close` while waiting for a pending call to "
                    f"`{pending.kind.value}` to complete.",
                    stacklevel=3,
                )
            elif session.state is IDLE:
                try:
                    # Bounded: timings are a courtesy at close, never a reason to hang.
                    session.flush_timers(self._close_timeout())
                except Exception:
                    pass
        finally:
            self._shutdown(graceful=True)
            _OPEN.discard(self)
            if session is not None:
                session.state = CLOSED
            if held:
                turn.release()  # type: ignore[union-attr]

    def _close_timeout(self) -> float:
        return float(getattr(self._backend, "close_timeout", 5.0))

    def close_extras(self, **kwargs: Any) -> None:
        """Part of gymnasium's ``VectorEnv.close`` protocol; :meth:`close` does the work."""
        self._shutdown(graceful=True)

    def _forked_copy(self) -> bool:
        """Whether this process is a fork of the one that opened the manager.

        Checked on the way out, where the fork hook may not have run: a fork made from C code.
        """
        return self._owner_pid not in (-1, os.getpid())

    def _shutdown(self, graceful: bool) -> None:
        if self._forked_copy():
            return
        session: Session | None = getattr(self, "_session", None)
        if session is not None:
            session.release(graceful)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # An exception leaving the block (Ctrl-C above all) may have cut a pipe read off
        # mid-message: ask the groups for nothing more (no timer flush), just stop them.
        self._close(clean=exc_type is None)

    def __del__(self) -> None:
        # Safety net only: the interpreter may be half torn down here.
        try:
            self._shutdown(graceful=False)
        except Exception:
            pass
