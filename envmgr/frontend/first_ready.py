"""First-ready stepping (EnvPool's ``send``/``recv``), a part of the front end's API.

``send(actions, env_ids)`` hands whole groups their actions and returns at once;
``recv()`` returns the groups that finish first, so a slow env holds back only its
own group::

    send(a, ids) -> check, backend.post_step(groups, seq)     groups step at once
    recv()       -> backend.wait({group: seq}, need=k)         the first k to finish
                 -> their rows of the batch arrays, infos, env_ids

The groups in flight are the session's state (``IN_FLIGHT``: group -> seq of
its step); :class:`FirstReady` holds the session and the action checks, nothing
of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

import numpy as np

from envmgr import timers
from envmgr.errors import AlreadyPendingCallError, NoAsyncCallError
from envmgr.frontend.action_checks import ActionChecks
from envmgr.frontend.options import count
from envmgr.frontend.session import Session
from envmgr.frontend.state import CallKind

__all__ = ["FirstReady"]


class FirstReady:
    """``send``, ``async_reset`` and ``recv`` of a manager, over its session.

    Args:
        session: The manager's session.
        actions: The manager's action checks.
    """

    def __init__(self, session: Session, actions: ActionChecks) -> None:
        self._session = session
        self._actions = actions

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """:meth:`~envmgr.frontend.vector_env.BatchedVectorEnv.send`: whole groups only."""
        session = self._session
        backend = session.require_usable("send")
        pending = session.state.call
        if pending is not None:
            kind = pending.kind.value
            raise AlreadyPendingCallError(f"cannot send while a {kind} call is pending", kind)
        layout = session.layout
        g = layout.group_with_ids(env_ids)  # recv's ids sent straight back
        ids: np.ndarray
        if g is not None:
            ids, groups = env_ids, [g]  # type: ignore[assignment]  # an int64 array, checked
        else:
            ids, groups = layout.whole_groups(env_ids, session.nouns)
        in_flight = session.state.in_flight
        busy = [g for g in groups if g in in_flight]
        if busy:
            raise AlreadyPendingCallError(
                f"{session.where(busy[0])} already has a step in flight: recv() it first", "send"
            )
        self._actions.check(actions, ids)
        ship = session.worker_timers.timers_due(groups)
        seq = session.next_seq()
        backend.post_step(groups, seq, ship, actions, ids)
        session.mark_in_flight(dict.fromkeys(groups, seq))
        session.worker_timers.unshipped = True

    def async_reset(
        self,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> None:
        """:meth:`~envmgr.frontend.vector_env.BatchedVectorEnv.async_reset`."""
        session = self._session
        session.require_idle("async_reset")
        if options is not None and "reset_mask" in options:
            raise ValueError("async_reset() resets every env: reset_mask is not supported here")
        session.mark_in_flight(session.post_reset(seed, options).seqs)

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Return the first groups done, for the manager's ``recv``.

        This is :meth:`~envmgr.frontend.vector_env.BatchedVectorEnv.recv`; the result is ``(obs,
        rewards, terminations, truncations, infos, env_ids)`` of those groups.
        """
        session = self._session
        backend = session.require_usable("recv")
        inflight = session.state.in_flight
        if not inflight:
            raise NoAsyncCallError("recv() called with no step in flight: send() first", "recv")
        if batch_size is None:
            need = 1
        else:
            batch_size = count("batch_size", batch_size)
            need = _groups_to_wait_for(batch_size, [session.layout.sizes[g] for g in inflight])
        timeout = session.timeout(timeout)
        worker_timers = session.worker_timers
        waited = 0.0
        if timeout is None:
            # The usual case (no deadline; answers all in the batch arrays): no answer
            # objects, the wait timed straight into the "workers" node.
            t0 = perf_counter()
            ready = backend.ready(inflight, need)
            waited = perf_counter() - t0
            if ready is not None:
                worker_timers.wait_node().add_time(waited)
                session.mark_received(ready)
                return session.reader.read_group_rows(ready)  # type: ignore[union-attr,no-any-return]
        with timers.hierarchical_timer("workers", worker_timers.stack) as node:
            node.total += waited
            answers, replaced = session.wait(inflight, timeout, CallKind.STEP, need=need)
        chosen = sorted(answers)
        session.mark_received(chosen)
        ranges = map(session.layout.range, chosen)
        ids = np.concatenate([np.arange(r.start, r.stop) for r in ranges])
        ship = any(a is not None and a.timer_root is not None for a in answers.values())
        obs, rewards, terms, truncs, infos = session.batch_from_answers(
            answers, replaced, ship, ids
        )
        return obs, rewards, terms, truncs, infos, ids


def _groups_to_wait_for(batch_size: int, sizes: list[int]) -> int:
    """Return how many of the in-flight groups (of ``sizes`` envs) to wait for.

    Enough to hold ``batch_size`` envs whichever finish first (so the smallest count), all when
    they hold fewer.
    """
    held = 0
    for k, size in enumerate(sorted(sizes), 1):
        held += size
        if held >= batch_size:
            return k
    return len(sizes)
