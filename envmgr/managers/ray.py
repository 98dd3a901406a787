"""``RayEnvManager``: envmgr's batched ``VectorEnv`` with its envs in Ray actors.

When one machine is not enough, the envs move into Ray actors spread over a
cluster -- the engine RL users already run (RLlib) -- behind the same
``gymnasium.vector.VectorEnv`` API as :class:`envmgr.SubprocessEnvManager`: the
public API is :class:`~envmgr.frontend.vector_env.BatchedVectorEnv`'s; this module holds the
arguments, the documentation and the Ray connection, and builds the backend::

    RayEnvManager (frontend.BatchedVectorEnv: API, restarts, infos, timers)
        |  post / post_step / wait / replace
        v
    RayBackend (backends/ray/backend.py) -- actor.run.remote(cmd), ray.wait -->
        EnvActor (backends/ray/actor.py) -- serve(cmd) --> EnvGroup (envmgr.envside.group)

* One actor per node (or per group of cores) owns many envs. A Ray actor call
  costs about ten times a pipe round trip to a child process (under a millisecond
  against tens of microseconds on the 2-vCPU machine of
  ``benchmarks/results/record/outputs/ray_call.json``), so each call carries a whole batch:
  one call per actor per batch step, answered with the actor's rows of the batch.
* Inside an actor the envs are stepped inline (``workers_per_actor`` 0 or 1) or
  by envmgr's own :class:`~envmgr.SubprocessEnvManager`, hosted as a batched env,
  when the actor is given several cores (``workers_per_actor=N``).
* Actor timer trees are merged under the caller's current timer as parallel
  nodes: ``workers`` -> ``worker_root`` (all actors summed) and
  ``actor_<k>@<node ip>`` (each actor alone).
* Every remote wait is bounded. A dead actor (process killed, node lost) or a
  hung one is reported as :class:`RayActorDiedError` /
  :class:`~envmgr.errors.WorkerTimeoutError` naming the actor, its envs and its
  node; the restart policy is the front end's, the same as for local workers.

Ray is imported only when a manager is built: ``import envmgr`` (and this
module) work without it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from envmgr.backends.ray.backend import ActorInfo, RayBackend
from envmgr.errors import RayActorDiedError
from envmgr.frontend.options import (
    DEFAULT_START_TIMEOUT,
    FrontEndOptions,
    check_options,
    ragged_options,
    seconds,
)
from envmgr.frontend.results import RESTARTED_INFO_KEY
from envmgr.frontend.vector_env import BatchedVectorEnv
from envmgr.managers.arguments import group_specs, hosted_layout

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "RayEnvManager",
    "RayActorDiedError",
    "ActorInfo",
    "RESTARTED_INFO_KEY",
    "RAY_INSTALL_HINT",
]

EnvFactory = Callable[[], gym.Env[Any, Any]]

#: What to run when Ray is missing.
RAY_INSTALL_HINT = 'pip install "envmgr[ray]"'
#: Default seconds an actor may take to answer one step, reset or call.
DEFAULT_STEP_TIMEOUT = 60.0


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(
            "envmgr's Ray backend (RayEnvManager) needs Ray, which is not installed: "
            f'run `{RAY_INSTALL_HINT}` (or `pip install "ray[default]"`)'
        ) from exc
    return ray


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


class RayEnvManager(BatchedVectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose envs run in Ray actors across a cluster.

    The same API as :class:`envmgr.SubprocessEnvManager`, first-ready stepping
    (:meth:`async_reset` / :meth:`send` / :meth:`recv`) included.

    Example:
        >>> envs = RayEnvManager(lambda: gym.make("CartPole-v1"), 2, 64, address="auto")
        >>> obs, infos = envs.reset(seed=0)
        >>> obs, rew, term, trunc, infos = envs.step(envs.action_space.sample())

    Args:
        env_fns: One zero-argument env factory (called once per env) or a
            sequence of them, one per env. They travel with cloudpickle.
        n_actors: Number of Ray actors; default ``min(num_envs, alive nodes)``, the
            envs split as evenly as they go (the first actors one env more), as
            :class:`~envmgr.SubprocessEnvManager` splits them over its cores. A
            single factory without ``num_envs`` gets one actor per alive node (each
            pinned to its node, softly) of ``envs_per_actor`` envs; with no size at
            all it is refused (``TypeError``).
        envs_per_actor: Envs each actor owns and steps per call (an even split; default
            1 with a single factory). Make it large: a Ray call costs far more than a
            step of a cheap env.
        workers_per_actor: ``0``/``1``: the actor steps its envs itself.
            ``N > 1`` with ``env_fns``: the actor runs an
            :class:`~envmgr.SubprocessEnvManager` with ``N`` worker processes
            (``envs_per_actor`` must be a multiple of ``N``). With ``vector_fn`` the
            actor hosts its batched env itself, and ``N`` only sets the default
            ``num_cpus_per_actor``.
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
        step_timeout: Seconds an actor may take to answer a step, reset or call
            (``None``: no limit; a dead actor is still noticed at once).
        close_timeout: Seconds ``close()`` waits for actors to close their envs
            before killing them.
        context: Start method of the worker processes inside an actor
            (``workers_per_actor > 1``).
        shutdown_ray: Shut Ray down (or disconnect) on ``close()`` if this
            manager connected or started it (default). Several managers sharing
            that connection shut it down when the last one closes.
        **options: The arguments both managers take, documented in
            :class:`~envmgr.frontend.options.FrontEndOptions`: ``num_envs``, ``vector_fn``
            (a batched env hosted per actor), ``copy``, ``autoreset_mode``,
            ``check_actions``, ``max_restarts`` (a lost actor is a dead actor
            process, a lost node, or one that overran ``step_timeout``),
            ``restart_window``, ``start_timeout`` (placing an actor waits for
            resources; an impossible one ends here), ``timer_interval``,
            ``max_worker_steps`` and ``max_worker_memory`` (recycling: each actor
            reports its own resident memory, wherever it runs), and for
            ``Sequence``/``Graph`` observations ``ragged`` and ``capacity`` (each actor
            ships its rows as padded arrays plus lengths in its answer).
    """

    group_noun = "actors"
    group_noun_singular = "actor"

    def __init__(
        self,
        env_fns: EnvFactory | Sequence[EnvFactory] | None = None,
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
        step_timeout: float | None = DEFAULT_STEP_TIMEOUT,
        close_timeout: float = 10.0,
        context: str | None = None,
        shutdown_ray: bool = True,
        **options: Unpack[FrontEndOptions],
    ) -> None:
        check_options("RayEnvManager", dict(options))
        seconds("step_timeout", step_timeout, none=True)
        seconds("close_timeout", close_timeout, zero=True)
        self._owns_ray = False
        if not isinstance(workers_per_actor, int) or workers_per_actor < 0:
            raise ValueError(f"workers_per_actor must be an int >= 0, got {workers_per_actor!r}")
        self.ray = ray = _import_ray()
        self.workers_per_actor = workers_per_actor
        self.context = context
        self.shutdown_ray = shutdown_ray
        self.close_timeout = close_timeout
        self._owns_ray = _acquire_ray(ray, address, dict(ray_init_kwargs or {}))
        try:
            alive = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
            per_node = (
                n_actors is None
                and callable(env_fns)
                and options.get("num_envs") is None
                and node_ids is None
                and resources_per_actor is None
                and actor_options is None
            )
            names = ("n_actors", "envs_per_actor")
            fns, layout, mode = hosted_layout(
                env_fns, n_actors, envs_per_actor, options, names, default_groups=len(alive)
            )
            vector_fn = options.get("vector_fn")
            if workers_per_actor > 1 and fns is not None:
                if any(size % workers_per_actor for size in layout.sizes):
                    raise ValueError(
                        f"envs_per_actor={max(layout.sizes)} is not a multiple of "
                        f"workers_per_actor={workers_per_actor}"
                    )
                vector_fn = _InnerManager(
                    tuple(fns), workers_per_actor, context, mode, step_timeout
                )
                fns = None
            self.n_actors = layout.n_groups
            self.envs_per_actor = layout.sizes[0] if layout.even else None
            self.actor_sizes = layout.sizes
            if num_cpus_per_actor is None:
                num_cpus_per_actor = max(1, workers_per_actor)
            opts = self._placement(
                layout.n_groups,
                num_cpus_per_actor,
                resources_per_actor,
                list(node_ids) if node_ids is not None else (alive if per_node else None),
                node_affinity_soft if node_ids is not None else True,
                actor_options,
            )
            payloads = group_specs(layout, fns, vector_fn, mode, "actor", ragged_options(options))
            backend = RayBackend(
                ray,
                layout,
                payloads,
                opts,
                start_timeout=options.get("start_timeout", DEFAULT_START_TIMEOUT),
                close_timeout=close_timeout,
                get_timeout=30.0 if step_timeout is None else max(5.0, step_timeout),
            )
            self.actor_info = backend.actor_info
            self._open(backend, options, autoreset_mode=mode, step_timeout=step_timeout)
        except BaseException:
            self._shutdown(graceful=False)
            raise

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

    @property
    def actor_handles(self) -> list[Any]:
        """The live Ray actor handles, by actor index (for inspection and tests)."""
        backend = self._backend
        return [] if backend is None else list(backend.actors)  # type: ignore[attr-defined]

    @property
    def actors_in_flight(self) -> list[int]:
        """Actors sent a step or reset (:meth:`send` / :meth:`async_reset`) not yet received."""
        return self._groups_in_flight()

    @property
    def restarts(self) -> list[int]:
        """How many times each actor was replaced after a failure.

        Recycles count in ``.recycles``.
        """
        return list(self._budget.restarts)

    def _shutdown(self, graceful: bool) -> None:
        try:
            super()._shutdown(graceful)
        finally:
            if self._owns_ray:
                self._owns_ray = False
                _release_ray(self.ray, shutdown=self.shutdown_ray)

    def _repr_fields(self) -> str:
        per = getattr(self, "envs_per_actor", "?")
        split = f"actor_sizes={self.actor_sizes}" if per is None else f"envs_per_actor={per}"
        return (
            f"n_actors={getattr(self, 'n_actors', '?')}, {split}, "
            f"workers_per_actor={getattr(self, 'workers_per_actor', '?')}"
        )


class _InnerManager:
    """``vector_fn`` of an actor given several cores: envmgr's own manager over its envs."""

    def __init__(
        self,
        fns: tuple[EnvFactory, ...],
        workers: int,
        context: str | None,
        mode: str,
        step_timeout: float | None,
    ) -> None:
        self.fns, self.workers, self.context = fns, workers, context
        self.mode, self.step_timeout = mode, step_timeout

    def __call__(self, n: int) -> Any:
        from envmgr.managers.local import SubprocessEnvManager

        return SubprocessEnvManager(
            list(self.fns[:n]),
            n_workers=self.workers,
            context=self.context,
            autoreset_mode=self.mode,
            step_timeout=self.step_timeout,
            check_actions="off",  # the driver checked them
        )
