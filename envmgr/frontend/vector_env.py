"""The front end both managers share: the whole public API, written once over a backend.

:class:`BatchedVectorEnv` is the ``gymnasium.vector.VectorEnv`` users hold. It is
made of parts that share one :class:`~envmgr.frontend.session.Session` (the one
state, sequence numbers, waits, restarts, timers): :class:`~envmgr.frontend.calls.Calls`
for per-env calls and :class:`~envmgr.frontend.first_ready.FirstReady` for
``send``/``recv``; start-up and close are :mod:`envmgr.frontend.lifecycle`'s; reset and
step are here. A backend (:mod:`envmgr.backends.base`) only moves commands and answers.
One step::

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
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from envmgr import timers
from envmgr.errors import BusyManagerError
from envmgr.frontend.lifecycle import ManagerLifecycle, open_managers
from envmgr.frontend.options import FrontEndOptions
from envmgr.frontend.recycling import RECYCLED_INFO_KEY
from envmgr.frontend.results import RESTARTED_INFO_KEY
from envmgr.frontend.session import Batch
from envmgr.frontend.state import IDLE, CallKind, PendingCall

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


class BatchedVectorEnv(ManagerLifecycle):
    """A ``VectorEnv`` over groups of envs run by a backend; the managers subclass it.

    A subclass builds its backend and calls :meth:`_open` with it; opening and closing
    are :class:`~envmgr.frontend.lifecycle.ManagerLifecycle`'s, the calls are here.
    """

    # ================================================================ state

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

    def _repr_fields(self) -> str:
        return ""

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        name = spec.id if spec is not None else "envs"
        num_envs = getattr(self, "num_envs", "?")
        return f"{type(self).__name__}({name}, num_envs={num_envs}, {self._repr_fields()})"
