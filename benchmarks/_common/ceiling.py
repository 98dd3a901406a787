"""The machine's ceiling: independent processes, each stepping its share of the envs at once.

The serial loop is the wrong yardstick for a multi-process manager on small VMs: it says
what one core does, not what the machine does. The ceiling is the most any design built
from processes could reach here: ``P`` processes, each stepping ``n / P`` envs in its own
plain loop at the same time, with no communication at all. envmgr / ceiling is then the
share of the machine envmgr delivers (1.0 = nothing lost to hand-offs or wake-ups).

A *block* is what one process steps:

* ``("serial", name)``: :class:`SerialLoop` over single envs from ``envs.FACTORIES[name]``;
* ``("vector", env_id)``: an in-process batched env,
  ``gymnasium.make_vec(env_id, n, vectorization_mode="vector_entry_point")``, or
  ``envs.VECTOR_FACTORIES[name](n)`` for a name found there.

The processes are started with ``spawn`` (no fork of a threaded parent, same on every
platform) and kept alive between samples, so the ceiling takes part in the harness's
interleaved rounds like any other implementation: every sample tells all processes to run
for ``seconds`` at once and adds up their rates.
"""

from __future__ import annotations

import multiprocessing as mp
import os
from collections.abc import Callable
from functools import partial
from multiprocessing.shared_memory import SharedMemory
from time import perf_counter, process_time
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector.utils import create_empty_array

from benchmarks._common import envs as bench_envs
from benchmarks._common.timing import run_for
from envmgr.tune.ceiling import BlockProcesses

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


def block_maker(kind: str, name: str) -> Callable[[int], Any]:
    """``n -> block``: what one ceiling process steps, a serial loop of ``name`` envs or a
    vector env.

    Resolved in this process: a factory added to ``envs.FACTORIES`` at run time (the real
    envs of ``realenv_peers``) travels with it, by value, to a process that never ran the
    code that added it.
    """
    if kind == "serial":
        return partial(SerialLoop, bench_envs.FACTORIES[name])
    if kind == "vector":
        own = bench_envs.VECTOR_FACTORIES.get(name)
        if own is not None:
            return own
        return partial(gym.make_vec, name, vectorization_mode="vector_entry_point")
    raise ValueError(f"unknown block kind {kind!r}; expected 'serial' or 'vector'")


def build_block(kind: str, name: str, n: int) -> Any:
    """A block of ``n`` envs, built here (see :func:`block_maker`)."""
    return block_maker(kind, name)(n)


class Share:
    """What one ceiling process steps: its block, walking its own columns of the actions.

    Built in the process by :class:`envmgr.tune.ceiling.BlockProcesses`, which calls these
    methods when told; ``k`` is where the block is in ``actions``.
    """

    def __init__(self, make: Callable[[int], Any], seed: int, actions: np.ndarray) -> None:
        self.block = make(actions.shape[1])
        self.block.reset(seed=seed)
        self.actions = actions
        self.k = 0

    def steps(self, count: int) -> None:
        step, actions, m = self.block.step, self.actions, len(self.actions)
        for _ in range(count):
            step(actions[self.k % m])
            self.k += 1

    def run(self, seconds: float) -> dict[str, Any]:
        result = run_for(self.block.step, self.actions, self.k, seconds)
        self.k += result["batches"]
        return result

    def lockstep(self, segment: str, me: int, last: int) -> None:
        self.k = _follow(self.block.step, self.actions, segment, me, last)

    def close(self) -> None:
        self.block.close()


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
        self._start(block_maker(kind, name), actions, processes, seed)

    @classmethod
    def of_blocks(
        cls, make: Callable[[int], Any], actions: np.ndarray, processes: int, seed: int = 0
    ) -> Ceiling:
        """A ceiling over blocks ``make(n)`` builds: anything with ``reset(seed=)``,
        ``step(actions)`` and ``close()`` (a multi-agent loop, say). ``make`` is pickled
        to the processes; process ``p`` gets ``actions[:, its envs]``."""
        ceiling = cls.__new__(cls)
        ceiling._start(make, actions, processes, seed)
        return ceiling

    def _start(
        self, make: Callable[[int], Any], actions: np.ndarray, processes: int, seed: int
    ) -> None:
        n = actions.shape[1]
        if not 1 <= processes <= n:
            raise ValueError(f"ceiling needs 1 <= processes <= n_envs, got {processes} for {n}")
        self.impl = "ceiling"
        self.vec = self  # the harness closes ``runner.vec``
        self.sizes = [n // processes + (1 if p < n % processes else 0) for p in range(processes)]
        starts = np.cumsum([0, *self.sizes])
        self.processes = BlockProcesses(
            mp.get_context("spawn"),
            [
                partial(Share, make, seed + int(a), np.ascontiguousarray(actions[:, a : a + size]))
                for a, size in zip(starts, self.sizes, strict=False)
            ],
            name="ceiling",
        )

    def steps(self, count: int) -> None:
        self.processes.post("steps", count)
        self.processes.gather(None, "step")

    def warm_up(self, seconds: float) -> int:
        return sum(r["batches"] for r in self.timed(seconds)["per_process"])

    def timed(self, seconds: float) -> dict[str, Any]:
        """All processes step for ``seconds`` at once; the sample is the sum of their rates."""
        c0 = process_time()
        t0 = perf_counter()
        self.processes.post("run", seconds)
        results = self.processes.gather(None, "step")
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
        self.processes.close()


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
            for p in range(len(rest.sizes)):
                rest.processes.send(p, "lockstep", self.shm.name, p + 1, self.k)
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
                rest.processes.gather(None, "step in lock-step")
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
