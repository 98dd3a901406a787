"""The front end both managers share: the whole public API, written once over a backend.

:class:`BatchedVectorEnv` is the ``gymnasium.vector.VectorEnv`` users hold. It is
made of parts that share one :class:`~envmgr.frontend.session.Session` (the one
state, sequence numbers, waits, restarts, timers): :class:`~envmgr.frontend.calls.Calls`
for per-env calls and :class:`~envmgr.frontend.first_ready.FirstReady` for
``send``/``recv``; reset, step and close are here. A backend
(:mod:`envmgr.backends.base`) only moves commands and answers. One step::

    step(actions)
      step_async: ActionChecks.check_batch -> backend.post_step(all groups, seq)
                    local: actions copied into shared memory, command words set
                    Ray:   each actor's rows sent with its step call
      step_wait:  backend.wait_step(seq)
                    None (the usual step) -> obs, rewards, flags copied from the arrays
                    else answers / lost / errors -> Session.resolve_answers:
                      lost group -> Session.recover: budget, backend.replace, reset it
                      timers merged; obs, rewards, flags read from the batch arrays
                      infos = the groups' infos + restart notes
                  -> (obs, r, term, trunc, infos)

Broken is not closed: after a failure that is not recovered, every later call
raises :class:`~envmgr.errors.BrokenManagerError` caused by that failure;
:class:`~envmgr.errors.ClosedManagerError` is for a manager the user closed.
"""

from __future__ import annotations

import functools
import os
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np
from gymnasium import logger
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envmgr import timers
from envmgr.backends.base import Backend
from envmgr.errors import BusyManagerError, SpaceMismatchError, WorkerFailure
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
from envmgr.frontend.recycling import RECYCLED_INFO_KEY, Recycler
from envmgr.frontend.restarts import RestartBudget
from envmgr.frontend.results import RESTARTED_INFO_KEY, BatchReader
from envmgr.frontend.session import Batch, Session
from envmgr.frontend.state import CLOSED, IDLE, CallKind, PendingCall, State
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.messages import Ready

__all__ = [
    "BatchedVectorEnv",
    "FrontEndOptions",
    "RECYCLED_INFO_KEY",
    "RESTARTED_INFO_KEY",
    "open_managers",
]

_Method = TypeVar("_Method", bound=Callable[..., Any])


def one_thread_at_a_time(method: _Method) -> _Method:
    """Refuse ``method`` while another thread is inside a call to the same manager.

    The refusal is a :class:`~envmgr.errors.BusyManagerError`.

    Without it two threads stepping one manager each pass the idle check and read the
    other's batch, with no error. The lock is reentrant, so ``reset`` may call
    ``reset_async``.
    """
    name = method.__name__

    @functools.wraps(method)
    def guarded(self: BatchedVectorEnv, *args: Any, **kwargs: Any) -> Any:
        turn = self._turn
        if not turn.acquire(False):
            raise BusyManagerError.on(type(self).__name__, name, self._busy_with)
        try:
            self._busy_with = name
            return method(self, *args, **kwargs)
        finally:
            turn.release()

    return guarded  # type: ignore[return-value]


#: Every manager opened in this process and not closed (for the fork hook below, and
#: the local managers' exit hook).
_OPEN: weakref.WeakSet[BatchedVectorEnv] = weakref.WeakSet()

_Manager = TypeVar("_Manager", bound="BatchedVectorEnv")


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


