"""Envs that misbehave on purpose, for the fault-injection tests (``test_faults.py``,
``test_shutdown.py``) and the soak script.

One class, :class:`FaultEnv`, a small real ``gymnasium.Env``, is parametrized by
the *kind* of fault and the step at which it fires:

==================  ==========================================================
kind                what happens when it fires
==================  ==========================================================
``none``            nothing: a well-behaved env
``segfault``        a real segmentation fault (``ctypes.string_at(0)``)
``sigsegv``         ``os.kill(os.getpid(), SIGSEGV)``
``exit``            ``os._exit(EXIT_CODE)``
``sigkill``         ``os.kill(os.getpid(), SIGKILL)`` (what the OOM killer does)
``raise``           raises :class:`InjectedFault`, defined here
``hang``            ``time.sleep(HANG_SECONDS)`` (tests set ``step_timeout``)
``hang_noterm``     like ``hang``, but ignores SIGTERM first (close must SIGKILL)
``spin``            like ``hang``, but busy in Python code (a loop) instead of asleep
``hold_gil``        like ``hang``, but asleep inside C code that holds the GIL
                    (``ctypes.PyDLL``), so no other thread of the worker can run
``unpicklable``     returns an info holding a ``threading.Lock``
``leak``            keeps ``leak_bytes`` more memory on *every* step and reports
                    the process RSS in ``info["rss"]``; at ``at_step`` it is
                    "OOM-killed" (SIGKILLs itself)
``init_raise``      the constructor raises :class:`InjectedFault`
``init_exit``       the constructor calls ``os._exit(EXIT_CODE)``
``raise_reset``     the first ``reset`` raises :class:`InjectedFault`
``hang_reset``      the first ``reset`` hangs like ``hang``
==================  ==========================================================

A hang ends after ``hang_seconds`` or, with ``release_file``, as soon as that
file exists (and the step then returns normally: a *late* answer, for the tests
that prove a late answer is dropped). ``step_log`` appends one line per step
call, so a test can see that an env has finished a step without a clock.

Crash dumps: a worker forked from pytest inherits its ``faulthandler``, which
would print a ``Fatal Python error`` dump into the test log for every deliberate
segfault. Right before crashing on purpose the env points ``faulthandler`` at
``crash-env<tag>-<pid>.txt`` in ``state_dir`` (or turns it off without one),
so a passing run prints no dump and a failing one still has it, in the test's
``tmp_path``.

Step faults fire on the ``at_step``-th call to ``step`` (1-based, counted over
the env's lifetime, across episodes), or on every later call too for ``hang``.

Firing only once: a replaced worker rebuilds its envs from the same factories,
so an env that crashed at step 3 would crash again at step 3 of its new life.
Give the env a ``state_dir`` (a directory shared by every incarnation) and
``fire_in`` (which incarnations fire, 0 = the first): each construction of the
env with tag ``tag`` records itself there, so incarnation numbers survive the
process that made them. Without ``state_dir`` every incarnation fires.

Dynamics (deterministic given the reset seed, as ``tests/envs.py``): the
observation is ``[t, x]`` with ``t`` the steps since reset and ``x`` a random
draw from ``self.np_random``; the reward is ``action + t / 10``; the episode is
truncated after ``episode_len`` steps. So even after an unseeded reset (which
is what a restarted worker does), ``t`` and the reward are predictable.

The module is imported by name (``fault_envs``) in worker processes, like
``envs``: ``tests/`` is on ``sys.path`` in every start method.
"""

from __future__ import annotations

import ctypes
import faulthandler
import functools
import mmap
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

__all__ = [
    "EXIT_CODE",
    "HANG_SECONDS",
    "STEP_FAULTS",
    "INIT_FAULTS",
    "RESET_FAULTS",
    "ALL_FAULTS",
    "InjectedFault",
    "FaultEnv",
    "fault_env_fns",
    "incarnations",
    "record_construction",
    "rss_bytes",
    "process_token",
    "process_state",
    "wait_gone",
    "segment_of",
    "segment_path",
    "wait_unlinked",
]

