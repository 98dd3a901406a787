"""``SubprocessEnvManager``: many envs in a few worker processes, stepped as one batch.

Design in brief:

* Each worker owns ``envs_per_worker`` envs and is woken once per batch step.
* Observations, actions, rewards and done flags live in one shared-memory
  segment (:mod:`envmgr.shared_memory`); per step only a tiny command and a
  :class:`~envmgr.messages.StepResponse` (infos, and timers when asked) cross
  each pipe.
* The parent waits on the worker pipes *and* the process sentinels together,
  so a worker that dies is noticed at once instead of hanging the caller.
* Worker timer trees are merged into the caller's current timer context under
  ``workers`` -> ``worker_root`` and ``workers`` -> ``worker_<i>`` as parallel
  nodes. Workers ship their trees every ``timer_interval`` seconds rather than
  every step (it would cost several percent of throughput), and any read of the
  tree through :mod:`envmgr.timers` first pulls in what has not been shipped, so
  a read always reflects every completed step.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import pickle
import select
import signal
import sys
import threading
import types
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from copy import deepcopy
from multiprocessing import resource_tracker
from multiprocessing.connection import Connection
from time import monotonic, perf_counter
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from envmgr import timers
from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenWorkerError,
    NoAsyncCallError,
    RemoteTraceback,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from envmgr.frontend import BatchedVectorEnv
from envmgr.messages import (
    Ack,
    Attach,
    Call,
    CallResponse,
    Close,
    Command,
    ErrorResponse,
    FlushTimers,
    Ready,
    Reset,
    SetAttr,
    Step,
    StepResponse,
    WorkerConfig,
)
from envmgr.shared_memory import SharedBuffers, SharedLayout, tree_map
from envmgr.signalling import KIND_PIPE, KIND_STEP, SHIP_TIMERS, WAIT_ANY, ParentDoorbell
from envmgr.timer_merge import WorkerTimers
from envmgr.validation import ActionChecker, reset_arguments, whole_groups
from envmgr.worker import worker_main

__all__ = ["SubprocessEnvManager", "default_start_method", "DEFAULT_SPIN_SECONDS"]

EnvFactory = Callable[[], gym.Env[Any, Any]]

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


@contextmanager
def _main_module_hidden() -> Iterator[None]:
    """Keep spawn/forkserver children from re-running the user's ``__main__``.

    Workers need nothing from ``__main__``: env factories travel by value with
    cloudpickle. Hiding it means scripts without an ``if __name__ == "__main__"``
    guard work under every start method.
    """
    main = sys.modules.get("__main__")
    stub = types.ModuleType("__main__")
    sys.modules["__main__"] = stub
    try:
        yield
    finally:
        if main is not None:
            sys.modules["__main__"] = main


def _resolve_layout(
    env_fns: EnvFactory | Sequence[EnvFactory],
    n_groups: int | None,
    per_group: int | None,
    *,
    default_groups: int | None = None,
    names: tuple[str, str] = ("n_workers", "envs_per_worker"),
) -> tuple[list[EnvFactory], int, int]:
    """Turn the constructor's arguments into (factories, groups, envs per group).

    Shared by the local manager (groups = worker processes) and the Ray one
    (groups = actors); ``names`` are the caller's argument names for messages.
    ``default_groups`` replaces the core count when neither size is given.
    """
    g_name, e_name = names
    for name, value in ((g_name, n_groups), (e_name, per_group)):
        if value is not None and (
            not isinstance(value, int) or isinstance(value, bool) or value < 1
        ):
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    cores = os.cpu_count() or 1
    if callable(env_fns):
        g = n_groups if n_groups is not None else (default_groups or min(2, cores))
        e = per_group if per_group is not None else 1
        return [env_fns] * (g * e), g, e
    fns = list(env_fns)
    if not fns:
        raise ValueError("env_fns is an empty sequence: need at least one env factory")
    for i, fn in enumerate(fns):
        if not callable(fn):
            raise ValueError(f"env_fns[{i}] is {fn!r}, not a zero-argument callable")
    n = len(fns)
    if n_groups is not None and per_group is not None:
        if n_groups * per_group != n:
            raise ValueError(
                f"{g_name} * {e_name} = {n_groups} * {per_group} = "
                f"{n_groups * per_group}, but {n} env factories were given"
            )
        return fns, n_groups, per_group
    if n_groups is not None:
        if n % n_groups:
            raise ValueError(f"{n} env factories cannot be split evenly over {g_name}={n_groups}")
        return fns, n_groups, n // n_groups
    if per_group is not None:
        if n % per_group:
            raise ValueError(
                f"{n} env factories cannot be split into groups of {e_name}={per_group}"
            )
        return fns, n // per_group, per_group
    limit = max(1, default_groups or cores)
    g = max(d for d in range(1, min(limit, n) + 1) if n % d == 0)
    return fns, g, n // g


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
            to ``min(2, cpu_count)``; with a sequence, it is derived from the
            sequence's length and ``envs_per_worker``.
        envs_per_worker: Envs each worker owns and steps per command.
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
        check_actions: Validate actions against the action space in the parent
            before sending them (shape, range, NaN). Turn off only for speed.
        max_restarts: How many times each worker may be replaced after it dies
            or overruns ``step_timeout``. A replaced worker rebuilds its envs from
            their factories and resets them; the step returns with those envs
            truncated and ``infos["envmgr_restarted"]`` giving the reason. ``0``
            (default): a failure closes the manager and raises.
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

    def __init__(
        self,
        env_fns: EnvFactory | Sequence[EnvFactory],
        n_workers: int | None = None,
        envs_per_worker: int | None = None,
        *,
        context: str | None = None,
        copy: bool = True,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        spin_seconds: float = DEFAULT_SPIN_SECONDS,
        parent_spin_seconds: float = 0.0,
        step_timeout: float | None = None,
        start_timeout: float | None = 120.0,
        close_timeout: float = 5.0,
        timer_interval: float = DEFAULT_TIMER_INTERVAL,
        check_actions: bool = True,
        max_restarts: int = 0,
        restart_window: float | None = None,
        shared_memory: bool = True,
        daemon: bool = True,
        observation_mode: str = "same",
        worker: Callable[..., Any] | None = None,
    ) -> None:
        self.closed = True  # until start-up succeeds; makes close() safe to call early
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
        self._processes: list[Any] = []
        self._conns: list[Connection] = []
        self._buffers: SharedBuffers | None = None
        self._broken: str | None = None
        fns, n_workers, envs_per_worker = _resolve_layout(env_fns, n_workers, envs_per_worker)
        self.n_workers = n_workers
        self.envs_per_worker = envs_per_worker
        self.num_envs = n_workers * envs_per_worker
        self.context = context or default_start_method()
        if self.context not in mp.get_all_start_methods():
            raise ValueError(
                f"context={self.context!r} is not a start method here; "
                f"choose from {mp.get_all_start_methods()}"
            )
        self.copy = copy
        self.autoreset_mode = AutoresetMode(autoreset_mode)
        self.spin_seconds = float(spin_seconds)
        self.parent_spin_seconds = float(parent_spin_seconds)
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.timer_interval = timer_interval
        self.check_actions = check_actions
        if max_restarts < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts}")
        self.max_restarts = max_restarts
        self.restart_window = restart_window
        #: Restarts so far, per worker.
        self.restarts = [0] * n_workers
        self._restart_times: list[list[float]] = [[] for _ in range(n_workers)]
        self._inflight: dict[int, int] = {}  # worker -> seq of its send() step
        self._sub_checkers: dict[int, ActionChecker] = {}
        self._ctx = mp.get_context(self.context)
        if self.context == "fork" and _native_thread_count() > 1:
            warnings.warn(
                f"forking {n_workers} envmgr workers from a process with "
                f"{_native_thread_count()} threads (Ray, gRPC and PyTorch start some that "
                "Python does not list): a forked worker can crash (SIGSEGV) on a lock one of "
                "them held; use context='forkserver' (the default) or 'spawn'",
                RuntimeWarning,
                stacklevel=2,
            )
        if self.context == "forkserver":
            # Workers fork from a server that already imported numpy and gymnasium.
            self._ctx.set_forkserver_preload(["envmgr.worker"])
        self._seq = 0
        self._pending = None
        self._worker_timers = WorkerTimers(timer_interval, self._flush_timers)
        self._fallback_obs: list[Any] = []

        try:
            # Pickle every factory in the parent: an unpicklable one fails here,
            # with its reason, not as a dead worker.
            payloads = []
            for w in range(n_workers):
                chunk = fns[w * envs_per_worker : (w + 1) * envs_per_worker]
                try:
                    payloads.append(cloudpickle.dumps(chunk))
                except Exception as exc:
                    raise ValueError(
                        f"env factory for worker {w} (envs {w * envs_per_worker}-"
                        f"{(w + 1) * envs_per_worker - 1}) cannot be pickled: {exc}"
                    ) from exc
            self._start(payloads)
        except BaseException:
            self._shutdown()
            raise
        self.closed = False
        _LIVE_MANAGERS.add(self)

    # ================================================================ start-up

    def _env_range(self, w: int) -> range:
        return range(w * self.envs_per_worker, (w + 1) * self.envs_per_worker)

    def _where(self, w: int) -> str:
        r = self._env_range(w)
        return f"worker {w} (envs {r.start}-{r.stop - 1})"

    def _start(self, payloads: list[bytes]) -> None:
        # One wake-up pipe for the whole manager: the last worker to finish a
        # step writes a byte, so the parent sleeps through the whole batch.
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        # Start the resource tracker before any worker exists, so every worker
        # shares it and it unlinks our segment if this process is killed.
        resource_tracker.ensure_running()
        os.set_blocking(self._wake_r.fileno(), False)
        self._payloads = payloads
        for w in range(self.n_workers):
            proc, conn = self._spawn_worker(w, None)
            self._processes.append(proc)
            self._conns.append(conn)

        readies = self._gather(range(self.n_workers), -1, self.start_timeout, "start")
        first: Ready = readies[0]
        for w in range(1, self.n_workers):
            r = readies[w]
            for kind in ("observation_space", "action_space"):
                if getattr(r, kind) != getattr(first, kind):
                    raise ValueError(
                        f"{self._where(w)} has {kind} {getattr(r, kind)}, "
                        f"but worker 0 (env 0) has {getattr(first, kind)}"
                    )
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.metadata = dict(first.metadata)
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.render_mode = first.render_mode
        self.spec = first.spec
        self.worker_pids = [r.pid for r in (readies[w] for w in range(self.n_workers))]

        self._buffers = SharedBuffers.create(
            self.single_observation_space, self.single_action_space, self.num_envs, self.n_workers
        )
        seq = self._next_seq()
        self._broadcast(lambda w: Attach(seq, self._buffers.layout))  # type: ignore[union-attr]
        self._gather(range(self.n_workers), seq, self.start_timeout, "attach")
        self._bell = ParentDoorbell(self._buffers.control, self._conns, self._wake_r.fileno())
        self._build_poller()
        self._checker = ActionChecker(self.single_action_space, self.num_envs, self.envs_per_worker)
        self._init_observation_views()

    def _spawn_worker(self, w: int, layout: SharedLayout | None) -> tuple[Any, Connection]:
        """Start worker ``w``'s process; with ``layout`` it attaches to shared memory at once."""
        parent_conn, child_conn = self._ctx.Pipe(duplex=True)
        inherited = [parent_conn, self._wake_r, *(c for i, c in enumerate(self._conns) if i != w)]
        config = WorkerConfig(
            worker_index=w,
            env_offset=w * self.envs_per_worker,
            env_fns=self._payloads[w],
            autoreset_mode=self.autoreset_mode.value,
            spin_seconds=self.spin_seconds,
            manager_pid=os.getpid(),
            # A forked child inherits the parent's ends of the pipes; it closes
            # them so that a dead parent reads as end-of-file.
            fds_to_close=tuple(c.fileno() for c in inherited) if self.context == "fork" else (),
            layout=layout,
            death_signal=threading.current_thread() is threading.main_thread(),
        )
        proc = self._ctx.Process(  # type: ignore[attr-defined]
            target=worker_main,
            args=(child_conn, self._wake_w, config),
            name=f"envmgr-worker-{w}",
            daemon=True,
        )
        with _main_module_hidden():
            proc.start()
        child_conn.close()
        return proc, parent_conn

    def _build_poller(self) -> None:
        """One poll set for steps: the wake-up pipe and every worker's sentinel."""
        self._poller = select.poll()
        self._poller.register(self._wake_r.fileno(), select.POLLIN)
        self._sentinel_owner = {}
        for w, proc in enumerate(self._processes):
            self._poller.register(proc.sentinel, select.POLLIN)
            self._sentinel_owner[proc.sentinel] = w

    def _init_observation_views(self) -> None:
        buffers = self._buffers
        assert buffers is not None
        if buffers.observations is not None:

            def read_only(a: np.ndarray) -> np.ndarray:
                v = a.view()
                v.flags.writeable = False
                return v

            self._obs_views = tree_map(read_only, buffers.observations)
        else:
            self._fallback_obs = [None] * self.num_envs
            self._obs_views = create_empty_array(self.single_observation_space, self.num_envs)

    # ================================================================ messaging

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _broadcast(
        self, make: Callable[[int], Command], workers: Iterable[int] | None = None
    ) -> None:
        """Send a pickled command to each worker, then flag it in shared memory."""
        targets = list(range(self.n_workers) if workers is None else workers)
        seq = None
        for w in targets:
            cmd = make(w)
            seq = cmd.seq
            try:
                self._conns[w].send(cmd)
            except (BrokenPipeError, ConnectionResetError, OSError):
                # The worker is dead. The wait that follows sees its sentinel and
                # replaces it under the restart policy, or raises naming its exit
                # code or signal; failing here would bypass both.
                pass
        bell = getattr(self, "_bell", None)
        if bell is not None and seq is not None:
            # A worker spinning on its command word looks there, not at the pipe.
            bell.announce(targets, seq, KIND_PIPE)

    def _gather(
        self,
        workers: Iterable[int],
        seq: int,
        timeout: float | None,
        phase: str,
        on_lost: Callable[[int, str, bool], Any] | None = None,
    ) -> dict[int, Any]:
        """Wait for every listed worker's answer to command ``seq``.

        Waits on pipes and process sentinels together, so a dead worker is
        noticed at once. Answers to older commands (late replies after a
        timeout) are dropped. If several workers raise, all answers are still
        collected (keeping every pipe in step) and the first error is raised.

        Args:
            workers: The workers that owe an answer.
            seq: The command's sequence number (``-1`` for start-up).
            timeout: Seconds to wait in all (``None``: no limit).
            phase: What the command was, for messages.
            on_lost: Called as ``on_lost(w, reason, timed_out)`` for a worker that
                died or overran; returns the answer to use in its place (e.g. from
                a replacement). Without it, the failure is raised.
        """
        pending = set(workers)
        answers: dict[int, Any] = {}
        errors: list[ErrorResponse] = []
        deadline = None if timeout is None else monotonic() + timeout
        poller = select.poll()
        fd_map: dict[int, tuple[bool, int]] = {}
        for w in pending:
            c, s = self._conns[w].fileno(), self._processes[w].sentinel
            poller.register(c, select.POLLIN)
            poller.register(s, select.POLLIN)
            fd_map[c] = (True, w)
            fd_map[s] = (False, w)

        def lost(w: int, reason: str, timed_out: bool) -> None:
            pending.discard(w)
            for fd in (self._conns[w].fileno(), self._processes[w].sentinel):
                try:
                    poller.unregister(fd)
                except KeyError:
                    pass
            if on_lost is None:
                self._fail(w, reason, timed_out)
            answers[w] = on_lost(w, reason, timed_out)  # type: ignore[misc]

        while pending:
            wait_ms = None if deadline is None else max(0, int((deadline - monotonic()) * 1000) + 1)
            events = poller.poll(wait_ms)
            if not events:
                if deadline is not None and monotonic() >= deadline:
                    for w in sorted(pending):
                        lost(w, f"it did not answer {phase} within {timeout} s", True)
                continue
            dead: list[int] = []
            for fd, _ in events:
                is_conn, w = fd_map.get(fd, (False, -1))
                if w not in pending:
                    continue
                if not is_conn:
                    dead.append(w)
                    continue
                try:
                    msg = self._conns[w].recv()
                except (EOFError, OSError):
                    dead.append(w)
                    continue
                if getattr(msg, "seq", seq) != seq and not isinstance(msg, Ready):
                    if not (isinstance(msg, ErrorResponse) and msg.seq == -1):
                        continue  # a late answer to an older command
                pending.discard(w)
                poller.unregister(fd)
                poller.unregister(self._processes[w].sentinel)
                if isinstance(msg, ErrorResponse):
                    errors.append(msg)
                else:
                    answers[w] = msg
            for w in dead:
                if w in pending:
                    lost(w, self._exit_reason(w, seq, phase), False)
        if errors:
            self._raise_remote(errors[0])
        return answers

    def _wait_step(self, seq: int, timeout: float | None) -> tuple[dict[int, Any], dict[int, str]]:
        """Sleep until every worker finished step ``seq``; read the messages some sent.

        The workers answer in the shared control block; only those with infos,
        timers or an error also wrote to their pipe.

        Returns:
            The messages by worker, and the workers replaced during the step
            (with the reason), whose envs were reset instead.
        """
        bell = self._bell
        deadline = None if timeout is None else monotonic() + timeout
        pending = set(range(self.n_workers))
        replaced: dict[int, str] = {}
        fresh: dict[int, StepResponse] = {}  # the replacements' reset answers
        # Wake-ups are not lost (see envmgr.signalling), but re-checking every few
        # milliseconds keeps even a lost one from costing more than that.
        wait_ms = 5
        if self.parent_spin_seconds > 0.0 and not bell.all_done(seq):
            spin_end = perf_counter() + self.parent_spin_seconds
            while not bell.all_done(seq) and perf_counter() < spin_end:
                os.sched_yield()
        while True:
            pending = {w for w in pending if not bell.is_done(w, seq)}
            if not pending:
                break
            if deadline is not None:
                left = deadline - monotonic()
                if left <= 0:
                    for w in sorted(pending):
                        reason = f"it did not answer step within {timeout} s"
                        fresh[w] = self._replace_or_fail(w, reason, True)
                        replaced[w] = reason
                    pending.clear()
                    break
                wait_ms = min(wait_ms, int(left * 1000) + 1)
            for fd, _ in bell.wait(lambda: bell.all_done(seq), self._poller, wait_ms):
                owner = self._sentinel_owner.get(fd)
                if owner is not None and owner in pending and not bell.is_done(owner, seq):
                    w = owner
                    reason = self._exit_reason(w, seq, "step")
                    fresh[w] = self._replace_or_fail(w, reason, False)
                    replaced[w] = reason
                    pending.discard(w)
            wait_ms = min(wait_ms * 2, 100)
        answers: dict[int, Any] = dict(fresh)
        errors: list[ErrorResponse] = []
        for w in bell.with_message():
            if w in replaced:
                continue
            while True:
                try:
                    msg = self._conns[w].recv()
                except (EOFError, OSError):
                    self._fail(w, "its pipe closed during step", False)
                if getattr(msg, "seq", None) == seq:
                    break  # older answers (after a timeout) are dropped
            if isinstance(msg, ErrorResponse):
                errors.append(msg)
            else:
                answers[w] = msg
        if errors:
            self._raise_remote(errors[0])
        return answers, replaced

    def _exit_reason(self, w: int, seq: int, phase: str) -> str:
        """Why worker ``w`` stopped answering; raises the error it reported, if any."""
        conn = self._conns[w]
        try:
            while conn.poll():
                msg = conn.recv()
                if isinstance(msg, ErrorResponse) and msg.seq in (seq, -1):
                    self._break(f"{self._where(w)} raised {msg.type_name} and exited")
                    self._raise_remote(msg)
        except (EOFError, OSError):
            pass
        proc = self._processes[w]
        proc.join(0.5)
        code = proc.exitcode
        if code is None:
            how = "stopped answering"
        elif code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name} (exit code {code})"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        return f"it {how} during {phase}"

    def _replace_or_fail(
        self, w: int, reason: str, timed_out: bool, reset: Reset | None = None
    ) -> StepResponse:
        """Replace worker ``w`` under the restart policy, or raise its failure.

        Returns:
            The replacement's answer to its reset (its infos, and its observations
            when they travel pickled).
        """
        if self.max_restarts <= 0:
            self._fail(w, reason, timed_out)
        return self._restart(w, reason, reset)

    def _fail(self, w: int, reason: str, timed_out: bool) -> None:
        """Raise the failure of worker ``w`` after closing the manager."""
        code = self._processes[w].exitcode if w < len(self._processes) else None
        message = f"{self._where(w)}: {reason}"
        self._break(message)
        if timed_out:
            raise WorkerTimeoutError(message, w, self._env_range(w))
        raise WorkerDiedError(message, w, self._env_range(w), code)

    def _restart(self, w: int, reason: str, reset: Reset | None = None) -> StepResponse:
        """Replace worker ``w`` in place: new process, same envs from their factories, reset.

        Raises:
            BrokenWorkerError: The worker has used up ``max_restarts`` (within
                ``restart_window`` seconds, when set); the manager is closed.
        """
        while True:
            answer, failure = self._restart_once(w, reason, reset)
            self.restarts[w] += 1
            if failure is None:
                return answer  # type: ignore[return-value]
            # The replacement died or hung before it was ready (killed by the OOM
            # killer, say): one more failure of this worker, under the same budget.
            reason = f"its replacement {failure}"

    def _restart_once(
        self, w: int, reason: str, reset: Reset | None
    ) -> tuple[StepResponse | None, str | None]:
        """One replacement attempt.

        Returns:
            ``(answer, None)``, or ``(None, why)`` if the new process was lost.
        """
        now = monotonic()
        history = self._restart_times[w]
        if self.restart_window is not None:
            history[:] = [t for t in history if now - t < self.restart_window]
        if len(history) >= self.max_restarts:
            window = "" if self.restart_window is None else f" within {self.restart_window:g} s"
            message = (
                f"{self._where(w)} failed ({reason}) after {len(history)} restarts{window}; "
                f"max_restarts={self.max_restarts} is spent, so the manager is closed"
            )
            self._break(message)
            raise BrokenWorkerError(message, w, self._env_range(w))
        history.append(now)
        failures: list[str] = []

        def lost(_w: int, why: str, timed_out: bool) -> None:
            failures.append(why)

        with timers.hierarchical_timer(f"restart_worker_{w}", self._worker_timers.stack):
            old = self._processes[w]
            if old.is_alive():
                old.kill()
            old.join(5.0)
            try:
                self._poller.unregister(old.sentinel)
            except (KeyError, ValueError):
                pass
            self._sentinel_owner.pop(old.sentinel, None)
            self._conns[w].close()
            assert self._buffers is not None
            # Its command word may hold the step it never finished: the new
            # process reads the word as already seen, so it will not run it.
            proc, conn = self._spawn_worker(w, self._buffers.layout)
            self._processes[w], self._conns[w] = proc, conn
            try:
                old.close()
            except ValueError:
                pass
            self._poller.register(proc.sentinel, select.POLLIN)
            self._sentinel_owner[proc.sentinel] = w
            ready = self._gather([w], -1, self.start_timeout, "restart", lost).get(w)
            if failures:
                return None, failures[0]
            assert ready is not None
            self.worker_pids[w] = ready.pid
            seq = self._next_seq()
            if reset is None:
                # Cut mid-step: reset now, and in next-step mode once more on the
                # next step, so the step after a truncation starts a new episode.
                next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
                cmd = Reset(seq, (None,) * self.envs_per_worker, None, None, False, next_step)
            else:  # cut mid-reset: carry out the reset that was asked for
                cmd = Reset(seq, reset.seeds, reset.options, reset.mask, False)
            try:
                self._conns[w].send(cmd)
            except OSError:
                pass  # died already: the wait below reports how
            self._bell.announce([w], seq, KIND_PIPE)
            answer = self._gather([w], seq, self.start_timeout, "restart reset", lost).get(w)
            if failures:
                return None, failures[0]
        return answer, None

    def _break(self, reason: str) -> None:
        """Mark the manager unusable and release every resource it holds."""
        self._broken = reason
        self._pending = None
        self._shutdown()
        self.closed = True

    def _raise_remote(self, err: ErrorResponse) -> None:
        w = err.worker_index
        where = self._where(w)
        if err.env_index is not None:
            where += f", env {err.env_index}"
        where += f", during {err.phase}"
        exc: BaseException | None = None
        if err.exception is not None:
            try:
                exc = pickle.loads(err.exception)
            except Exception:
                exc = None
        if not isinstance(exc, BaseException):
            exc = WorkerError(
                f"{where}: {err.type_name}: {err.message}",
                w,
                self._env_range(w),
                err.type_name,
                err.env_index,
            )
        else:
            note = f"raised in envmgr {where}"
            if hasattr(exc, "add_note"):
                exc.add_note(note)
            else:  # Python 3.10: keep the information reachable all the same
                exc.__notes__ = [*getattr(exc, "__notes__", []), note]  # type: ignore[attr-defined]
            for attr, value in (("worker_index", w), ("env_index", err.env_index)):
                try:
                    setattr(exc, attr, value)
                except Exception:
                    pass
        if err.phase == "make" or err.seq == -1:
            self._break(f"{where}: {err.type_name}: {err.message}")
        raise exc from RemoteTraceback(err.traceback)

    # ================================================================ timers

    def env_step_seconds(self) -> tuple[np.ndarray, np.ndarray]:
        """Cumulative seconds inside ``env.step`` and step counts, per env.

        Per-env timings live in two shared arrays rather than in the timer tree,
        so 1,000 envs cost 16 kB and no tree nodes; the tree holds their sum
        (``env.step`` under each worker).

        Returns:
            ``(seconds, steps)``, copies of shape ``(num_envs,)``.
        """
        self._check_usable("env_step_seconds")
        self._flush_timers()  # workers publish per-env times when their tree ships
        buffers = self._buffers
        assert buffers is not None
        return buffers.env_seconds.copy(), buffers.env_steps.copy()

    def _flush_timers(self) -> None:
        """Pull every worker's unshipped timings into the current target."""
        if (
            not self._worker_timers.unshipped
            or self._pending is not None
            or self._inflight
            or self.closed
        ):
            return
        seq = self._next_seq()
        self._broadcast(lambda w: FlushTimers(seq))
        answers = self._gather(range(self.n_workers), seq, self.step_timeout, "flush_timers")
        self._worker_timers.merge(
            (f"worker_{a.worker_index}", a.timer_root, a.gauges) for a in answers.values()
        )
        self._worker_timers.shipped()

    # ================================================================ actions

    def _send_actions(self, actions: Any) -> tuple[Any, ...] | None:
        """Validate and place the actions; returns per-env actions for the fallback."""
        if self.check_actions:
            self._checker.check(actions)
        buffers = self._buffers
        assert buffers is not None
        if buffers.actions is None:
            from gymnasium.vector.utils import iterate

            return tuple(iterate(self.action_space, actions))
        _copy_tree(buffers.actions, actions)
        return None

    # ================================================================ VectorEnv API

    def reset(
        self,
        *,
        seed: int | Sequence[int | None] | None = None,
        options: dict[str, Any] | None = None,
    ) -> tuple[Any, dict[str, Any]]:
        """Reset every env (or those in ``options["reset_mask"]``).

        Args:
            seed: ``None`` (random), an int ``s`` (env ``i`` gets ``s + i``), or one
                seed per env.
            options: Passed to every ``env.reset``; a ``"reset_mask"`` entry (bool
                array of shape ``(num_envs,)``) resets only those envs.

        Returns:
            The batched observations and the vector info dict.
        """
        self.reset_async(seed=seed, options=options)
        return self.reset_wait()

    def reset_async(
        self, seed: int | Sequence[int | None] | None = None, options: dict[str, Any] | None = None
    ) -> None:
        """Send a reset to the workers without waiting (see :meth:`reset`)."""
        self._check_idle("reset_async")
        n = self.num_envs
        seeds, options, mask = reset_arguments(seed, options, n)
        workers = [
            w for w in range(self.n_workers) if mask is None or mask[self._env_range(w)].any()
        ]
        ship = self._worker_timers.want()
        seq = self._next_seq()
        e = self.envs_per_worker

        def command(w: int) -> Reset:
            sl = slice(w * e, (w + 1) * e)
            return Reset(
                seq,
                tuple(seeds[sl]),
                options,
                None if mask is None else tuple(bool(b) for b in mask[sl]),
                ship,
            )

        commands = {w: command(w) for w in workers}
        self._broadcast(commands.__getitem__, workers)
        self._worker_timers.unshipped = True
        self._pending = ("reset", (seq, (workers, ship, commands)))

    def reset_wait(self, timeout: float | None = None) -> tuple[Any, dict[str, Any]]:
        """Wait for the reset sent by :meth:`reset_async`.

        Args:
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.
        """
        seq, (workers, ship, commands) = self._take_pending("reset")
        replaced: dict[int, str] = {}

        def on_lost(w: int, reason: str, timed_out: bool) -> StepResponse:
            if self.max_restarts <= 0:
                self._fail(w, reason, timed_out)
            replaced[w] = reason
            return self._restart(w, reason, commands[w])

        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            answers = self._gather(workers, seq, self._timeout(timeout), "reset", on_lost)
        infos = self._infos(answers, replaced)
        return self._collect(answers, ship)[0], infos

    def step(self, actions: Any) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every env with its action; see ``gymnasium.vector.VectorEnv.step``."""
        self.step_async(actions)
        return self.step_wait()

    def step_async(self, actions: Any) -> None:
        """Validate the actions, place them in shared memory and wake the workers."""
        self._check_idle("step_async")
        per_env = self._send_actions(actions)
        ship = self._worker_timers.want()
        seq = self._next_seq()
        e = self.envs_per_worker
        if per_env is None:
            self._bell.announce(
                range(self.n_workers), seq, KIND_STEP | (SHIP_TIMERS if ship else 0)
            )
        else:
            self._broadcast(lambda w: Step(seq, ship, per_env[w * e : (w + 1) * e]))
        self._worker_timers.unshipped = True
        self._pending = ("step", (seq, (ship, per_env is None)))

    def step_wait(
        self, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Wait for the step sent by :meth:`step_async` and return its batch.

        Args:
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.
        """
        seq, (ship, fast) = self._take_pending("step")
        wait = self._timeout(timeout)
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            if fast:
                answers, replaced = self._wait_step(seq, wait)
            else:
                replaced = {}

                def on_lost(w: int, reason: str, timed_out: bool) -> StepResponse:
                    replaced[w] = reason
                    return self._replace_or_fail(w, reason, timed_out)

                answers = self._gather(range(self.n_workers), seq, wait, "step", on_lost)
        obs, buffers = self._collect(answers, ship)
        rewards = buffers.rewards.copy()
        terminations = buffers.terminations.copy()
        truncations = buffers.truncations.copy()
        for w in replaced:
            envs = self._env_range(w)
            truncations[envs.start : envs.stop] = True
        return obs, rewards, terminations, truncations, self._infos(answers, replaced)

    # ---------------------------------------------------------------- first-ready

    def send(self, actions: Any, env_ids: Sequence[int] | np.ndarray | None = None) -> None:
        """Start stepping some envs without waiting (EnvPool's ``send``).

        Together with :meth:`recv` this gives first-ready stepping: each worker
        runs as soon as it has actions, and ``recv`` returns whichever workers
        finish first, so one slow env no longer holds the whole batch back.

        Args:
            actions: Batched actions for ``env_ids`` (first axis ``len(env_ids)``).
            env_ids: Global env indices to step; they must be whole workers'
                groups (``envs_per_worker`` consecutive ids starting at a multiple
                of it), typically the ``env_ids`` a previous :meth:`recv` returned.
                ``None`` steps every env.

        Raises:
            ValueError: Ids that split a worker's group, or a worker that already
                has a step in flight.
        """
        self._check_usable("send")
        if self._pending is not None:
            raise AlreadyPendingCallError(
                f"cannot send while a {self._pending[0]} call is pending", self._pending[0]
            )
        e = self.envs_per_worker
        ids, workers = whole_groups(env_ids, self.num_envs, e, "workers")
        busy = [w for w in workers if w in self._inflight]
        if busy:
            raise ValueError(
                f"{self._where(busy[0])} already has a step in flight: recv() it first"
            )
        buffers = self._buffers
        assert buffers is not None
        if buffers.actions is None or buffers.observations is None:
            raise ValueError("send/recv needs observation and action spaces that fit shared memory")
        if self.check_actions:
            checker = self._sub_checkers.get(len(ids))
            if checker is None:
                checker = ActionChecker(self.single_action_space, len(ids), e)
                self._sub_checkers[len(ids)] = checker
            checker.check(actions, ids)
        _scatter_tree(buffers.actions, ids, actions)
        seq = self._next_seq()
        self._bell.announce(workers, seq, KIND_STEP)
        for w in workers:
            self._inflight[w] = seq
        self._worker_timers.unshipped = True

    def recv(
        self, batch_size: int | None = None, timeout: float | None = None
    ) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any], np.ndarray]:
        """Return the first workers to finish their :meth:`send` (EnvPool's ``recv``).

        Args:
            batch_size: Envs to return, rounded up to whole workers; defaults to
                one worker's group. Capped at what is in flight.
            timeout: Seconds to wait; defaults to the manager's ``step_timeout``.

        Returns:
            ``(obs, rewards, terminations, truncations, infos, env_ids)`` for the
            returned envs, in ``env_ids`` order (ascending worker index).
        """
        self._check_usable("recv")
        if not self._inflight:
            raise NoAsyncCallError("recv() called with no step in flight: send() first", "recv")
        e = self.envs_per_worker
        need = min(len(self._inflight), max(1, -(-(batch_size or e) // e)))
        bell = self._bell
        timeout = self._timeout(timeout)
        deadline = None if timeout is None else monotonic() + timeout
        replaced: dict[int, str] = {}

        def ready() -> list[int]:
            words = bell.done_words()
            return [w for w, s in self._inflight.items() if words[w] == s] + list(replaced)

        wait_ms = 5
        muted: list[int] = []
        with timers.hierarchical_timer("workers", self._worker_timers.stack):
            try:
                while len(got := ready()) < need:
                    if deadline is not None:
                        left = deadline - monotonic()
                        if left <= 0:
                            late = [w for w in self._inflight if w not in got]
                            for w in late[: need - len(got)]:
                                reason = f"it did not answer step within {timeout} s"
                                self._replace_or_fail(w, reason, True)
                                replaced[w] = reason
                            continue
                        wait_ms = min(wait_ms, int(left * 1000) + 1)
                    events = bell.wait(
                        lambda: len(ready()) >= need, self._poller, wait_ms, WAIT_ANY
                    )
                    for fd, _ in events:
                        owner = self._sentinel_owner.get(fd)
                        if owner is None:
                            continue
                        w = owner
                        if w not in self._inflight:
                            # Died while idle: the next send to it deals with it. Stop
                            # polling its sentinel meanwhile, or poll() returns at once
                            # and this loop spins.
                            self._poller.unregister(fd)
                            muted.append(fd)
                        elif w is not None and w not in ready():
                            reason = self._exit_reason(w, self._inflight[w], "step")
                            self._replace_or_fail(w, reason, False)
                            replaced[w] = reason
                    wait_ms = min(wait_ms * 2, 100)
            finally:
                if not self.closed:
                    for fd in muted:
                        self._poller.register(fd, select.POLLIN)
        # First come, first served: the steps sent earliest (lowest seq) first, so a
        # finished worker is never passed over for one sent after it.
        by_age = sorted(got, key=lambda w: (self._inflight[w], w))
        chosen = sorted(by_age[:need])
        has_message = bell.with_message()
        answers: dict[int, Any] = {}
        for w in chosen:
            seq = self._inflight.pop(w)
            if w in replaced or w not in has_message:
                continue
            while True:
                msg = self._conns[w].recv()
                if getattr(msg, "seq", None) == seq:
                    break
            if isinstance(msg, ErrorResponse):
                self._raise_remote(msg)
            answers[w] = msg
        ids = np.concatenate([np.arange(w * e, (w + 1) * e) for w in chosen])
        buffers = self._buffers
        assert buffers is not None
        obs = tree_map(lambda a: a[ids], self._obs_views)  # fancy indexing copies
        rewards = buffers.rewards[ids]
        terminations = buffers.terminations[ids]
        truncations = buffers.truncations[ids]
        for w in replaced:
            truncations[np.isin(ids, self._env_range(w))] = True
        return obs, rewards, terminations, truncations, self._infos(answers, replaced, ids), ids

    def _timeout(self, timeout: float | None) -> float | None:
        return self.step_timeout if timeout is None else timeout

    def _collect(self, answers: dict[int, StepResponse], ship: bool) -> tuple[Any, SharedBuffers]:
        if ship:
            self._worker_timers.merge(
                (f"worker_{a.worker_index}", a.timer_root, a.gauges) for a in answers.values()
            )
            self._worker_timers.shipped()
        buffers = self._buffers
        assert buffers is not None
        if buffers.observations is None:
            e = self.envs_per_worker
            for w, a in answers.items():
                if a.observations is not None:
                    for i, o in enumerate(a.observations):
                        if o is not None:
                            self._fallback_obs[w * e + i] = o
            self._obs_views = concatenate(
                self.single_observation_space, self._fallback_obs, self._obs_views
            )
            return (deepcopy(self._obs_views) if self.copy else self._obs_views), buffers
        if self.copy:
            return tree_map(np.copy, self._obs_views), buffers
        return self._obs_views, buffers

    def _infos(
        self,
        answers: dict[int, StepResponse],
        replaced: dict[int, str] | None = None,
        rows: np.ndarray | None = None,
    ) -> dict[str, Any]:
        """The vector infos of the workers' answers, then the restart notes."""
        e = self.envs_per_worker
        per_env = [(w * e + i, info) for w in sorted(answers) for i, info in answers[w].infos]
        if replaced:
            per_env.extend(self._restart_infos(replaced))
        return self._vector_infos(per_env, rows)

    # ---------------------------------------------------------------- call / attrs

    def call_async(self, name: str, *args: Any, **kwargs: Any) -> None:
        """Send :meth:`call` to the workers without waiting (as ``AsyncVectorEnv``)."""
        self._check_idle("call_async")
        seq = self._next_seq()
        self._broadcast(lambda w: Call(seq, name, args, kwargs))
        self._pending = ("call", (seq, name))

    def call_wait(self, timeout: float | None = None) -> tuple[Any, ...]:
        """Wait for the call sent by :meth:`call_async`; one result per env."""
        seq, name = self._take_pending("call")
        answers: dict[int, CallResponse] = self._gather(
            range(self.n_workers), seq, self._timeout(timeout), f"call({name!r})"
        )
        return tuple(r for w in range(self.n_workers) for r in answers[w].results)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every env: one value for all, or one per env."""
        self._check_idle("set_attr")
        if not isinstance(values, (list, tuple)):
            values = [values] * self.num_envs
        if len(values) != self.num_envs:
            raise ValueError(f"got {len(values)} values for num_envs={self.num_envs}")
        seq = self._next_seq()
        e = self.envs_per_worker
        self._broadcast(lambda w: SetAttr(seq, name, tuple(values[w * e : (w + 1) * e])))
        answers: dict[int, Ack] = self._gather(
            range(self.n_workers), seq, self.step_timeout, "set_attr"
        )
        assert len(answers) == self.n_workers

    # ---------------------------------------------------------------- shutdown

    def close(self, **kwargs: Any) -> None:
        """Close workers and free shared memory. Idempotent; safe after failures."""
        if self.closed and not self._processes and self._buffers is None:
            return
        try:
            if not self.closed and self._broken is None and self._pending is None:
                try:
                    self._flush_timers()
                except Exception:
                    pass  # timings are a courtesy at close; never block shutdown on them
        finally:
            self._shutdown()
            self.closed = True

    def close_extras(self, **kwargs: Any) -> None:
        """Part of gymnasium's ``VectorEnv.close`` protocol; :meth:`close` does the work."""
        self._shutdown()

    def _shutdown(self) -> None:
        """Stop every worker within ``close_timeout`` and unlink shared memory."""
        worker_timers = getattr(self, "_worker_timers", None)
        if worker_timers is not None:
            worker_timers.close()
        procs, conns = self._processes, self._conns
        self._processes, self._conns = [], []
        seq = self._next_seq() if hasattr(self, "_seq") else 0
        for proc, conn in zip(procs, conns, strict=True):
            if proc.is_alive():
                try:
                    conn.send(Close(seq))
                except Exception:
                    pass
        deadline = monotonic() + getattr(self, "close_timeout", 5.0)
        for proc in procs:
            proc.join(max(0.0, deadline - monotonic()))
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(1.0)
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
        wake: list[Connection | None] = [
            getattr(self, "_wake_r", None),
            getattr(self, "_wake_w", None),
        ]
        for pipe_end in [*conns, *wake]:
            if pipe_end is not None:
                pipe_end.close()
        self._wake_r = self._wake_w = None  # type: ignore[assignment]
        for proc in procs:
            try:
                proc.close()
            except ValueError:
                pass
        buffers, self._buffers = self._buffers, None
        if buffers is not None:
            self._obs_views = None
            buffers.close()

    def __del__(self) -> None:
        # Safety net only: the interpreter may be half torn down here.
        try:
            if getattr(self, "_processes", None) or getattr(self, "_buffers", None) is not None:
                self._shutdown()
        except Exception:
            pass

    def __repr__(self) -> str:
        spec = getattr(self, "spec", None)
        name = spec.id if spec is not None else "envs"
        return (
            f"SubprocessEnvManager({name}, num_envs={self.num_envs}, n_workers={self.n_workers}, "
            f"envs_per_worker={self.envs_per_worker}, context={self.context!r})"
        )


def _scatter_tree(dst: Any, rows: np.ndarray, src: Any) -> None:
    """Copy a batched nest into rows ``rows`` of the shared arrays."""
    if isinstance(dst, dict):
        for k, d in dst.items():
            _scatter_tree(d, rows, src[k])
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src, strict=True):
            _scatter_tree(d, rows, s)
    else:
        dst[rows] = src


def _copy_tree(dst: Any, src: Any) -> None:
    """Copy a batched action nest into the shared arrays of the same structure."""
    if isinstance(dst, dict):
        for k, d in dst.items():
            _copy_tree(d, src[k])
    elif isinstance(dst, tuple):
        for d, s in zip(dst, src, strict=True):
            _copy_tree(d, s)
    else:
        dst[...] = src


@atexit.register
def _close_live_managers() -> None:
    # Workers are daemons, so multiprocessing would kill them at exit anyway;
    # this is about the shared-memory segments, which only an unlink frees.
    for manager in list(_LIVE_MANAGERS):
        try:
            manager.close()
        except Exception:
            pass
