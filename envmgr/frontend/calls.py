"""Per-env calls: ``call`` / ``get_attr`` / ``set_attr`` / ``apply``, a part of the front end.

:class:`Calls` holds the manager's :class:`~envmgr.frontend.session.Session` and
goes through it: a call is pending in the session's one state between
``call_async`` and ``call_wait``. Only the groups owning the chosen envs are
contacted, and each env's result is put back in ``env_ids`` order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import numpy as np

from envmgr.frontend.session import Session
from envmgr.frontend.state import CallKind, PendingCall
from envmgr.protocol.layout import Layout, env_indices
from envmgr.protocol.messages import Apply, Call, SetAttr

__all__ = ["Calls", "targets_of"]

#: Builds the command for one group: ``(group, seq, its local env ids or None) -> command``.
_Make = Callable[[int, int, tuple[int, ...] | None], Any]


def targets_of(
    layout: Layout, env_ids: Sequence[int] | np.ndarray | None
) -> tuple[dict[int, tuple[int, ...] | None], list[tuple[int, int]]]:
    """The groups a per-env call goes to, and where each env's result will be.

    Returns:
        ``{group: local ids (None: all its envs)}`` for the groups owning the chosen
        envs, and ``(group, position in its answer)`` per chosen env, in ``env_ids`` order.

    Raises:
        ValueError: An id out of range.
    """
    if env_ids is None:
        groups = range(layout.n_groups)
        return dict.fromkeys(groups), [(g, i) for g in groups for i in range(layout.sizes[g])]
    ids = env_indices(env_ids).reshape(-1)
    if ids.size and (ids.min() < 0 or ids.max() >= layout.num_envs):
        raise ValueError(
            f"env_ids must be env indices in [0, {layout.num_envs}), got {ids.tolist()}"
        )
    local: dict[int, list[int]] = {}
    order = []
    for i, g in zip(ids.tolist(), layout.group_of(ids).tolist(), strict=True):
        mine = local.setdefault(g, [])
        order.append((g, len(mine)))
        mine.append(i - layout.starts[g])
    return {g: tuple(v) for g, v in local.items()}, order


class Calls:
    """The per-env call API of a manager, over its session.

    Args:
        session: The manager's session.
    """

    def __init__(self, session: Session) -> None:
        self._session = session

    def call_async(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> None:
        """Send ``call(name, ...)`` to the groups without waiting."""
        call = self._post(
            "call_async",
            f"call({name!r})",
            env_ids,
            lambda g, seq, ids: Call(seq, name, args, kwargs, ids),
        )
        self._session.begin(call)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call sent by :meth:`call_async`; one result per env."""
        session = self._session
        timeout = session.timeout(timeout)  # a bad one is refused with the call still pending
        call = session.take(CallKind.CALL)
        answers, _ = session.wait(call.seqs, timeout, call.kind, call.label)
        return tuple(answers[g].results[k] for g, k in call.order)

    def call(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of each chosen env."""
        self.call_async(name, *args, env_ids=env_ids, **kwargs)
        return self.call_wait()

    def apply(
        self,
        fn: Callable[..., Any],
        *args: Any,
        env_ids: Sequence[int] | None = None,
        **kwargs: Any,
    ) -> tuple[Any, ...]:
        """Run ``fn(env, *args, **kwargs)`` where each chosen env lives (``fn`` cloudpickled)."""
        try:
            blob = cloudpickle.dumps(fn)
        except Exception as exc:
            raise ValueError(f"apply(): {fn!r} cannot be pickled: {exc}") from exc
        call = self._post(
            "apply", "apply", env_ids, lambda g, seq, ids: Apply(seq, blob, args, kwargs, ids)
        )
        self._session.begin(call)
        return self.call_wait()

    def set_attr(self, name: str, values: Any, env_ids: Sequence[int] | None = None) -> None:
        """Set attribute ``name`` of each chosen env: one value for all, or one per env."""
        session = self._session
        n = session.layout.num_envs if env_ids is None else len(env_ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * n
        if len(values) != n:
            if env_ids is None:  # AsyncVectorEnv's message
                raise ValueError(
                    "Values must be a list or tuple with length equal to the number of "
                    f"environments. Got `{len(values)}` values for {n} environments."
                )
            raise ValueError(f"got {len(values)} values for {n} envs (env_ids)")
        targets, order = targets_of(session.layout, env_ids)
        per_group: dict[int, list[Any]] = {g: [] for g in targets}
        for (g, _), v in zip(order, values, strict=True):
            per_group[g].append(v)
        call = self._post(
            "set_attr",
            "set_attr",
            env_ids,
            lambda g, seq, ids: SetAttr(seq, name, tuple(per_group[g]), ids),
        )
        session.wait(call.seqs, session.step_timeout, call.kind, call.label)

    def _post(
        self, name: str, label: str, env_ids: Sequence[int] | None, make: _Make
    ) -> PendingCall:
        """Send ``make``'s command to each group owning a chosen env (refused unless idle)."""
        session = self._session
        backend = session.require_idle(name)
        targets, order = targets_of(session.layout, env_ids)
        seq = session.next_seq()
        commands = {g: make(g, seq, ids) for g, ids in targets.items()}
        backend.post(commands)
        return PendingCall(
            CallKind.CALL, dict.fromkeys(commands, seq), label=label, order=tuple(order)
        )