EXIT_CODE = 3
HANG_SECONDS = 3600.0
#: Faults that fire inside ``step``.
STEP_FAULTS = (
    "segfault",
    "sigsegv",
    "exit",
    "sigkill",
    "raise",
    "hang",
    "hang_noterm",
    "spin",
    "hold_gil",
    "unpicklable",
    "leak",
)
#: Faults that fire inside the constructor.
INIT_FAULTS = ("init_raise", "init_exit")
#: Faults that fire inside ``reset``.
RESET_FAULTS = ("raise_reset", "hang_reset")
ALL_FAULTS = ("none", *STEP_FAULTS, *INIT_FAULTS, *RESET_FAULTS)


class InjectedFault(RuntimeError):
    """What ``raise`` / ``init_raise`` raise; a custom type the parent must re-create."""


def rss_bytes() -> int:
    """Resident set size of this process, from ``/proc/self/statm``."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE")


def incarnations(state_dir: str | os.PathLike[str], tag: int) -> int:
    """How many times the env with ``tag`` has been constructed under ``state_dir``."""
    return sum(1 for p in Path(state_dir).glob(f"env{tag}.built.*"))


def record_construction(state_dir: str, tag: int) -> int:
    """Record one more construction of env ``tag``; returns its incarnation number (0-based)."""
    d = Path(state_dir)
    n = 0
    while True:  # O_EXCL: two processes can never claim the same number
        try:
            fd = os.open(d / f"env{tag}.built.{n}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            n += 1
            continue
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        return n


def _segfault() -> None:
    ctypes.string_at(0)  # reads address 0: SIGSEGV inside C code


#: Where this process's crash dump goes (kept open until the crash).
_dump_file: Any = None


def _quiet_crash_dump(state_dir: str | None, tag: int) -> None:
    """Send a deliberate crash's ``faulthandler`` dump to a file instead of the test log."""
    global _dump_file
    if not faulthandler.is_enabled():
        return
    if state_dir is None:
        faulthandler.disable()
        return
    _dump_file = open(Path(state_dir) / f"crash-env{tag}-{os.getpid()}.txt", "w")  # noqa: SIM115
    faulthandler.enable(file=_dump_file)


def _sleep_holding_the_gil(seconds: float) -> None:
    """Sleep in libc's ``sleep`` through ``PyDLL``, which does not release the GIL."""
    ctypes.PyDLL(None).sleep(ctypes.c_uint(int(seconds)))


