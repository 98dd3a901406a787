"""Commands in, answers out: how a worker process or a Ray actor serves its EnvGroup.

:func:`serve` carries out one command of :mod:`envmgr.protocol.messages` on an
:class:`~envmgr.envside.group.EnvGroup` and builds its answer; the error helpers turn
an exception into the :class:`~envmgr.protocol.messages.ErrorResponse` the parent
re-raises. Shared by :func:`envmgr.backends.local.worker.worker_main` and the Ray actor, so the
two wrappers hold no env logic of their own.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import cloudpickle

from envmgr.envside.group import BuildFailed, EnvGroup, GroupSpec, Infos
from envmgr.errors import format_remote_exception
from envmgr.protocol.messages import (
    Ack,
    Apply,
    Call,
    CallResponse,
    Command,
    ErrorResponse,
    FlushTimers,
    Reset,
    Response,
    SetAttr,
    Step,
    StepResponse,
)
from envmgr.protocol.ragged import RaggedStore
from envmgr.protocol.ragged_read import read_store

__all__ = [
    "serve",
    "serve_step",
    "error_response",
    "command_error",
    "build_error",
    "spec_error",
    "unreadable_command",
    "UNPICKLING_FACTORIES",
]

#: The start-up phase of a group whose spec did not unpickle where it was sent.
UNPICKLING_FACTORIES = "make (unpickling the env factories)"


def serve(group: EnvGroup, cmd: Command, with_arrays: bool = False) -> Response | None:
    """Carry out one command on ``group`` and return its answer.

    ``None`` answers a step or reset whose whole result is in the group's rows of
    the batch arrays (no infos, timers or observations to carry): the usual step.

    Args:
        group: The group.
        cmd: A :class:`Step`, :class:`Reset`, :class:`Call`, :class:`SetAttr`,
            :class:`Apply` or :class:`FlushTimers`.
        with_arrays: Put the group's rows of the batch arrays in the answer (a
            backend without shared memory).
    """
    if isinstance(cmd, Step):
        return serve_step(group, cmd.seq, cmd.ship_timers, cmd.actions, with_arrays)
    if isinstance(cmd, Reset):
        group.timers.calls += 1
        infos = _within(
            group, "reset", group.reset, cmd.seeds, cmd.options, cmd.mask, cmd.autoreset_next
        )
        if group.info_writer is not None and not group.writes_info_columns:
            infos = group.info_writer.split(infos)
        return _answer(group, cmd.seq, infos, cmd.ship_timers, with_arrays)
    if isinstance(cmd, Call):
        return CallResponse(
            group.index, cmd.seq, group.call(cmd.name, cmd.args, cmd.kwargs, cmd.env_ids)
        )
    if isinstance(cmd, Apply):
        fn = cloudpickle.loads(cmd.fn)
        return CallResponse(
            group.index, cmd.seq, group.apply(fn, cmd.args, cmd.kwargs, cmd.env_ids)
        )
    if isinstance(cmd, SetAttr):
        group.set_attr(cmd.name, cmd.values, cmd.env_ids)
        return Ack(group.index, cmd.seq)
    if isinstance(cmd, FlushTimers):
        # Without shared memory the per-env step times travel in the answer; the batch's
        # rows do not (the parent has them from the last step or reset).
        return _answer(group, cmd.seq, [], True, with_arrays, rows=False)
    raise TypeError(f"group {group.index}: unknown command {cmd!r}")


def serve_step(
    group: EnvGroup, seq: int, ship_timers: bool, actions: Any, with_arrays: bool = False
) -> Response | None:
    """:func:`serve` of ``Step(seq, ship_timers, actions)``, without building the command.

    ``actions``: ``None`` when they are in the group's rows of the batch arrays or its action
    store; a store (of a Sequence/Graph action space) is read into Gymnasium's batch form.
    """
    # A shipped root's count: the steps and resets it served (what the parent's
    # "workers" node counts), not the number of shipments.
    timers = group.timers
    timers.calls += 1
    if actions is None:
        actions = group.views["actions"]
    if actions.__class__ is RaggedStore:
        actions = read_store(actions)
    # _within(group, "step", ...), inlined: this runs once per batch step.
    stack = timers.stack
    stack.push("step")
    try:
        infos = group.step(actions)
    finally:
        stack.pop()
    writer = group.info_writer
    if writer is not None:
        if not group.writes_info_columns:
            infos = writer.split(infos)
        if writer.unacked:
            return _answer(group, seq, infos, ship_timers, with_arrays)
    if not (infos or ship_timers or with_arrays) and group.shared_obs:
        return None  # the usual step: everything is in the group's rows of the arrays
    return _answer(group, seq, infos, ship_timers, with_arrays)


def _within(group: EnvGroup, name: str, run: Callable[..., Infos], *args: Any) -> Infos:
    """Run with timer ``name`` open, so env code's own timers nest there.

    The node's time is added by ``run`` itself; the stack only places children.
    """
    stack = group.timers.stack
    stack.push(name)
    try:
        return run(*args)
    finally:
        stack.pop()


def _answer(
    group: EnvGroup,
    seq: int,
    infos: Infos,
    ship_timers: bool,
    with_arrays: bool,
    rows: bool = True,
) -> StepResponse | None:
    """The answer, or ``None`` when the batch arrays say it all.

    ``with_arrays``: carry the group's rows of the batch arrays (``rows``) and, with the
    timers, its per-env step times (a backend without shared memory).
    """
    writer = group.info_writer
    schema = writer.schema() if writer is not None and writer.unacked else None
    if not (infos or ship_timers or with_arrays or schema) and group.shared_obs:
        return None
    root = gauges = None
    if ship_timers:
        root, gauges = group.take_timers()
    views = group.views
    shared_obs = group.shared_obs
    observations = None if shared_obs else group.observations()
    arrays = None
    if with_arrays:
        arrays = (
            views["observations"] if shared_obs and rows else None,
            views["rewards"] if rows else None,
            views["terminations"] if rows else None,
            views["truncations"] if rows else None,
            views["env_seconds"] if ship_timers else None,
            views["env_steps"] if ship_timers else None,
        )
    return StepResponse(group.index, seq, tuple(infos), observations, root, gauges, arrays, schema)


def error_response(
    index: int, seq: int, env_index: int | None, phase: str, exc: BaseException
) -> ErrorResponse:
    """The answer carrying ``exc`` (pickled when it can be) and its traceback."""
    try:
        payload: bytes | None = cloudpickle.dumps(exc)
        pickle.loads(payload)  # type: ignore[arg-type]  # would fail in the parent too
    except Exception:
        payload = None
    return ErrorResponse(
        worker_index=index,
        seq=seq,
        env_index=env_index,
        phase=phase,
        exception=payload,
        type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback=format_remote_exception(exc),
    )


def unsendable_answer(index: int, answer: Any, phase: str, exc: BaseException) -> ErrorResponse:
    """Return what group ``index`` sends instead of an ``answer`` that failed to pickle.

    ``exc`` is the pickling error (an info or call result that cannot leave the process).
    """
    seq = getattr(answer, "seq", -1)
    return error_response(index, seq, None, f"{phase} (sending the result)", exc)


def command_error(group: EnvGroup, cmd: Command, exc: BaseException) -> ErrorResponse:
    """The answer to ``cmd`` that raised ``exc``, naming the env that ran."""
    env = group.current_env
    group.current_env = None
    phase = type(cmd).__name__.lower()
    if isinstance(cmd, Call):
        phase = f"call({cmd.name!r})"
    return error_response(
        group.index, cmd.seq, None if env is None else group.offset + env, phase, exc
    )


def build_error(spec: GroupSpec, failed: BuildFailed) -> ErrorResponse:
    """The start-up answer of a group whose build failed."""
    env = None if failed.env is None else spec.offset + failed.env
    return error_response(spec.index, -1, env, "make", failed.exc)


def spec_error(index: int, exc: BaseException) -> ErrorResponse:
    """The start-up answer of group ``index`` whose spec failed to unpickle with ``exc``.

    The cause: a factory, wrapper or env class from a module this process cannot import.
    """
    return error_response(index, -1, None, UNPICKLING_FACTORIES, exc)


def unreadable_command(index: int, exc: BaseException) -> ErrorResponse:
    """The answer of group ``index`` to a command that failed to unpickle with ``exc``.

    The cause: an argument of a class this process cannot import. Its ``seq`` and
    ``phase`` are not known here: the receiver stamps them, as it knows which call this
    answers.
    """
    return error_response(index, -1, None, "reading the command", exc)
