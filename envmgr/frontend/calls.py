"""Calls: the pending-call state, and ``call`` / ``get_attr`` / ``set_attr`` / ``apply``.

A manager has at most one pending ``*_async`` call, described by a typed
:class:`PendingCall` (like Gymnasium's ``AsyncState``); ``send()`` steps in
flight are tracked per group apart from it (a group -> sequence number map),
since several may be outstanding. :class:`CallsMixin` is the front end's
per-env call API: only the groups owning the chosen envs are contacted.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Protocol

import cloudpickle
import numpy as np

from envmgr.backends.base import Backend
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Apply, Call, SetAttr

__all__ = ["CallKind", "PendingCall", "CallsMixin", "targets_of"]


class CallKind(Enum):
    """What a pending ``*_async`` call was."""

    RESET = "reset"
    STEP = "step"
    CALL = "call"


@dataclass(slots=True)
class PendingCall:
    """A call sent to some groups whose answers are not read yet.

    Attributes:
        kind: What the call was.
        seqs: Sequence number each group's answer will echo, by group.
        ship: Whether the groups ship their timer trees with the answers.
        commands: The command sent to each group, to send again to a replacement
            (resets only).
        phase: How messages name the call (``"step"``, ``"call('render')"``).
        order: For calls: ``(group, position in the group's answer)`` per result.
    """

    kind: CallKind
    seqs: dict[int, int]
    ship: bool = False
    commands: dict[int, Any] | None = None
    phase: str = ""
    order: tuple[tuple[int, int], ...] | list[tuple[int, int]] = ()


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
    ids = np.asarray(env_ids, dtype=np.int64).reshape(-1)
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


class _FrontEnd(Protocol):
    """What :class:`CallsMixin` uses of the front end."""

    num_envs: int
    step_timeout: float | None
    _layout: Layout
    _pending: PendingCall | None

    def _check_idle(self, name: str) -> Backend: ...
    def _take_pending(self, kind: CallKind) -> PendingCall: ...
    def _next_seq(self) -> int: ...
    def _timeout(self, timeout: float | None) -> float | None: ...
    def _await(
        self, seqs: dict[int, int], timeout: float | None, phase: str
    ) -> tuple[dict[int, Any], Any]: ...
    def _post_call(
        self,
        name: str,
        phase: str,
        env_ids: Sequence[int] | None,
        make: Callable[[int, int, tuple[int, ...] | None], Any],
    ) -> PendingCall: ...
    def call_async(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> None: ...
    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]: ...
    def call(
        self, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]: ...


class CallsMixin:
    """The per-env call API of :class:`~envmgr.frontend.vector_env.BatchedVectorEnv`."""

    _pending: PendingCall | None = None

    def call_async(
        self: _FrontEnd, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> None:
        """Send :meth:`call` to the groups without waiting (as ``AsyncVectorEnv``)."""
        self._pending = self._post_call(
            "call_async",
            f"call({name!r})",
            env_ids,
            lambda g, seq, ids: Call(seq, name, args, kwargs, ids),
        )

    def call_wait(self: _FrontEnd, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call sent by :meth:`call_async`; one result per env."""
        call = self._take_pending(CallKind.CALL)
        answers, _ = self._await(call.seqs, self._timeout(timeout), call.phase)
        return tuple(answers[g].results[k] for g, k in call.order)

    def call(
        self: _FrontEnd, name: str, *args: Any, env_ids: Sequence[int] | None = None, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of each env (of ``env_ids``).

        Only the groups owning the chosen envs are contacted. Returns one result per
        env, in ``env_ids`` order.
        """
        self.call_async(name, *args, env_ids=env_ids, **kwargs)
        return self.call_wait()

    def get_attr(
        self: _FrontEnd, name: str, env_ids: Sequence[int] | None = None
    ) -> tuple[Any, ...]:
        """Read attribute ``name`` of each env (of ``env_ids``)."""
        return self.call(name, env_ids=env_ids)

    def render(self: _FrontEnd) -> tuple[Any, ...]:
        """Each env's ``render()`` result."""
        return self.call("render")

    def apply(
        self: _FrontEnd,
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

    def set_attr(
        self: _FrontEnd, name: str, values: Any, env_ids: Sequence[int] | None = None
    ) -> None:
        """Set attribute ``name`` of each env (of ``env_ids``): one value for all, or a list/tuple
        with one per chosen env."""
        n = self.num_envs if env_ids is None else len(env_ids)
        if not isinstance(values, (list, tuple)):
            values = [values] * n
        if len(values) != n:
            if env_ids is None:  # AsyncVectorEnv's message
                raise ValueError(
                    "Values must be a list or tuple with length equal to the number of "
                    f"environments. Got `{len(values)}` values for {n} environments."
                )
            raise ValueError(f"got {len(values)} values for {n} envs (env_ids)")
        targets, order = targets_of(self._layout, env_ids)
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
        self: _FrontEnd,
        name: str,
        phase: str,
        env_ids: Sequence[int] | None,
        make: Callable[[int, int, tuple[int, ...] | None], Any],
    ) -> PendingCall:
        backend = self._check_idle(name)
        targets, order = targets_of(self._layout, env_ids)
        seq = self._next_seq()
        commands = {g: make(g, seq, ids) for g, ids in targets.items()}
        backend.post(commands)
        return PendingCall(CallKind.CALL, dict.fromkeys(commands, seq), phase=phase, order=order)
