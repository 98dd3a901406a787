"""``RayEnvManager``: envmgr's batched ``VectorEnv`` with its envs in Ray actors.

When one machine is not enough, the envs move into Ray actors spread over a
cluster -- the engine RL users already run (RLlib) -- behind the same
``gymnasium.vector.VectorEnv`` API as :class:`envmgr.SubprocessEnvManager`.

Design in brief:

* One actor per node (or per group of cores) owns many envs. A Ray actor call
  costs ~0.7 ms against ~0.04 ms for a pipe round trip, so each call carries a
  whole batch: one ``step`` call per actor per batch step, answered with a
  :class:`RayStepResult` (the actor's observations, rewards and done flags as
  arrays, and an :class:`envmgr.messages.StepResponse` with the infos and, when
  asked, the actor's timer tree).
* Inside an actor the envs are stepped inline (``workers_per_actor`` 0 or 1) or
  by envmgr's own :class:`~envmgr.SubprocessEnvManager` over shared memory when
  the actor is given several cores (``workers_per_actor=N``).
* Actor timer trees are merged under the caller's current timer as parallel
  nodes: ``workers`` -> ``worker_root`` (all actors summed) and
  ``actor_<k>@<node ip>`` (each actor alone). Actors ship their trees every
  ``timer_interval`` seconds, and any read of the tree through
  :mod:`envmgr.timers` first pulls in what has not been shipped.
* Every remote wait is bounded (``step_timeout``, ``start_timeout``,
  ``close_timeout``). A dead actor (process killed, node lost) or a hung one is
  reported as :class:`RayActorDiedError` / :class:`~envmgr.errors.WorkerTimeoutError`
  naming the actor, its envs and its node. The restart policy is
  :class:`~envmgr.SubprocessEnvManager`'s: under ``max_restarts`` the actor is
  replaced (envs rebuilt and reset) and the step returns those envs truncated
  with ``infos["envmgr_restarted"]``; with ``max_restarts=0`` the failure is
  raised, and once the budget is spent a :class:`~envmgr.errors.BrokenWorkerError`;
  either way the manager is then closed.

Ray is imported only when a manager is built: ``import envmgr`` (and this
module) work without it.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from time import monotonic, perf_counter
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array, iterate

from envmgr import timers
from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenWorkerError,
    ClosedManagerError,
    NoAsyncCallError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerError,
    WorkerFailure,
    WorkerTimeoutError,
)
from envmgr.frontend import RESTARTED_INFO_KEY, BatchedVectorEnv
from envmgr.messages import Ready, StepResponse
from envmgr.timer_merge import WorkerTimers
from envmgr.timers import GaugeNode, TimerNode
from envmgr.validation import ActionChecker, reset_arguments, whole_groups

__all__ = [
    "RayEnvManager",
    "RayActorDiedError",
    "RayStepResult",
    "ActorInfo",
    "RESTARTED_INFO_KEY",
    "RAY_INSTALL_HINT",
]

logger = logging.getLogger("envmgr.ray")

EnvFactory = Callable[[], gym.Env[Any, Any]]

#: What to run when Ray is missing.
RAY_INSTALL_HINT = 'pip install "envmgr[ray]"'
#: Default seconds an actor may take to answer one step, reset or call.
DEFAULT_STEP_TIMEOUT = 60.0
#: How often actors ship their timer trees during a steady stepping loop.
DEFAULT_TIMER_INTERVAL = 1.0

_NEXT_STEP, _SAME_STEP, _DISABLED = "NextStep", "SameStep", "Disabled"


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "envmgr's Ray backend (RayEnvManager) needs Ray, which is not installed: "
            f'run `{RAY_INSTALL_HINT}` (or `pip install "ray[default]"`)'
        ) from exc
    return ray


# =============================================================================== errors


def _add_note(exc: BaseException, note: str) -> None:
    """``exc.add_note(note)``, also on Python 3.10 (which lacks it) and on odd exceptions."""
    try:
        if hasattr(exc, "add_note"):
            exc.add_note(note)
        else:
            exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
    except Exception:
        pass


class RayActorDiedError(WorkerDiedError):
    """A Ray actor of the manager died: its process was killed or its node was lost.

    Attributes:
        worker_index: Index of the actor in the manager (``actor_index`` too).
        env_indices: Global indices of the envs the actor owned.
        node_ip: IP address of the node the actor ran on.
        node_id: Ray node id (hex) of that node.
        actor_id: Ray actor id (hex).
        pid: The actor's process id on its node.
        node_alive: Whether Ray still listed the node as alive when the death was
            noticed (``False``: the whole node was lost; ``None``: unknown).
        reason: Ray's own account of the death.
    """

    def __init__(
        self,
        message: str,
        worker_index: int,
        env_indices: Sequence[int] = (),
        *,
        node_ip: str | None = None,
        node_id: str | None = None,
        actor_id: str | None = None,
        pid: int | None = None,
        node_alive: bool | None = None,
        reason: str = "",
    ) -> None:
        super().__init__(message, worker_index, env_indices, None)
        self.node_ip = node_ip
        self.node_id = node_id
        self.actor_id = actor_id
        self.pid = pid
        self.node_alive = node_alive
        self.reason = reason

    @property
    def actor_index(self) -> int:
        return self.worker_index


# =============================================================================== messages


@dataclass(frozen=True, slots=True)
class RayStepResult:
    """One actor's answer to a step, reset or timer flush: its slice of the batch.

    Attributes:
        response: The infos (local env index, info), the sequence number and,
            when asked, the actor's timer tree and gauges.
        observations: The batched observations of the actor's envs (``None`` for
            a timer flush).
        rewards, terminations, truncations: Arrays of the actor's envs (``None``
            for a reset or a timer flush).
    """

    response: StepResponse
    observations: Any = None
    rewards: np.ndarray | None = None
    terminations: np.ndarray | None = None
    truncations: np.ndarray | None = None


@dataclass(frozen=True, slots=True)
class _Started:
    ready: Ready
    node_id: str
    node_ip: str


# =============================================================================== batches

_ARRAY_SPACES = (
    gym.spaces.Box,
    gym.spaces.Discrete,
    gym.spaces.MultiDiscrete,
    gym.spaces.MultiBinary,
)


def _concat_batches(space: gym.Space[Any], parts: Sequence[Any]) -> Any:
    """Join batches of ``space`` (one per actor) into one batch, always as fresh arrays."""
    if isinstance(space, _ARRAY_SPACES):
        return np.concatenate(parts, axis=0)
    if isinstance(space, gym.spaces.Dict):
        return {k: _concat_batches(s, [p[k] for p in parts]) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_concat_batches(s, [p[i] for p in parts]) for i, s in enumerate(space.spaces))
    # Text, Graph, Sequence, OneOf, custom spaces: the batch is a tuple of items.
    return tuple(itertools.chain.from_iterable(parts))


def _take_rows(space: gym.Space[Any], batch: Any, rows: np.ndarray | slice) -> Any:
    """Rows ``rows`` of a batch of ``space`` (for one actor's share of the actions)."""
    if isinstance(space, _ARRAY_SPACES):
        return np.ascontiguousarray(np.asarray(batch)[rows])
    if isinstance(space, gym.spaces.Dict):
        return {k: _take_rows(s, batch[k], rows) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_take_rows(s, batch[i], rows) for i, s in enumerate(space.spaces))
    items = list(batch)
    if isinstance(rows, slice):
        return tuple(items[rows])
    return tuple(items[int(r)] for r in rows)


def _unbatch_infos(infos: dict[str, Any], n: int) -> list[dict[str, Any]]:
    """Split a Gymnasium vector info dict back into one info dict per env."""
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_") and key[1:] in infos:
            continue
        mask = infos.get(f"_{key}")
        if mask is None:
            continue
        if isinstance(value, dict):
            sub = _unbatch_infos(value, n)
            for i in np.flatnonzero(mask):
                out[i][key] = sub[i]
        else:
            for i in np.flatnonzero(mask):
                out[i][key] = value[i]
    return out


# Small payloads cross as one pickled ``bytes`` each way: Ray serializes a bytes
# object far more cheaply than a tuple of numpy arrays (~1.2 ms against ~1.9 ms
# per round trip here). Large ones keep Ray's own zero-copy path for arrays.
_PACK_LIMIT = 256 * 1024


def _nbytes(x: Any) -> int:
    if isinstance(x, np.ndarray):
        return int(x.nbytes)
    if isinstance(x, dict):
        return sum(_nbytes(v) for v in x.values())
    if isinstance(x, (tuple, list)):
        return sum(_nbytes(v) for v in x)
    return 64


def _pack(obj: Any, size_of: Any) -> Any:
    if _nbytes(size_of) <= _PACK_LIMIT:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return obj


def _unpack(obj: Any) -> Any:
    return pickle.loads(obj) if isinstance(obj, bytes) else obj


# =============================================================================== the actor


class _EnvActor:
    """Runs inside a Ray actor: owns a slice of the manager's envs and steps them per call.

    Plain class; :func:`_actor_class` wraps it with ``ray.remote`` lazily. Ray runs
    the methods of a default actor one at a time on its main thread, so the
    thread's default timer stack collects everything, including the timings an
    inner :class:`~envmgr.SubprocessEnvManager` merges from its workers.
    """

    def __init__(
        self,
        index: int,
        env_offset: int,
        env_fns: bytes,
        autoreset_mode: str,
        workers_per_actor: int,
        context: str | None,
        step_timeout: float | None,
        notice: str | None = None,
    ) -> None:
        # Nothing that can fail here: env factories run in start(), so their
        # exceptions come back as task errors, not as a dead actor.
        self.index = index
        self.offset = env_offset
        self._env_fns = env_fns
        self.mode = autoreset_mode
        self.workers = workers_per_actor
        self.context = context
        self.step_timeout = step_timeout
        self._start_notice = notice
        self.envs: list[gym.Env[Any, Any]] = []
        self.inner: Any = None
        self._idle_since: float | None = None
        self.current_env: int | None = None

    # ----------------------------------------------------------------- set-up

    def start(self) -> _Started:
        import ray

        self.node_ip = ray.util.get_node_ip_address()
        fns = cloudpickle.loads(self._env_fns)
        self.n = n = len(fns)
        if self.workers > 1:
            from envmgr.manager import SubprocessEnvManager

            self.inner = SubprocessEnvManager(
                fns,
                n_workers=self.workers,
                context=self.context,
                autoreset_mode=self.mode,
                step_timeout=self.step_timeout,
                check_actions=False,  # the driver checked them
            )
            obs_space = self.inner.single_observation_space
            act_space = self.inner.single_action_space
            metadata = dict(self.inner.metadata)
            render_mode, spec = self.inner.render_mode, self.inner.spec
        else:
            for k, fn in enumerate(fns):
                self.current_env = k
                env = fn()
                self.envs.append(env)
                for kind in ("observation_space", "action_space"):
                    if k and getattr(env, kind) != getattr(self.envs[0], kind):
                        raise ValueError(
                            f"env {self.offset + k} has {kind} {getattr(env, kind)}, but env "
                            f"{self.offset} has {getattr(self.envs[0], kind)}"
                        )
            self.current_env = None
            first = self.envs[0]
            obs_space, act_space = first.observation_space, first.action_space
            metadata, render_mode, spec = dict(first.metadata), first.render_mode, first.spec
        self.obs_space = obs_space
        self.local_action_space = batch_space(act_space, n)
        self.autoreset = np.zeros(n, dtype=np.bool_)
        self.obs_list: list[Any] = [None] * n
        self.obs_batch: Any = None
        # Restart bookkeeping: which envs still owe the "restarted" notice, and
        # (inner manager only) whether all envs are to be reset at the next step.
        self.notice = np.zeros(n, dtype=np.bool_)
        self.notice_reason = ""
        self.reset_next = False
        if self._start_notice is not None:
            self._reset_envs([None] * n, None, None)
            self.notice[:] = True
            self.notice_reason = self._start_notice
        node_id = ray.get_runtime_context().get_node_id()
        ready = Ready(self.index, os.getpid(), obs_space, act_space, metadata, render_mode, spec)
        self._idle_since = perf_counter()
        return _Started(ready, node_id, self.node_ip)

    # ----------------------------------------------------------------- helpers

    def _enter(self) -> None:
        now = perf_counter()
        if self._idle_since is not None:
            timers.get_default_stack().root.get_child("wait_command").add_time(
                now - self._idle_since
            )

    def _leave(self) -> None:
        self._idle_since = perf_counter()

    def _where(self, env: int | None, phase: str) -> str:
        where = f"raised in envmgr ray actor {self.index} on node {self.node_ip}"
        if env is not None:
            where += f", env {self.offset + env}"
        return where + f", during {phase}"

    def _annotate(self, exc: BaseException, phase: str) -> None:
        _add_note(exc, self._where(self.current_env, phase))
        self.current_env = None

    def _take_timers(self) -> tuple[TimerNode, dict[str, GaugeNode]]:
        stack = timers.get_default_stack()
        timers.get_timer_root(stack)  # pulls in an inner manager's unshipped worker timings
        root = stack.get_root()
        gauges = dict(stack.gauges)
        stack.reset()
        return root, gauges

    def _result(
        self,
        seq: int,
        infos: Sequence[tuple[int, dict[str, Any]]],
        ship: bool,
        obs: Any = None,
        rewards: np.ndarray | None = None,
        terms: np.ndarray | None = None,
        truncs: np.ndarray | None = None,
    ) -> RayStepResult:
        root = gauges = None
        if ship:
            root, gauges = self._take_timers()
        response = StepResponse(self.index, seq, tuple(infos), None, root, gauges)
        return RayStepResult(response, obs, rewards, terms, truncs)

    @staticmethod
    def _pack_result(result: RayStepResult) -> Any:
        return _pack(result, result.observations)

    def _batch_obs(self) -> Any:
        out: Any = create_empty_array(self.obs_space, self.n)
        return concatenate(self.obs_space, self.obs_list, out)

    def _notice_info(self, obs: Any) -> dict[str, Any]:
        info: dict[str, Any] = {RESTARTED_INFO_KEY: self.notice_reason}
        if self.mode == _SAME_STEP:
            info["final_obs"] = obs
            info["final_info"] = {}
        return info

    # ----------------------------------------------------------------- reset

    def _reset_envs(
        self,
        seeds: Sequence[int | None],
        options: dict[str, Any] | None,
        mask: Sequence[bool] | None,
    ) -> tuple[Any, list[tuple[int, dict[str, Any]]]]:
        node = timers.get_default_stack().root.get_child("reset")
        t_start = perf_counter()
        infos: list[tuple[int, dict[str, Any]]] = []
        if self.inner is not None:
            opts = dict(options) if options else {}
            if mask is not None:
                opts["reset_mask"] = np.asarray(mask, dtype=np.bool_)
            with timers.hierarchical_timer("reset"):
                obs, vinfos = self.inner.reset(seed=list(seeds), options=opts or None)
            self.obs_batch = obs
            per_env = _unbatch_infos(vinfos, self.n)
            if self.notice.any() or self.reset_next:
                # After a restart the inner manager's envs are settled as one: any
                # reset clears the pending notice (the reset envs carry it) and the
                # pending autoreset of the others, which then step on from the
                # fresh state they were rebuilt in.
                for i in range(self.n):
                    if self.notice[i] and (mask is None or mask[i]):
                        per_env[i][RESTARTED_INFO_KEY] = self.notice_reason
                self.notice[:] = False
                self.reset_next = False
            infos = [(i, info) for i, info in enumerate(per_env) if info]
            return obs, infos
        env_node = node.get_child("env.reset")
        t_env = 0.0
        count = 0
        for i, env in enumerate(self.envs):
            if mask is not None and not mask[i]:
                continue
            self.current_env = i
            t0 = perf_counter()
            obs, info = env.reset(seed=seeds[i], options=options)
            t_env += perf_counter() - t0
            count += 1
            self.obs_list[i] = obs
            self.autoreset[i] = False
            if self.notice[i]:
                info = {**info, RESTARTED_INFO_KEY: self.notice_reason}
                self.notice[i] = False
            if info:
                infos.append((i, info))
        self.current_env = None
        env_node.add_time(t_env, count)
        node.add_time(perf_counter() - t_start)
        return self._batch_obs(), infos

    def reset(self, payload: Any) -> Any:
        """``payload``: packed ``(seq, seeds, options, mask, ship)``; returns a packed result."""
        self._enter()
        try:
            seq, seeds, options, mask, ship = _unpack(payload)
            obs, infos = self._reset_envs(seeds, options, mask)
            return self._pack_result(self._result(seq, infos, ship, obs))
        except BaseException as exc:
            self._annotate(exc, "reset")
            raise
        finally:
            self._leave()

    # ----------------------------------------------------------------- step

    def step(self, payload: Any) -> Any:
        """``payload``: packed ``(seq, actions, ship)``; returns a packed result."""
        self._enter()
        try:
            seq, actions, ship = _unpack(payload)
            with timers.hierarchical_timer("step"):
                if self.inner is not None:
                    obs, rewards, terms, truncs, infos = self._step_inner(actions)
                else:
                    obs, rewards, terms, truncs, infos = self._step_inline(actions)
            result = self._result(seq, infos, ship, obs, rewards, terms, truncs)
            return self._pack_result(result)
        except BaseException as exc:
            self._annotate(exc, "step")
            raise
        finally:
            self._leave()

    def _step_inline(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[Any]]:
        n = self.n
        rewards = np.zeros(n, dtype=np.float64)
        terms = np.zeros(n, dtype=np.bool_)
        truncs = np.zeros(n, dtype=np.bool_)
        infos: list[tuple[int, dict[str, Any]]] = []
        autoreset, notice, mode, obs_list = self.autoreset, self.notice, self.mode, self.obs_list
        t_env = t_reset = 0.0
        n_steps = n_resets = 0
        per_env_actions = iterate(self.local_action_space, actions)
        for i, (env, action) in enumerate(zip(self.envs, per_env_actions, strict=True)):
            self.current_env = i
            if notice[i]:
                # The env was rebuilt and reset after its actor died: report the
                # episode as truncated, without stepping.
                notice[i] = False
                truncs[i] = True
                infos.append((i, self._notice_info(obs_list[i])))
                continue
            t0 = perf_counter()
            reward: Any
            if autoreset[i] and mode == _NEXT_STEP:
                obs, info = env.reset()
                reward, term, trunc = 0.0, False, False
                t_reset += perf_counter() - t0
                n_resets += 1
            else:
                if autoreset[i] and mode == _DISABLED:
                    raise RuntimeError(
                        f"env {self.offset + i} finished its episode and autoreset_mode is "
                        "'Disabled': reset it (reset(options={'reset_mask': ...})) before stepping"
                    )
                obs, reward, term, trunc, info = env.step(action)
                t_env += perf_counter() - t0
                n_steps += 1
                if mode == _SAME_STEP and (term or trunc):
                    t1 = perf_counter()
                    info = {"final_obs": obs, "final_info": info}
                    obs, reset_info = env.reset()
                    if reset_info:
                        info.update(reset_info)
                    t_reset += perf_counter() - t1
                    n_resets += 1
            obs_list[i] = obs
            rewards[i] = reward
            terms[i] = term
            truncs[i] = trunc
            if info:
                infos.append((i, info))
        self.current_env = None
        np.logical_or(terms, truncs, out=autoreset)
        step_node = timers.get_default_stack().current()
        step_node.get_child("env.step").add_time(t_env, n_steps)
        if n_resets:
            step_node.get_child("env.reset").add_time(t_reset, n_resets)
        return self._batch_obs(), rewards, terms, truncs, infos

    def _step_inner(
        self, actions: Any
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, list[Any]]:
        n = self.n
        if self.notice.any():
            # After a restart all of the actor's envs owe the notice (the inner
            # manager cannot step some of its envs and not others).
            self.notice[:] = False
            self.reset_next = self.mode != _SAME_STEP
            infos = [(i, self._notice_info(self._row(i))) for i in range(n)]
            return (
                self.obs_batch,
                np.zeros(n, dtype=np.float64),
                np.zeros(n, dtype=np.bool_),
                np.ones(n, dtype=np.bool_),
                infos,
            )
        if self.reset_next:
            if self.mode == _DISABLED:
                raise RuntimeError(
                    f"envs {self.offset}-{self.offset + n - 1} were truncated when their actor "
                    "was restarted and autoreset_mode is 'Disabled': reset them before stepping"
                )
            self.reset_next = False
            obs, vinfos = self.inner.reset(seed=None)
            self.obs_batch = obs
            per_env = _unbatch_infos(vinfos, n)
            return (
                obs,
                np.zeros(n, dtype=np.float64),
                np.zeros(n, dtype=np.bool_),
                np.zeros(n, dtype=np.bool_),
                [(i, info) for i, info in enumerate(per_env) if info],
            )
        obs, rewards, terms, truncs, vinfos = self.inner.step(actions)
        self.obs_batch = obs
        per_env = _unbatch_infos(vinfos, n)
        return obs, rewards, terms, truncs, [(i, info) for i, info in enumerate(per_env) if info]

    def _row(self, i: int) -> Any:
        return next(
            itertools.islice(iterate(batch_space(self.obs_space, self.n), self.obs_batch), i, None)
        )

    # ----------------------------------------------------------------- calls

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
        self._enter()
        try:
            with timers.hierarchical_timer("call"):
                if self.inner is not None:
                    return tuple(self.inner.call(name, *args, **kwargs))
                results = []
                for i, env in enumerate(self.envs):
                    self.current_env = i
                    attr = env.get_wrapper_attr(name)
                    results.append(attr(*args, **kwargs) if callable(attr) else attr)
                self.current_env = None
                return tuple(results)
        except BaseException as exc:
            self._annotate(exc, f"call({name!r})")
            raise
        finally:
            self._leave()

    def set_attr(self, name: str, values: tuple[Any, ...]) -> None:
        self._enter()
        try:
            if self.inner is not None:
                self.inner.set_attr(name, list(values))
                return
            for i, (env, value) in enumerate(zip(self.envs, values, strict=True)):
                self.current_env = i
                env.set_wrapper_attr(name, value)
            self.current_env = None
        except BaseException as exc:
            self._annotate(exc, "set_attr")
            raise
        finally:
            self._leave()

    def flush_timers(self, seq: int) -> RayStepResult:
        self._enter()
        self._leave()
        return self._result(seq, (), True)

    def close(self) -> None:
        if self.inner is not None:
            try:
                self.inner.close()
            finally:
                self.inner = None
        for env in self.envs:
            try:
                env.close()
            except Exception:
                pass
        self.envs = []


_ACTOR_CLASS: Any = None


def _actor_class(ray: Any) -> Any:
    global _ACTOR_CLASS
    if _ACTOR_CLASS is None:
        # Ray's own restarts stay off: the manager replaces dead actors itself,
        # because the new envs must be reset and the caller told.
        _ACTOR_CLASS = ray.remote(max_restarts=0, max_task_retries=0)(_EnvActor)
    return _ACTOR_CLASS


# =============================================================================== Ray connection

_ray_lock = threading.Lock()
_ray_users = 0  # live managers using the Ray connection that an envmgr manager opened
_ray_opened_gcs: str | None = None  # the GCS address of that connection


def _current_gcs(ray: Any) -> str | None:
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:
        return None


def _acquire_ray(ray: Any, address: str | None, init_kwargs: dict[str, Any]) -> bool:
    """Make sure the driver is connected; return True if an envmgr manager opened the connection."""
    global _ray_users, _ray_opened_gcs
    with _ray_lock:
        if ray.is_initialized():
            if _ray_opened_gcs is not None and _current_gcs(ray) == _ray_opened_gcs:
                _ray_users += 1
                return True
            return False
        ray.init(address=address, **init_kwargs)
        _ray_opened_gcs = _current_gcs(ray)
        _ray_users = 1
        return True


def _release_ray(ray: Any, shutdown: bool = True) -> None:
    """Shut Ray down once the last manager using a connection envmgr opened is closed.

    With ``shutdown=False`` the connection is left up and handed over to the
    caller: no later manager shuts it down.
    """
    global _ray_users, _ray_opened_gcs
    with _ray_lock:
        _ray_users -= 1
        if _ray_users > 0:
            return
        opened, _ray_opened_gcs, _ray_users = _ray_opened_gcs, None, 0
        if shutdown and opened is not None and ray.is_initialized() and _current_gcs(ray) == opened:
            ray.shutdown()


# =============================================================================== the manager


@dataclass
class _Flight:
    """A call on its way to one actor: enough to send it again to a replacement."""

    kind: str  # "step" | "reset" | "call" | "set_attr" | "flush"
    ref: Any
    args: tuple[Any, ...]
    deadline: float


@dataclass
class ActorInfo:
    """Where one actor of the manager runs.

    Attributes:
        index: The actor's index in the manager.
        envs: Global indices of its envs.
        node_id: Ray node id (hex).
        node_ip: The node's IP address.
        pid: The actor's process id.
        actor_id: Ray actor id (hex).
        restarts: How many times it was replaced.
    """

    index: int
    envs: range
    node_id: str = ""
    node_ip: str = ""
    pid: int = 0
    actor_id: str = ""
    restarts: int = 0

    @property
    def timer_name(self) -> str:
        return f"actor_{self.index}@{self.node_ip}"


class RayEnvManager(BatchedVectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose envs run in Ray actors across a cluster.

    The same API as :class:`envmgr.SubprocessEnvManager`, plus first-ready
    stepping (:meth:`async_reset` / :meth:`send` / :meth:`recv`).

    Example:
        >>> envs = RayEnvManager(lambda: gym.make("CartPole-v1"), 2, 64, address="auto")
        >>> obs, infos = envs.reset(seed=0)
        >>> obs, rew, term, trunc, infos = envs.step(envs.action_space.sample())

    Args:
        env_fns: One zero-argument env factory (called once per env) or a
            sequence of them, one per env. They travel with cloudpickle.
        n_actors: Number of Ray actors. Defaults to one per alive node of the
            cluster (each pinned to its node, softly) with a single factory, or
            is derived from the sequence's length and ``envs_per_actor``.
        envs_per_actor: Envs each actor owns and steps per call (default 1 with
            a single factory). Make it large: a Ray call costs ~1 ms.
        workers_per_actor: ``0``/``1``: the actor steps its envs itself.
            ``N > 1``: the actor runs an :class:`~envmgr.SubprocessEnvManager`
            with ``N`` worker processes (``envs_per_actor`` must be a multiple of ``N``).
        address: Ray address to connect to when Ray is not initialized yet:
            ``"auto"`` (an existing cluster on this machine), ``"ray://..."`` /
            ``"host:port"`` (a remote one), ``"local"`` (always start a new local
            instance) or ``None`` (Ray's default). Ignored when the driver is
            already connected.
        ray_init_kwargs: Further keyword arguments for ``ray.init`` (e.g.
            ``num_cpus``, ``_node_ip_address``), used only if this manager starts Ray.
        num_cpus_per_actor: CPUs each actor reserves (default:
            ``max(1, workers_per_actor)``; ``0`` reserves none).
        resources_per_actor: Custom resources each actor requests: one dict for
            all, or one per actor (e.g. ``[{"node_a": 1}, {"node_b": 1}]``).
        node_ids: Ray node ids (hex) to pin actors to, one per actor or cycled,
            through ``NodeAffinitySchedulingStrategy``.
        node_affinity_soft: Whether that pinning may fall back to another node.
        actor_options: Extra ``.options(...)`` for the actors (one dict for all or
            one per actor), applied last: ``scheduling_strategy``, ``runtime_env``...
        max_restarts: How many times each actor may be replaced after it dies
            (process killed, node lost) or overruns ``step_timeout``. A replaced
            actor's envs are rebuilt from their factories and reset (unseeded);
            the step returns with those envs truncated and
            ``infos["envmgr_restarted"]`` giving the reason. ``0`` (default): a
            failure closes the manager and raises :class:`RayActorDiedError` /
            :class:`~envmgr.errors.WorkerTimeoutError`; once the budget is
            spent, :class:`~envmgr.errors.BrokenWorkerError`.
        restart_window: Count restarts only within this many seconds (a rate
            limit); ``None`` counts over the manager's lifetime.
        step_timeout: Seconds an actor may take to answer a step, reset or call
            (``None``: no limit; a dead actor is still noticed at once).
        start_timeout: Seconds to place and start an actor (placement waits for
            resources; an impossible one ends here).
        close_timeout: Seconds ``close()`` waits for actors to close their envs
            before killing them.
        timer_interval: Seconds between timer-tree shipments from the actors.
        autoreset_mode: Gymnasium autoreset mode; next-step by default.
        check_actions: Validate actions against the action space before sending.
        context: Start method of the worker processes inside an actor
            (``workers_per_actor > 1``).
        shutdown_ray: Shut Ray down (or disconnect) on ``close()`` if this
            manager connected or started it (default). Several managers sharing
            that connection shut it down when the last one closes.
    """

    group_noun = "actors"

    def __init__(
        self,
        env_fns: EnvFactory | Sequence[EnvFactory],
        n_actors: int | None = None,
        envs_per_actor: int | None = None,
        *,
        workers_per_actor: int = 1,
        address: str | None = None,
        ray_init_kwargs: dict[str, Any] | None = None,
        num_cpus_per_actor: float | None = None,
        resources_per_actor: dict[str, float] | Sequence[dict[str, float]] | None = None,
        node_ids: Sequence[str] | None = None,
        node_affinity_soft: bool = False,
        actor_options: dict[str, Any] | Sequence[dict[str, Any]] | None = None,
        max_restarts: int = 0,
        restart_window: float | None = None,
        step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
        start_timeout: float | None = 120.0,
        close_timeout: float = 10.0,
        timer_interval: float = DEFAULT_TIMER_INTERVAL,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        check_actions: bool = True,
        context: str | None = None,
        shutdown_ray: bool = True,
    ) -> None:
        self.closed = True  # until start-up succeeds; makes close() safe to call early
        self._actors: list[Any] = []
        self._owns_ray = False
        self._broken: str | None = None
        self._inflight: dict[int, _Flight] = {}
        self._closing = False
        self._pending: tuple[str, Any] | None = None
        self._sub_checkers: dict[int, ActionChecker] = {}
        for name, value in (
            ("max_restarts", max_restarts),
            ("workers_per_actor", workers_per_actor),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be an int >= 0, got {value!r}")
        self.ray = ray = _import_ray()
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.workers_per_actor = workers_per_actor
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.timer_interval = timer_interval
        self.check_actions = check_actions
        self.context = context
        self.shutdown_ray = shutdown_ray
        self.failures: list[WorkerFailure] = []
        self._seq = 0
        self._worker_timers = WorkerTimers(timer_interval, self._flush_timers)

        self._owns_ray = _acquire_ray(ray, address, dict(ray_init_kwargs or {}))
        try:
            alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
            per_node = (
                n_actors is None
                and callable(env_fns)
                and node_ids is None
                and resources_per_actor is None
                and actor_options is None
            )
            fns, n_actors, envs_per_actor = self._layout(
                env_fns, n_actors, envs_per_actor, len(alive)
            )
            if workers_per_actor > 1 and envs_per_actor % workers_per_actor:
                raise ValueError(
                    f"envs_per_actor={envs_per_actor} is not a multiple of "
                    f"workers_per_actor={workers_per_actor}"
                )
            self.n_actors = n_actors
            self.envs_per_actor = envs_per_actor
            self.num_envs = n_actors * envs_per_actor
            if num_cpus_per_actor is None:
                num_cpus_per_actor = max(1, workers_per_actor)
            self._actor_opts = self._placement(
                n_actors,
                num_cpus_per_actor,
                resources_per_actor,
                list(node_ids) if node_ids is not None else (alive if per_node else None),
                node_affinity_soft if node_ids is not None else True,
                actor_options,
            )
            self._payloads = []
            for k in range(n_actors):
                chunk = fns[k * envs_per_actor : (k + 1) * envs_per_actor]
                try:
                    self._payloads.append(cloudpickle.dumps(chunk))
                except Exception as exc:
                    r = self._env_range(k)
                    raise ValueError(
                        f"env factory for actor {k} (envs {r.start}-{r.stop - 1}) cannot be "
                        f"pickled: {exc}"
                    ) from exc
            self.actor_info = [ActorInfo(k, self._env_range(k)) for k in range(n_actors)]
            self._restart_times: list[list[float]] = [[] for _ in range(n_actors)]
            self._start()
        except BaseException:
            self._shutdown(graceful=False)
            raise
        self.closed = False

    # ================================================================ start-up

    @staticmethod
    def _layout(
        env_fns: EnvFactory | Sequence[EnvFactory],
        n_actors: int | None,
        envs_per_actor: int | None,
        n_nodes: int,
    ) -> tuple[list[EnvFactory], int, int]:
        from envmgr.manager import _resolve_layout

        return _resolve_layout(
            env_fns,
            n_actors,
            envs_per_actor,
            default_groups=max(1, n_nodes),
            names=("n_actors", "envs_per_actor"),
        )

    def _placement(
        self,
        n_actors: int,
        num_cpus: float,
        resources: dict[str, float] | Sequence[dict[str, float]] | None,
        node_ids: list[str] | None,
        soft: bool,
        extra: dict[str, Any] | Sequence[dict[str, Any]] | None,
    ) -> list[dict[str, Any]]:
        def per_actor(value: Any, name: str) -> list[Any]:
            if value is None or isinstance(value, dict):
                return [value] * n_actors
            values = list(value)
            if len(values) != n_actors:
                raise ValueError(f"{name} has {len(values)} entries for n_actors={n_actors}")
            return values

        res = per_actor(resources, "resources_per_actor")
        extras = per_actor(extra, "actor_options")
        if node_ids is not None and not node_ids:
            raise ValueError("node_ids is empty")
        opts = []
        for k in range(n_actors):
            o: dict[str, Any] = {"num_cpus": num_cpus}
            if res[k]:
                o["resources"] = dict(res[k])
            if node_ids is not None:
                from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

                o["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                    node_id=node_ids[k % len(node_ids)], soft=soft
                )
            elif not res[k]:
                o["scheduling_strategy"] = "SPREAD"
            if extras[k]:
                o.update(extras[k])
            opts.append(o)
        return opts

    def _env_range(self, k: int) -> range:
        return range(k * self.envs_per_actor, (k + 1) * self.envs_per_actor)

    def _where(self, k: int) -> str:
        r = self._env_range(k)
        info = self.actor_info[k] if k < len(getattr(self, "actor_info", ())) else None
        where = f"ray actor {k} (envs {r.start}-{r.stop - 1})"
        if info is not None and info.node_ip:
            where += f" on node {info.node_ip} (node id {info.node_id[:12]}, pid {info.pid})"
        return where

    def _new_actor(self, k: int, notice: str | None) -> Any:
        cls = _actor_class(self.ray)
        return cls.options(**self._actor_opts[k]).remote(
            k,
            k * self.envs_per_actor,
            self._payloads[k],
            self.autoreset_mode.value,
            self.workers_per_actor,
            self.context,
            self.step_timeout,
            notice,
        )

    def _start(self) -> None:
        ray = self.ray
        self._actors = [self._new_actor(k, None) for k in range(self.n_actors)]
        refs = [a.start.remote() for a in self._actors]
        ready, not_ready = ray.wait(
            refs, num_returns=len(refs), timeout=self.start_timeout, fetch_local=True
        )
        if not_ready:
            late = [refs.index(r) for r in not_ready]
            raise WorkerTimeoutError(
                f"{', '.join(self._where(k) for k in late)} did not start within "
                f"{self.start_timeout} s: could it be placed? It asks for "
                f"{self._actor_opts[late[0]]}; the cluster has {ray.available_resources()} free",
                late[0],
                self._env_range(late[0]),
            )
        started: list[_Started] = []
        for k, ref in enumerate(refs):
            try:
                started.append(ray.get(ref, timeout=self._short_timeout()))
            except ray.exceptions.RayTaskError as err:
                self._raise_remote(k, err, "start")
            except ray.exceptions.RayError as err:
                raise self._died_error(k, "start", err) from err
        first = started[0].ready
        for k, s in enumerate(started):
            self._record(k, s)
            for kind in ("observation_space", "action_space"):
                if getattr(s.ready, kind) != getattr(first, kind):
                    raise ValueError(
                        f"{self._where(k)} has {kind} {getattr(s.ready, kind)}, "
                        f"but actor 0 (env 0) has {getattr(first, kind)}"
                    )
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(first.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        self.spec = first.spec
        self._checker = ActionChecker(self.single_action_space, self.num_envs, self.envs_per_actor)
        # Each actor's latest observations, so a masked reset can return the whole batch.
        self._obs_parts: list[Any] = [
            create_empty_array(self.single_observation_space, self.envs_per_actor)
            for _ in range(self.n_actors)
        ]

    def _record(self, k: int, s: _Started) -> None:
        info = self.actor_info[k]
        info.node_id, info.node_ip, info.pid = s.node_id, s.node_ip, s.ready.pid
        try:
            info.actor_id = self._actors[k]._actor_id.hex()
        except Exception:
            info.actor_id = ""

    def _short_timeout(self) -> float:
        return 30.0 if self.step_timeout is None else max(5.0, self.step_timeout)

    # ================================================================ failures

    def _node_alive(self, node_id: str) -> bool | None:
        try:
            for n in self.ray.nodes():
                if n.get("NodeID") == node_id:
                    return bool(n.get("Alive"))
        except Exception:
            return None
        return None

    def _died_error(self, k: int, phase: str, err: BaseException) -> RayActorDiedError:
        info = self.actor_info[k]
        lines = [ln.strip() for ln in str(err).splitlines()]
        # Ray's message: a headline, tab-indented fields, then the cause.
        reason = (
            " ".join(ln for ln in lines if ln and ":" not in ln.split(" ", 1)[0])
            or type(err).__name__
        )
        node_alive = self._node_alive(info.node_id) if info.node_id else None
        if "node has died" in str(err) or isinstance(err, self.ray.exceptions.NodeDiedError):
            node_alive = False  # Ray said so before its node table caught up
        how = "was lost with its node" if node_alive is False else "died"
        message = f"{self._where(k)} {how} during {phase}: {reason}"
        return RayActorDiedError(
            message,
            k,
            self._env_range(k),
            node_ip=info.node_ip or None,
            node_id=info.node_id or None,
            actor_id=info.actor_id or getattr(err, "actor_id", None),
            pid=info.pid or None,
            node_alive=node_alive,
            reason=reason,
        )

    def _replace(self, k: int, phase: str, failure: WorkerFailure) -> Any:
        """Replace actor ``k`` after ``failure`` and send it the call it owed; return the new ref.

        The policy is :class:`~envmgr.SubprocessEnvManager`'s: with
        ``max_restarts=0`` the failure itself is raised (a
        :class:`RayActorDiedError` or :class:`~envmgr.errors.WorkerTimeoutError`);
        once the budget is spent, :class:`~envmgr.errors.BrokenWorkerError`
        (caused by the failure). Either way the manager is closed first.
        """
        ray = self.ray
        self.failures.append(failure)
        flight = self._inflight.pop(k, None)
        info = self.actor_info[k]
        if self.max_restarts <= 0 or self._closing:
            self._break(str(failure))
            raise failure
        now = monotonic()
        history = self._restart_times[k]
        if self.restart_window is not None:
            history[:] = [t for t in history if now - t < self.restart_window]
        if len(history) >= self.max_restarts:
            window = "" if self.restart_window is None else f" within {self.restart_window:g} s"
            message = (
                f"{failure} -- after {len(history)} restarts{window}; max_restarts="
                f"{self.max_restarts} is spent, so the manager is closed"
            )
            self._break(message)
            raise BrokenWorkerError(message, k, self._env_range(k)) from failure
        history.append(now)
        info.restarts += 1
        logger.warning(
            "%s; replacing it (restart %d, max_restarts=%d)",
            failure,
            info.restarts,
            self.max_restarts,
        )
        with timers.hierarchical_timer(f"restart_actor_{k}", self._worker_timers.stack):
            try:
                ray.kill(self._actors[k], no_restart=True)
            except Exception:
                pass
            notice = (
                f"{failure}; envs {info.envs.start}-{info.envs.stop - 1} were rebuilt and reset "
                f"(restart {info.restarts})"
            )
            new = self._new_actor(k, notice)
            self._actors[k] = new
            ref = new.start.remote()
            ready, _ = ray.wait([ref], timeout=self.start_timeout)
            try:
                if not ready:
                    raise TimeoutError(
                        f"the replacement did not start within {self.start_timeout} s"
                    )
                started = ray.get(ref, timeout=self._short_timeout())
            except Exception as exc:
                message = f"{failure} -- and its replacement failed: {type(exc).__name__}: {exc}"
                self._break(message)
                raise BrokenWorkerError(message, k, self._env_range(k)) from failure
            self._record(k, started)
        if flight is None:
            return None
        self._dispatch(k, flight.kind, flight.args, self.step_timeout)
        return self._inflight[k].ref

    def _raise_remote(self, k: int, err: Any, phase: str) -> None:
        """Re-raise an exception raised in actor ``k`` as its own type, else as WorkerError."""
        cause = getattr(err, "cause", None)
        tb = getattr(err, "traceback_str", None) or str(err)
        if isinstance(cause, BaseException):
            notes = getattr(cause, "__notes__", ())
            if not any(str(n).startswith(f"raised in envmgr ray actor {k} ") for n in notes):
                _add_note(cause, f"raised in envmgr {self._where(k)}, during {phase}")
            if phase == "start":
                self._break(f"{self._where(k)} failed to build its envs: {cause!r}")
            raise cause from RemoteTraceback(tb)
        message = f"{self._where(k)}, during {phase}: {err}"
        if phase == "start":
            self._break(message)
        raise WorkerError(message, k, self._env_range(k), type(err).__name__) from RemoteTraceback(
            tb
        )

    @staticmethod
    def _is_actor_loss(err: Any) -> bool:
        """An actor task error that means the actor itself is lost (its inner manager broke)."""
        cause = getattr(err, "cause", None)
        return isinstance(
            cause, (WorkerDiedError, WorkerTimeoutError, BrokenWorkerError, ClosedManagerError)
        )

    def _break(self, reason: str) -> None:
        """Mark the manager unusable and release every resource it holds."""
        self._broken = reason
        self._pending = None
        self._inflight.clear()
        self._shutdown(graceful=False)
        self.closed = True

    # ================================================================ dispatch / collect

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _dispatch(self, k: int, kind: str, args: tuple[Any, ...], timeout: float | None) -> None:
        actor = self._actors[k]
        seq = self._next_seq()
        if kind == "step":
            ref = actor.step.remote(_pack((seq, *args), args[0]))
        elif kind == "reset":
            ref = actor.reset.remote(_pack((seq, *args), None))
        elif kind == "call":
            ref = actor.call.remote(*args)
        elif kind == "set_attr":
            ref = actor.set_attr.remote(*args)
        elif kind == "flush":
            ref = actor.flush_timers.remote(seq)
        else:  # pragma: no cover - internal misuse
            raise ValueError(kind)
        deadline = float("inf") if timeout is None else monotonic() + timeout
        self._inflight[k] = _Flight(kind, ref, args, deadline)

    def _collect(
        self,
        actors: Sequence[int],
        phase: str,
        need: int | None = None,
        timeout: float | None = None,
    ) -> dict[int, Any]:
        """Wait for the calls in flight to ``actors``; replace dead or hung actors on the way.

        Args:
            actors: Actors whose calls to wait for.
            phase: What the calls were, for messages.
            need: Return once this many answers are in (first-ready); the other
                calls stay in flight. ``None``: all of them.
            timeout: Seconds to wait, overriding the calls' own deadlines
                (``step_timeout`` from when each was sent) if sooner.

        Env exceptions are raised (as their own type) once every awaited answer
        is in, keeping the actors in step.
        """
        ray = self.ray
        exc_mod = ray.exceptions
        actors = list(actors)
        if timeout is not None:
            cap = monotonic() + timeout
            for k in actors:
                flight = self._inflight[k]
                flight.deadline = min(flight.deadline, cap)
        if need is None and actors:
            # Fast path, the steady state: one ray.get for every answer. Any
            # failure or timeout falls through to the careful loop below, which
            # finds the answers already in.
            deadline = min(self._inflight[k].deadline for k in actors)
            wait_s = None if deadline == float("inf") else max(0.0, deadline - monotonic())
            try:
                values = ray.get([self._inflight[k].ref for k in actors], timeout=wait_s)
            except Exception:
                pass
            else:
                for k in actors:
                    del self._inflight[k]
                return {k: _unpack(v) for k, v in zip(actors, values, strict=True)}
        want = len(actors) if need is None else min(need, len(actors))
        results: dict[int, Any] = {}
        errors: list[tuple[int, Any]] = []
        waiting = {self._inflight[k].ref: k for k in actors}
        while waiting and len(results) + len(errors) < want:
            now = monotonic()
            failure: WorkerFailure
            for ref, k in list(waiting.items()):
                if self._inflight[k].deadline <= now:
                    del waiting[ref]
                    failure = WorkerTimeoutError(
                        f"{self._where(k)} did not answer {phase} within "
                        f"{self._timeout_text(timeout)} s",
                        k,
                        self._env_range(k),
                    )
                    waiting[self._replace(k, phase, failure)] = k
            deadline = min(self._inflight[k].deadline for k in waiting.values())
            wait_s = None if deadline == float("inf") else max(0.0, deadline - monotonic())
            ready, _ = ray.wait(
                list(waiting),
                num_returns=min(want - len(results) - len(errors), len(waiting)),
                timeout=wait_s,
            )
            for ref in ready:
                k = waiting.pop(ref)
                try:
                    results[k] = _unpack(ray.get(ref, timeout=self._short_timeout()))
                    del self._inflight[k]
                except exc_mod.RayTaskError as err:
                    if self._is_actor_loss(err):
                        failure = self._died_error(k, phase, err)
                        waiting[self._replace(k, phase, failure)] = k
                    else:
                        del self._inflight[k]
                        errors.append((k, err))
                except exc_mod.GetTimeoutError:
                    waiting[ref] = k  # not really ready yet; its deadline decides
                except exc_mod.RayError as err:
                    # RayActorError (ActorDiedError, ActorUnavailableError), a lost
                    # node or result object, a crashed worker: the actor is gone.
                    failure = self._died_error(k, phase, err)
                    waiting[self._replace(k, phase, failure)] = k
        if errors:
            first, remote = errors[0]
            self._raise_remote(first, remote, phase)
        return results

    def _timeout_text(self, timeout: float | None) -> str:
        return f"{self.step_timeout if timeout is None else timeout}"

    # ================================================================ timers

    def _merge_results(self, results: Iterable[RayStepResult]) -> None:
        self._worker_timers.merge(
            (
                self.actor_info[r.response.worker_index].timer_name,
                r.response.timer_root,
                r.response.gauges,
            )
            for r in results
        )

    def _flush_timers(self) -> None:
        """Pull every actor's unshipped timings into the current target."""
        if (
            not self._worker_timers.unshipped
            or self._inflight
            or self._pending is not None
            or self.closed
        ):
            return
        for k in range(self.n_actors):
            self._dispatch(k, "flush", (), self.step_timeout)
        results = self._collect(range(self.n_actors), "flush_timers")
        self._merge_results(results.values())
        self._worker_timers.shipped()

    # ================================================================ checks

    # ================================================================ VectorEnv API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``).

        Args:
            seed: ``None`` (random), an int ``s`` (env ``i`` gets ``s + i``, as in
                ``SyncVectorEnv``), or one seed per env.
            options: Passed to every ``env.reset``; a ``"reset_mask"`` entry (bool
                array of shape ``(num_envs,)``) resets only those envs.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def _reset_commands(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> dict[int, tuple[Any, ...]]:
        n = self.num_envs
        seeds, options, mask = reset_arguments(seed, options, n)
        ship = self._worker_timers.want()
        commands = {}
        for k in range(self.n_actors):
            r = self._env_range(k)
            if mask is not None and not mask[r.start : r.stop].any():
                continue
            sub = None if mask is None else tuple(bool(b) for b in mask[r.start : r.stop])
            commands[k] = (tuple(seeds[r.start : r.stop]), options, sub, ship)
        return commands

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to the actors without waiting (see :meth:`reset`)."""
        self._check_idle("reset_async")
        commands = self._reset_commands(seed, options)
        for k, args in commands.items():
            self._dispatch(k, "reset", args, self.step_timeout)
        self._worker_timers.unshipped = True
        self._pending = ("reset", sorted(commands))

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset sent by :meth:`reset_async`.

        Args:
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.
        """
        actors = self._take_pending("reset")
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            results = self._collect(actors, "reset", timeout=timeout)
        self._after_collect(results)
        for k, r in results.items():
            self._obs_parts[k] = r.observations
        obs = _concat_batches(self.single_observation_space, self._obs_parts)
        e = self.envs_per_actor
        per_env = [
            (k * e + i, info) for k in sorted(results) for i, info in results[k].response.infos
        ]
        return obs, self._vector_infos(per_env)

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action; see ``gymnasium.vector.VectorEnv.step``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Validate the actions and send each actor its share, without waiting."""
        self._check_idle("step_async")
        if self.check_actions:
            self._checker.check(actions)
        ship = self._worker_timers.want()
        space = self.single_action_space
        for k in range(self.n_actors):
            r = self._env_range(k)
            self._dispatch(
                k,
                "step",
                (_take_rows(space, actions, slice(r.start, r.stop)), ship),
                self.step_timeout,
            )
        self._worker_timers.unshipped = True
        self._pending = ("step", None)

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step sent by :meth:`step_async` and return its batch.

        Args:
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.
        """
        self._take_pending("step")
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            results = self._collect(range(self.n_actors), "step", timeout=timeout)
        self._after_collect(results)
        return self._assemble(results, list(range(self.n_actors)))

    def _after_collect(self, results: dict[int, RayStepResult]) -> None:
        shipped = [r for r in results.values() if r.response.timer_root is not None]
        if shipped:
            self._merge_results(shipped)
            if len(shipped) == len(results) and not self._inflight:
                self._worker_timers.shipped()

    def _assemble(
        self, results: dict[int, RayStepResult], actors: list[int]
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        for k in actors:
            self._obs_parts[k] = results[k].observations
        obs = _concat_batches(
            self.single_observation_space, [results[k].observations for k in actors]
        )
        rewards = np.concatenate([results[k].rewards for k in actors])
        terms = np.concatenate([results[k].terminations for k in actors])
        truncs = np.concatenate([results[k].truncations for k in actors])
        e = self.envs_per_actor
        per_env = [(k * e + i, info) for k in actors for i, info in results[k].response.infos]
        everyone = actors == list(range(self.n_actors))
        rows = None if everyone else np.concatenate([self._env_range(k) for k in actors])
        return obs, rewards, terms, truncs, self._vector_infos(per_env, rows)

    # ---------------------------------------------------------------- first-ready stepping

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start stepping some envs without waiting (EnvPool's ``send``).

        Together with :meth:`recv` this gives first-ready stepping: each actor
        steps as soon as it has actions, and ``recv`` returns whichever actors
        finish first, so a slow node no longer holds the whole batch back.

        Args:
            actions: Batched actions for ``env_ids`` (row ``j`` for ``env_ids[j]``).
            env_ids: Global env indices to step; they must be whole actors'
                groups (``envs_per_actor`` consecutive ids starting at a multiple
                of it), typically the ``env_ids`` a previous :meth:`recv` returned.
                ``None`` steps every env.

        Raises:
            ValueError: Ids that split an actor's group, or an actor that already
                has a step in flight.
        """
        self._check_usable("send")
        if self._pending is not None:
            raise AlreadyPendingCallError(
                f"cannot send while a {self._pending[0]} call is pending", self._pending[0]
            )
        e = self.envs_per_actor
        ids, targets = whole_groups(env_ids, self.num_envs, e, "actors")
        busy = [k for k in targets if k in self._inflight]
        if busy:
            raise ValueError(
                f"{self._where(busy[0])} already has a step in flight: recv() it first"
            )
        if self.check_actions:
            checker = self._sub_checkers.get(len(ids))
            if checker is None:
                checker = ActionChecker(self.single_action_space, len(ids), e)
                self._sub_checkers[len(ids)] = checker
            checker.check(actions, ids)
        space = self.single_action_space
        actor_of = ids // e
        shares = {}
        for k in targets:
            rows = np.flatnonzero(actor_of == k)
            shares[k] = _take_rows(space, actions, rows[np.argsort(ids[rows])])
        ship = self._worker_timers.want()
        for k in targets:
            self._dispatch(k, "step", (shares[k], ship), self.step_timeout)
        self._worker_timers.unshipped = True

    def async_reset(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Reset every env without waiting; :meth:`recv` returns the actors as they finish.

        A first-ready loop can start with this instead of ``reset()`` followed
        by ``send()``: each actor starts stepping as soon as its own reset is
        received. Resets come back from :meth:`recv` with zero rewards and no
        done flags.
        """
        self._check_idle("async_reset")
        if options is not None and "reset_mask" in options:
            raise ValueError("async_reset() resets every env: reset_mask is not supported here")
        for k, args in self._reset_commands(seed, options).items():
            self._dispatch(k, "reset", args, self.step_timeout)
        self._worker_timers.unshipped = True

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Return the first actors to finish their :meth:`send` (EnvPool's ``recv``).

        Args:
            batch_size: Envs to return, rounded up to whole actors; defaults to
                one actor's group. Capped at what is in flight.
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``
                (counted from each ``send``). An actor that overruns it is
                handled like a dead one (replaced under ``max_restarts``).

        Returns:
            ``(obs, rewards, terminations, truncations, infos, env_ids)`` for the
            returned envs, in ``env_ids`` order (ascending actor index).
        """
        self._check_usable("recv")
        if not self._inflight:
            raise NoAsyncCallError(
                "recv() called with no step in flight: send() (or async_reset()) first", "recv"
            )
        e = self.envs_per_actor
        need = min(len(self._inflight), max(1, -(-(batch_size or e) // e)))
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            results = self._collect(sorted(self._inflight), "step", need=need, timeout=timeout)
        self._after_collect(results)
        chosen = sorted(results)
        for k in chosen:
            r = results[k]
            if r.rewards is None:  # an answer to async_reset
                results[k] = RayStepResult(
                    r.response,
                    r.observations,
                    np.zeros(e, dtype=np.float64),
                    np.zeros(e, dtype=np.bool_),
                    np.zeros(e, dtype=np.bool_),
                )
        obs, rewards, terms, truncs, infos = self._assemble(results, chosen)
        ids = np.concatenate([np.arange(k * e, (k + 1) * e) for k in chosen])
        return obs, rewards, terms, truncs, infos, ids

    # ---------------------------------------------------------------- call / attrs

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Send :meth:`call` to every actor without waiting (``AsyncVectorEnv``'s API)."""
        self._check_idle("call_async")
        for k in range(self.n_actors):
            self._dispatch(k, "call", (name, args, kwargs), self.step_timeout)
        self._pending = ("call", name)

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call sent by :meth:`call_async`; one result per env."""
        name = self._take_pending("call")
        results = self._collect(range(self.n_actors), f"call({name!r})", timeout=timeout)
        return tuple(x for k in range(self.n_actors) for x in results[k])

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every env: one value for all, or a list/tuple per env."""
        self._check_idle("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"got {len(values)} values for num_envs={self.num_envs}")
        for k in range(self.n_actors):
            r = self._env_range(k)
            self._dispatch(
                k, "set_attr", (name, tuple(values[r.start : r.stop])), self.step_timeout
            )
        self._collect(range(self.n_actors), "set_attr")

    # ---------------------------------------------------------------- introspection

    @property
    def actor_handles(self) -> list[Any]:
        """The live Ray actor handles, by actor index (for inspection and tests)."""
        return list(self._actors)

    @property
    def actors_in_flight(self) -> list[int]:
        """Actors sent a step or reset (:meth:`send` / :meth:`async_reset`) not yet received."""
        return sorted(self._inflight)

    @property
    def restarts(self) -> list[int]:
        """How many times each actor was replaced."""
        return [a.restarts for a in self.actor_info]

    # ---------------------------------------------------------------- shutdown

    def close(self, **kwargs: Any) -> None:
        """Close every actor's envs, kill the actors and, if this manager started Ray, stop it.

        Idempotent; safe after failures.
        """
        if self.closed and not self._actors and not self._owns_ray:
            return
        try:
            if (
                not self.closed
                and self._broken is None
                and self._pending is None
                and not self._inflight
            ):
                self._closing = True  # a dead actor is not replaced just to flush timers
                try:
                    self._flush_timers()
                except Exception:
                    pass  # timings are a courtesy at close; never block shutdown on them
        finally:
            self._shutdown(graceful=True)
            self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        """Part of Gymnasium's ``VectorEnv.close`` protocol; :meth:`close` does the work."""
        self._shutdown(graceful=True)

    def _shutdown(self, graceful: bool) -> None:
        worker_timers = getattr(self, "_worker_timers", None)
        if worker_timers is not None:
            worker_timers.close()
        actors, self._actors = self._actors, []
        self._inflight = {}
        ray = getattr(self, "ray", None)
        if actors and ray is not None and ray.is_initialized():
            if graceful:
                try:
                    refs = [a.close.remote() for a in actors]
                    ray.wait(refs, num_returns=len(refs), timeout=self.close_timeout)
                except Exception:
                    pass
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:
                    pass
        if self._owns_ray:
            self._owns_ray = False
            if ray is not None:
                _release_ray(ray, shutdown=self.shutdown_ray)

    def __del__(self) -> None:
        # Safety net only (Ray also kills a driver's actors when the driver exits).
        try:
            if getattr(self, "_actors", None):
                self._shutdown(graceful=False)
        except Exception:
            pass

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        name = spec.id if spec is not None else "envs"
        return (
            f"RayEnvManager({name}, num_envs={getattr(self, 'num_envs', '?')}, "
            f"n_actors={getattr(self, 'n_actors', '?')}, "
            f"envs_per_actor={getattr(self, 'envs_per_actor', '?')}, "
            f"workers_per_actor={self.workers_per_actor})"
        )
