"""The small protocol between the front end and a backend (processes, or Ray actors).

The front end (:class:`~envmgr.frontend.vector_env.BatchedVectorEnv`) holds the public API,
call order, restart policy, infos and timers; a backend only moves commands to
groups of envs and answers back::

    front end                                   backend
    ---------                                   -------
    start()                      ------------>  build every group, return their Ready
    attach(spaces)               ------------>  the batch arrays (shared memory or private)
    post({group: command})       ------------>  pickled commands to some groups
    post_step(groups, seq, ...)  ------------>  the hot path: actions in, groups woken
    ready(seqs, need)            <------------  first-ready's hot path: the first groups
                                                done, all in the arrays (else None: wait)
    wait_step(seq, timeout)      <------------  None: the batch is in the arrays, nothing
                                                more to say (else as wait)
    wait(seqs, timeout, need)    <------------  answers, lost groups, errors
    replace(group)               ------------>  a new group in place of a lost one (its Ready)
    abandon(group, why)          ------------>  a replace cut off (Ctrl-C): leave the group
                                                lost, to be replaced at the next call
    shutdown(graceful)           ------------>  stop everything, free the arrays

Answers of steps and resets land in the batch arrays before :meth:`Backend.wait`
returns (in place through shared memory, or copied out of the answers), so the
front end reads a batch the same way whatever the backend.
"""

from __future__ import annotations

import pickle
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from envmgr.errors import WorkerError, WorkerFailure, add_note
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Command, ErrorResponse, Ready
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.protocol.trees import take_rows

__all__ = ["Backend", "Lost", "Waited", "remote_exception", "unsendable", "group_shares"]


@dataclass(slots=True)
class Lost:
    """A group that died or overran its deadline.

    Attributes:
        reason: What happened, without the group's name (``"it exited with code 3 during step"``).
        failure: The error to raise if the group is not replaced.
    """

    reason: str
    failure: WorkerFailure


@dataclass(slots=True)
class Waited:
    """What :meth:`Backend.wait` found.

    Attributes:
        answers: Answer by group (``None``: a step answered in shared memory only).
        lost: Groups that died or overran.
        errors: Exceptions the groups' envs raised (the groups live on).
        fatal: An exception after which its group exited: the manager breaks.
        raised: An exception an env stepped in this process raised (``caller_envs``);
            re-raised as is, its group counted among ``answers`` as done.
    """

    answers: dict[int, Any] = field(default_factory=dict)
    lost: dict[int, Lost] = field(default_factory=dict)
    errors: list[ErrorResponse] = field(default_factory=list)
    fatal: ErrorResponse | None = None
    raised: BaseException | None = None


class Backend(Protocol):
    """What the front end needs from a backend; see the module docstring."""

    layout: Layout

    def start(self) -> list[Ready]: ...

    def attach(
        self, observation_space: gym.Space[Any], action_space: gym.Space[Any]
    ) -> SharedBuffers: ...

    def post(self, commands: Mapping[int, Command]) -> None: ...

    def post_step(
        self, groups: Sequence[int], seq: int, ship: bool, actions: Any, ids: np.ndarray | None
    ) -> None: ...

    def wait(
        self, seqs: Mapping[int, int], timeout: float | None, need: int | None, phase: str
    ) -> Waited: ...

    def wait_step(self, seq: int, timeout: float | None) -> Waited | None:
        """Wait for batch step ``seq`` of every group, as :meth:`wait` does.

        Returns ``None`` in the usual case: every group answered, in the batch
        arrays only (no infos, timers, errors or losses). The hot path: no answer
        objects are built for it.
        """
        ...

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """First-ready's usual case, without a deadline: the ``need`` groups of ``seqs``
        (group -> seq) that finished first, when their answers are all in the batch
        arrays; ``None`` means "use :meth:`wait`" (a backend may always say so)."""
        ...

    def replace(self, g: int, timeout: float | None) -> Ready | Lost: ...

    def abandon(self, g: int, why: str) -> bool:
        """After an interrupt (not an error) cut :meth:`replace` of group ``g`` off: leave
        the group lost, whatever step of the replacement it reached, so that the next
        wait finds it so (saying ``why``) and the front end replaces it again. ``False``
        if this backend cannot, and the manager is then broken."""
        ...

    def where(self, g: int) -> str: ...

    def timer_name(self, g: int) -> str: ...

    def shutdown(self, graceful: bool) -> None: ...

    def disown(self) -> None:
        """In a child forked from the process that started the groups: forget them without
        stopping them (they are the parent's), so that nothing at this process's exit does."""
        ...


def remote_exception(err: ErrorResponse, where: str, envs: range) -> BaseException:
    """The exception a group reported, as its own type where it unpickles and is an
    ``Exception``, else a WorkerError.

    A note names the group, the env and the phase, and another the fix when ``err`` knows
    one; raise it ``from RemoteTraceback(err.traceback)``.
    """
    w = err.worker_index
    where = (
        f"{where}{'' if err.env_index is None else f', env {err.env_index}'}, during {err.phase}"
    )
    exc: BaseException | None = None
    if err.exception is not None:
        try:
            exc = pickle.loads(err.exception)
        except Exception:
            exc = None
    # Only an Exception is raised as itself: a SystemExit or KeyboardInterrupt that env
    # code raised in a worker would end the caller's program, or pass for its own Ctrl-C.
    if not isinstance(exc, Exception):
        fix = f"; {err.fix}" if err.fix else ""
        return WorkerError(
            f"{where}: {err.type_name}: {err.message}{fix}", w, envs, err.type_name, err.env_index
        )
    add_note(exc, f"raised in envmgr {where}")
    if err.fix:
        add_note(exc, f"fix: {err.fix}")
    for attr, value in (("worker_index", w), ("env_index", err.env_index)):
        try:
            setattr(exc, attr, value)
        except Exception:
            pass
    return exc


#: What each command carries from the caller, for the message when it does not pickle.
_CARRIES = {
    "Reset": "reset()'s options",
    "Call": "the call's arguments",
    "Apply": "apply()'s arguments",
    "SetAttr": "set_attr()'s values",
    "Step": "the actions",
}


def unsendable(cmd: Any, exc: Exception) -> ValueError:
    """The error for ``cmd``, which did not pickle (``exc``): it names what the caller
    passed. A backend pickles every command of a call before it sends any, so that the
    groups and the manager are left as they were."""
    what = _CARRIES.get(type(cmd).__name__, type(cmd).__name__)
    return ValueError(f"{what} cannot be sent to the workers: {exc}")


def group_shares(
    space: gym.Space[Any],
    actions: Any,
    layout: Layout,
    groups: Sequence[int],
    ids: np.ndarray | None,
) -> dict[int, Any]:
    """Each group's rows of a batch of actions (``ids``: the global env of each row)."""
    if ids is None:
        return {g: take_rows(space, actions, slice(*_bounds(layout, g))) for g in groups}
    owner = layout.group_of(ids)
    shares = {}
    for g in groups:
        rows = np.flatnonzero(owner == g)
        shares[g] = take_rows(space, actions, rows[np.argsort(ids[rows])])
    return shares


def _bounds(layout: Layout, g: int) -> tuple[int, int]:
    r = layout.range(g)
    return r.start, r.stop
