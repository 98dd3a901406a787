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
import sys
import traceback
from collections.abc import Callable
from multiprocessing.connection import Connection
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
