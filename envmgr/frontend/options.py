"""The keyword arguments both managers take, documented once (:class:`FrontEndOptions`)."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from numbers import Integral, Real
from typing import Any, Literal, TypedDict, overload

from gymnasium.vector import AutoresetMode, VectorEnv

from envmgr.frontend.action_checks import check_mode
from envmgr.protocol.ragged_layout import RAGGED_MODES, RaggedOptions

__all__ = [
    "FrontEndOptions",
    "check_options",
    "count",
    "memory_size",
    "seconds",
    "ragged_options",
    "DEFAULT_START_TIMEOUT",
    "DEFAULT_TIMER_INTERVAL",
]


#: Seconds a group may take to build its envs, by default.
DEFAULT_START_TIMEOUT = 120.0
#: How often groups ship their timer trees during a steady stepping loop, by default.
DEFAULT_TIMER_INTERVAL = 1.0


class FrontEndOptions(TypedDict, total=False):
    """The keyword arguments both managers take, documented once.

    Attributes:
        num_envs: Total envs, with a single factory or ``vector_fn``. Any
            ``num_envs >= n_groups`` works: group ``g`` gets ``num_envs //
            n_groups`` envs and the first ``num_envs % n_groups`` groups one more.
        vector_fn: Instead of ``env_fns``: ``vector_fn(k) -> gymnasium.vector.VectorEnv``
            with ``num_envs == k``, called once in each group for its ``k`` envs (a
            batched env hosted per worker or actor: one ``step`` call per group per
            batch). Needs ``num_envs``.
        copy: Return copies of the observations (default). With ``False`` they are
            views of the batch arrays, writable as ``AsyncVectorEnv``'s, that the next
            ``step``/``reset`` overwrites: copy what you keep.
        autoreset_mode: Gymnasium autoreset mode; next-step by default.
        check_actions: How actions are checked before they are sent: ``"safe"``
            (default: structure, shape and a castable dtype, as ``AsyncVectorEnv``
            passes actions on), ``"strict"`` (also every value against the space)
            or ``"off"``. ``True``/``False`` mean safe/off.
        max_restarts: How many times each group may be replaced after it dies or
            overruns ``step_timeout``. A replaced group rebuilds its envs from their
            factories and resets them; the step returns with those envs truncated
            and ``infos["envmgr_restarted"]`` giving the reason. ``0`` (default): a
            failure breaks the manager and raises; every later call raises
            :class:`~envmgr.errors.BrokenManagerError`, caused by it.
        restart_window: Count restarts only within this many seconds (a rate
            limit); ``None`` counts over the manager's lifetime.
        start_timeout: Seconds a group may take to start and build its envs.
        timer_interval: Seconds between timer-tree shipments from the groups while
            stepping (``0``: every step); reads of the timer tree always pull in the
            rest first.
        ragged: How observations of ``Sequence``/``Graph`` parts come back:
            ``"gymnasium"`` (default: what ``SyncVectorEnv`` returns, a tuple of per-env
            arrays or ``GraphInstance`` items) or ``"padded"`` (a Sequence part as
            ``(data[num_envs, capacity, *shape], lengths[num_envs])``, a Graph part as
            ``(nodes, n_nodes, edges, edge_links, n_edges)``; past its length a row holds
            nothing meaningful; under ``copy=False``, views of the workers' shared
            memory), or ``"pickled"`` (no store: every observation and action travels
            pickled, a point of comparison). See docs/guide/variable-size.md.
        capacity: Starting capacity of the ``Sequence``/``Graph`` parts in shared
            memory: one int for all, or by path (``{"entities/type_a": 64}``, a Graph's
            ``"graph/nodes"``/``"graph/edges"``, or a key above them; the action space's
            parts under ``"actions"``: ``{"actions/targets": 16}``). Without it the
            capacity comes from the values seen; an observation over capacity travels
            pickled on that step and the capacity grows (a batch of actions over capacity
            re-lays that group's action store at once).
        info_bytes_per_env: Bytes of shared memory per env for numeric infos (the info
            columns; default :data:`~envmgr.protocol.info_columns.ROW_BYTES`). A key that
            finds no room travels pickled; multi-agent envs, whose infos hold a value per
            agent, get room for every slot from :func:`~envmgr.make_parallel`.
        max_worker_steps: Replace a worker (or actor) once it has stepped this many
            batches (``step()`` calls; each steps all of its envs once), however
            healthy it is: a planned replacement for envs whose memory grows. ``None``
            (default): never. See ``docs/guide/recycling.md``.
        max_worker_memory: Replace a worker (or actor) once its resident set size
            passes this: bytes as an int, or a string such as ``"2GB"``, ``"512MB"``
            (powers of 1000) or ``"1.5GiB"`` (powers of 1024). Read from ``/proc`` at
            most every :data:`~envmgr.frontend.recycling.MEMORY_READ_SECONDS` seconds,
            at the end of a step. ``None`` (default): never.

            A worker over either limit is *recycled*: in the batch where it is found
            over, its envs whose episode did not end come back truncated, and every
            one of its envs carries ``infos["envmgr_recycled"]``; the next ``step()``
            or ``reset()`` replaces it first (its envs are reset, to start their next
            episode at that step in next-step autoreset mode). A ``reset()`` of all of
            its envs is its episode boundary: it is replaced before it, and that reset
            carries out the one asked for. Recycling is not charged to
            ``max_restarts``: it counts in ``.recycles``, beside ``.restarts``.
            ``caller_envs`` run in the calling process and are never recycled.
    """

    num_envs: int | None
    vector_fn: Callable[[int], VectorEnv] | None  # type: ignore[type-arg]
    copy: bool
    autoreset_mode: str | AutoresetMode | None
    check_actions: str | bool
    max_restarts: int
    restart_window: float | None
    start_timeout: float | None
    timer_interval: float
    ragged: str
    capacity: int | dict[str, int] | None
    info_bytes_per_env: int
    max_worker_steps: int | None
    max_worker_memory: int | str | None


def check_options(owner: str, options: dict[str, Any]) -> None:
    """Refuse keyword arguments that are not :class:`FrontEndOptions`."""
    unknown = sorted(set(options) - set(FrontEndOptions.__annotations__))
    if "caller_envs" in unknown:
        raise TypeError(
            f"{owner}() does not take caller_envs=: only SubprocessEnvManager steps envs "
            "in the calling process"
        )
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    check_mode(options.get("check_actions", "safe"))  # a bad value fails before anything starts
    row = options.get("info_bytes_per_env")
    if row is not None and (isinstance(row, bool) or not isinstance(row, Integral) or row < 64):
        raise ValueError(f"info_bytes_per_env must be an int >= 64, got {row!r}")
    mode, modes = options.get("autoreset_mode"), [m.value for m in AutoresetMode]
    if mode is not None and not isinstance(mode, AutoresetMode) and mode not in modes:
        raise ValueError(
            f"autoreset_mode must be one of {modes} (or an AutoresetMode), got {mode!r}"
        )
    # Bad durations fail here, not as a broken wait or a refused close() later.
    seconds("start_timeout", options.get("start_timeout"), none=True)
    seconds("timer_interval", options.get("timer_interval", DEFAULT_TIMER_INTERVAL), zero=True)
    seconds("restart_window", options.get("restart_window"), none=True)
    ragged = options.get("ragged", "gymnasium")
    if ragged not in RAGGED_MODES:
        raise ValueError(
            f"ragged must be one of {', '.join(map(repr, RAGGED_MODES))}, got {ragged!r}"
        )
    capacity = options.get("capacity")
    if capacity is not None and not isinstance(capacity, (int, Mapping)) or capacity is True:
        raise TypeError(f"capacity must be an int or a dict of path -> int, got {capacity!r}")
    if not isinstance(options.get("copy", True), bool):
        raise TypeError(f"copy must be True or False, got {options['copy']!r}")
    count("max_worker_steps", options.get("max_worker_steps"))
    memory_size("max_worker_memory", options.get("max_worker_memory"))


@overload
def seconds(name: str, value: Any, *, none: Literal[False] = ..., zero: bool = ...) -> float: ...
@overload
def seconds(name: str, value: Any, *, none: bool, zero: bool = ...) -> float | None: ...
def seconds(name: str, value: Any, *, none: bool = False, zero: bool = False) -> float | None:
    """``value`` as a number of seconds, or the error that names ``name``.

    Args:
        name: The argument, for the message.
        value: What was given.
        none: ``None`` is allowed (no limit) and returned as it is.
        zero: ``0`` is allowed (don't wait, don't spin).
    """
    if value is None and none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real):
        allowed = "a number of seconds" + (" or None" if none else "")
        raise TypeError(f"{name} must be {allowed}, got {value!r}")
    if math.isnan(value) or value < 0 or (value == 0 and not zero):
        bound = ">= 0" if zero else "> 0"
        raise ValueError(f"{name} must be {bound} seconds, got {value!r}")
    return float(value)


def ragged_options(options: Mapping[str, Any]) -> RaggedOptions:
    """The manager's ``ragged=`` and ``capacity=``, for the backends."""
    return RaggedOptions(options.get("ragged", "gymnasium"), options.get("capacity"))


def hosted_autoreset_mode(metadata: Mapping[str, Any], options: Mapping[str, Any]) -> AutoresetMode:
    """The manager's autoreset mode when it hosts VectorEnvs: the hosted env's own.

    A hosted VectorEnv autoresets itself, so an ``autoreset_mode=`` that differs from its
    ``metadata["autoreset_mode"]`` is refused rather than silently ignored.
    """
    own = AutoresetMode(metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP))
    asked = options.get("autoreset_mode")
    if asked is not None and AutoresetMode(asked) != own:
        raise ValueError(
            f"autoreset_mode={AutoresetMode(asked).value!r}, but the VectorEnv that "
            f"vector_fn builds autoresets in mode {own.value!r} (its "
            "metadata['autoreset_mode']): drop autoreset_mode= or build the env in that mode"
        )
    return own


