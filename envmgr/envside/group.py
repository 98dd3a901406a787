"""The env-side stepper: one worker's (or actor's) envs, stepped as a batch, with no IPC.

An :class:`EnvGroup` owns the envs of one group and carries out the commands of
:mod:`envmgr.protocol.messages` on them: build, step with autoreset, reset (seeds,
options, mask), call, set_attr, apply, per-env step times and the group's
timers. It writes each batch of results into ``views`` (its rows of the batch
arrays: shared memory in a worker process, private arrays in a Ray actor) and
knows nothing of pipes or Ray. :func:`envmgr.envside.serve.serve` turns one command
into one answer::

    command (messages.Step/Reset/Call/...)            answer (StepResponse/CallResponse/Ack)
          |                                                   ^
          v                                                   |
    serve(group, cmd) --> group.step(actions) --> views: obs, rewards, terminations, truncations
                                                  infos, timers --> StepResponse

:func:`envmgr.backends.local.worker.worker_main` (a process) and the Ray actor
(:mod:`envmgr.backends.ray.actor`) are thin wrappers: they receive a command,
call :func:`~envmgr.envside.serve.serve`, and send its answer back.

Two kinds of group: :class:`~envmgr.envside.single_group.SingleEnvGroup` (one
``gymnasium.Env`` per slot, stepped in a loop, autoreset done here) and
:class:`~envmgr.envside.vector_group.VectorEnvGroup` (one hosted
``gymnasium.vector.VectorEnv`` owning all the group's envs: one ``step`` call
per batch, autoreset done by the hosted env).
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr import timers as timer_module
from envmgr.envside.info_writer import InfoWriter
from envmgr.protocol.messages import Ready
from envmgr.protocol.ragged import RaggedSpill, RaggedStore
from envmgr.protocol.ragged_layout import RaggedOptions
from envmgr.protocol.trees import copy_tree, unbatch_infos
from envmgr.timers import GaugeNode, TimerNode

__all__ = [
    "GroupSpec",
    "EnvGroup",
    "BuildFailed",
    "unbatched",
    "write_batch",
]


Infos = list[tuple[int, dict[str, Any]]]


@dataclass(frozen=True)
class GroupSpec:
    """What a group is built from; travels to its process with cloudpickle.

    Attributes:
        index: The group's index in the manager.
        offset: Global index of its first env.
        size: Number of envs.
        autoreset_mode: Gymnasium autoreset mode value (single envs only).
        env_fns: One zero-argument factory per env (a :class:`SingleEnvGroup`), or
        vector_fn: ``fn(size) -> VectorEnv`` (a :class:`VectorEnvGroup`).
        registrations: The parent's gymnasium registrations
            (:func:`~envmgr.envside.registrations.registrations`), installed before the
            envs are built.
        ragged: The manager's ``ragged=``/``capacity=`` for a Sequence/Graph observation
            space, for a group that lays its own store (a Ray actor's).
    """

    index: int
    offset: int
    size: int
    autoreset_mode: str
    env_fns: tuple[Callable[[], gym.Env[Any, Any]], ...] | None = None
    vector_fn: Callable[[int], gym.vector.VectorEnv] | None = None  # type: ignore[type-arg]
    registrations: bytes = b""
    ragged: RaggedOptions | None = None


class BuildFailed(Exception):
    """A group could not be built; ``env`` is the local index of the env that failed."""

    def __init__(self, env: int | None, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.env = env
        self.exc = exc


class GroupTimers:
    """The group's timer nodes, fetched once per shipped tree, not per step.

    They live on the thread's default stack (reset by :func:`build_group`), so
    timers and gauges that env code sets through :mod:`envmgr.timers` ship with
    the group's tree (nested under the ``step`` / ``reset`` node open while the
    env runs). Env calls are timed with two ``perf_counter`` reads added straight
    into the nodes: a context manager per env would cost more than a CartPole step.

    Attributes:
        calls: Steps and resets served since the last shipment; a shipped root's
            ``count``, so a worker node's count is its number of calls (as the
            parent's ``workers`` node above it counts them), not of shipments.
    """

    def __init__(self) -> None:
        self.stack = timer_module.get_default_stack()
        self.calls = 0
        self._bind()

    def _bind(self) -> None:
        root = self.stack.root
        self.wait = root.get_child("wait_command")
        self.step = root.get_child("step")
        self.step_env = self.step.get_child("env.step")
        self.step_autoreset = self.step.get_child("env.reset")
        self.reset = root.get_child("reset")
        self.reset_env = self.reset.get_child("env.reset")
        self.send = root.get_child("send_response")
        #: Rows of a Sequence/Graph space that did not fit their store (sent pickled).
        self.overflow = root.get_child("ragged.overflow")

    def take(self) -> tuple[TimerNode, dict[str, GaugeNode]]:
        """The tree and gauges accumulated since the last call; then start afresh."""
        timer_module.get_timer_root(self.stack)  # pulls in a hosted manager's unshipped timings
        root = self.stack.get_root()
        root.count = self.calls
        gauges = dict(self.stack.gauges)
        self.restart()
        return root, gauges

    def restart(self) -> None:
        """Drop what was timed so far and start the clock afresh."""
        self.stack.reset()
        self.calls = 0
        self._bind()


class EnvGroup(ABC):
    """The envs of one group and what can be done to them.

    Subclasses build their envs in ``__init__`` (raising :class:`BuildFailed`) and
    set the spaces, ``metadata``, ``render_mode`` and ``env_spec``.
    """

    single_observation_space: gym.Space[Any]
    single_action_space: gym.Space[Any]
    metadata: dict[str, Any]
    render_mode: str | None
    env_spec: Any
    #: Local index of the env running when an exception was raised, if known.
    current_env: int | None = None
    #: ``step``/``reset`` fill the info columns themselves (else ``serve`` splits their infos).
    writes_info_columns = False

    def __init__(self, spec: GroupSpec) -> None:
        self.spec = spec
        self.index = spec.index
        self.offset = spec.offset
        self.n = spec.size
        self.timers = GroupTimers()
        self.views: dict[str, Any] = {}
        self.shared_obs = False
        self.env_sec = [0.0] * self.n
        self.env_cnt = [0] * self.n
        #: Numeric info values go to columns in shared memory (else all pickle).
        self.info_writer: InfoWriter | None = None
        #: The store of a space with Sequence/Graph parts (``views["observations"]``).
        self.ragged: RaggedStore | None = None

    def attach(self, views: dict[str, Any]) -> None:
        """Write results into ``views`` from now on (this group's rows of the batch arrays).

        ``views["observations"]`` may be a :class:`~envmgr.protocol.ragged.RaggedStore`
        (a space with Sequence/Graph parts).
        """
        self.views = views
        obs = views.get("observations")
        self.ragged = obs if isinstance(obs, RaggedStore) else None
        #: The observations go into ``views`` (a fixed shape, or a store that held them
        #: all: a ragged group clears it for a batch that spilled).
        self.shared_obs = obs is not None
        arena = views.get("info_arena")
        self.info_writer = None if arena is None else InfoWriter(arena)

    def attach_ragged(self, store: RaggedStore) -> None:
        """Write observations into ``store`` (a re-laid, larger one) from now on.

        It starts with the latest ones, so every row it holds is current.
        """
        self.views["observations"] = self.ragged = store
        self.shared_obs = True
        latest = self.latest_observations()
        if latest is not None:
            self._write_ragged(latest)

    def latest_observations(self) -> list[Any] | None:
        """The latest observation of each env, or ``None`` before the first reset."""
        return None

    def _write_ragged(self, values: list[Any]) -> None:
        """Write one observation per env into the store; rows over capacity spill."""
        store = self.ragged
        assert store is not None
        self.shared_obs = store.write_rows(values, self.offset)
        if not self.shared_obs:
            self.timers.overflow.add_time(0.0, len(store.spilled))

    def ragged_spill(self) -> RaggedSpill:
        """What the store could not hold in the last batch, for the answer."""
        store = self.ragged
        assert store is not None
        return RaggedSpill(tuple(store.spilled), tuple(store.wants))

    def ready(self, pid: int) -> Ready:
        """Return the start-up answer, then start the group's clock afresh.

        The answer holds the spaces, metadata, a spec plain ``pickle`` can carry, and the
        start-up's timer tree (its own node in the parent, not charged to the first command).
        """
        self.timers.calls = 1  # the start-up, one call
        root, gauges = self.timers.take()
        spec = self.env_spec
        try:
            pickle.dumps(spec)
        except Exception:
            spec = None  # only cloudpickle could carry it; the parent uses it for its repr alone
        return Ready(
            self.index,
            pid,
            self.single_observation_space,
            self.single_action_space,
            dict(self.metadata),
            self.render_mode,
            spec,
            root,
            gauges,
        )

    @abstractmethod
    def step(self, actions: Any) -> Infos:
        """Step every env with its row of ``actions``; results go to ``views``."""

    @abstractmethod
    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None,
        autoreset_next: bool = False,
    ) -> Infos:
        """Reset the envs (those in ``mask``); observations go to ``views``."""

    @abstractmethod
    def call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], ids: Sequence[int] | None
    ) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of the envs ``ids`` (local)."""

    @abstractmethod
    def set_attr(self, name: str, values: Sequence[Any], ids: Sequence[int] | None) -> None:
        """Set attribute ``name`` of the envs ``ids``, one value each."""

    @abstractmethod
    def apply(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ids: Sequence[int] | None,
    ) -> tuple[Any, ...]:
        """``fn(env, *args, **kwargs)`` for each env ``ids``."""

    @abstractmethod
    def observations(self) -> tuple[Any, ...]:
        """The latest observation of each env, for a space without a fixed shape."""

    @abstractmethod
    def close(self) -> None:
        """Close every env once, ignoring errors from ``close``."""

    def take_timers(self) -> tuple[TimerNode, dict[str, GaugeNode]]:
        """The group's tree since the last shipment; publishes the per-env step times too."""
        if self.views:
            self._publish_env_times(self.views)
        return self.timers.take()

    def _publish_env_times(self, views: dict[str, Any]) -> None:
        views["env_seconds"][:] = self.env_sec
        views["env_steps"][:] = self.env_cnt

    def _publish(self, rewards: Any, terms: Any, truncs: Any) -> None:
        views = self.views
        views["rewards"][:] = rewards
        views["terminations"][:] = terms
        views["truncations"][:] = truncs

    def _ids(self, ids: Sequence[int] | None) -> Sequence[int]:
        return range(self.n) if ids is None else ids


# =============================================================================== single envs


def unbatched(infos: dict[str, Any], n: int) -> Infos:
    """A vector info dict as ``(local index, info)`` pairs of the envs that have one."""
    if not infos:
        return []
    return [(i, info) for i, info in enumerate(unbatch_infos(infos, n)) if info]


def write_batch(views: dict[str, Any], obs: Any) -> None:
    """Copy a batch of observations into the views, one copy per field.

    A field whose shape differs or whose dtype would change its values is refused (as
    SyncVectorEnv would).
    """
    out = views["observations"]
    _check_batch(out, obs, "observations")
    copy_tree(out, obs)


def _check_batch(out: Any, got: Any, path: str) -> None:
    if isinstance(out, dict):
        for k, o in out.items():
            _check_batch(o, got[k], f"{path}[{k!r}]")
    elif isinstance(out, tuple):
        for j, (o, g) in enumerate(zip(out, got, strict=True)):
            _check_batch(o, g, f"{path}[{j}]")
    else:
        a = got if isinstance(got, np.ndarray) else np.asarray(got)
        if a.shape != out.shape or not np.can_cast(a.dtype, out.dtype, "same_kind"):
            raise ValueError(
                f"the VectorEnv returned {path} of shape {a.shape} and dtype {a.dtype}, "
                f"expected shape {out.shape} and dtype {out.dtype} (its "
                "single_observation_space batched)"
            )
