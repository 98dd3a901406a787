"""The worker process: owns a batch of envs and steps them all per command.

:func:`worker_main` is a plain module-level function so every start method
(fork, forkserver, spawn) can run it. A worker wakes once per batch command,
not once per env: it reads its slice of the actions from shared memory, steps
each of its envs, writes observations, rewards and done flags into its slice of
shared memory, and answers with one small :class:`~envmgr.messages.StepResponse`.
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from time import perf_counter
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import batch_space, iterate

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
from envmgr.shared_memory import SharedBuffers, tree_map
from envmgr.signalling import SHIP_TIMERS, WorkerDoorbell
from envmgr.timers import TimerNode, get_default_stack

__all__ = ["worker_main"]

#: While blocked, how often a worker checks that its manager still exists.
LIVENESS_INTERVAL = 0.25
#: How often the watchdog thread checks the same while the worker is busy.
WATCHDOG_INTERVAL = 0.5

# Autoreset modes, by gymnasium.vector.AutoresetMode value.
_NEXT_STEP, _SAME_STEP, _DISABLED = "NextStep", "SameStep", "Disabled"


class _Timers:
    """The worker's timer nodes, fetched once per shipped tree, not per step.

    Env calls are timed with two ``perf_counter`` reads added straight into the
    nodes: a context manager per env would cost more than a CartPole step.
    """

    def __init__(self) -> None:
        # The thread's default stack, so timers and gauges that env code sets
        # through envmgr.timers ship with the worker's tree (nested under the
        # ``step`` / ``reset`` node that is open while the env runs).
        self.stack = get_default_stack()
        self.stack.reset()
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

    def take(self) -> tuple[TimerNode, dict[str, Any]]:
        """Return the tree and gauges accumulated since the last call, then start afresh."""
        root = self.stack.get_root()
        gauges = dict(self.stack.gauges)
        self.stack.reset()
        self._bind()
        return root, gauges


class _Worker:
    """State of one worker process; :func:`worker_main` drives it."""

    def __init__(
        self,
        conn: Connection,
        wake: Connection,
        config: WorkerConfig,
        envs: list[gym.Env[Any, Any]],
    ) -> None:
        self.conn = conn
        self.wake = wake
        self.doorbell: WorkerDoorbell | None = None
        self.config = config
        self.envs = envs
        self.n = len(envs)
        self.timers = _Timers()
        self.autoreset = [False] * self.n
        # Last results per env, kept between commands so a partial reset can
        # republish the observations of the envs it did not touch.
        self._obs: list[Any] = [None] * self.n
        self._rew: list[Any] = [0.0] * self.n
        self._term: list[Any] = [False] * self.n
        self._trunc: list[Any] = [False] * self.n
        # Per-env step seconds and counts, written to shared memory when the
        # timer tree ships rather than every step.
        self._env_sec: list[float] = [0.0] * self.n
        self._env_cnt: list[int] = [0] * self.n
        self._discrete_actions = isinstance(envs[0].action_space, gym.spaces.Discrete)
        self.mode = config.autoreset_mode
        self.single_obs_space = envs[0].observation_space
        self.local_action_space = batch_space(envs[0].action_space, self.n)
        self.buffers: SharedBuffers | None = None
        self.views: dict[str, Any] = {}
        self.write_obs: Callable[[list[Any]], None] | None = None
        if config.layout is not None:
            self.attach(config.layout)

    # ----------------------------------------------------------------- set-up

    def attach(self, layout: Any) -> None:
        self.buffers = SharedBuffers.attach(layout)
        off = self.config.env_offset
        self.views = self.buffers.slice(off, off + self.n)
        obs = self.views["observations"]
        self.write_obs = None if obs is None else _make_writer(obs)
        parent_pid = os.getppid()
        manager_pid = self.config.manager_pid
        self.doorbell = WorkerDoorbell(
            self.buffers.control,
            self.config.worker_index,
            self.conn,
            self.wake.fileno(),
            self.config.spin_seconds,
            lambda: not _manager_gone(manager_pid, parent_pid),
            LIVENESS_INTERVAL,
        )

    def env_index(self, local: int) -> int:
        return self.config.env_offset + local

    # ----------------------------------------------------------------- commands

    def handle(self, cmd: Command) -> Any:
        if isinstance(cmd, Step):
            return self._within("step", self.step, cmd)
        if isinstance(cmd, Reset):
            return self._within("reset", self.reset, cmd)
        if isinstance(cmd, Call):
            return self.call(cmd)
        if isinstance(cmd, SetAttr):
            for env, value in zip(self.envs, cmd.values, strict=True):
                env.set_wrapper_attr(cmd.name, value)
            return Ack(self.config.worker_index, cmd.seq)
        if isinstance(cmd, FlushTimers):
            return self._response(cmd.seq, (), None, True)
        if isinstance(cmd, Attach):
            self.attach(cmd.layout)
            return Ack(self.config.worker_index, cmd.seq)
        raise TypeError(f"worker {self.config.worker_index}: unknown command {cmd!r}")

    def _within(self, name: str, run: Callable[[Any], StepResponse], cmd: Any) -> StepResponse:
        """Run ``run(cmd)`` with timer ``name`` open, so env code's own timers nest there.

        The node's time is added by ``run`` itself; the stack only places children.
        """
        stack = self.timers.stack
        stack.push(name)
        try:
            answer = run(cmd)
        finally:
            stack.pop()
        if cmd.ship_timers:
            answer = self._response(answer.seq, answer.infos, answer.observations, True)
        return answer

    def step(self, cmd: Step) -> StepResponse:
        t_start = perf_counter()
        if cmd.actions is not None:
            actions: Any = cmd.actions
        else:
            actions = self._read_actions()
        envs, mode, autoreset = self.envs, self.mode, self.autoreset
        obs_list, rewards, terms, truncs = self._obs, self._rew, self._term, self._trunc
        env_sec, env_cnt = self._env_sec, self._env_cnt
        infos: list[tuple[int, dict[str, Any]]] = []
        t_env = t_reset = 0.0
        n_resets = 0
        i = 0
        # Results go into plain lists and are written to shared memory once per
        # batch: one numpy assignment per array instead of one per env. The loop
        # body is kept lean on purpose: it runs once per env step.
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
                            f"env {self.env_index(i)} finished its episode and autoreset_mode "
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
                    term_or_trunc = False
                else:
                    term_or_trunc = term or trunc
                obs_list[i], rewards[i], terms[i], truncs[i] = obs, reward, term, trunc
                autoreset[i] = term_or_trunc
                if info:
                    infos.append((i, info))
        except BaseException:
            self.current_env = i
            raise
        obs_out = self._publish(obs_list, rewards, terms, truncs)
        timers = self.timers
        timers.step_env.add_time(t_env, self.n - n_resets if mode == _NEXT_STEP else self.n)
        if n_resets:
            timers.step_autoreset.add_time(t_reset, n_resets)
        timers.step.add_time(perf_counter() - t_start)
        return self._response(cmd.seq, tuple(infos), obs_out, False)  # timers: see _within

    def _read_actions(self) -> list[Any]:
        """This worker's actions from shared memory, one per env, as private copies.

        Copies, because an env may keep its action and the parent overwrites the
        shared array on the next step. Discrete actions become Python ints (one
        ``tolist`` instead of a numpy scalar per env); gymnasium's ``iterate``
        splits everything else exactly as ``SyncVectorEnv`` does.
        """
        view = self.views["actions"]
        if self._discrete_actions:
            return view.tolist()  # type: ignore[no-any-return]
        return list(iterate(self.local_action_space, tree_map(np.array, view)))

    def _publish(
        self, obs_list: list[Any], rewards: list[Any], terms: list[Any], truncs: list[Any]
    ) -> tuple[Any, ...] | None:
        """Write a batch of results to shared memory; returns observations for the fallback."""
        views = self.views
        views["rewards"][:] = rewards
        views["terminations"][:] = terms
        views["truncations"][:] = truncs
        if self.write_obs is None:
            return tuple(obs_list)
        try:
            self.write_obs(obs_list)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            self._explain_bad_observation(obs_list, exc)
        return None

    def _explain_bad_observation(self, obs_list: list[Any], exc: Exception) -> None:
        """Name the env whose observation does not fit the observation space."""
        space = self.single_obs_space
        for i, obs in enumerate(obs_list):
            if obs not in space:
                shape = getattr(obs, "shape", None)
                self.current_env = i
                raise ValueError(
                    f"env {self.env_index(i)} returned an observation that is not in its "
                    f"observation space {space}: got {type(obs).__name__}"
                    + (f" of shape {shape}" if shape is not None else "")
                    + f" ({exc})"
                ) from exc
        raise exc

    def reset(self, cmd: Reset) -> StepResponse:
        t_start = perf_counter()
        obs_list, rewards, terms, truncs = self._obs, self._rew, self._term, self._trunc
        infos: list[tuple[int, dict[str, Any]]] = []
        t_env = 0.0
        count = 0
        for i, env in enumerate(self.envs):
            if cmd.mask is not None and not cmd.mask[i]:
                continue  # keeps its last observation and flags, as SyncVectorEnv does
            self.current_env = i
            t0 = perf_counter()
            obs, info = env.reset(seed=cmd.seeds[i], options=cmd.options)
            t_env += perf_counter() - t0
            count += 1
            obs_list[i] = obs
            rewards[i] = 0.0
            terms[i] = truncs[i] = False
            self.autoreset[i] = cmd.autoreset_next
            if info:
                infos.append((i, info))
        self.current_env = None
        obs_out = self._publish(obs_list, rewards, terms, truncs)
        self.timers.reset_env.add_time(t_env, count)
        self.timers.reset.add_time(perf_counter() - t_start)
        return self._response(cmd.seq, tuple(infos), obs_out, False)  # timers: see _within

    def call(self, cmd: Call) -> CallResponse:
        results = []
        for i, env in enumerate(self.envs):
            self.current_env = i
            attr = env.get_wrapper_attr(cmd.name)
            results.append(attr(*cmd.args, **cmd.kwargs) if callable(attr) else attr)
        self.current_env = None
        return CallResponse(self.config.worker_index, cmd.seq, tuple(results))

    def _response(
        self,
        seq: int,
        infos: tuple[tuple[int, dict[str, Any]], ...],
        observations: tuple[Any, ...] | None,
        ship_timers: bool,
    ) -> StepResponse:
        root = gauges = None
        if ship_timers:
            root, gauges = self.timers.take()
            views = self.views
            if views:
                views["env_seconds"][:] = self._env_sec
                views["env_steps"][:] = self._env_cnt
        return StepResponse(self.config.worker_index, seq, infos, observations, root, gauges)

    current_env: int | None = None


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


def _error(
    config: WorkerConfig, seq: int, env_index: int | None, phase: str, exc: BaseException
) -> ErrorResponse:
    try:
        payload: bytes | None = cloudpickle.dumps(exc)
        pickle.loads(payload)  # type: ignore[arg-type]  # would fail in the parent too
    except Exception:
        payload = None
    return ErrorResponse(
        worker_index=config.worker_index,
        seq=seq,
        env_index=env_index,
        phase=phase,
        exception=payload,
        type_name=f"{type(exc).__module__}.{type(exc).__qualname__}",
        message=str(exc),
        traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    )


def _receive(conn: Connection, spin_seconds: float, parent_pid: int) -> Command | None:
    """Wait for the next command: spin briefly (cheap wake-up), then block.

    Returns ``None`` when the manager is gone (pipe closed or parent changed).
    """
    if not conn.poll():
        if spin_seconds > 0.0:
            deadline = perf_counter() + spin_seconds
            # sched_yield lets a process that needs the core (the parent, another
            # worker) run at once: spinning without it collapses throughput when
            # processes outnumber cores.
            while not conn.poll():
                if perf_counter() > deadline:
                    break
                os.sched_yield()
        while not conn.poll(LIVENESS_INTERVAL):
            if os.getppid() != parent_pid:
                return None
    try:
        return conn.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        return None


def _send(conn: Connection, config: WorkerConfig, message: Any, phase: str) -> bool:
    """Send ``message``; if it cannot be pickled, send the reason instead."""
    try:
        conn.send(message)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False
    except Exception as exc:  # unpicklable info, observation, or call result
        seq = getattr(message, "seq", -1)
        err = _error(config, seq, None, f"{phase} (sending the result)", exc)
        try:
            conn.send(err)
        except Exception:
            return False
        return True


def worker_main(conn: Connection, wake: Connection, config: WorkerConfig) -> None:
    """Run one worker until told to close or until its manager is gone.

    Args:
        conn: The worker's end of its duplex pipe to the manager.
        wake: Write end of the manager's shared wake-up pipe.
        config: Start-up settings and the cloudpickled env factories.
    """
    # Ctrl-C goes to the whole process group; the manager alone handles it and
    # closes workers in order, so a worker must not die half-way through a step.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for fd in config.fds_to_close:
        try:
            os.close(fd)
        except OSError:
            pass
    parent_pid = os.getppid()
    if config.death_signal:
        _set_death_signal()
    _start_watchdog(config.manager_pid, parent_pid)

    envs: list[gym.Env[Any, Any]] = []
    try:
        env_fns = cloudpickle.loads(config.env_fns)
        for k, fn in enumerate(env_fns):
            env = fn()
            envs.append(env)
            if k and env.observation_space != envs[0].observation_space:
                raise ValueError(
                    f"env {config.env_offset + k} has observation space {env.observation_space}, "
                    f"but env {config.env_offset} has {envs[0].observation_space}"
                )
            if k and env.action_space != envs[0].action_space:
                raise ValueError(
                    f"env {config.env_offset + k} has action space {env.action_space}, "
                    f"but env {config.env_offset} has {envs[0].action_space}"
                )
        worker = _Worker(conn, wake, config, envs)
    except BaseException as exc:
        env_index = config.env_offset + len(envs)
        _send(conn, config, _error(config, -1, env_index, "make", exc), "make")
        _close_envs(envs)
        return

    first = envs[0]
    spec = first.spec
    try:
        pickle.dumps(spec)
    except Exception:
        # A spec carrying a lambda (a wrapper's argument, say) only cloudpickle
        # could carry; the parent uses the spec for its repr alone.
        spec = None
    ready = Ready(
        config.worker_index,
        os.getpid(),
        first.observation_space,
        first.action_space,
        dict(first.metadata),
        first.render_mode,
        spec,
    )
    if not _send(conn, config, ready, "start"):
        _close_envs(envs)
        return

    timers = worker.timers
    config_spin = config.spin_seconds
    try:
        while True:
            t0 = perf_counter()
            bell = worker.doorbell
            if bell is None:  # before Attach, every command comes down the pipe
                got: Any = _receive(conn, config_spin, parent_pid)
            else:
                got = bell.wait()
            timers.wait.add_time(perf_counter() - t0)
            if got is None:
                break
            fast = isinstance(got, tuple)
            if fast:
                seq, kind = got
                cmd: Command = Step(seq, bool(kind & SHIP_TIMERS))
            else:
                cmd = pickle.loads(got) if isinstance(got, bytes) else got
                if bell is not None:
                    bell.saw(cmd.seq)
            if isinstance(cmd, Close):
                _close_envs(envs)
                _send(conn, config, Ack(config.worker_index, cmd.seq), "close")
                break
            try:
                answer = worker.handle(cmd)
            except BaseException as exc:
                phase = type(cmd).__name__.lower()
                failed_env = worker.current_env
                worker.current_env = None
                failed_index = None if failed_env is None else worker.env_index(failed_env)
                answer = _error(config, cmd.seq, failed_index, phase, exc)
            t2 = perf_counter()
            if fast:
                # Steps announced in shared memory answer there too; the pipe
                # carries a message only when there is something to say.
                has_message = isinstance(answer, ErrorResponse) or bool(
                    answer.infos or answer.timer_root is not None or answer.observations is not None
                )
                ok = _send(conn, config, answer, "step") if has_message else True
                worker.doorbell.step_done(seq, has_message)  # type: ignore[union-attr]
            else:
                ok = _send(conn, config, answer, type(cmd).__name__.lower())
            timers.send.add_time(perf_counter() - t2)
            if not ok:
                break
    finally:
        if worker.buffers is not None:
            worker.doorbell = None
            worker.views = {}
            worker.write_obs = None
            worker.buffers.close()
        _close_envs(envs)


def _manager_gone(manager_pid: int, parent_pid: int) -> bool:
    """Whether the manager process has exited (a zombie counts as exited)."""
    if os.getppid() != parent_pid:
        return True
    try:
        os.kill(manager_pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{manager_pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state in ("Z", "X")


def _start_watchdog(manager_pid: int, parent_pid: int) -> None:
    """Exit this worker soon after the manager dies, even if an env is stuck in Python code.

    The pipe's end-of-file covers a worker waiting for a command; this thread
    covers one busy in a long step. Under fork and spawn the kernel's parent
    death signal (:func:`_set_death_signal`) also covers code that holds the GIL.
    """

    def watch() -> None:
        while True:
            time.sleep(WATCHDOG_INTERVAL)
            if _manager_gone(manager_pid, parent_pid):
                os._exit(0)

    threading.Thread(target=watch, name="envmgr-watchdog", daemon=True).start()


def _set_death_signal() -> None:
    """Have Linux SIGKILL this process when the process (thread) that created it exits."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _close_envs(envs: list[gym.Env[Any, Any]]) -> None:
    """Close every env once (the list is emptied), ignoring errors from ``close``."""
    for env in envs:
        try:
            env.close()
        except Exception:
            pass
    envs.clear()
