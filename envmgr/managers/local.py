"""``SubprocessEnvManager``: many envs in a few worker processes, stepped as one batch.

The public API lives in :class:`~envmgr.frontend.vector_env.BatchedVectorEnv`; this module
holds the constructor's arguments and documentation, and builds the local
backend (:mod:`envmgr.backends.local.process`)::

    SubprocessEnvManager (frontend.BatchedVectorEnv: API, restarts, infos, timers)
        |  post / post_step / wait / replace
        v
    ProcessBackend -- shared memory + doorbell words --> worker_main (envmgr.backends.local.worker)
                                                             |  serve(cmd)
                                                             v
                                                         EnvGroup (envmgr.envside.group)

Worker timer trees are merged into the caller's current timer context under
``workers`` -> ``worker_root`` and ``workers`` -> ``worker_<i>`` as parallel
nodes; workers ship them every ``timer_interval`` seconds, and any read of the
tree through :mod:`envmgr.timers` first pulls in what has not been shipped.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import warnings
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import gymnasium as gym

from envmgr.backends.local.caller_group import CallerBackend
from envmgr.backends.local.fork_safety import describe, fork_unsafe_threads
from envmgr.backends.local.process import ProcessBackend
from envmgr.envside.group import GroupSpec
from envmgr.frontend.options import (
    DEFAULT_START_TIMEOUT,
    FrontEndOptions,
    check_options,
    seconds,
)
from envmgr.frontend.vector_env import BatchedVectorEnv, open_managers
from envmgr.managers.arguments import group_specs, hosted_layout, split_caller
from envmgr.protocol.layout import Layout

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["SubprocessEnvManager", "default_start_method", "DEFAULT_SPIN_SECONDS"]

EnvFactory = Callable[[], gym.Env[Any, Any]]
VectorEnvFactory = Callable[[int], gym.vector.VectorEnv]  # type: ignore[type-arg]

#: How long a worker busy-polls (yielding its core) for the next command before
#: it blocks. On a VM, waking a sleeping worker costs far more than a pipe hop (an
#: idle vCPU must be woken by the host), so a budget of about a step's interval
#: keeps workers awake between batches; longer only burns idle CPU
#: (``python -m benchmarks.probes.probe spin`` measures it).
DEFAULT_SPIN_SECONDS = 1e-3


def default_start_method() -> str:
    """``forkserver`` where it exists (Linux, macOS), else ``spawn``.

    ``fork`` is faster to start but unsafe once the parent has threads (Ray,
    PyTorch, gRPC all start some), so it is only used when asked for.
    """
    return "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"


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
        n_workers: Number of worker processes; default ``min(num_envs, cpu_count)``,
            the envs split as evenly as they go (the first workers one env more).
            ``num_envs`` is the length of a sequence of factories, or the
            ``num_envs`` option; a single factory given neither gets ``n_workers``
            (default ``cpu_count``) times ``envs_per_worker`` (default 1) envs, and
            with no size at all it is refused (``TypeError``).
        envs_per_worker: Envs each worker owns (an even split).
        context: Start method: ``"fork"``, ``"forkserver"`` or ``"spawn"``.
            Defaults to :func:`default_start_method`. Scripts without a
            ``__main__`` guard work under all three.
        spin_seconds: How long a worker busy-polls for the next command before
            blocking (``0`` blocks at once; default 1 ms). Spinning saves a
            wake-up per step while stepping (on a VM, waking an idle vCPU costs
            much more than a pipe hop); it yields the core on every
            turn, so it does not starve other processes, but an idle worker burns
            up to this much CPU after each command before it sleeps.
        parent_spin_seconds: How long ``step_wait`` busy-polls (yielding) for the
            workers to finish before it sleeps. Default: off (``0``), as on a
            machine with no spare core the parent's spinning competes with the
            workers; with ``caller_envs`` it is ``spin_seconds``, as the parent
            then steps envs on a core of its own and, finished first, would
            otherwise pay a wake-up per step.
        step_timeout: Seconds a worker may take to answer a step or reset
            (``None``: no limit; a dead worker is still noticed at once).
        close_timeout: Seconds ``close()`` waits for workers to exit before
            terminating them.
        shared_memory: Accepted for ``AsyncVectorEnv`` compatibility. envmgr
            always uses shared memory for spaces of fixed shape.
        daemon: Accepted for ``AsyncVectorEnv`` compatibility; workers are
            always daemonic (they must not outlive the manager).
        observation_mode: ``"same"`` (the only mode supported): every env must
            have the same observation space.
        worker: ``AsyncVectorEnv``'s custom worker function is not supported;
            passing one raises ``TypeError``.
        max_concurrency: ``AsyncVectorEnv``'s limit on envs stepping at once (Gymnasium
            1.4). ``None`` is accepted; a number is refused with ``ValueError``: at most
            ``n_workers`` envs step at once here, so pass ``n_workers`` instead.
        caller_envs: Envs the calling process steps itself, between waking the
            workers and collecting them (:mod:`envmgr.backends.local.caller_group`): the last
            ``caller_envs`` envs of the batch, with the same results, autoreset,
            seeds and calls as in a worker, timed as ``worker_caller``. An
            exception from one of them is raised as is. ``num_envs`` (or the
            factory list) counts them; ``n_workers``/``envs_per_worker`` describe
            the workers only. ``0`` (default): every env runs in a worker.
        **options: The arguments both managers take, documented in
            :class:`~envmgr.frontend.options.FrontEndOptions`: ``num_envs``, ``vector_fn``
            (a batched env hosted per worker), ``copy``, ``autoreset_mode``,
            ``check_actions``, ``max_restarts``, ``restart_window``,
            ``start_timeout``, ``timer_interval``, ``max_worker_steps`` and
            ``max_worker_memory`` (recycling; never the ``caller_envs``), and for
            ``Sequence``/``Graph`` observations ``ragged`` (SyncVectorEnv's form,
            ``"padded"`` arrays, or ``"pickled"``) and ``capacity`` (a starting capacity hint).
    """

    group_noun = "workers"
    group_noun_singular = "worker"

    def __init__(
        self,
        env_fns: EnvFactory | Sequence[EnvFactory] | None = None,
        n_workers: int | None = None,
        envs_per_worker: int | None = None,
        *,
        context: str | None = None,
        spin_seconds: float = DEFAULT_SPIN_SECONDS,
        parent_spin_seconds: float | None = None,
        step_timeout: float | None = None,
        close_timeout: float = 5.0,
        shared_memory: bool = True,
        daemon: bool = True,
        observation_mode: str = "same",
        worker: Callable[..., Any] | None = None,
        max_concurrency: int | None = None,
        caller_envs: int = 0,
        **options: Unpack[FrontEndOptions],
    ) -> None:
        check_options("SubprocessEnvManager", dict(options))
        seconds("step_timeout", step_timeout, none=True)
        seconds("close_timeout", close_timeout, zero=True)
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
        if max_concurrency is not None:
            raise ValueError(
                f"max_concurrency={max_concurrency!r} is not supported: each worker steps its "
                "envs one after another, so at most n_workers envs step at once; pass "
                f"n_workers={max_concurrency!r} instead"
            )
        del shared_memory  # always on where the space allows
        self.context = context or default_start_method()
        if self.context not in mp.get_all_start_methods():
            raise ValueError(
                f"context={self.context!r} is not a start method here; "
                f"choose from {mp.get_all_start_methods()}"
            )
        env_fns, worker_options, caller_fns = split_caller(env_fns, options, caller_envs)
        fns, layout, mode = hosted_layout(
            env_fns,
            n_workers,
            envs_per_worker,
            worker_options,  # type: ignore[arg-type]
        )
        self.caller_envs = caller_envs
        self.n_workers = layout.n_groups
        #: Envs per worker when the split is even, else ``None`` (see ``worker_sizes``).
        self.envs_per_worker = layout.sizes[0] if layout.even else None
        self.worker_sizes = layout.sizes
        self.spin_seconds = seconds("spin_seconds", spin_seconds, zero=True)
        if parent_spin_seconds is None:
            parent_spin_seconds = spin_seconds if caller_envs else 0.0
        self.parent_spin_seconds = seconds("parent_spin_seconds", parent_spin_seconds, zero=True)
        self.close_timeout = close_timeout
        ctx = mp.get_context(self.context)
        unsafe = fork_unsafe_threads() if self.context == "fork" else []
        if unsafe:
            # Only threads known to hold locks across fork: OpenBLAS's are harmless.
            warnings.warn(
                f"forking {self.n_workers} envmgr workers from a process with "
                f"{len(unsafe)} thread(s) known to make fork unsafe: {describe(unsafe)}. "
                "A forked worker can deadlock or crash (SIGSEGV) on a lock one of them "
                "held; use context='forkserver' (the default) or 'spawn'",
                RuntimeWarning,
                stacklevel=2,
            )
        if self.context == "forkserver":
            # Workers fork from a server that already imported numpy and gymnasium.
            ctx.set_forkserver_preload(["envmgr.backends.local.worker"])
        payloads = group_specs(layout, fns, options.get("vector_fn"), mode, "worker")
        try:
            whole = Layout.of([*layout.sizes, caller_envs]) if caller_envs else layout
            backend: Any = ProcessBackend(
                whole,
                payloads,
                ctx,
                spin_seconds=self.spin_seconds,
                parent_spin_seconds=self.parent_spin_seconds,
                start_timeout=options.get("start_timeout", DEFAULT_START_TIMEOUT),
                close_timeout=close_timeout,
                send_timeout=step_timeout,
                n_workers=layout.n_groups,
            )
            if caller_envs:
                spec = GroupSpec(
                    layout.n_groups,
                    layout.num_envs,
                    caller_envs,
                    mode,
                    caller_fns,
                    options.get("vector_fn"),
                )
                backend = CallerBackend(backend, spec)
            self._open(backend, options, autoreset_mode=mode, step_timeout=step_timeout)
        except BaseException:
            self._shutdown(graceful=False)
            raise

    @property
    def restarts(self) -> list[int]:
        """The restarts so far per group, as a copy.

        Each worker, then with ``caller_envs`` the caller's block, which has no process to
        replace (always 0), as group indices count in messages and infos.
        """
        return list(self._budget.restarts)

    @property
    def worker_pids(self) -> list[int]:
        """The process id of each worker."""
        backend = self._backend
        return [] if backend is None else backend.worker_pids  # type: ignore[attr-defined]

    def _repr_fields(self) -> str:
        per = getattr(self, "envs_per_worker", "?")
        split = f"worker_sizes={self.worker_sizes}" if per is None else f"envs_per_worker={per}"
        return (
            f"n_workers={getattr(self, 'n_workers', '?')}, {split}, "
            f"context={getattr(self, 'context', '?')!r}"
        )


@atexit.register
def _close_live_managers() -> None:
    # Workers are daemons, so multiprocessing would kill them at exit anyway;
    # this is about the shared-memory segments, which only an unlink frees. Not a
    # clean close: the script has ended, so a pending call is not warned about (the
    # warning could point only here) and no timings are pulled for nobody to read.
    for manager in open_managers(SubprocessEnvManager):
        try:
            manager._close(clean=False)
        except Exception:
            pass