def _disable_death_signal() -> None:
    """Undo the parent-death signal a worker asked the kernel for (Linux ``prctl``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, 0, 0, 0, 0)


def _mute_thread_exits() -> None:
    """Make ``os._exit`` block forever when called from any thread but the main one.

    Takes the worker's watchdog thread (which ends a worker with ``os._exit``)
    out of play without touching envmgr, so another exit path can be shown to
    work alone. The main thread's exits are untouched.
    """
    real_exit = os._exit

    def exit_from_main_thread_only(code: int) -> Any:
        if threading.current_thread() is threading.main_thread():
            real_exit(code)
        while True:
            time.sleep(3600)

    os._exit = exit_from_main_thread_only  # type: ignore[assignment]


class FaultEnv(gym.Env):  # type: ignore[type-arg]
    """A small env that commits fault ``kind`` at step ``at_step`` (see the module doc).

    Args:
        kind: One of :data:`ALL_FAULTS`.
        at_step: The step call (1-based, over the env's lifetime) at which a
            step fault fires.
        tag: This env's identity (its global index, by convention); appears in
            messages and in ``state_dir`` file names.
        state_dir: Directory shared by every incarnation; see ``fire_in``.
        fire_in: Incarnations (0-based) in which the fault fires; ``None`` means
            all. Only meaningful with ``state_dir``.
        episode_len: Steps after which an episode is truncated.
        leak_bytes: Bytes kept per step by the ``leak`` kind.
        ready_file: If given, a file created just before a ``hang`` starts (so a
            test knows the worker is inside the step).
        hang_seconds: How long ``hang`` sleeps (a short one makes a *slow* step
            whose answer would arrive after the step timeout).
        rebuild_fault: A fault of the *replacements* (a worker whose replacement
            cannot be built or dies while starting): ``"init_raise"`` or
            ``"init_exit"`` in the constructor, or ``"reset_exit"``
            (``os._exit(EXIT_CODE)`` in the first reset, which for a replacement
            is the reset the manager sends while restarting it). Committed by
            the incarnations in ``rebuild_in``. Needs ``state_dir``.
        rebuild_in: Incarnations committing ``rebuild_fault``; ``None``: every
            incarnation after the first.
        release_file: If given, a hang ends as soon as this file exists.
        step_log: If given, a file to which every step call appends ``<tag>``.
        no_death_signal: Cancel the worker's parent-death signal (``prctl``).
        mute_watchdog: Make ``os._exit`` from non-main threads block (see
            :func:`_mute_thread_exits`).
    """

    metadata: dict[str, Any] = {"render_modes": []}

    def __init__(
        self,
        kind: str = "none",
        at_step: int = 3,
        tag: int = 0,
        state_dir: str | None = None,
        fire_in: Sequence[int] | None = (0,),
        episode_len: int = 20,
        leak_bytes: int = 1 << 20,
        ready_file: str | None = None,
        hang_seconds: float = HANG_SECONDS,
        rebuild_fault: str | None = None,
        rebuild_in: Sequence[int] | None = None,
        release_file: str | None = None,
        step_log: str | None = None,
        no_death_signal: bool = False,
        mute_watchdog: bool = False,
    ) -> None:
        if kind not in ALL_FAULTS:
            raise ValueError(f"unknown fault kind {kind!r}; choose from {ALL_FAULTS}")
        self.kind = kind
        self.at_step = at_step
        self.tag = tag
        self.episode_len = episode_len
        self.leak_bytes = leak_bytes
        self.ready_file = ready_file
        self.hang_seconds = hang_seconds
        self.release_file = release_file
        self.step_log = step_log
        self.state_dir = state_dir
        if no_death_signal:
            _disable_death_signal()
        if mute_watchdog:
            _mute_thread_exits()
        self.incarnation = 0 if state_dir is None else record_construction(state_dir, tag)
        self.armed = kind != "none" and (
            state_dir is None or fire_in is None or self.incarnation in fire_in
        )
        self.observation_space = spaces.Box(-1e6, 1e6, shape=(2,), dtype=np.float32)
        self.action_space = spaces.Discrete(2)
        self.t = 0
        self.calls = 0  # step calls over the env's lifetime
        self.resets = 0  # reset calls over the env's lifetime
        self._leak: list[mmap.mmap] = []
        init_fault = kind if self.armed else None
        rebuilding = self.incarnation >= 1 and (
            rebuild_in is None or self.incarnation in rebuild_in
        )
        if rebuild_fault is not None and rebuilding:
            init_fault = rebuild_fault
        self.exit_in_reset = init_fault == "reset_exit"
        if init_fault == "init_raise":
            raise InjectedFault(f"env {tag} refused to be built (incarnation {self.incarnation})")
        if init_fault == "init_exit":
            os._exit(EXIT_CODE)

    def _obs(self) -> np.ndarray:
        return np.array([self.t, self.np_random.uniform(-1.0, 1.0)], dtype=np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        if self.exit_in_reset:
            os._exit(EXIT_CODE)
        self.resets += 1
        if self.armed and self.resets == 1 and self.kind == "raise_reset":
            raise InjectedFault(f"env {self.tag} failed to reset")
        if self.armed and self.resets == 1 and self.kind == "hang_reset":
            self._hang()
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.calls += 1
        info: dict[str, Any] = {}
        if self.kind == "leak" and self.armed:
            # A fresh mapping, every page written: resident for sure. (A bytearray could
            # come from free heap inherited from a forked parent, pages already counted in
            # the RSS, and the leak would not show.)
            block = mmap.mmap(-1, self.leak_bytes)
            block.write(b"x" * self.leak_bytes)
            self._leak.append(block)
            info["rss"] = rss_bytes()
            info["leaked"] = len(self._leak) * self.leak_bytes
        if self.armed and self.calls >= self.at_step:
            self._fire(info)
        self.t += 1
        reward = float(action) + self.t / 10.0
        truncated = self.t >= self.episode_len
        if self.step_log is not None:
            with open(self.step_log, "a") as f:
                f.write(f"{self.tag}\n")
        return self._obs(), reward, False, truncated, info

    def pause(self, seconds: float, tag: int | None = None) -> int:
        """For ``call``: sleep ``seconds`` (or until ``release_file`` exists) if this env
        is env ``tag`` (every env when ``None``); returns this env's tag."""
        if tag is None or tag == self.tag:
            self.hang_seconds = seconds
            self._hang()
        return self.tag

    def make_lock(self, tag: int | None = None) -> Any:
        """For ``call``: a result that cannot be pickled (a lock) from env ``tag`` (every
        env when ``None``); the others return their tag."""
        return threading.Lock() if tag is None or tag == self.tag else self.tag

    def _hang(self) -> None:
        """Sleep ``hang_seconds`` or until ``release_file`` appears; say so in ``ready_file``."""
        if self.ready_file is not None:
            Path(self.ready_file).write_text(str(os.getpid()))
        deadline = time.monotonic() + self.hang_seconds
        if self.kind == "hold_gil":
            _sleep_holding_the_gil(self.hang_seconds)
        elif self.kind == "spin":
            while time.monotonic() < deadline:
                pass
        elif self.release_file is None:
            time.sleep(self.hang_seconds)
        else:
            release = Path(self.release_file)
            while not release.exists() and time.monotonic() < deadline:
                time.sleep(0.01)

    def _fire(self, info: dict[str, Any]) -> None:
        kind, first = self.kind, self.calls == self.at_step
        if kind in ("hang", "hang_noterm", "spin", "hold_gil"):
            if kind == "hang_noterm":
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
            self._hang()
        elif not first:
            return
        elif kind == "segfault":
            _quiet_crash_dump(self.state_dir, self.tag)
            _segfault()
        elif kind == "sigsegv":
            _quiet_crash_dump(self.state_dir, self.tag)
            os.kill(os.getpid(), signal.SIGSEGV)
            time.sleep(60)  # the signal is delivered at once; never reached
        elif kind == "exit":
            os._exit(EXIT_CODE)
        elif kind in ("sigkill", "leak"):
            os.kill(os.getpid(), signal.SIGKILL)
            time.sleep(60)
        elif kind == "raise":
            raise InjectedFault(f"env {self.tag} failed at step {self.calls}")
        elif kind == "unpicklable":
            info["lock"] = threading.Lock()


def fault_env_fns(
    kind: str,
    num_envs: int,
    fault_env: int,
    at_step: int = 3,
    state_dir: str | os.PathLike[str] | None = None,
    fire_in: Sequence[int] | None = (0,),
    rebuild_fault: str | None = None,
    rebuild_in: Sequence[int] | None = None,
    **kwargs: Any,
) -> list[Callable[[], FaultEnv]]:
    """One factory per env; only env ``fault_env`` carries ``kind`` and ``rebuild_fault``.

    Every env gets ``tag`` = its index. Extra keyword arguments go to every env.
    """
    sd = None if state_dir is None else str(state_dir)
    return [
        functools.partial(
            FaultEnv,
            kind=kind if i == fault_env else "none",
            at_step=at_step,
            tag=i,
            state_dir=sd,
            fire_in=fire_in,
            rebuild_fault=rebuild_fault if i == fault_env else None,
            rebuild_in=rebuild_in,
            **kwargs,
        )
        for i in range(num_envs)
    ]


def slow_to_restart(flag: str, part: str) -> Callable[[], gym.Env[Any, Any]]:
    """A CartPole factory whose env, while ``flag`` exists, stalls in its build
    (``part="build"``) or its reset (``"reset"``) until the test removes ``flag``, after
    appending its process's pid to ``flag + ".pids"``: a restart for an interrupt to cut
    off, in a worker process or a Ray actor."""

    def stall() -> None:
        with open(flag + ".pids", "a") as f:
            f.write(f"{os.getpid()}\n")
        deadline = time.monotonic() + 60.0  # a liveness bound: the test removes the flag
        while os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)

    class SlowReset(gym.Wrapper):  # type: ignore[type-arg]
        def reset(self, **kwargs: Any) -> Any:
            if os.path.exists(flag):
                stall()
            return self.env.reset(**kwargs)

    def make() -> gym.Env[Any, Any]:
        if part == "build" and os.path.exists(flag):
            stall()
        env = gym.make("CartPole-v1")
        return SlowReset(env) if part == "reset" else env

    return make


