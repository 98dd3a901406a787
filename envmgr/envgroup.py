"""The env-side stepper: one worker's (or actor's) envs, stepped as a batch, with no IPC.

An :class:`EnvGroup` owns the envs of one group and carries out the commands of
:mod:`envmgr.messages` on them: build, step with autoreset, reset (seeds,
options, mask), call, set_attr, apply, per-env step times and the group's
timers. It writes each batch of results into ``views`` (its rows of the batch
arrays: shared memory in a worker process, private arrays in a Ray actor) and
knows nothing of pipes or Ray. :func:`envmgr.serve.serve` turns one command
into one answer::

    command (messages.Step/Reset/Call/...)            answer (StepResponse/CallResponse/Ack)
          |                                                   ^
          v                                                   |
    serve(group, cmd) --> group.step(actions) --> views: obs, rewards, terminations, truncations
                                                  infos, timers --> StepResponse

:func:`envmgr.worker.worker_main` (a process) and the Ray actor
(:mod:`envmgr.backends._ray_actor`) are thin wrappers: they receive a command,
call :func:`~envmgr.serve.serve`, and send its answer back.

Two kinds of group: :class:`SingleEnvGroup` (one ``gymnasium.Env`` per slot,
stepped in a loop, autoreset done here) and
:class:`~envmgr.vectorgroup.VectorEnvGroup` (one hosted
``gymnasium.vector.VectorEnv`` owning all the group's envs: one ``step`` call
per batch, autoreset done by the hosted env).
"""

from __future__ import annotations

import pickle
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, iterate

from envmgr import timers as timer_module
from envmgr.batching import copy_tree, tree_map, unbatch_infos
from envmgr.messages import (
    Ready,
)
from envmgr.timers import GaugeNode, TimerNode

__all__ = [
    "GroupSpec",
    "EnvGroup",
    "SingleEnvGroup",
    "BuildFailed",
    "build_group",
    "unbatched",
    "write_batch",
]

