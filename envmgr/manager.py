"""``SubprocessEnvManager``: many envs in a few worker processes, stepped as one batch.

The public API lives in :class:`~envmgr.frontend.BatchedVectorEnv`; this module
holds the constructor's arguments and documentation, and builds the local
backend (:mod:`envmgr.process_backend`)::

    SubprocessEnvManager (frontend.BatchedVectorEnv: API, restarts, infos, timers)
        |  post / post_step / wait / replace
        v
    ProcessBackend -- shared memory + doorbell words --> worker_main (envmgr.worker)
                                                             |  serve(cmd)
                                                             v
                                                         EnvGroup (envmgr.envgroup)

Worker timer trees are merged into the caller's current timer context under
``workers`` -> ``worker_root`` and ``workers`` -> ``worker_<i>`` as parallel
nodes; workers ship them every ``timer_interval`` seconds, and any read of the
tree through :mod:`envmgr.timers` first pulls in what has not been shipped.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import threading
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import cloudpickle
import gymnasium as gym
from gymnasium.vector import AutoresetMode

from envmgr.envgroup import GroupSpec
from envmgr.frontend import BatchedVectorEnv
from envmgr.layout import Layout, resolve_layout
from envmgr.process_backend import ProcessBackend

__all__ = ["SubprocessEnvManager", "default_start_method", "DEFAULT_SPIN_SECONDS"]

EnvFactory = Callable[[], gym.Env[Any, Any]]
VectorEnvFactory = Callable[[int], gym.vector.VectorEnv]  # type: ignore[type-arg]

#: How long a worker busy-polls (yielding its core) for the next command before
#: it blocks. Measured with benchmarks/probe.py spin on a 2-vCPU VM: waking a
#: sleeping worker costs far more there than the 20 µs of a pipe hop (an idle
#: vCPU must be woken by the host), and budgets of 1-2 ms beat 0.2 ms by
#: 10-30% on compute-bound and CartPole batches; longer only burns idle CPU.
DEFAULT_SPIN_SECONDS = 1e-3
#: How often workers ship their timer trees during a steady stepping loop.
DEFAULT_TIMER_INTERVAL = 1.0

_LIVE_MANAGERS: weakref.WeakSet[SubprocessEnvManager] = weakref.WeakSet()


def _native_thread_count() -> int:
    """Threads of this process, native ones included (Linux); else Python's count."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def default_start_method() -> str:
    """``forkserver`` where it exists (Linux, macOS), else ``spawn``.

    ``fork`` is faster to start but unsafe once the parent has threads (Ray,
    PyTorch, gRPC all start some), so it is only used when asked for.
    """
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


def _resolve_layout(
    env_fns: EnvFactory | Sequence[EnvFactory], n_groups: int | None, per_group: int | None
) -> tuple[list[EnvFactory], int, int]:
    """(factories, groups, envs per group) of an even layout; see :func:`resolve_layout`."""
    fns, layout = resolve_layout(env_fns, n_groups, per_group)
    return fns, layout.n_groups, max(layout.sizes)


def group_specs(
    layout: Layout,
    fns: Sequence[EnvFactory] | None,
    vector_fn: VectorEnvFactory | None,
    autoreset_mode: str,
    noun: str,
) -> list[bytes]:
    """Each group's cloudpickled :class:`GroupSpec`; an unpicklable factory fails here."""
    payloads = []
    for g in range(layout.n_groups):
        r = layout.range(g)
        spec = GroupSpec(
            g,
            r.start,
            len(r),
            autoreset_mode,
            None if fns is None else tuple(fns[r.start : r.stop]),
            vector_fn,
        )
        try:
            payloads.append(cloudpickle.dumps(spec))
        except Exception as exc:
            raise ValueError(
                f"env factory for {noun} {g} (envs {r.start}-{r.stop - 1}) cannot be pickled: {exc}"
            ) from exc
    return payloads


