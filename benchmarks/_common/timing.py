"""Timing pieces shared by the benchmark scripts: action batches, runners, interleaved rounds.

Every measurement here follows one rule: implementations that are compared are built
side by side and timed in *interleaved* rounds (each round times every one of them once,
in an order that rotates), so a burst of load on the shared machine lands on all of them
alike; the reported figure is a median over rounds, and ratios are taken within a round.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable, Sequence
from time import perf_counter, process_time
from typing import Any

import numpy as np
from gymnasium.vector.utils import batch_space

from benchmarks._common import envs as bench_envs
from benchmarks._common.worker_traffic import io_bytes
from envmgr.tune.ceiling import run_for as ceiling_run_for

#: Action batches drawn per configuration (walked cyclically) ...
N_ACTION_BATCHES = 1000
#: ... but no more than this many action values in all (16,384 envs x 1000 would be 130 MB).
MAX_ACTION_VALUES = 4_000_000


def median(xs: Sequence[float]) -> float:
    """The median, or NaN for no samples."""
    return float(statistics.median(xs)) if xs else float("nan")


def spread(xs: Sequence[float]) -> dict[str, float]:
    """``median``, ``min`` and ``max`` of ``xs`` (NaN each for no samples)."""
    if not xs:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan")}
    return {"median": median(xs), "min": float(min(xs)), "max": float(max(xs))}


def sample_actions(env: str, n: int, seed: int) -> np.ndarray:
    """Action batches for ``n`` copies of benchmark env ``env``, drawn once per configuration."""
    probe = bench_envs.FACTORIES[env]()
    space = batch_space(probe.action_space, n)
    probe.close()
    space.seed(seed)
    count = max(16, min(N_ACTION_BATCHES, MAX_ACTION_VALUES // max(n, 1)))
    return np.stack([space.sample() for _ in range(count)])


def run_for(step: Callable[[Any], Any], actions: np.ndarray, k: int, seconds: float) -> dict:
    """Call ``step`` on action batches ``k, k+1, ...`` (cyclically) for ``seconds``: the
    tuner's timed loop (:func:`envmgr.tune.ceiling.run_for`), with this process's CPU.

    Returns:
        ``batches``, wall ``seconds`` and this process's ``cpu_seconds``.
    """
    c0 = process_time()
    batches, elapsed = ceiling_run_for(step, actions, k, seconds)
    return {"batches": batches, "seconds": elapsed, "cpu_seconds": process_time() - c0}


def warm_then_time(
    step: Callable[[Any], Any],
    actions: np.ndarray,
    warmup: float,
    seconds: float,
    pids: Sequence[int] = (),
) -> dict[str, Any]:
    """``step`` over action batches ``0, 1, ...`` for ``warmup`` seconds (5 batches at
    least), then timed for ``seconds`` (:func:`run_for`).

    Returns:
        :func:`run_for`'s keys; ``next``, the action batch after the last one stepped; and
        ``written_bytes_per_batch``, what the processes ``pids`` wrote per timed batch.
    """
    deadline = perf_counter() + warmup
    k = 0
    while k < 5 or perf_counter() < deadline:
        step(actions[k % len(actions)])
        k += 1
    written0 = io_bytes(pids)[1]
    timed = run_for(step, actions, k, seconds)
    written = io_bytes(pids)[1] - written0
    return timed | {
        "next": k + timed["batches"],
        "written_bytes_per_batch": written / timed["batches"],
    }


class Runner:
    """One built implementation (anything with ``step(actions)``) and its place in the actions."""

    def __init__(self, impl: str, vec: Any, actions: np.ndarray) -> None:
        self.impl = impl
        self.vec = vec
        self.actions = actions
        self.cursor = 0

    def steps(self, count: int) -> None:
        actions, k, step = self.actions, self.cursor, self.vec.step
        m = len(actions)
        for _ in range(count):
            step(actions[k % m])
            k += 1
        self.cursor = k

    def warm_up(self, seconds: float) -> int:
        deadline = perf_counter() + seconds
        done = 0
        while perf_counter() < deadline or done < 20:
            self.steps(5)
            done += 5
        return done

    def timed(self, seconds: float) -> dict[str, Any]:
        """Step for ``seconds``; returns batch steps, wall and parent CPU seconds."""
        s = run_for(self.vec.step, self.actions, self.cursor, seconds)
        self.cursor += s["batches"]
        return s


def rotated(items: list[Any], r: int) -> list[Any]:
    """``items`` starting at position ``r`` (mod len): round ``r``'s order."""
    if not items:
        return []
    r %= len(items)
    return items[r:] + items[:r]


def timed_sample(runner: Any, n_envs: int, seconds: float, pre_steps: int) -> dict[str, Any]:
    """One timed sample of ``runner`` with the derived rates filled in.

    ``pre_steps`` untimed batch steps come first: they wake workers that slept while the
    other implementations were timed.
    """
    runner.steps(pre_steps)
    s = runner.timed(seconds)
    s.setdefault("steps_per_second", s["batches"] * n_envs / s["seconds"])
    s["us_per_batch"] = s["seconds"] / s["batches"] * 1e6
    s["parent_cpu_us_per_batch"] = s["cpu_seconds"] / s["batches"] * 1e6
    s["loadavg_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return s


def per_round_ratios(
    samples: dict[str, list[dict[str, Any]]], mine: str, peer: str, key: str = "steps_per_second"
) -> dict[str, Any] | None:
    """``mine / peer`` of ``key`` within each round both have, and the median of those."""
    if mine not in samples or peer not in samples:
        return None
    a = {s["round"]: s[key] for s in samples[mine]}
    b = {s["round"]: s[key] for s in samples[peer]}
    per_round = [a[r] / b[r] for r in sorted(set(a) & set(b)) if b[r]]
    return {"per_round": per_round, "median": median(per_round)}


def medians(samples: dict[str, list[dict[str, Any]]], key: str) -> dict[str, float]:
    """Median of ``key`` per implementation."""
    return {impl: median([s[key] for s in ss]) for impl, ss in samples.items()}