# Autoreset modes, by gymnasium.vector.AutoresetMode value.
_NEXT_STEP, _SAME_STEP, _DISABLED = "NextStep", "SameStep", "Disabled"

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
    """

    index: int
    offset: int
    size: int
    autoreset_mode: str
    env_fns: tuple[Callable[[], gym.Env[Any, Any]], ...] | None = None
    vector_fn: Callable[[int], gym.vector.VectorEnv] | None = None  # type: ignore[type-arg]


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

    def attach(self, views: dict[str, Any]) -> None:
        """Write results into ``views`` from now on (this group's rows of the batch arrays)."""
        self.views = views
        #: The observations go into ``views`` (their space has a fixed shape).
        self.shared_obs = views.get("observations") is not None

    def ready(self, pid: int) -> Ready:
        """The start-up answer: spaces, metadata, a spec plain ``pickle`` can carry, and
        the start-up's timer tree (its own node in the parent, not charged to the first
        command); the group's clock then starts afresh."""
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


class SingleEnvGroup(EnvGroup):
    """One ``gymnasium.Env`` per slot, stepped in a loop; autoreset is done here."""

    def __init__(self, spec: GroupSpec) -> None:
        super().__init__(spec)
        assert spec.env_fns is not None
        self.envs: list[gym.Env[Any, Any]] = []
        try:
            for k, fn in enumerate(spec.env_fns):
                self.current_env = k
                env = fn()
                self.envs.append(env)
                for kind in ("observation_space", "action_space"):
                    if k and getattr(env, kind) != getattr(self.envs[0], kind):
                        raise ValueError(
                            f"env {self.offset + k} has {kind.replace('_', ' ')} "
                            f"{getattr(env, kind)}, "
                            f"but env {self.offset} has {getattr(self.envs[0], kind)}"
                        )
        except BaseException as exc:
            failed = self.current_env
            self.close()
            raise BuildFailed(failed, exc) from exc
        self.current_env = None
        first = self.envs[0]
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.metadata = dict(first.metadata)
        self.render_mode = first.render_mode
        self.env_spec = first.spec
        self.mode = spec.autoreset_mode
        self.autoreset = [False] * self.n
        # Last results per env, kept between commands so a partial reset can
        # republish the observations of the envs it did not touch.
        self._obs: list[Any] = [None] * self.n
        self._rew: list[Any] = [0.0] * self.n
        self._term: list[Any] = [False] * self.n
        self._trunc: list[Any] = [False] * self.n
        self._discrete = isinstance(first.action_space, gym.spaces.Discrete)
        self._batch_action_space = batch_space(first.action_space, self.n)
        self._write_obs: Callable[[list[Any]], None] | None = None

    def attach(self, views: dict[str, Any]) -> None:
        super().attach(views)
        obs = views.get("observations")
        self._write_obs = None if obs is None else _make_writer(obs)

    def _actions(self, actions: Any) -> Any:
        """Per-env private copies of the group's batch of actions.

        Copies, because an env may keep its action and the parent overwrites the
        shared array on the next step. Discrete actions are the array's numpy scalars
        (each holds its own value), as ``SyncVectorEnv`` hands them out: not Python
        ints, which ``tolist`` would make faster but which cost the env more
        (gymnasium's ``Discrete.contains`` looks up ``np.iinfo`` for an int: CartPole's
        step took about 1 µs, an eighth, longer). Gymnasium's ``iterate`` splits
        everything else exactly as ``SyncVectorEnv`` does.
        """
        if self._discrete and isinstance(actions, np.ndarray):
            return list(actions)
        if actions is self.views.get("actions"):
            actions = tree_map(np.array, actions)  # else it came pickled: private already
        return list(iterate(self._batch_action_space, actions))

    def step(self, actions: Any) -> Infos:
        t_start = perf_counter()
        actions = self._actions(actions)
        envs, mode, autoreset = self.envs, self.mode, self.autoreset
        obs_list, rewards, terms, truncs = self._obs, self._rew, self._term, self._trunc
        env_sec, env_cnt = self.env_sec, self.env_cnt
        infos: Infos = []
        t_env = t_reset = 0.0
        n_resets = 0
        i = 0
        # Results go into plain lists and are written to the views once per batch:
        # one numpy assignment per array instead of one per env. The loop body is
        # kept lean on purpose: it runs once per env step.
        try:
            for i in range(self.n):
                env = envs[i]
                if autoreset[i]:
                    if mode == _NEXT_STEP:
                        t0 = perf_counter()
                        obs, info = env.reset()
                        t_reset += perf_counter() - t0
                        n_resets += 1
                        obs_list[i], rewards[i], terms[i], truncs[i] = obs, 0.0, False, False
                        autoreset[i] = False
                        if info:
                            infos.append((i, info))
                        continue
                    if mode == _DISABLED:
                        raise RuntimeError(
                            f"env {self.offset + i} finished its episode and autoreset_mode "
                            "is 'Disabled': reset it (reset(options={'reset_mask': ...})) "
                            "before stepping it again"
                        )
                t0 = perf_counter()
                obs, reward, term, trunc, info = env.step(actions[i])
                dt = perf_counter() - t0
                t_env += dt
                env_sec[i] += dt
                env_cnt[i] += 1
                if (term or trunc) and mode == _SAME_STEP:
                    t0 = perf_counter()
                    final = {"final_obs": obs, "final_info": info}
                    obs, info = env.reset()
                    info = {**info, **final} if info else final
                    t_reset += perf_counter() - t0
                    n_resets += 1
                    done = False
                else:
                    done = term or trunc
                obs_list[i], rewards[i], terms[i], truncs[i] = obs, reward, term, trunc
                autoreset[i] = done
                if info:
                    infos.append((i, info))
        except BaseException:
            self.current_env = i
            raise
        self._publish_all()
        t = self.timers
        t.step_env.add_time(t_env, self.n - n_resets if mode == _NEXT_STEP else self.n)
        if n_resets:
            t.step_autoreset.add_time(t_reset, n_resets)
        t.step.add_time(perf_counter() - t_start)
        return infos

    def _publish_all(self) -> None:
        self._publish(self._rew, self._term, self._trunc)
        if self._write_obs is None:
            return
        try:
            self._write_obs(self._obs)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            self._explain_bad_observation(exc)

    def _explain_bad_observation(self, exc: Exception) -> None:
        """Name the env whose observation does not fit the observation space."""
        space = self.single_observation_space
        for i, obs in enumerate(self._obs):
            if obs not in space:
                shape = getattr(obs, "shape", None)
                self.current_env = i
                raise ValueError(
                    f"env {self.offset + i} returned an observation that is not in its "
                    f"observation space {space}: got {type(obs).__name__}"
                    + (f" of shape {shape}" if shape is not None else "")
                    + f" ({exc})"
                ) from exc
        raise exc

    def reset(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None,
        autoreset_next: bool = False,
    ) -> Infos:
        t_start = perf_counter()
        infos: Infos = []
        t_env = 0.0
        count = 0
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue  # keeps its last observation and flags, as SyncVectorEnv does
            self.current_env = i
            t0 = perf_counter()
            obs, info = env.reset(seed=seeds[i], options=options)
            t_env += perf_counter() - t0
            count += 1
            self._obs[i] = obs
            self._rew[i] = 0.0
            self._term[i] = self._trunc[i] = False
            self.autoreset[i] = autoreset_next
            if info:
                infos.append((i, info))
        self.current_env = None
        self._publish_all()
        self.timers.reset_env.add_time(t_env, count)
        self.timers.reset.add_time(perf_counter() - t_start)
        return infos

    def call(
        self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any], ids: Sequence[int] | None
    ) -> tuple[Any, ...]:
        results = []
        for i in self._ids(ids):
            self.current_env = i
            attr = self.envs[i].get_wrapper_attr(name)
            results.append(attr(*args, **kwargs) if callable(attr) else attr)
        self.current_env = None
        return tuple(results)

    def set_attr(self, name: str, values: Sequence[Any], ids: Sequence[int] | None) -> None:
        for i, value in zip(self._ids(ids), values, strict=True):
            self.current_env = i
            self.envs[i].set_wrapper_attr(name, value)
        self.current_env = None

    def apply(
        self,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        ids: Sequence[int] | None,
    ) -> tuple[Any, ...]:
        results = []
        for i in self._ids(ids):
            self.current_env = i
            results.append(fn(self.envs[i], *args, **kwargs))
        self.current_env = None
        return tuple(results)

    def observations(self) -> tuple[Any, ...]:
        return tuple(self._obs)

    def close(self) -> None:
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass
        self.envs = []


