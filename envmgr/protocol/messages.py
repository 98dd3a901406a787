"""Every message that crosses the parent/worker boundary, as small frozen dataclasses.

Commands flow parent -> worker over the worker's pipe; each carries a sequence
number ``seq`` that the answer echoes, so an answer that arrives late (after a
timeout, say) can never be taken for the answer to a newer command.

Per step only the :class:`Step` command and the :class:`StepResponse` are
pickled; observations, actions, rewards and done flags live in shared memory
(see :mod:`envmgr.protocol.shared_memory`) unless a space cannot, in which case they ride
along in ``Step.actions`` / ``StepResponse.observations``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from operator import attrgetter
from typing import Any, TypeVar

import gymnasium as gym

from envmgr.protocol.info_columns import Schema
from envmgr.protocol.ragged_layout import RaggedLayout
from envmgr.protocol.shared_memory import SharedLayout
from envmgr.timers import GaugeNode, TimerNode

__all__ = [
    "WorkerConfig",
    "Attach",
    "AttachRagged",
    "Step",
    "Reset",
    "Call",
    "Apply",
    "SetAttr",
    "FlushTimers",
    "Close",
    "Command",
    "Ready",
    "Ack",
    "StepResponse",
    "CallResponse",
    "ErrorResponse",
    "Response",
]


_T = TypeVar("_T")


def _fast_pickle(cls: type[_T]) -> type[_T]:
    """Pickle a frozen dataclass as ``cls(*fields)``.

    The default for frozen slotted dataclasses restores state field by field
    through ``object.__setattr__``, which costs several microseconds per
    message; this halves it on the per-step path.
    """
    getter = attrgetter(*(f.name for f in fields(cls)))  # type: ignore[arg-type]
    single = len(fields(cls)) == 1  # type: ignore[arg-type]

    def __reduce__(self: Any) -> tuple[Any, tuple[Any, ...]]:
        values = getter(self)
        return (cls, (values,) if single else values)

    cls.__reduce__ = __reduce__  # type: ignore[method-assign,assignment]
    return cls


# --------------------------------------------------------------------------- start-up


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """Everything a worker process needs to start, passed as its single argument.

    Attributes:
        worker_index: This worker's index in the manager.
        group: The worker's :class:`~envmgr.envside.group.GroupSpec`, cloudpickled
            (lambdas and closures travel).
        spin_seconds: How long to busy-poll for a command before blocking.
        manager_pid: Pid of the manager process, checked to exit when it is gone.
        fds_to_close: Inherited descriptors a forked worker closes at once (the
            parent's ends of earlier workers' pipes), so end-of-file works.
        layout: Shared-memory layout to attach to at start (restarts); ``None``
            on first start, when the parent sends :class:`Attach` after
            :class:`Ready`.
        ragged: The worker's store of a Sequence/Graph observation space, with ``layout``.
        actions: The worker's store of a Sequence/Graph action space, with ``layout``.
        death_signal: Ask the kernel to kill the worker when its parent exits
            (Linux). Only sound when the manager was created on the main thread:
            the signal follows the creating *thread*, not the process.
    """

    worker_index: int
    group: bytes
    spin_seconds: float
    manager_pid: int
    fds_to_close: tuple[int, ...] = ()
    layout: SharedLayout | None = None
    death_signal: bool = False
    ragged: RaggedLayout | None = None
    actions: RaggedLayout | None = None


# --------------------------------------------------------------------------- commands


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Attach:
    """Attach to the manager's shared memory (sent once, after :class:`Ready`).

    It also attaches to the group's stores of a Sequence/Graph observation space (``ragged``)
    and action space (``actions``).
    """

    seq: int
    layout: SharedLayout
    ragged: RaggedLayout | None = None
    actions: RaggedLayout | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class AttachRagged:
    """Write observations into this re-laid (larger) store from now on; answered by Ack."""

    seq: int
    layout: RaggedLayout


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Step:
    """Step every env of the worker with the actions already in shared memory.

    Attributes:
        seq: Sequence number the answer echoes.
        ship_timers: Send the worker's accumulated timer tree with the answer.
        actions: The group's actions, only when the action space cannot live in
            shared memory (the fallback transport), or its private
            :class:`~envmgr.protocol.ragged.RaggedStore` of a Sequence/Graph action space
            (a Ray actor's).
        actions_layout: The store of a Sequence/Graph action space to map (a re-laid one)
            before the actions are read from it.
    """

    seq: int
    ship_timers: bool = False
    actions: Any = None
    actions_layout: RaggedLayout | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Reset:
    """Reset the worker's envs.

    Attributes:
        seq: Sequence number the answer echoes.
        seeds: One seed (or ``None``) per env of the worker.
        options: Passed to every ``env.reset`` unchanged.
        mask: Which of the worker's envs to reset; ``None`` resets all.
        ship_timers: Send the worker's accumulated timer tree with the answer.
        autoreset_next: Reset the envs once more on the next step (after a
            restart in next-step autoreset mode, the step after the truncation
            starts a new episode, as it would for any truncation).
    """

    seq: int
    seeds: tuple[int | None, ...]
    options: dict[str, Any] | None = None
    mask: tuple[bool, ...] | None = None
    ship_timers: bool = True
    autoreset_next: bool = False


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Call:
    """Call a method (or read an attribute) on the envs ``env_ids`` (local; ``None``: all)."""

    seq: int
    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_ids: tuple[int, ...] | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Apply:
    """Run ``fn(env, *args, **kwargs)`` (``fn`` cloudpickled) on the envs ``env_ids``."""

    seq: int
    fn: bytes
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    env_ids: tuple[int, ...] | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class SetAttr:
    """Set an attribute on the envs ``env_ids`` (local; ``None``: all), one value per env."""

    seq: int
    name: str
    values: tuple[Any, ...]
    env_ids: tuple[int, ...] | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class FlushTimers:
    """Send the timer tree accumulated since the last one shipped."""

    seq: int


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Close:
    """Close the envs and exit."""

    seq: int


Command = Attach | AttachRagged | Step | Reset | Call | Apply | SetAttr | FlushTimers | Close


# --------------------------------------------------------------------------- answers


@dataclass(frozen=True, slots=True)
class Ready:
    """Sent once by a worker whose envs were all built.

    Attributes:
        worker_index: The worker's index.
        pid: The worker's process id.
        observation_space: The single-env observation space (the same for all its envs).
        action_space: The single-env action space (the same for all its envs).
        metadata: The first env's ``metadata``.
        render_mode: The first env's ``render_mode``.
        spec: The first env's ``spec`` (may be ``None``).
        timer_root: The worker's start-up tree (``make_envs`` below it), merged as its
            own node in the parent; its count is 1.
        gauges: Gauges set during start-up.
    """

    worker_index: int
    pid: int
    observation_space: gym.Space[Any]
    action_space: gym.Space[Any]
    metadata: dict[str, Any]
    render_mode: str | None
    spec: Any
    timer_root: TimerNode | None = None
    gauges: dict[str, GaugeNode] | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class Ack:
    """A command that returns nothing was carried out."""

    worker_index: int
    seq: int


@_fast_pickle
@dataclass(frozen=True, slots=True)
class StepResponse:
    """A worker's answer to :class:`Step`, :class:`Reset` and :class:`FlushTimers`.

    Attributes:
        worker_index: The worker's index.
        seq: The command's sequence number.
        infos: ``(local env index, info)`` for each env whose info dict is not empty.
        observations: Per-env observations, only under the fallback transport; for a
            Sequence/Graph space, the :class:`~envmgr.protocol.ragged.RaggedSpill` of the
            rows its store could not hold.
        timer_root: The worker's timer tree since the last one shipped, or ``None``
            when the command did not ask for it.
        gauges: The worker's gauges since the last shipment.
        arrays: The group's rows of the batch, from a backend without shared
            memory: ``(observations or None, rewards, terminations, truncations,
            env_seconds or None, env_steps or None)``; a timers flush carries the
            step times alone (the first four ``None``).
        info_schema: The group's info columns, until the parent reads with them
            (:mod:`envmgr.protocol.info_columns`); ``None``: unchanged.
    """

    worker_index: int
    seq: int
    infos: tuple[tuple[int, dict[str, Any]], ...] = ()
    observations: Any = None
    timer_root: TimerNode | None = None
    gauges: dict[str, GaugeNode] | None = None
    arrays: tuple[Any, ...] | None = None
    info_schema: Schema | None = None


@_fast_pickle
@dataclass(frozen=True, slots=True)
class CallResponse:
    """Per-env results of :class:`Call`, in the worker's env order."""

    worker_index: int
    seq: int
    results: tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class ErrorResponse:
    """An exception raised in the worker while it carried out a command.

    Attributes:
        worker_index: The worker's index.
        seq: The command's sequence number (``-1`` during start-up).
        env_index: Global index of the env that raised, if one did.
        phase: What the worker was doing (``"make"``, ``"step"``, ``"reset"``, ...).
        exception: The pickled exception, or ``None`` when it could not be pickled.
        type_name: Qualified name of the exception's type.
        message: ``str()`` of the exception.
        traceback: The formatted remote traceback.
        fix: What the caller can do about it, when the receiving side knows (a module the
            remote side could not import); ``""`` if nothing is known.
    """

    worker_index: int
    seq: int
    env_index: int | None
    phase: str
    exception: bytes | None
    type_name: str
    message: str
    traceback: str
    fix: str = ""


Response = Ready | Ack | StepResponse | CallResponse | ErrorResponse
