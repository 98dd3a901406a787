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
    retire(group, seq)           ------------>  a healthy group stopped for a planned
                                                replacement (recycling); replace() follows
    resident_bytes(group)        <------------  its resident memory, as last read
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
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Command, ErrorResponse, Ready
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.protocol.trees import take_rows

__all__ = ["Backend", "LostGroup", "WaitResult", "remote_exception", "unsendable", "group_shares"]


@dataclass(slots=True)
class LostGroup:
    """A group that died or overran its deadline.

    Attributes:
        reason: What happened, without the group's name (``"it exited with code 3 during step"``).
        failure: The error to raise if the group is not replaced.
    """

    reason: str
    failure: WorkerFailure


@dataclass(slots=True)
class WaitResult:
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
    lost: dict[int, LostGroup] = field(default_factory=dict)
    errors: list[ErrorResponse] = field(default_factory=list)
    fatal: ErrorResponse | None = None
    raised: BaseException | None = None


class Backend(Protocol):
    """What the front end needs from a backend; see the module docstring."""

    layout: Layout

    def start(self) -> list[Ready]:
        """Build every group; return each group's start-up answer, in group order."""
        ...

    def attach(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ragged: Any = None,
        info_row_bytes: int = ROW_BYTES,
    ) -> SharedBuffers:
        """Make the batch arrays, attach the groups to them and return them.

        ``ragged``: the manager's :class:`~envmgr.protocol.ragged_layout.RaggedOptions` for a
        Sequence/Graph space; ``info_row_bytes``: the info columns' bytes per env.
        """
        ...

    def post(self, commands: Mapping[int, Command]) -> None:
        """Send ``commands`` (by group) to their groups, all pickled before any is sent."""
        ...

    def post_step(
        self, groups: Sequence[int], seq: int, ship: bool, actions: Any, ids: np.ndarray | None
    ) -> None:
        """Place a batch step's actions and wake ``groups``: the hot path.

        Args:
            groups: The groups to step.
            seq: The step's sequence number, which the answers echo.
            ship: Whether the groups send their timer trees with the answer.
            actions: The actions of the envs stepped.
            ids: The env indices ``actions`` are for, or ``None`` for the whole batch.
        """
        ...

    def wait(
        self, seqs: Mapping[int, int], timeout: float | None, need: int | None, phase: str
    ) -> WaitResult:
        """Wait for the answers to ``seqs`` (group -> seq) and collect what the groups said.

        Args:
            seqs: The sequence number each group's answer echoes.
            timeout: Seconds to wait at most (``None``: no limit); a group past it is lost.
            need: How many groups to wait for (``None``: all of them).
            phase: What the groups were asked to do, for messages.

        Returns:
            The answers, lost groups and errors found.
        """
        ...

    def wait_step(self, seq: int, timeout: float | None) -> WaitResult | None:
        """Wait for batch step ``seq`` of every group, as :meth:`wait` does.

        Returns ``None`` in the usual case: every group answered, in the batch
        arrays only (no infos, timers, errors or losses). The hot path: no answer
        objects are built for it.
        """
        ...

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """Return the first ``need`` groups done, when their answers are all in the batch arrays.

        First-ready's usual case, without a deadline: the ``need`` groups of ``seqs`` (group ->
        seq) that finished first. ``None`` means "use :meth:`wait`" (a backend may always say
        so).
        """
        ...

    def replace(self, g: int, timeout: float | None) -> Ready | LostGroup:
        """Start a new group in place of group ``g``: its start-up answer, or its loss."""
        ...

    def recyclable(self) -> Sequence[int]:
        """The groups with a process of their own, which recycling may replace."""
        ...

    def retire(self, g: int, seq: int) -> None:
        """Stop healthy group ``g`` for a planned replacement.

        Its envs are closed (``seq``: the command's), within ``close_timeout``; :meth:`replace`
        ends what is left.
        """
        ...

    def resident_bytes(self, g: int) -> int | None:
        """Return group ``g``'s resident set size in bytes, as last read.

        ``None``: not known yet. Called at most every few hundred milliseconds; it must not
        wait.
        """
        ...

    def abandon(self, g: int, why: str) -> bool:
        """Leave group ``g`` lost after an interrupt cut its :meth:`replace` off.

        After an interrupt (not an error), whatever step of the replacement it reached, the
        group is left lost so that the next wait finds it so (saying ``why``) and the front end
        replaces it again. ``False`` if this backend cannot, and the manager is then broken.
        """
        ...

    def where(self, g: int) -> str:
        """Return group ``g``'s name in messages (``"worker 1 (envs 2-3)"``)."""
        ...

    def timer_name(self, g: int) -> str:
        """Return the name of group ``g``'s node in the merged timer tree."""
        ...

    def shutdown(self, graceful: bool) -> None:
        """Stop every group and free the batch arrays; ``graceful``: let the envs close first."""
        ...

    def disown(self) -> None:
        """Forget the groups without stopping them, in a forked child.

        In a child forked from the process that started the groups, the groups are the parent's,
        so nothing at this process's exit may stop them.
        """
        ...


def remote_exception(err: ErrorResponse, where: str, envs: range) -> BaseException:
    """Return the exception a group reported.

    It is of its own type where it unpickles and is an ``Exception``, else a WorkerError.

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
    """Return the error for ``cmd``, which did not pickle (``exc``).

    It names what the caller passed. A backend pickles every command of a call before it sends
    any, so that the groups and the manager are left as they were.
    """
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