def _make_writer(out: Any) -> Callable[[list[Any]], None]:
    """A function writing a list of per-env observations into the batch views."""
    if isinstance(out, np.ndarray):

        def write(values: list[Any]) -> None:
            out[:] = values

        return write
    if isinstance(out, dict):
        writers = {k: _make_writer(v) for k, v in out.items()}

        def write_dict(values: list[Any]) -> None:
            for k, w in writers.items():
                w([v[k] for v in values])

        return write_dict
    parts = [_make_writer(v) for v in out]

    def write_tuple(values: list[Any]) -> None:
        for j, w in enumerate(parts):
            w([v[j] for v in values])

    return write_tuple


def build_group(spec: GroupSpec, began: float | None = None) -> EnvGroup:
    """Build the group ``spec`` describes; raises :class:`BuildFailed`.

    The thread's default timer stack is reset and the envs are built under a
    ``make_envs`` timer; :meth:`EnvGroup.ready` ships that start-up tree.

    Args:
        spec: The group.
        began: ``perf_counter()`` when the process (or actor) began starting up:
            the start-up tree's wall clock runs from there. Default: now.
    """
    stack = timer_module.get_default_stack()
    stack.reset()
    if began is not None:
        stack.start_time = began
    with timer_module.hierarchical_timer("make_envs", stack):
        if spec.vector_fn is not None:
            from envmgr.vectorgroup import VectorEnvGroup  # it subclasses EnvGroup

            return VectorEnvGroup(spec)
        return SingleEnvGroup(spec)


def unbatched(infos: dict[str, Any], n: int) -> Infos:
    """A vector info dict as ``(local index, info)`` pairs of the envs that have one."""
    if not infos:
        return []
    return [(i, info) for i, info in enumerate(unbatch_infos(infos, n)) if info]


def write_batch(views: dict[str, Any], obs: Any) -> None:
    """Copy a batch of observations into the views (one copy per field)."""
    copy_tree(views["observations"], obs)
