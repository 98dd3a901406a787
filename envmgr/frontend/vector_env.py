"""The front end both managers share: the whole public API, written once over a backend.

:class:`BatchedVectorEnv` is the ``gymnasium.vector.VectorEnv`` users hold. It
keeps the call order (one pending call, typed in :mod:`envmgr.frontend.calls`), checks
actions, restarts lost groups under the restart budget, builds infos (restart
notes included, in one place) and merges the groups' timer trees. A backend
(:mod:`envmgr.backends.base`) only moves commands and answers. One step::

    step(actions)
      step_async: ActionChecker.check -> backend.post_step(all groups, seq)
                    local: actions copied into shared memory, command words set
                    Ray:   each actor's rows sent with its step call
      step_wait:  backend.wait_step(seq)
                    None (the usual step) -> obs, rewards, flags copied from the arrays
                    else answers / lost / errors:
                      lost group -> _recover: budget, backend.replace, reset it
                      timers merged; obs, rewards, flags read from the batch arrays
                      infos = the groups' infos + restart notes
                  -> (obs, r, term, trunc, infos)

Broken is not closed: after a failure that is not recovered, every later call
raises :class:`~envmgr.errors.BrokenManagerError` caused by that failure;
:class:`~envmgr.errors.ClosedManagerError` is for a manager the user closed.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from envmgr import timers
from envmgr.backends.base import Backend, Lost, Waited, remote_exception
from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    ClosedManagerError,
    NoAsyncCallError,
    RemoteTraceback,
    WorkerFailure,
)
from envmgr.frontend.action_checks import ActionChecks
from envmgr.frontend.calls import CallKind, CallsMixin, PendingCall
from envmgr.frontend.first_ready import FirstReadyMixin
from envmgr.frontend.options import (
    DEFAULT_START_TIMEOUT,
    DEFAULT_TIMER_INTERVAL,
    FrontEndOptions,
    hosted_autoreset_mode,
)
from envmgr.frontend.restarts import RestartBudget
from envmgr.frontend.results import RESTARTED_INFO_KEY, BatchReader
from envmgr.frontend.validation import reset_arguments
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import FlushTimers, Ready, Reset, StepResponse
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.timers.merge import WorkerTimers

__all__ = ["BatchedVectorEnv", "FrontEndOptions", "RESTARTED_INFO_KEY"]


_Batch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
#: Why a group whose restart an interrupt cut off is lost (the next call restarts it).
_CUT_OFF = "its restart was cut off by an interrupt in this process"
#: The phase of a timer flush, the one internal call (it finds lost groups, never replaces them).
_FLUSH = "flush_timers"


class BatchedVectorEnv(CallsMixin, FirstReadyMixin, VectorEnv):  # type: ignore[type-arg]
    """A ``VectorEnv`` over groups of envs run by a backend; the managers subclass it.

    A subclass builds its backend and calls :meth:`_open` with it.
    """

    #: What a group is called in messages ("workers", "actors").
    group_noun = "workers"
    closed = True
    _failure: BaseException | None = None
    _user_closed = False
    _pending: PendingCall | None = None
    _backend: Backend | None = None

    def _open(
        self,
        backend: Backend,
        options: FrontEndOptions,
        *,
        autoreset_mode: str | AutoresetMode,
        step_timeout: float | None,
    ) -> None:
        """Start ``backend``'s groups and take their spaces; the caller shuts down on failure."""
        self._backend = backend
        self._layout: Layout = backend.layout
        self.num_envs = self._layout.num_envs
        self.copy = copy = options.get("copy", True)
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.check_actions = check_actions = options.get("check_actions", "safe")
        self.max_restarts = options.get("max_restarts", 0)
        self.restart_window = options.get("restart_window")
        self._budget = RestartBudget(self._layout.n_groups, self.max_restarts, self.restart_window)
        self.step_timeout = step_timeout
        self.start_timeout = options.get("start_timeout", DEFAULT_START_TIMEOUT)
        self.failures: list[WorkerFailure] = []
        self._seq = 0
        self._inflight: dict[int, int] = {}  # group -> seq of its send() step
        self._flushing = False  # a timer flush is under way (flushes never nest)
        self._groups = list(range(self._layout.n_groups))
        interval = options.get("timer_interval", DEFAULT_TIMER_INTERVAL)
        self._worker_timers = WorkerTimers(interval, self._flush_timers, self._layout.n_groups)
        # Start-up is a node of its own, so it is not charged to the first reset or step.
        with timers.hierarchical_timer(f"start_{self.group_noun}") as started:
            readies = backend.start()
            self._adopt(readies, options)
            self._buffers: SharedBuffers | None = backend.attach(
                self.single_observation_space, self.single_action_space
            )
        self._merge_start(started, dict(enumerate(readies)))
        self._reader: BatchReader | None = BatchReader(
            self._buffers,
            self._layout,
            self.single_observation_space,
            copy,
            self._add_info,
        )
        self._actions = ActionChecks(
            self.single_action_space, self._layout, self.group_noun[:-1], check_actions
        )
        self.closed = False

    def _adopt(self, readies: list[Ready], options: FrontEndOptions) -> None:
        """Take the spaces and metadata the groups reported; they must agree."""
        first = readies[0]
        for g, r in enumerate(readies[1:], 1):
            for kind in ("observation_space", "action_space"):
                if getattr(r, kind) != getattr(first, kind):
                    raise ValueError(
                        f"{self._where(g)} has {kind} {getattr(r, kind)}, "
                        f"but {self.group_noun[:-1]} 0 (env 0) has {getattr(first, kind)}"
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

    # ================================================================ names

    def _where(self, g: int) -> str:
        assert self._backend is not None
        return self._backend.where(g)

    def _env_range(self, g: int) -> range:
        return self._layout.range(g)

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _timeout(self, timeout: float | None) -> float | None:
        return self.step_timeout if timeout is None else timeout

    # ================================================================ call order

    def _check_usable(self, name: str) -> Backend:
        if self._user_closed or (self.closed and self._failure is None):
            raise ClosedManagerError.on(type(self).__name__, name)
        failure = self._failure
        if failure is not None:
            w = getattr(failure, "worker_index", -1)
            envs = getattr(failure, "env_indices", ())
            # str() of a KeyboardInterrupt (an interrupted restart) is empty: name its type.
            why = str(failure) or type(failure).__name__
            raise BrokenManagerError(
                f"cannot {name}: the manager is broken ({why})", w, envs
            ) from failure
        assert self._backend is not None
        return self._backend

    def _check_idle(self, name: str) -> Backend:
        """Refuse a new call while an ``*_async`` call or ``send()`` steps are outstanding."""
        if not (self.closed or self._pending is not None or self._inflight):
            return self._backend  # type: ignore[return-value]  # open: _open set it
        backend = self._check_usable(name)
        if self._pending is not None:
            raise AlreadyPendingCallError.on(name, self._pending.kind.value)
        if self._inflight:
            raise AlreadyPendingCallError(
                f"cannot {name} while {self.group_noun} {sorted(self._inflight)} have send() "
                "steps in flight: recv() them first",
                "send",
            )
        return backend

    def _take_pending(self, kind: CallKind) -> PendingCall:
        """End the pending ``kind`` call and return it."""
        self._check_usable(f"{kind.value}_wait")
        call = self._pending
        if call is None or call.kind is not kind:
            raise NoAsyncCallError.on(kind.value, None if call is None else call.kind.value)
        self._pending = None
        return call

    # ================================================================ failures

    def _break(self, failure: BaseException) -> None:
        """Mark the manager broken by ``failure`` and release everything it holds."""
        if self._failure is None:
            self._failure = failure
        self._pending = None
        self._inflight.clear()
        # Closed first: an interrupt cutting the shutdown off must not leave an open
        # manager in front of stopped groups.
        self.closed = True
        self._shutdown(graceful=False)

    def _raise_remote(self, err: Any, fatal: bool = False) -> None:
        """Raise what a group reported; ``fatal``: the group exited after it (break first)."""
        exc = remote_exception(
            err, self._where(err.worker_index), self._env_range(err.worker_index)
        )
        if fatal or err.phase == "make" or err.seq == -1:
            self._break(exc)
        raise exc from RemoteTraceback(err.traceback)

    def _await(
        self,
        seqs: dict[int, int],
        timeout: float | None,
        phase: str,
        need: int | None = None,
        resets: dict[int, Reset] | None = None,
    ) -> tuple[dict[int, Any], dict[int, tuple[range, str]]]:
        """Wait for the answers to ``seqs``; replace lost groups (steps and resets only).

        Returns:
            The answers by group, and the groups replaced on the way (with the note
            their envs' infos carry).
        """
        backend = self._backend
        assert backend is not None
        return self._settle(backend.wait(seqs, timeout, need, phase), phase, resets)

    def _settle(
        self, got: Waited, phase: str, resets: dict[int, Reset] | None = None
    ) -> tuple[dict[int, Any], dict[int, tuple[range, str]]]:
        """What :meth:`_await` makes of a wait: fatal errors raised, lost groups replaced."""
        if got.fatal is not None:
            self._raise_remote(got.fatal, fatal=True)
        answers = got.answers
        replaced: dict[int, tuple[range, str]] = {}
        for g, lost in sorted(got.lost.items()) if got.lost else ():
            if phase == _FLUSH:
                # Its unshipped timings are gone with it; the next step or reset finds
                # it lost again (the backend still sees it dead or silent) and replaces
                # it under the restart policy, with the note its envs' infos carry.
                continue
            if phase not in ("step", "reset"):
                self.failures.append(lost.failure)
                self._break(lost.failure)
                raise lost.failure
            note = f"{self._where(g)}: {lost.reason}"  # names the group that failed
            answers[g] = self._recover(g, lost, None if resets is None else resets.get(g))
            replaced[g] = (self._env_range(g), note)
        if got.errors or got.raised is not None:
            # Groups that answered (even with an error) are done with their send().
            for g in (*answers, *(e.worker_index for e in got.errors)):
                self._inflight.pop(g, None)
            if got.raised is not None:
                raise got.raised
            self._raise_remote(got.errors[0])
        return answers, replaced

    def _recover(self, g: int, lost: Lost, reset: Reset | None) -> StepResponse:
        """Replace group ``g`` under the restart budget; its answer to the reset it then does.

        A group cut mid-step is reset (and, in next-step mode, reset once more at
        the next step); one cut mid-reset carries out the reset asked for.
        """
        backend = self._backend
        assert backend is not None
        first = lost.failure
        self.failures.append(first)
        if self._budget.max_restarts <= 0:
            self._break(first)
            raise first
        reason = lost.reason
        while True:
            spent = self._budget.charge(g)
            if spent is not None:
                message = f"{self._where(g)} failed ({reason}) {spent}, so the manager is closed"
                broken = BrokenWorkerError(message, g, self._env_range(g))
                broken.__cause__ = first
                self._break(broken)
                raise broken from first
            with timers.hierarchical_timer(
                f"restart_{self.group_noun[:-1]}_{g}", self._worker_timers.stack
            ) as restarted:
                stage = "replace"
                try:
                    again = backend.replace(g, self.start_timeout)
                    stage = "reset"
                    self._budget.done(g)
                    if isinstance(again, Ready):
                        self._merge_start(restarted, {g: again})
                        seq = self._next_seq()
                        if reset is None:
                            next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
                            n = len(self._env_range(g))
                            cmd = Reset(seq, (None,) * n, None, None, False, next_step)
                        else:
                            cmd = Reset(seq, reset.seeds, reset.options, reset.mask, False)
                        backend.post({g: cmd})
                        got = backend.wait({g: seq}, self.start_timeout, None, "restart reset")
                        if got.fatal is not None:
                            self._raise_remote(got.fatal, fatal=True)
                        if got.errors:
                            self._raise_remote(got.errors[0])
                        if g in got.answers:
                            return got.answers[g]  # type: ignore[no-any-return]
                        again = got.lost[g]
                except BaseException as exc:
                    # Ctrl-C cut the restart (replacement or its reset) off: the group is
                    # left lost, and the next call restarts it again (under the same
                    # budget), where the backend can do that. The replacement's factory
                    # raised: broken. A reset's error is raised as at any reset.
                    if not isinstance(exc, Exception):
                        if not backend.abandon(g, _CUT_OFF):
                            self._break(exc)
                    elif stage == "replace":
                        self._break(exc)
                    raise
            # The replacement died or hung before it was ready: one more failure of
            # this group, under the same budget.
            reason = f"its replacement {again.reason}"

    def _read(
        self,
        answers: dict[int, Any],
        replaced: dict[int, tuple[range, str]],
        ship: bool,
        ids: np.ndarray | None,
    ) -> _Batch:
        """The batch (or rows ``ids``) with the answers' infos; timers merged if shipped."""
        if ship:
            self._merge_timers(answers)
        reader = self._reader
        assert reader is not None
        return reader.read(answers, replaced, ids)

    # ================================================================ reset / step

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

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to the groups without waiting (see :meth:`reset`)."""
        self._check_idle("reset_async")
        self._pending = self._post_reset(seed, options)

    def _post_reset(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> PendingCall:
        backend = self._check_usable("reset")
        seeds, options, mask = reset_arguments(seed, options, self.num_envs)
        ship = self._worker_timers.want()
        seq = self._next_seq()
        commands: dict[int, Reset] = {}
        for g in self._groups:
            r = self._env_range(g)
            if mask is None or mask[r.start : r.stop].any():
                sub = None if mask is None else tuple(bool(b) for b in mask[r.start : r.stop])
                commands[g] = Reset(seq, tuple(seeds[r.start : r.stop]), options, sub, ship)
        backend.post(commands)
        self._worker_timers.unshipped = True
        return PendingCall(CallKind.RESET, dict.fromkeys(commands, seq), ship, commands, "reset")

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset sent by :meth:`reset_async` (``timeout``: ``step_timeout``)."""
        call = self._take_pending(CallKind.RESET)
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            answers, replaced = self._await(
                call.seqs, self._timeout(timeout), "reset", resets=call.commands
            )
        obs, _, _, _, infos = self._read(answers, replaced, call.ship, None)
        return obs, infos

    def step(self, actions: Any) -> _Batch:
        """Step every env with its action; see ``gymnasium.vector.VectorEnv.step``."""
        # step_async + step_wait without the pending-call record in between: this is
        # the hot path, and nothing can run between the two halves here.
        if self.closed or self._pending is not None or self._inflight:
            self._check_idle("step")  # raises
        seq, ship = self._post_batch_step(self._backend, actions)  # type: ignore[arg-type]
        return self._wait_batch_step(seq, ship, self.step_timeout)

    def step_async(self, actions: Any) -> None:
        """Check the actions, hand them to the groups and wake them, without waiting."""
        seq, ship = self._post_batch_step(self._check_idle("step_async"), actions)
        self._pending = PendingCall(CallKind.STEP, dict.fromkeys(self._groups, seq), ship)

    def step_wait(self, timeout: float | None = None) -> _Batch:
        """Wait for the step sent by :meth:`step_async` (``timeout``: default ``step_timeout``)."""
        call = self._take_pending(CallKind.STEP)
        return self._wait_batch_step(call.seqs[0], call.ship, self._timeout(timeout))

    def _post_batch_step(self, backend: Backend, actions: Any) -> tuple[int, bool]:
        """Check the actions, hand them to every group: the step's seq and whether timers ship."""
        self._actions.check_batch(actions)
        ship = self._worker_timers.want()
        self._seq = seq = self._seq + 1
        backend.post_step(self._groups, seq, ship, actions, None)
        self._worker_timers.unshipped = True
        return seq, ship

    def _wait_batch_step(self, seq: int, ship: bool, timeout: float | None) -> _Batch:
        backend = self._backend
        assert backend is not None
        t0 = perf_counter()
        got = backend.wait_step(seq, timeout)
        if got is None:
            self._worker_timers.target.add_time(perf_counter() - t0)  # type: ignore[union-attr]
            return self._reader.read_batch()  # type: ignore[union-attr]
        return self._settle_step(got, ship, perf_counter() - t0)

    def _settle_step(self, got: Waited, ship: bool, waited: float) -> _Batch:
        """A step whose groups said more than their rows, or were lost: under ``workers``,
        which already holds the ``waited`` seconds (restarts nest there)."""
        with timers.hierarchical_timer("workers", self._worker_timers.stack) as node:
            node.total += waited
            answers, replaced = self._settle(got, "step")
        return self._read(answers, replaced, ship, None)

    # ================================================================ timers

    def _merge_timers(self, answers: dict[int, Any]) -> None:
        backend = self._backend
        assert backend is not None
        self._worker_timers.merge(
            (backend.timer_name(g), a.timer_root, a.gauges)
            for g, a in sorted(answers.items())
            if a is not None
        )
        if len(answers) == len(self._groups) and not self._inflight:
            self._worker_timers.shipped()

    def _merge_start(self, node: Any, readies: dict[int, Ready]) -> None:
        """Merge the groups' start-up trees (shipped in their Ready) under ``node``."""
        backend = self._backend
        assert backend is not None
        self._worker_timers.merge(
            ((backend.timer_name(g), r.timer_root, r.gauges) for g, r in readies.items()), node
        )

    def _flush_timers(self, timeout: float | None = None) -> None:
        """Pull every group's unshipped timings into the current target.

        Args:
            timeout: Seconds to wait for the groups; default ``step_timeout``.
        """
        if (
            not self._worker_timers.unshipped
            or self._pending is not None
            or self._inflight
            or self.closed
            or self._flushing
        ):
            return
        backend = self._check_usable("flush timers")
        seq = self._next_seq()
        # Never nested: a flush inside a flush would take the answers the outer one
        # waits for (an older seq's are dropped) and leave it reading a pipe for ever.
        self._flushing = True
        try:
            backend.post({g: FlushTimers(seq) for g in self._groups})
            answers, _ = self._await(
                dict.fromkeys(self._groups, seq),
                self.step_timeout if timeout is None else timeout,
                _FLUSH,
            )
            self._merge_timers(answers)
        finally:
            self._flushing = False

    def env_step_seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """``(seconds, steps)``: cumulative ``env.step`` seconds and counts per env, copies of
        shape ``(num_envs,)``. Two arrays, not tree nodes (1,000 envs cost 16 kB); the tree
        holds their sum per group."""
        self._check_usable("env_step_seconds")
        self._flush_timers()  # groups publish per-env times when their tree ships
        buffers = self._buffers
        assert buffers is not None
        return buffers.env_seconds.copy(), buffers.env_steps.copy()

    # ================================================================ shutdown

    def close(self, **kwargs: Any) -> None:
        """Stop every group and free the batch arrays. Idempotent; safe after failures."""
        self._close(flush=True)

    def _close(self, flush: bool) -> None:
        try:
            if flush and not self.closed and self._pending is None and not self._inflight:
                try:
                    # Bounded: timings are a courtesy at close, never a reason to hang.
                    self._flush_timers(getattr(self._backend, "close_timeout", 5.0))
                except Exception:
                    pass
        finally:
            self._shutdown(graceful=True)
            self.closed = True
            self._user_closed = True

    def close_extras(self, **kwargs: Any) -> None:
        """Part of gymnasium's ``VectorEnv.close`` protocol; :meth:`close` does the work."""
        self._shutdown(graceful=True)

    def _shutdown(self, graceful: bool) -> None:
        worker_timers = getattr(self, "_worker_timers", None)
        if worker_timers is not None:
            worker_timers.close()
        backend = self._backend
        if backend is not None:
            self._reader = None  # views handed out stay valid: they keep the memory mapped
            self._buffers = None
            backend.shutdown(graceful)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # An exception leaving the block (Ctrl-C above all) may have cut a pipe read off
        # mid-message: ask the groups for nothing more (no timer flush), just stop them.
        self._close(flush=exc_type is None)

    def __del__(self) -> None:
        # Safety net only: the interpreter may be half torn down here.
        try:
            if self._backend is not None:
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
