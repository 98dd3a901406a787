"""The machine's ceiling: independent processes, each stepping its share of the envs at once.

The serial loop is the wrong yardstick for a multi-process manager on small VMs: it says
what one core does, not what the machine does. The ceiling is the most any design built
from processes could reach here: ``P`` processes, each stepping ``n / P`` envs in its own
plain loop at the same time, with no communication at all. envmgr / ceiling is then the
share of the machine envmgr delivers (1.0 = nothing lost to hand-offs or wake-ups).

A *block* is what one process steps:

* ``("serial", name)``: :class:`SerialLoop` over single envs from ``envs.FACTORIES[name]``;
* ``("vector", env_id)``: an in-process batched env,
  ``gymnasium.make_vec(env_id, n, vectorization_mode="vector_entry_point")``.

The processes are started with ``spawn`` (no fork of a threaded parent, same on every
platform) and kept alive between samples, so the ceiling takes part in the harness's
interleaved rounds like any other implementation: every sample tells all processes to run
for ``seconds`` at once and adds up their rates.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import envs as bench_envs  # noqa: E402
from timing import run_for  # noqa: E402

#: Longest wait for a process to build its block (thousands of single envs take seconds).
START_TIMEOUT = 120.0
#: int64 words per lock-step word (one cache line each).
_LINE = 8


class SerialLoop:
    """``n`` envs stepped one after another in this process, next-step autoreset.

    Writes into preallocated batch arrays and returns them (no copies, infos dropped):
    the least Python work a batch step can take.
    """

    def __init__(self, factory: Callable[[], gym.Env], n: int) -> None:
        self.envs = [factory() for _ in range(n)]
        self.num_envs = n
        self.obs = create_empty_array(self.envs[0].observation_space, n, fn=np.zeros)
        self.rewards = np.zeros(n, dtype=np.float64)
        self.terminations = np.zeros(n, dtype=np.bool_)
        self.truncations = np.zeros(n, dtype=np.bool_)
        self.autoreset = [False] * n

    def reset(self, *, seed: int | None = None) -> tuple[Any, dict[str, Any]]:
        for i, env in enumerate(self.envs):
            self.obs[i], _ = env.reset(seed=None if seed is None else seed + i)
        self.autoreset = [False] * self.num_envs
        self.rewards[:] = 0.0
        self.terminations[:] = False
        self.truncations[:] = False
        return self.obs, {}

    def step(self, actions: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, rewards, terms, truncs = self.obs, self.rewards, self.terminations, self.truncations
        autoreset = self.autoreset
        for i, env in enumerate(self.envs):
            if autoreset[i]:
                obs[i], _ = env.reset()
                rewards[i], terms[i], truncs[i] = 0.0, False, False
                autoreset[i] = False
            else:
                o, r, te, tr, _ = env.step(actions[i])
                obs[i] = o
                rewards[i], terms[i], truncs[i] = r, te, tr
                autoreset[i] = te or tr
        return obs, rewards, terms, truncs, {}

    def close(self) -> None:
        for env in self.envs:
            env.close()


def build_block(kind: str, name: str, n: int) -> Any:
    """What one ceiling process steps: a serial loop of ``name`` envs or a vector env."""
    if kind == "serial":
        return SerialLoop(bench_envs.FACTORIES[name], n)
    if kind == "vector":
        return gym.make_vec(name, num_envs=n, vectorization_mode="vector_entry_point")
    raise ValueError(f"unknown block kind {kind!r}; expected 'serial' or 'vector'")


def _child(conn: Connection, kind: str, name: str, seed: int, actions: np.ndarray) -> None:
    """One ceiling process: build the block, then obey ``steps`` / ``run`` / ``close``."""
    block = None
    try:
        block = build_block(kind, name, actions.shape[1])
        block.reset(seed=seed)
        conn.send(("ok", None))
        step, k, m = block.step, 0, len(actions)
        while True:
            cmd, arg = conn.recv()
            if cmd == "close":
                break
            if cmd == "steps":
                for _ in range(arg):
                    step(actions[k % m])
                    k += 1
                conn.send(("ok", None))
            elif cmd == "run":
                result = run_for(step, actions, k, arg)
                k += result["batches"]
                conn.send(("ok", result))
            elif cmd == "lockstep":
                k = _follow(step, actions, *arg)
                conn.send(("ok", None))
    except (EOFError, KeyboardInterrupt):
        pass
    except BaseException:
        try:
            conn.send(("error", traceback.format_exc()))
        except OSError:
            pass
    finally:
        if block is not None:
            block.close()


def _follow(
    step: Callable[[Any], Any], actions: np.ndarray, segment: str, me: int, last: int
) -> int:
    """A lock-step follower: step once per new command word (above ``last``) until ``-1``.

    Waits as envmgr's workers do (spinning, yielding the core every turn); reports each
    finished step in its own done word. Returns where it is in ``actions``.
    """
    shm = SharedMemory(segment)
    try:
        words = np.ndarray((len(shm.buf) // 8,), np.int64, shm.buf)
        while True:
            while words[0] == last:
                os.sched_yield()
            k = int(words[0])
            if k < 0:
                break
            step(actions[k % len(actions)])
            words[me * _LINE] = k
            last = k
        del words
        return last
    finally:
        shm.close()


class Ceiling:
    """``processes`` independent processes stepping ``actions.shape[1]`` envs between them.

    Offers the harness's runner interface (``steps``, ``warm_up``, ``timed``, ``close``),
    so it is timed in the same interleaved rounds as the implementations it bounds.

    Args:
        kind: ``"serial"`` or ``"vector"`` (see :func:`build_block`).
        name: Benchmark env name (serial) or gymnasium id (vector).
        actions: Pre-sampled action batches ``(batches, n_envs, ...)``; process ``p`` walks
            its own columns of them.
        processes: How many processes (envs split as evenly as possible, in order).
        seed: Env ``i`` of the whole set is reset with ``seed + i``, as everywhere else.
    """

    def __init__(
        self, kind: str, name: str, actions: np.ndarray, processes: int, seed: int = 0
    ) -> None:
        n = actions.shape[1]
        if not 1 <= processes <= n:
            raise ValueError(f"ceiling needs 1 <= processes <= n_envs, got {processes} for {n}")
        self.impl = "ceiling"
        self.vec = self  # the harness closes ``runner.vec``
        self.sizes = [n // processes + (1 if p < n % processes else 0) for p in range(processes)]
        ctx = mp.get_context("spawn")
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        start = 0
        try:
            for size in self.sizes:
                mine, theirs = ctx.Pipe()
                share = np.ascontiguousarray(actions[:, start : start + size])
                proc = ctx.Process(
                    target=_child, args=(theirs, kind, name, seed + start, share), daemon=True
                )
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
                start += size
            self._gather(START_TIMEOUT)
        except BaseException:
            self.close()
            raise

    def _gather(self, timeout: float | None = None) -> list[Any]:
        out = []
        for p, conn in enumerate(self.conns):
            if timeout is not None and not conn.poll(timeout):
                raise TimeoutError(f"ceiling process {p} did not answer within {timeout} s")
            status, value = conn.recv()
            if status != "ok":
                raise RuntimeError(f"ceiling process {p} failed:\n{value}")
            out.append(value)
        return out

    def steps(self, count: int) -> None:
        for conn in self.conns:
            conn.send(("steps", count))
        self._gather()

    def warm_up(self, seconds: float) -> int:
        return sum(r["batches"] for r in self.timed(seconds)["per_process"])

    def timed(self, seconds: float) -> dict[str, Any]:
        """All processes step for ``seconds`` at once; the sample is the sum of their rates."""
        c0 = process_time()
        t0 = perf_counter()
        for conn in self.conns:
            conn.send(("run", seconds))
        results = self._gather()
        wall = perf_counter() - t0
        for r, size in zip(results, self.sizes, strict=True):
            r["n_envs"] = size
            r["steps_per_second"] = r["batches"] * size / r["seconds"]
        return {
            "batches": sum(r["batches"] for r in results),
            "seconds": wall,
            "cpu_seconds": process_time() - c0,
            "steps_per_second": sum(r["steps_per_second"] for r in results),
            "per_process": results,
        }

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send(("close", None))
            except OSError:
                pass
        for proc in self.procs:
            proc.join(10)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for conn in self.conns:
            conn.close()
        self.conns, self.procs = [], []


class LockStep:
    """``processes`` processes stepping their blocks in lock-step, with nothing else.

    This process steps the first block itself; each other process steps its block when a
    shared-memory command word changes and reports in its own done word, waiting as
    envmgr's workers do (spinning, yielding the core each turn). No actions,
    observations or answers cross between processes. So this is the most any design
    that steps its batch and then waits for all of it can reach here: the gap from the
    free-running :class:`Ceiling` is the cost of the barrier alone (one process waiting
    for the slower one, every step), the gap from envmgr is envmgr's own hand-off.
    Runner interface as :class:`Ceiling`.
    """

    def __init__(
        self, kind: str, name: str, actions: np.ndarray, processes: int, seed: int = 0
    ) -> None:
        n = actions.shape[1]
        sizes = [n // processes + (1 if p < n % processes else 0) for p in range(processes)]
        self.impl = "lockstep"
        self.vec = self
        self.actions = np.ascontiguousarray(actions[:, : sizes[0]])
        self.block = build_block(kind, name, sizes[0])
        self.block.reset(seed=seed)
        self.k = 0
        self.shm = SharedMemory(create=True, size=8 * _LINE * processes)
        self.words = np.ndarray((_LINE * processes,), np.int64, self.shm.buf)
        self.words[:] = 0
        self._done = self.words[_LINE::_LINE]
        self.rest: Ceiling | None = None
        try:
            if processes > 1:
                rest = actions[:, sizes[0] :]
                self.rest = Ceiling(kind, name, rest, processes - 1, seed + sizes[0])
        except BaseException:
            self.close()
            raise

    def _phase(self, go_on: Callable[[int], bool]) -> int:
        """Lock-step batches while ``go_on(batches so far)``; returns the batches done."""
        rest, words, done, actions = self.rest, self.words, self._done, self.actions
        words[0] = self.k  # (the followers are idle: they start from here)
        if rest is not None:
            for p, conn in enumerate(rest.conns, 1):
                conn.send(("lockstep", (self.shm.name, p, self.k)))
        step, k, m, batches = self.block.step, self.k, len(actions), 0
        try:
            while go_on(batches):
                k += 1
                words[0] = k
                step(actions[k % m])
                while done.min() < k:
                    os.sched_yield()
                batches += 1
        finally:
            self.k = k
            words[0] = -1
            if rest is not None:
                rest._gather()
        return batches

    def steps(self, count: int) -> None:
        self._phase(lambda b: b < count)

    def warm_up(self, seconds: float) -> int:
        return self.timed(seconds)["batches"]

    def timed(self, seconds: float) -> dict[str, Any]:
        c0, t0 = process_time(), perf_counter()
        deadline = t0 + seconds
        batches = self._phase(lambda b: perf_counter() < deadline)
        wall = perf_counter() - t0
        n = self.actions.shape[1] + (sum(self.rest.sizes) if self.rest is not None else 0)
        return {
            "batches": batches,
            "seconds": wall,
            "cpu_seconds": process_time() - c0,
            "steps_per_second": batches * n / wall,
        }

    def close(self) -> None:
        if self.rest is not None:
            self.rest.close()
            self.rest = None
        self.block.close()
        if self.shm is not None:
            del self.words, self._done
            self.shm.close()
            self.shm.unlink()
            self.shm = None