def count(name: str, value: Any) -> Any:
    """Return ``value`` as a plain ``int`` (a numpy integer too), or ``None``.

    Anything else, or less than 1, is refused naming ``name``.
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


#: Units of a size string, in bytes: decimal (``MB``) and binary (``MiB``); case is ignored.
_UNITS = {
    "": 1,
    "b": 1,
    **{f"{p}b": 1000**k for k, p in enumerate("kmgt", 1)},
    **{f"{p}ib": 1024**k for k, p in enumerate("kmgt", 1)},
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*", re.IGNORECASE)


def memory_size(name: str, value: Any) -> int | None:
    """Return ``value`` as a number of bytes, or ``None``.

    What is not a size is refused naming ``name``.

    Args:
        name: The argument, for the message.
        value: ``None``, an int of bytes (``>= 1``), or a string: a number and a unit
            among ``B``, ``KB``/``MB``/``GB``/``TB`` (powers of 1000) and
            ``KiB``/``MiB``/``GiB``/``TiB`` (powers of 1024), such as ``"2GB"``.
    """
    if value is None:
        return None
    if isinstance(value, Integral) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{name} must be at least 1 byte, got {value!r}")
        return int(value)
    if not isinstance(value, str):
        raise TypeError(
            f"{name} must be a number of bytes (int) or a size string such as '2GB', got {value!r}"
        )
    match = _SIZE.fullmatch(value)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(
            f"{name}={value!r} is not a size: write a number and one of the units "
            "B, KB, MB, GB, TB (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024), "
            "such as '2GB' or '512MiB'"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 1:
        raise ValueError(f"{name}={value!r} is less than 1 byte")
    return size