class BatchedVectorEnv(VectorEnv):  # type: ignore[type-arg]
    """A ``VectorEnv`` over groups of envs run by a backend; the managers subclass it.

    A subclass builds its backend and calls :meth:`_open` with it.
    """

    #: What several groups are called in messages ("workers", "actors").
    group_noun = "workers"
    #: What one group is called in messages and timer names ("worker", "actor").
    group_noun_singular = "worker"
    _backend: Backend | None = None
    #: Set by :meth:`_open`; the manager is closed until its groups have all started.
    _session: Session
    #: Held by the thread inside a public call (see :func:`one_thread_at_a_time`).
    _turn: threading.RLock
    #: The public call the thread holding ``_turn`` entered last, for the refusal message.
    _busy_with = ""
    #: The process that opened the manager: only it may stop the groups.
    _owner_pid = -1

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

    @property
    def recycles(self) -> list[int]:
        """Planned replacements so far per group (a copy), as ``restarts`` counts failures.

        A planned replacement is one for ``max_worker_steps`` or ``max_worker_memory``.
        """
        recycler = self._session.recycler
        return [0] * self._session.layout.n_groups if recycler is None else list(recycler.recycles)

    def _groups_in_flight(self) -> list[int]:
        """The groups with a ``send()`` step or an ``async_reset`` not yet received."""
        session = getattr(self, "_session", None)
        return [] if session is None else sorted(session.state.in_flight)

    # ================================================================ reset / step

    @one_thread_at_a_time
    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``).

        Args:
            seed: ``None`` (random), an int ``s`` (env ``i`` gets ``s + i``), or one
                seed per env.
            options: Passed to every ``env.reset``; a ``"reset_mask"`` entry (bool
                array of shape ``(num_envs,)``) resets only those envs.

        Returns:
            The batched observations and the vector info dict.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    @one_thread_at_a_time
    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to the groups without waiting (see :meth:`reset`)."""
        session = self._session
        session.require_idle("reset_async")
        session.begin(session.post_reset(seed, options))

    @one_thread_at_a_time
    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset sent by :meth:`reset_async` (``timeout``: ``step_timeout``)."""
        session = self._session
        timeout = session.timeout(timeout)  # a bad one is refused with the reset still pending
        call = session.take(CallKind.RESET)
        with timers.hierarchical_timer("workers", session.worker_timers.stack):
            answers, replaced = session.wait(call.seqs, timeout, call.kind, resets=call.commands)
        obs, _, _, _, infos = session.batch_from_answers(answers, replaced, call.ship, None)
        return obs, infos

    @one_thread_at_a_time
    def step(self, actions: Any) -> Batch:
        """Step every env with its action; see ``gymnasium.vector.VectorEnv.step``."""
        # step_async + step_wait with no pending call in between: this is the hot
        # path, and nothing can run between the two halves here.
        session = self._session
        if session.state is not IDLE:
            session.require_idle("step")  # raises
        self._actions.check_batch(actions)
        seq, ship = session.start_step(actions)
        return session.finish_step(seq, ship, self.step_timeout)

    @one_thread_at_a_time
    def step_async(self, actions: Any) -> None:
        """Check the actions, hand them to the groups and wake them, without waiting."""
        session = self._session
        session.require_idle("step_async")
        self._actions.check_batch(actions)
        seq, ship = session.start_step(actions)
        session.begin(PendingCall(CallKind.STEP, dict.fromkeys(session.groups, seq), ship))

    @one_thread_at_a_time
    def step_wait(self, timeout: float | None = None) -> Batch:
        """Wait for the step sent by :meth:`step_async` (``timeout``: default ``step_timeout``)."""
        session = self._session
        timeout = session.timeout(timeout)  # a bad one is refused with the step still pending
        call = session.take(CallKind.STEP)
        return session.finish_step(call.seqs[0], call.ship, timeout)

    # ================================================================ per-env calls

    @one_thread_at_a_time
    def call_async(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> None:
        """Send :meth:`call` to the groups without waiting (as ``AsyncVectorEnv``)."""
        self._calls.call_async(name, *args, env_ids=env_ids, **kwargs)

    @one_thread_at_a_time
    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call sent by :meth:`call_async`; one result per env."""
        return self._calls.call_wait(timeout)

    @one_thread_at_a_time
    def call(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of each env (of ``env_ids``).

        Only the groups owning the chosen envs are contacted. Returns one result per
        env, in ``env_ids`` order.
        """
        return self._calls.call(name, *args, env_ids=env_ids, **kwargs)

    @one_thread_at_a_time
    def get_attr(self, name: str, env_ids: Sequence[int] | None = None) -> tuple[Any, ...]:
        """Return attribute ``name`` of each env (of ``env_ids``), found through the wrappers.

        A method is called with no arguments and its result given, as Gymnasium's
        ``AsyncVectorEnv.get_attr`` does.
        """
        return self.call(name, env_ids=env_ids)

    @property
    def np_random_seed(self) -> tuple[int, ...]:  # type: ignore[override]
        """Each env's ``np_random_seed``, as ``SyncVectorEnv``/``AsyncVectorEnv`` give it.

        The base ``VectorEnv``'s own generator is seeded by nothing here.
        """
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]  # read-only, as in SyncVectorEnv
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """Copies of each env's ``np_random`` generator, as ``AsyncVectorEnv`` gives them."""
        return self.get_attr("np_random")

    @one_thread_at_a_time
    def render(self) -> tuple[Any, ...]:
        """Each env's ``render()`` result."""
        return self.call("render")

    @one_thread_at_a_time
    def apply(
        self,
        fn: Callable[..., Any],
        *args: Any,
        env_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run ``fn(env, *args, **kwargs)`` in the workers, for each env (of ``env_ids``).

        ``fn`` travels with cloudpickle. Returns one result per env, in ``env_ids`` order.
        """
        return self._calls.apply(fn, *args, env_ids=env_ids, **kwargs)

    @one_thread_at_a_time
    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` of each env (of ``env_ids``).

        ``values`` is one value for all, or a list/tuple with one per chosen env.
        """
        self._calls.set_attr(name, values, env_ids)

    # ================================================================ first-ready

    @one_thread_at_a_time
    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start stepping some envs without waiting (EnvPool's ``send``).

        Together with :meth:`recv` this gives first-ready stepping: each group
        runs as soon as it has actions, and ``recv`` returns whichever finish
        first, so one slow env does not hold the whole batch back.

        Args:
            actions: Batched actions for ``env_ids`` (row ``j`` for ``env_ids[j]``).
            env_ids: Global env indices to step; they must be whole groups (as
                :meth:`recv` returns them). ``None`` steps every env.

        Raises:
            ValueError: Ids out of range or that split a group.
            AlreadyPendingCallError: A chosen group already has a step in flight.
        """
        self._first_ready.send(actions, env_ids)

    @one_thread_at_a_time
    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env without waiting; :meth:`recv` returns the groups as they finish.

        A first-ready loop can start with this instead of ``reset()`` then
        ``send()``: each group starts stepping as soon as its own reset is
        received. Resets come back from :meth:`recv` with zero rewards and no flags.
        """
        self._first_ready.async_reset(seed, options)

    @one_thread_at_a_time
    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Return the first groups to finish their :meth:`send` (EnvPool's ``recv``).

        Args:
            batch_size: Envs to return at least, in whole groups: it waits for as many
                groups as hold that many envs even if the smallest finish first (with
                uneven groups it may return more); defaults to one group. Capped at what
                is in flight.
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.

        Returns:
            ``(obs, rewards, terminations, truncations, infos, env_ids)`` for the
            returned envs, in ``env_ids`` order (ascending group index).
        """
        return self._first_ready.recv(batch_size, timeout)

    # ================================================================ timers

    @one_thread_at_a_time
    def env_step_seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """Return ``(seconds, steps)``: cumulative ``env.step`` seconds and counts per env.

        Both are copies of shape ``(num_envs,)``. Two arrays, not tree nodes (1,000 envs cost 16
        kB); the tree holds their sum per group.
        """
        session = self._session
        session.require_usable("env_step_seconds")
        session.flush_timers()  # groups publish per-env times when their tree ships
        buffers = session.buffers
        assert buffers is not None
        return buffers.env_seconds.copy(), buffers.env_steps.copy()

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

    def _repr_fields(self) -> str:
        return ""

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        name = spec.id if spec is not None else "envs"
        num_envs = getattr(self, "num_envs", "?")
        return f"{type(self).__name__}({name}, num_envs={num_envs}, {self._repr_fields()})"
