"""The Ray actor: a thin wrapper around one :class:`~envmgr.envside.group.EnvGroup`.

Like the worker process, it receives commands of :mod:`envmgr.protocol.messages` and
answers them with :func:`envmgr.envside.serve.serve`; without shared memory, its
answers to steps and resets carry the group's rows of the batch (``arrays``).
Ray runs a default actor's methods one at a time on one thread, so the thread's
default timer stack collects everything, a hosted manager's merged timings too.
"""

from __future__ import annotations

import os
import pickle
from time import perf_counter
from typing import Any

import cloudpickle
import numpy as np

from envmgr.backends.memory import resident_bytes
from envmgr.envside.build import build_group
from envmgr.envside.group import BuildFailed, EnvGroup
from envmgr.envside.serve import (
    build_error,
    command_error,
    serve,
    spec_error,
    unreadable_command,
    unsendable_answer,
)
from envmgr.protocol.shared_memory import SharedBuffers

__all__ = ["EnvActor", "actor_class", "pack", "unpack"]

# Small payloads cross as one pickled ``bytes`` each way: Ray moves a bytes object
# more cheaply than a tuple of numpy arrays (``benchmarks/probes/ray_call.py`` measures a
# 64-env step both ways; docs/ray.md has the recorded figures). Large ones keep Ray's
# own zero-copy path for arrays.
_PACK_LIMIT = 256 * 1024


def _nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return 64


def pack(obj: Any, size_of: Any) -> Any:
    """``obj`` as pickled bytes when ``size_of`` is small, else as is."""
    if _nbytes(size_of) <= _PACK_LIMIT:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return obj


def unpack(obj: Any) -> Any:
    """Inverse of :func:`pack`."""
    return pickle.loads(obj) if isinstance(obj, bytes) else obj


class EnvActor:
    """Runs inside a Ray actor; :func:`actor_class` wraps it with ``ray.remote``.

    Nothing that can fail runs in ``__init__``, and no method lets an exception out:
    unpickling the spec and building the envs happen in :meth:`start`, unpickling a
    command in :meth:`run`, and what they raise comes back as an answer (an
    :class:`~envmgr.protocol.messages.ErrorResponse` the driver re-raises as its own
    type), not as a task error that Ray reports in its own words.

    Args:
        payload: The cloudpickled :class:`~envmgr.envside.group.GroupSpec`.
        index: The group's index in the manager (its spec may not unpickle here).
    """

    def __init__(self, payload: bytes, index: int) -> None:
        self._payload = payload
        self._index = index
        self.group: EnvGroup | None = None
        self._idle_since = perf_counter()

    def start(self) -> tuple[Any, str, str, int]:
        """Build the group; ``(Ready or ErrorResponse, node id, node ip, pid)``."""
        import ray

        began = perf_counter()
        # The pid travels beside the answer, not in it, so that a factory's error can
        # name the process it happened in too.
        node = (
            ray.get_runtime_context().get_node_id(),
            ray.util.get_node_ip_address(),
            os.getpid(),
        )
        try:
            spec = cloudpickle.loads(self._payload)
        except Exception as exc:  # a module the driver has and this node lacks
            return spec_error(self._index, exc), *node
        try:
            group = build_group(spec, began)
        except BuildFailed as failed:
            return build_error(spec, failed), *node
        self.group = group
        buffers = SharedBuffers.private(
            group.single_observation_space, group.single_action_space, group.n
        )
        views = buffers.slice(0, group.n)
        # No info columns: every answer travels anyway (it carries the rows), so the
        # infos ride in it and the driver merges them a key at a time.
        views["info_arena"] = None
        # A Sequence/Graph space: a store of its own, growing in place; it rides in the
        # answer as the observations' rows.
        buffers.add_ragged([group.n], spec.ragged, shared=False)
        if buffers.ragged is not None:
            views["observations"] = buffers.ragged[0]
        group.attach(views)
        self._idle_since = perf_counter()
        return group.ready(os.getpid()), *node

    def run(self, payload: Any) -> Any:
        """Carry out one packed command; returns the packed answer."""
        group = self.group
        assert group is not None
        group.timers.wait.add_time(perf_counter() - self._idle_since)
        try:
            cmd = unpack(payload)
        except Exception as exc:  # an argument of a class this node cannot import
            self._idle_since = perf_counter()
            return pack(unreadable_command(group.index, exc), None)
        try:
            answer: Any = serve(group, cmd, with_arrays=True)
        except BaseException as exc:
            answer = command_error(group, cmd, exc)
        self._idle_since = perf_counter()
        try:
            return pack(answer, getattr(answer, "arrays", None))
        except Exception as exc:  # an unpicklable info or call result, as a worker says it
            phase = type(cmd).__name__.lower()
            return pack(unsendable_answer(group.index, answer, phase, exc), None)

    def resident_bytes(self) -> int | None:
        """This actor's resident set size in bytes (for ``max_worker_memory``)."""
        return resident_bytes()

    def close(self) -> None:
        """Close the actor's envs, once."""
        if self.group is not None:
            self.group.close()
            self.group = None


_ACTOR_CLASS: Any = None


def actor_class(ray: Any) -> Any:
    """``ray.remote(EnvActor)``, made once."""
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        # Ray's own restarts stay off: the manager replaces dead actors itself,
        # because the new envs must be reset and the caller told.
        _ACTOR_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(EnvActor)
    return _ACTOR_CLASS