# --------------------------------------------------------------------------- process checks
#
# Helpers for the tests: a pid alone is not an identity (pids are reused), so a
# process is remembered as (pid, start time) and counts as gone once no process
# with that pid *and* that start time exists. A zombie still exists: a test that
# finds one has found a process nobody reaped.


def process_token(pid: int) -> tuple[int, str] | None:
    """``(pid, start time in clock ticks)`` of a live (or zombie) process, else ``None``."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return pid, fields[19]  # field 22 of stat; fields[0] is field 3 (state)


def process_state(token: tuple[int, str]) -> str | None:
    """State letter (``R``, ``S``, ``Z``...) of the process ``token`` names; ``None`` if gone."""
    pid, start = token
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[19] != start:
        return None  # the pid now belongs to another process
    return fields[0]


def wait_gone(
    tokens: Sequence[tuple[int, str] | None], timeout: float = 5.0, zombie_ok: bool = False
) -> dict[int, str]:
    """Poll until every process in ``tokens`` is gone; returns ``{pid: state}`` of the rest.

    Args:
        tokens: From :func:`process_token` (``None`` entries are ignored).
        timeout: Polling deadline in seconds.
        zombie_ok: Count a zombie as gone (for orphans: reaping them is init's job).
    """
    deadline = time.monotonic() + timeout
    while True:
        left = {}
        for tok in tokens:
            if tok is None:
                continue
            state = process_state(tok)
            if state is not None and not (zombie_ok and state in ("Z", "X")):
                left[tok[0]] = state
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def segment_of(pids: Sequence[int]) -> str:
    """The envmgr segment the worker processes ``pids`` all have mapped.

    Read from ``/proc/<pid>/maps`` (the segments are files in ``/dev/shm``), so a
    test can follow a manager's segment without reaching into the manager. A
    forked worker also inherits whatever other live segments its parent had
    mapped, hence the intersection over every worker.
    """
    common: set[str] | None = None
    for pid in pids:
        names = set()
        with open(f"/proc/{pid}/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                path = fields[5].strip() if len(fields) == 6 else ""
                if path.startswith("/dev/shm/envmgr_") and not path.endswith("(deleted)"):
                    names.add(path[len("/dev/shm/") :])
        common = names if common is None else common & names
    if not common or len(common) != 1:
        raise AssertionError(f"workers {list(pids)} share no single envmgr segment: {common}")
    return common.pop()


def segment_path(name: str) -> Path:
    """Where a shared-memory segment named ``name`` lives on Linux."""
    return Path("/dev/shm") / name.lstrip("/")


def wait_unlinked(name: str, timeout: float = 5.0) -> bool:
    """Poll until ``/dev/shm/<name>`` is gone; whether it is."""
    deadline = time.monotonic() + timeout
    path = segment_path(name)
    while path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True
