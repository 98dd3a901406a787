"""The front end both managers share: the whole public API, written once over a backend.

:class:`BatchedVectorEnv` is the ``gymnasium.vector.VectorEnv`` users hold. It
keeps the call order (one pending call, typed in :mod:`envmgr.calls`), checks
actions, restarts lost groups under the restart budget, builds infos (restart
notes included, in one place) and merges the groups' timer trees. A backend
(:mod:`envmgr.backend`) only moves commands and answers. One step::

    step(actions)
      step_async: ActionChecker.check -> backend.post_step(all groups, seq)
                    local: actions copied into shared memory, command words set
                    Ray:   each actor's rows sent with its step call
      step_wait:  backend.wait({group: seq})  -> answers / lost / errors
                    lost group -> _recover: budget, backend.replace, reset it
                  timers merged; obs, rewards, flags read from the batch arrays
                  infos = the groups' infos + restart notes -> (obs, r, term, trunc, infos)

Broken is not closed: after a failure that is not recovered, every later call
raises :class:`~envmgr.errors.BrokenManagerError` caused by that failure;
:class:`~envmgr.errors.ClosedManagerError` is for a manager the user closed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from copy import deepcopy
from typing import Any

import cloudpickle
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from envmgr import timers
from envmgr.backend import Backend, Lost, Waited, remote_exception
from envmgr.batching import rows_of_info, tree_map
from envmgr.calls import CallKind, PendingCall
from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    BrokenWorkerError,
    ClosedManagerError,
    NoAsyncCallError,
    RemoteTraceback,
    WorkerFailure,
)
from envmgr.layout import Layout
from envmgr.messages import Apply, Call, FlushTimers, Ready, Reset, SetAttr, StepResponse
from envmgr.restarts import RestartBudget
from envmgr.shared_memory import SharedBuffers
from envmgr.timer_merge import WorkerTimers
from envmgr.validation import ActionChecker, reset_arguments

__all__ = ["BatchedVectorEnv", "RESTARTED_INFO_KEY"]

#: Info key of envs whose worker (or actor) was replaced during the call.
RESTARTED_INFO_KEY = "envmgr_restarted"

_Batch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]


class BatchedVectorEnv(VectorEnv):  # type: ignore[type-arg]
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
    _obs_views: Any = None

    def _open(
        self,
        backend: Backend,
        *,
        autoreset_mode: str | AutoresetMode,
        copy: bool,
        check_actions: str | bool,
        max_restarts: int,
        restart_window: float | None,
        step_timeout: float | None,
        start_timeout: float | None,
        timer_interval: float,
    ) -> None:
        """Start ``backend``'s groups and take their spaces; the caller shuts down on failure."""
        self._backend = backend
        self._layout: Layout = backend.layout
        self.num_envs = self._layout.num_envs
        self.copy = copy
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.check_actions = check_actions
        self._budget = RestartBudget(self._layout.n_groups, max_restarts, restart_window)
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.failures: list[WorkerFailure] = []
        self._seq = 0
        self._inflight: dict[int, int] = {}  # group -> seq of its send() step
        self._closing = False
        self._groups = list(range(self._layout.n_groups))
        self._worker_timers = WorkerTimers(timer_interval, self._flush_timers)
        self._adopt(backend.start())
        self._buffers: SharedBuffers | None = backend.attach(
            self.single_observation_space, self.single_action_space
        )
        mode = _check_mode(check_actions)
        self._check_mode = mode
        self._checkers: dict[int, Any] = {}
        self._init_observation_views()
        self.closed = False

    def _adopt(self, readies: list[Ready]) -> None:
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
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        self.spec = first.spec

    def _init_observation_views(self) -> None:
        buffers = self._buffers
        assert buffers is not None
        if buffers.observations is not None:

            def read_only(a: np.ndarray) -> np.ndarray:
                v = a.view()
                v.flags.writeable = False
                return v

            self._obs_views = tree_map(read_only, buffers.observations)
            self._per_env_obs: list[Any] | None = None
        else:
            self._per_env_obs = [None] * self.num_envs
            empty: Any = create_empty_array(self.single_observation_space, self.num_envs)
            self._obs_views = empty

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
            raise ClosedManagerError(f"cannot {name}: the manager is closed")
        failure = self._failure
        if failure is not None:
            w = getattr(failure, "worker_index", -1)
            envs = getattr(failure, "env_indices", ())
            raise BrokenManagerError(
                f"cannot {name}: the manager is broken ({failure})", w, envs
            ) from failure
        assert self._backend is not None
        return self._backend

    def _check_idle(self, name: str) -> Backend:
        """Refuse a new call while an ``*_async`` call or ``send()`` steps are outstanding."""
        backend = self._check_usable(name)
        if self._pending is not None:
            kind = self._pending.kind.value
            raise AlreadyPendingCallError(
                f"cannot {name} while a {kind} call is pending: call {kind}_wait() first", kind
            )
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
            other = "" if call is None else f" (a {call.kind.value} call is pending)"
            raise NoAsyncCallError(
                f"{kind.value}_wait() called without a pending {kind.value}_async(){other}",
                kind.value,
            )
        self._pending = None
        return call

    # ================================================================ failures

    def _break(self, failure: BaseException) -> None:
        """Mark the manager broken by ``failure`` and release everything it holds."""
        if self._failure is None:
            self._failure = failure
        self._pending = None
        self._inflight.clear()
        self._shutdown(graceful=False)
        self.closed = True

    def _raise_remote(self, err: Any) -> None:
        exc = remote_exception(
            err, self._where(err.worker_index), self._env_range(err.worker_index)
        )
        if err.phase == "make" or err.seq == -1:
            self._break(exc)
        raise exc from RemoteTraceback(err.traceback)

    def _await(
        self,
        seqs: dict[int, int],
        timeout: float | None,
        phase: str,
        need: int | None = None,
        resets: dict[int, Reset] | None = None,
    ) -> tuple[dict[int, Any], dict[int, str]]:
        """Wait for the answers to ``seqs``; replace lost groups (steps and resets only).

        Returns:
            The answers by group, and the groups replaced on the way (with the note
            their envs' infos carry).
        """
        backend = self._backend
        assert backend is not None
        got: Waited = backend.wait(seqs, timeout, need, phase)
        if got.fatal is not None:
            self._raise_remote(got.fatal)
        answers = got.answers
        replaced: dict[int, str] = {}
        for g, lost in sorted(got.lost.items()) if got.lost else ():
            if phase not in ("step", "reset"):
                self.failures.append(lost.failure)
                self._break(lost.failure)
                raise lost.failure
            answers[g] = self._recover(g, lost, None if resets is None else resets.get(g))
            replaced[g] = f"{self._where(g)}: {lost.reason}"
        if got.errors:
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
        if self._budget.max_restarts <= 0 or self._closing:
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
            ):
                try:
                    again = backend.replace(g, self.start_timeout)
                except BaseException as exc:  # the replacement's factory raised
                    self._break(exc)
                    raise
                self._budget.done(g)
                if again is None:
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
                        self._raise_remote(got.fatal)
                    if got.errors:
                        self._raise_remote(got.errors[0])
                    if g in got.answers:
                        return got.answers[g]  # type: ignore[no-any-return]
                    again = got.lost[g]
            # The replacement died or hung before it was ready: one more failure of
            # this group, under the same budget.
            reason = f"its replacement {again.reason}"

    # ================================================================ reading a batch

    def _read(
        self, answers: dict[int, Any], replaced: dict[int, str], ship: bool, ids: np.ndarray | None
    ) -> _Batch:
        """The batch (or rows ``ids``) from the batch arrays, with the answers' infos."""
        if ship:
            self._merge_timers(answers)
        buffers = self._buffers
        assert buffers is not None
        obs = self._observations(answers, ids)
        if ids is None:
            rewards = buffers.rewards.copy()
            terms = buffers.terminations.copy()
            truncs = buffers.truncations.copy()
        else:
            rewards = buffers.rewards[ids]
            terms = buffers.terminations[ids]
            truncs = buffers.truncations[ids]
        for g in replaced:
            r = self._env_range(g)
            if ids is None:
                truncs[r.start : r.stop] = True
            else:
                truncs[(ids >= r.start) & (ids < r.stop)] = True
        return obs, rewards, terms, truncs, self._infos(answers, replaced, ids)

    def _observations(self, answers: dict[int, Any], ids: np.ndarray | None) -> Any:
        per_env = self._per_env_obs
        if per_env is None:
            if ids is not None:
                return tree_map(lambda a: a[ids], self._obs_views)  # fancy indexing copies
            return tree_map(np.copy, self._obs_views) if self.copy else self._obs_views
        for g, a in answers.items():
            if a is not None and a.observations is not None:
                start = self._layout.starts[g]
                per_env[start : start + len(a.observations)] = a.observations
        space = self.single_observation_space
        if ids is not None:
            chosen = [per_env[i] for i in ids]
            out: Any = create_empty_array(space, len(chosen))
            return concatenate(space, chosen, out)
        self._obs_views = concatenate(space, per_env, self._obs_views)
        return deepcopy(self._obs_views) if self.copy else self._obs_views

    def _infos(
        self, answers: dict[int, Any], replaced: dict[int, str], rows: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Gymnasium's vector infos of the answers, then the restart notes, cut to ``rows``."""
        infos: dict[str, Any] = {}
        starts = self._layout.starts
        said = [(g, a) for g, a in answers.items() if a is not None and a.infos]
        for g, a in sorted(said) if len(said) > 1 else said:
            for i, info in a.infos:
                infos = self._add_info(infos, info, starts[g] + i)
        for g, note in replaced.items():
            for i in self._env_range(g):
                infos = self._add_info(infos, {RESTARTED_INFO_KEY: note}, i)
        return infos if rows is None else rows_of_info(infos, rows)

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
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Check the actions, hand them to the groups and wake them, without waiting."""
        backend = self._check_idle("step_async")
        self._check_actions(actions, None)
        ship = self._worker_timers.want()
        seq = self._next_seq()
        backend.post_step(self._groups, seq, ship, actions, None)
        self._worker_timers.unshipped = True
        self._pending = PendingCall(CallKind.STEP, dict.fromkeys(self._groups, seq), ship)

    def step_wait(self, timeout: float | None = None) -> _Batch:
        """Wait for the step sent by :meth:`step_async` (``timeout``: default ``step_timeout``)."""
        call = self._take_pending(CallKind.STEP)
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            answers, replaced = self._await(call.seqs, self._timeout(timeout), "step")
        return self._read(answers, replaced, call.ship, None)

    def _check_actions(self, actions: Any, ids: np.ndarray | None) -> None:
        if self._check_mode == "off":
            return
        n = self.num_envs if ids is None else len(ids)
        checker = self._checkers.get(n)
        if checker is None:
            checker = self._checkers[n] = self._new_checker(n)
        checker.check(actions, ids)

    def _new_checker(self, n: int) -> Any:
        # The new signature is ActionChecker(space, n, where, mode); until it lands,
        # the old one takes envs_per_worker for its messages.
        try:
            return ActionChecker(self.single_action_space, n, self._env_where, self._check_mode)  # type: ignore[arg-type,call-arg]
        except TypeError:
            return _OldCheckerAdapter(self.single_action_space, n, self)

    def _env_where(self, i: int) -> str:
        g = int(self._layout.group_of(np.asarray([i]))[0])
        return f"env {i} ({self.group_noun[:-1]} {g})"

    # ================================================================ first-ready

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start stepping some envs without waiting (EnvPool's ``send``).

        Together with :meth:`recv` this gives first-ready stepping: each group
        runs as soon as it has actions, and ``recv`` returns whichever finish
        first, so one slow env no longer holds the whole batch back.

        Args:
            actions: Batched actions for ``env_ids`` (row ``j`` for ``env_ids[j]``).
            env_ids: Global env indices to step; they must be whole groups (as
                :meth:`recv` returns them). ``None`` steps every env.

        Raises:
            ValueError: Ids out of range or that split a group.
            AlreadyPendingCallError: A chosen group already has a step in flight.
        """
        backend = self._check_usable("send")
        if self._pending is not None:
            kind = self._pending.kind.value
            raise AlreadyPendingCallError(f"cannot send while a {kind} call is pending", kind)
        ids, groups = self._layout.whole_groups(env_ids, self.group_noun)
        busy = [g for g in groups if g in self._inflight]
        if busy:
            raise AlreadyPendingCallError(
                f"{self._where(busy[0])} already has a step in flight: recv() it first", "send"
            )
        self._check_actions(actions, ids)
        ship = self._worker_timers.want()
        seq = self._next_seq()
        backend.post_step(groups, seq, ship, actions, ids)
        for g in groups:
            self._inflight[g] = seq
        self._worker_timers.unshipped = True

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env without waiting; :meth:`recv` returns the groups as they finish.

        A first-ready loop can start with this instead of ``reset()`` then
        ``send()``: each group starts stepping as soon as its own reset is
        received. Resets come back from :meth:`recv` with zero rewards and no flags.
        """
        self._check_idle("async_reset")
        if options is not None and "reset_mask" in options:
            raise ValueError("async_reset() resets every env: reset_mask is not supported here")
        self._inflight.update(self._post_reset(seed, options).seqs)

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Return the first groups to finish their :meth:`send` (EnvPool's ``recv``).

        Args:
            batch_size: Envs to return, rounded up to whole groups; defaults to one
                group. Capped at what is in flight.
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.

        Returns:
            ``(obs, rewards, terminations, truncations, infos, env_ids)`` for the
            returned envs, in ``env_ids`` order (ascending group index).
        """
        self._check_usable("recv")
        if not self._inflight:
            raise NoAsyncCallError("recv() called with no step in flight: send() first", "recv")
        size = max(self._layout.sizes)
        need = min(len(self._inflight), max(1, -(-(batch_size or size) // size)))
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            answers, replaced = self._await(
                dict(self._inflight), self._timeout(timeout), "step", need
            )
        chosen = sorted(answers)
        for g in chosen:
            del self._inflight[g]
        ids = np.concatenate([np.arange(r.start, r.stop) for r in map(self._env_range, chosen)])
        ship = any(a is not None and a.timer_root is not None for a in answers.values())
        obs, rewards, terms, truncs, infos = self._read(answers, replaced, ship, ids)
        return obs, rewards, terms, truncs, infos, ids

    # ================================================================ call / attrs / apply

    def _targets(
        self, env_ids: Sequence[int] | np.ndarray | None
    ) -> tuple[dict[int, tuple[int, ...] | None], list[tuple[int, int]]]:
        """Per group, the local ids of the chosen envs; and where each result will be."""
        if env_ids is None:
            sizes = self._layout.sizes
            return dict.fromkeys(self._groups), [
                (g, i) for g in self._groups for i in range(sizes[g])
            ]
        ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_envs):
            raise ValueError(
                f"env_ids must be env indices in [0, {self.num_envs}), got {ids.tolist()}"
            )
        local: dict[int, list[int]] = {}
        order = []
        for i, g in zip(ids.tolist(), self._layout.group_of(ids).tolist(), strict=True):
            mine = local.setdefault(g, [])
            order.append((g, len(mine)))
            mine.append(i - self._layout.starts[g])
        return {g: tuple(v) for g, v in local.items()}, order

    def call_async(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> None:
        """Send :meth:`call` to the groups without waiting (as ``AsyncVectorEnv``)."""
        self._pending = self._post_call(
            "call_async",
            f"call({name!r})",
            env_ids,
            lambda g, seq, ids: Call(seq, name, args, kwargs, ids),
        )

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call sent by :meth:`call_async`; one result per env."""
        call = self._take_pending(CallKind.CALL)
        answers, _ = self._await(call.seqs, self._timeout(timeout), call.phase)
        return tuple(answers[g].results[k] for g, k in call.order)

    def call(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of each env (of ``env_ids``).

        Only the groups owning the chosen envs are contacted. Returns one result per
        env, in ``env_ids`` order.
        """
        self.call_async(name, *args, env_ids=env_ids, **kwargs)
        return self.call_wait()

    def get_attr(self, name: str, env_ids: Sequence[int] | None = None) -> tuple[Any, ...]:
        """Read attribute ``name`` of each env (of ``env_ids``)."""
        return self.call(name, env_ids=env_ids)

    def render(self) -> tuple[Any, ...]:
        """Each env's ``render()`` result."""
        return self.call("render")

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
        try:
            blob = cloudpickle.dumps(fn)
        except Exception as exc:
            raise ValueError(f"apply(): {fn!r} cannot be pickled: {exc}") from exc
        self._pending = self._post_call(
            "apply", "apply", env_ids, lambda g, seq, ids: Apply(seq, blob, args, kwargs, ids)
        )
        return self.call_wait()

    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` of each env (of ``env_ids``): one value for all, or a list/tuple
        with one per chosen env."""
        n = self.num_envs if env_ids is None else len(env_ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * n
        if len(values) != n:
            what = f"num_envs={n}" if env_ids is None else f"{n} envs"
            raise ValueError(f"got {len(values)} values for {what}")
        targets, order = self._targets(env_ids)
        per_group: dict[int, list[Any]] = {g: [] for g in targets}
        for (g, _), v in zip(order, values, strict=True):
            per_group[g].append(v)
        call = self._post_call(
            "set_attr",
            "set_attr",
            env_ids,
            lambda g, seq, ids: SetAttr(seq, name, tuple(per_group[g]), ids),
        )
        self._await(call.seqs, self.step_timeout, "set_attr")

    def _post_call(
        self,
        name: str,
        phase: str,
        env_ids: Sequence[int] | None,
        make: Callable[[int, int, tuple[int, ...] | None], Any],
    ) -> PendingCall:
        backend = self._check_idle(name)
        targets, order = self._targets(env_ids)
        seq = self._next_seq()
        commands = {g: make(g, seq, ids) for g, ids in targets.items()}
        backend.post(commands)
        return PendingCall(CallKind.CALL, dict.fromkeys(commands, seq), phase=phase, order=order)

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

    def _flush_timers(self) -> None:
        """Pull every group's unshipped timings into the current target."""
        if (
            not self._worker_timers.unshipped
            or self._pending is not None
            or self._inflight
            or self.closed
        ):
            return
        backend = self._check_usable("flush timers")
        seq = self._next_seq()
        backend.post({g: FlushTimers(seq) for g in self._groups})
        answers, _ = self._await(
            dict.fromkeys(self._groups, seq), self.step_timeout, "flush_timers"
        )
        self._merge_timers(answers)

    def env_step_seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """Cumulative seconds inside ``env.step`` and step counts, per env.

        Per-env timings live in two arrays rather than in the timer tree, so 1,000
        envs cost 16 kB and no tree nodes; the tree holds their sum (``env.step``
        under each group).

        Returns:
            ``(seconds, steps)``, copies of shape ``(num_envs,)``.
        """
        self._check_usable("env_step_seconds")
        self._flush_timers()  # groups publish per-env times when their tree ships
        buffers = self._buffers
        assert buffers is not None
        return buffers.env_seconds.copy(), buffers.env_steps.copy()

    # ================================================================ shutdown

    def close(self, **kwargs: Any) -> None:
        """Stop every group and free the batch arrays. Idempotent; safe after failures."""
        try:
            if not self.closed and self._pending is None and not self._inflight:
                self._closing = True  # a lost group is not replaced just to flush timers
                try:
                    self._flush_timers()
                except Exception:
                    pass  # timings are a courtesy at close; never block shutdown on them
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
            self._obs_views = None
            self._buffers = None
            backend.shutdown(graceful)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _OldCheckerAdapter:
    """Until the new ``ActionChecker(space, n, where, mode)`` lands: the old one, named by env."""

    def __init__(self, space: Any, n: int, owner: BatchedVectorEnv) -> None:
        size = max(owner._layout.sizes)
        self._checker = ActionChecker(space, n, size)
        self._owner = owner
        if owner._layout.even:
            return
        checker = self._checker
        checker._where = lambda i: owner._env_where(  # type: ignore[method-assign,assignment]
            int(i if checker._env_ids is None else checker._env_ids[i])
        )

    def check(self, actions: Any, env_ids: Any = None) -> None:
        self._checker.check(actions, env_ids)


def _check_mode(check_actions: str | bool) -> str:
    """``check_actions`` as a mode: ``"safe"``, ``"strict"`` or ``"off"`` (``True``/``False``
    mean safe/off)."""
    if check_actions is True or check_actions is False:
        return "safe" if check_actions else "off"
    if check_actions not in ("safe", "strict", "off"):
        raise ValueError(f"check_actions must be 'safe', 'strict' or 'off', got {check_actions!r}")
    return check_actions