class SubprocessEnvManager(BatchedVectorEnv):
    """A ``gymnasium.vector.VectorEnv`` whose envs run in worker processes.

    Example:
        >>> import gymnasium as gym
        >>> from envmgr import SubprocessEnvManager
        >>> with SubprocessEnvManager(lambda: gym.make("CartPole-v1"), 2, 4) as envs:
        ...     obs, infos = envs.reset(seed=0)
        ...     obs, rew, term, trunc, infos = envs.step(envs.action_space.sample())

    Args:
        env_fns: One zero-argument env factory, called once per env, or a
            sequence of them, one per env (as ``gymnasium.vector.AsyncVectorEnv``).
            Lambdas and closures are fine: they travel with cloudpickle.
        n_workers: Number of worker processes. With a single factory it defaults
            to ``min(2, cpu_count)``; with a sequence (or ``num_envs``), to the
            largest divisor of the env count not above the core count.
        envs_per_worker: Envs each worker owns (an even split).
        num_envs: Total envs, with a single factory or ``vector_fn``. Any
            ``num_envs >= n_workers`` works: worker ``w`` gets ``num_envs //
            n_workers`` envs and the first ``num_envs % n_workers`` workers one more.
        vector_fn: Instead of ``env_fns``: ``vector_fn(k) -> gymnasium.vector.VectorEnv``
            with ``num_envs == k``, called once in each worker for its ``k`` envs (a
            batched env hosted per worker: one ``step`` call per worker per batch;
            its own autoreset mode applies). Needs ``num_envs``.
        context: Start method: ``"fork"``, ``"forkserver"`` or ``"spawn"``.
            Defaults to :func:`default_start_method`. Scripts without a
            ``__main__`` guard work under all three.
        copy: Return copies of the observations (default). With ``False`` the
            observations returned are read-only views into shared memory that the
            next ``step``/``reset`` overwrites: copy what you keep.
        autoreset_mode: Gymnasium autoreset mode; next-step by default.
        spin_seconds: How long a worker busy-polls for the next command before
            blocking (``0`` blocks at once; default 1 ms). Spinning saves a
            wake-up per step while stepping (on a VM, waking an idle vCPU costs
            much more than the ~20 µs of a pipe hop); it yields the core on every
            turn, so it does not starve other processes, but an idle worker burns
            up to this much CPU after each command before it sleeps.
        parent_spin_seconds: How long ``step_wait`` busy-polls (yielding) for the
            workers to finish before it sleeps. Off by default: on a machine with
            no spare core the parent's spinning competes with the workers.
        step_timeout: Seconds a worker may take to answer a step or reset
            (``None``: no limit; a dead worker is still noticed at once).
        start_timeout: Seconds a worker may take to build its envs.
        close_timeout: Seconds ``close()`` waits for workers to exit before
            terminating them.
        timer_interval: Seconds between timer-tree shipments from workers while
            stepping; reads of the timer tree always pull in the rest first.
        check_actions: How actions are checked in the parent before they are
            sent: ``"safe"`` (default: structure, shape and a castable dtype, as
            ``AsyncVectorEnv`` passes actions on), ``"strict"`` (also every value
            against the space) or ``"off"``. ``True``/``False`` mean safe/off.
        max_restarts: How many times each worker may be replaced after it dies
            or overruns ``step_timeout``. A replaced worker rebuilds its envs from
            their factories and resets them; the step returns with those envs
            truncated and ``infos["envmgr_restarted"]`` giving the reason. ``0``
            (default): a failure breaks the manager and raises; later calls raise
            :class:`~envmgr.errors.BrokenManagerError`.
        restart_window: Count restarts only within this many seconds (a rate
            limit); ``None`` counts over the manager's lifetime.
        shared_memory: Accepted for ``AsyncVectorEnv`` compatibility. envmgr
            always uses shared memory for spaces of fixed shape.
        daemon: Accepted for ``AsyncVectorEnv`` compatibility; workers are
            always daemonic (they must not outlive the manager).
        observation_mode: ``"same"`` (the only mode supported): every env must
            have the same observation space.
        worker: ``AsyncVectorEnv``'s custom worker function is not supported;
            passing one raises ``TypeError``.
    """

    group_noun = "workers"

    def __init__(
        self,
        env_fns: EnvFactory | Sequence[EnvFactory] | None = None,
        n_workers: int | None = None,
        envs_per_worker: int | None = None,
        *,
        num_envs: int | None = None,
        vector_fn: VectorEnvFactory | None = None,
        context: str | None = None,
        copy: bool = True,
        autoreset_mode: str | AutoresetMode | None = None,
        spin_seconds: float = DEFAULT_SPIN_SECONDS,
        parent_spin_seconds: float = 0.0,
        step_timeout: float | None = None,
        start_timeout: float | None = 120.0,
        close_timeout: float = 5.0,
        timer_interval: float = DEFAULT_TIMER_INTERVAL,
        check_actions: str | bool = "safe",
        max_restarts: int = 0,
        restart_window: float | None = None,
        shared_memory: bool = True,
        daemon: bool = True,
        observation_mode: str = "same",
        worker: Callable[..., Any] | None = None,
    ) -> None:
        if worker is not None:
            raise TypeError(
                "worker= (AsyncVectorEnv's custom worker loop) is not supported: envmgr runs "
                "its own batched worker loop; wrap the env instead"
            )
        if observation_mode != "same":
            raise ValueError(
                f"observation_mode={observation_mode!r} is not supported; envmgr batches "
                "identical observation spaces only ('same')"
            )
        if not daemon:
            raise ValueError("daemon=False is not supported: workers must not outlive the manager")
        del shared_memory  # always on where the space allows
        fns, layout, mode = hosted_layout(
            env_fns, vector_fn, n_workers, envs_per_worker, num_envs, autoreset_mode
        )
        self.n_workers = layout.n_groups
        #: Envs per worker when the split is even, else ``None`` (see ``worker_sizes``).
        self.envs_per_worker = layout.sizes[0] if layout.even else None
        self.worker_sizes = layout.sizes
        self.context = context or default_start_method()
        if self.context not in mp.get_all_start_methods():
            raise ValueError(
                f"context={self.context!r} is not a start method here; "
                f"choose from {mp.get_all_start_methods()}"
            )
        self.spin_seconds = float(spin_seconds)
        self.parent_spin_seconds = float(parent_spin_seconds)
        self.close_timeout = close_timeout
        self.timer_interval = timer_interval
        ctx = mp.get_context(self.context)
        if self.context == "fork" and _native_thread_count() > 1:
            warnings.warn(
                f"forking {self.n_workers} envmgr workers from a process with "
                f"{_native_thread_count()} threads (Ray, gRPC and PyTorch start some that "
                "Python does not list): a forked worker can crash (SIGSEGV) on a lock one of "
                "them held; use context='forkserver' (the default) or 'spawn'",
                RuntimeWarning,
                stacklevel=2,
            )
        if self.context == "forkserver":
            # Workers fork from a server that already imported numpy and gymnasium.
            ctx.set_forkserver_preload(["envmgr.worker"])
        payloads = group_specs(layout, fns, vector_fn, AutoresetMode(mode).value, "worker")
        try:
            self._open(
                ProcessBackend(
                    layout,
                    payloads,
                    ctx,
                    spin_seconds=self.spin_seconds,
                    parent_spin_seconds=self.parent_spin_seconds,
                    start_timeout=start_timeout,
                    close_timeout=close_timeout,
                ),
                autoreset_mode=mode,
                copy=copy,
                check_actions=check_actions,
                max_restarts=max_restarts,
                restart_window=restart_window,
                step_timeout=step_timeout,
                start_timeout=start_timeout,
                timer_interval=timer_interval,
            )
        except BaseException:
            self._shutdown(graceful=False)
            raise
        _LIVE_MANAGERS.add(self)

    @property
    def restarts(self) -> list[int]:
        """Restarts so far, per worker."""
        return self._budget.restarts

    @property
    def worker_pids(self) -> list[int]:
        """The process id of each worker."""
        backend = self._backend
        return [] if backend is None else backend.worker_pids  # type: ignore[attr-defined]

    def __del__(self) -> None:
        # Safety net only: the interpreter may be half torn down here.
        try:
            if self._backend is not None:
                self._shutdown(graceful=False)
        except Exception:
            pass

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        name = spec.id if spec is not None else "envs"
        return (
            f"SubprocessEnvManager({name}, num_envs={getattr(self, 'num_envs', '?')}, "
            f"n_workers={getattr(self, 'n_workers', '?')}, "
            f"envs_per_worker={getattr(self, 'envs_per_worker', '?')}, "
            f"context={getattr(self, 'context', '?')!r})"
        )


