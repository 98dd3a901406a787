"""First-ready stepping (EnvPool's ``send``/``recv``), a part of the front end's API.

``send(actions, env_ids)`` hands whole groups their actions and returns at once;
``recv()`` returns the groups that finish first, so a slow env holds back only its
own group::

    send(a, ids) -> check, backend.post_step(groups, seq)     groups step at once
    recv()       -> backend.wait({group: seq}, need=k)         the first k to finish
                 -> their rows of the batch arrays, infos, env_ids

The groups in flight are the front end's ``_inflight`` (group -> seq of its step);
the rest (call order, restarts, infos, timers) is
:class:`~envmgr.frontend.vector_env.BatchedVectorEnv`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any, Protocol

import numpy as np

from envmgr import timers
from envmgr.backends.base import Backend
from envmgr.errors import AlreadyPendingCallError, NoAsyncCallError
from envmgr.frontend.action_checks import ActionChecks
from envmgr.frontend.calls import PendingCall
from envmgr.protocol.layout import Layout
from envmgr.timers.merge import WorkerTimers

_Batch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]

__all__ = ["FirstReadyMixin"]


class _FrontEnd(Protocol):
    """What :class:`FirstReadyMixin` uses of the front end."""

    group_noun: str
    _layout: Layout
    _pending: PendingCall | None
    _inflight: dict[int, int]
    _actions: ActionChecks
    _worker_timers: WorkerTimers

    _reader: Any
    _seq: int
    step_timeout: float | None

    def _check_usable(self, name: str) -> Backend: ...
    def _check_idle(self, name: str) -> Backend: ...
    def _where(self, g: int) -> str: ...
    def _env_range(self, g: int) -> range: ...
    def _next_seq(self) -> int: ...
    def _timeout(self, timeout: float | None) -> float | None: ...
    def _post_reset(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> PendingCall: ...
    def _await(
        self, seqs: dict[int, int], timeout: float | None, phase: str, need: int | None = None
    ) -> tuple[dict[int, Any], dict[int, tuple[range, str]]]: ...
    def _read(
        self,
        answers: dict[int, Any],
        replaced: dict[int, tuple[range, str]],
        ship: bool,
        ids: np.ndarray | None,
    ) -> _Batch: ...


class FirstReadyMixin:
    """``send``, ``async_reset`` and ``recv`` of the front end."""

    def send(
        self: _FrontEnd, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None
    ) -> None:
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
        g = self._layout.group_with_ids(env_ids)  # recv's ids sent straight back
        ids: np.ndarray
        if g is not None:
            ids, groups = env_ids, [g]  # type: ignore[assignment]  # an int64 array, checked
        else:
            ids, groups = self._layout.whole_groups(env_ids, self.group_noun)
        busy = [g for g in groups if g in self._inflight]
        if busy:
            raise AlreadyPendingCallError(
                f"{self._where(busy[0])} already has a step in flight: recv() it first", "send"
            )
        self._actions.check(actions, ids)
        ship = self._worker_timers.want(groups)
        self._seq = seq = self._seq + 1
        backend.post_step(groups, seq, ship, actions, ids)
        for g in groups:
            self._inflight[g] = seq
        self._worker_timers.unshipped = True

    def async_reset(
        self: _FrontEnd,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
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
        self: _FrontEnd, batch_size: int | None = None, timeout: float | None = None
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
        backend = self._check_usable("recv")
        inflight = self._inflight
        if not inflight:
            raise NoAsyncCallError("recv() called with no step in flight: send() first", "recv")
        size = self._layout.largest
        need = min(len(inflight), max(1, -(-(batch_size or size) // size)))
        if timeout is None:
            timeout = self.step_timeout
        waited = 0.0
        if timeout is None:
            # The usual case (no deadline; answers all in the batch arrays): no answer
            # objects, the wait timed straight into the "workers" node.
            t0 = perf_counter()
            ready = backend.ready(inflight, need)
            waited = perf_counter() - t0
            if ready is not None:
                self._worker_timers.wait_node().add_time(waited)
                for g in ready:
                    del inflight[g]
                return self._reader.read_groups(ready)  # type: ignore[no-any-return]
        with timers.hierarchical_timer("workers", self._worker_timers.stack) as node:
            node.total += waited
            answers, replaced = self._await(dict(inflight), timeout, "step", need)
        chosen = sorted(answers)
        for g in chosen:
            del self._inflight[g]
        ids = np.concatenate([np.arange(r.start, r.stop) for r in map(self._env_range, chosen)])
        ship = any(a is not None and a.timer_root is not None for a in answers.values())
        obs, rewards, terms, truncs, infos = self._read(answers, replaced, ship, ids)
        return obs, rewards, terms, truncs, infos, ids
