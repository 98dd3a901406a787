"""The user-facing half both managers share: call-order rules, infos, conveniences.

:class:`~envmgr.manager.SubprocessEnvManager` (worker processes) and
:class:`~envmgr.backends.ray.RayEnvManager` (Ray actors) differ in how commands
reach their groups of envs, not in what a caller may do when: both keep one
pending ``*_async`` call (``_pending = (kind, payload)``) and a set of groups
with a ``send()`` step in flight (``_inflight``), and both assemble Gymnasium
vector infos the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
from gymnasium.vector import VectorEnv

from envmgr.errors import AlreadyPendingCallError, ClosedManagerError, NoAsyncCallError

__all__ = ["BatchedVectorEnv", "RESTARTED_INFO_KEY"]

#: Info key of envs whose worker (or actor) was replaced during the call.
RESTARTED_INFO_KEY = "envmgr_restarted"


class BatchedVectorEnv(VectorEnv):  # type: ignore[type-arg]
    """Base of the managers: a ``VectorEnv`` over groups of envs.

    Subclasses set ``num_envs``, ``closed``, ``_broken`` (a reason, or ``None``),
    ``_pending`` and ``_inflight``, and provide :meth:`_where`, :meth:`_env_range`,
    ``call_async`` and ``call_wait``.
    """

    #: What a group is called in messages.
    group_noun = "workers"
    _broken: str | None = None
    _pending: tuple[str, Any] | None = None
    _inflight: dict[int, Any]

    def _where(self, group: int) -> str:
        raise NotImplementedError

    def _env_range(self, group: int) -> range:
        raise NotImplementedError

    # ---------------------------------------------------------------- call order

    def _check_usable(self, name: str) -> None:
        if self._broken is not None:
            raise ClosedManagerError(f"cannot {name}: the manager is broken ({self._broken})")
        if self.closed:
            raise ClosedManagerError(f"cannot {name}: the manager is closed")

    def _check_idle(self, name: str) -> None:
        """Refuse a new call while an ``*_async`` call or ``send()`` steps are outstanding."""
        self._check_usable(name)
        if self._pending is not None:
            kind = self._pending[0]
            raise AlreadyPendingCallError(
                f"cannot {name} while a {kind} call is pending: call {kind}_wait() first", kind
            )
        if self._inflight:
            busy = sorted(self._inflight)
            raise AlreadyPendingCallError(
                f"cannot {name} while {self.group_noun} {busy} have send() steps in flight: "
                "recv() them first",
                "send",
            )

    def _take_pending(self, kind: str) -> Any:
        """End the pending ``kind`` call; returns what its ``*_async`` stored."""
        self._check_usable(f"{kind}_wait")
        if self._pending is None or self._pending[0] != kind:
            raise NoAsyncCallError(
                f"{kind}_wait() called without a pending {kind}_async()"
                + ("" if self._pending is None else f" (a {self._pending[0]} call is pending)"),
                kind,
            )
        payload = self._pending[1]
        self._pending = None
        return payload

    # ---------------------------------------------------------------- infos

    def _vector_infos(
        self, per_env: Iterable[tuple[int, dict[str, Any]]], rows: np.ndarray | None = None
    ) -> dict[str, Any]:
        """Gymnasium's vector info dict from ``(global env index, info)`` pairs.

        Built with gymnasium's own ``_add_info`` over the whole batch, then cut to
        ``rows`` when only some envs are returned (``recv``).
        """
        infos: dict[str, Any] = {}
        for i, info in per_env:
            infos = self._add_info(infos, info, i)
        return infos if rows is None else _rows_of_info(infos, rows)

    def _restart_infos(self, replaced: dict[int, str]) -> Iterable[tuple[int, dict[str, Any]]]:
        """The ``envmgr_restarted`` info of every env of each replaced group."""
        for group, reason in replaced.items():
            note = {RESTARTED_INFO_KEY: f"{self._where(group)}: {reason}"}
            for i in self._env_range(group):
                yield i, note

    # ---------------------------------------------------------------- conveniences

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) on every env; one result per env."""
        self.call_async(name, *args, **kwargs)
        return self.call_wait()  # type: ignore[no-any-return]

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        raise NotImplementedError

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Read attribute ``name`` of every env."""
        return self.call(name)

    def render(self) -> tuple[Any, ...]:
        """Each env's ``render()`` result."""
        return self.call("render")

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _rows_of_info(infos: dict[str, Any], rows: np.ndarray) -> dict[str, Any]:
    """The vector info dict restricted to envs ``rows`` (arrays indexed, nests recursed)."""
    out: dict[str, Any] = {}
    for k, v in infos.items():
        if isinstance(v, dict):
            out[k] = _rows_of_info(v, rows)
        elif isinstance(v, np.ndarray):
            out[k] = v[rows]
        else:
            out[k] = v
    return out