def hosted_layout(
    env_fns: Any,
    vector_fn: Any,
    n_groups: int | None,
    per_group: int | None,
    num_envs: int | None,
    autoreset_mode: str | AutoresetMode | None,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
) -> tuple[list[EnvFactory] | None, Layout, str | AutoresetMode]:
    """The factories, layout and autoreset mode of a manager's constructor arguments."""
    if (env_fns is None) == (vector_fn is None):
        raise TypeError("pass exactly one of env_fns (one env per slot) and vector_fn")
    if vector_fn is None:
        fns, layout = resolve_layout(env_fns, n_groups, per_group, num_envs=num_envs, names=names)
        return fns, layout, autoreset_mode or AutoresetMode.NEXT_STEP
    if not callable(vector_fn):
        raise TypeError(f"vector_fn must be a callable num_envs -> VectorEnv, got {vector_fn!r}")
    if num_envs is None:
        raise TypeError("vector_fn needs num_envs (the total over all workers)")
    _, layout = resolve_layout(vector_fn, n_groups, per_group, num_envs=num_envs, names=names)
    return None, layout, autoreset_mode or AutoresetMode.NEXT_STEP


@atexit.register
def _close_live_managers() -> None:
    # Workers are daemons, so multiprocessing would kill them at exit anyway;
    # this is about the shared-memory segments, which only an unlink frees.
    for manager in list(_LIVE_MANAGERS):
        try:
            manager.close()
        except Exception:
            pass
