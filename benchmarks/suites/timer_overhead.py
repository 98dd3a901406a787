#!/usr/bin/env python
"""What envmgr's hierarchical timers cost.

Usage (from the repository root)::

    python -m benchmarks.suites.timer_overhead [--calls 200000] [--rounds 7]
                                        [--seconds 1] [--throughput-rounds 10] [--out PATH.json]

1. Per-call cost of ``with envmgr.timers.hierarchical_timer("x"): pass`` -- ``--calls`` calls
   per round, ``--rounds`` rounds, median. Printed raw and net of an empty ``for`` loop of the
   same length (the loop's own cost), with ``@timed`` on an empty function for comparison.
2. envmgr throughput on CartPole-v1, 2 workers x 32 envs per worker (64 envs), with a typical
   training loop's two timers per batch step (``sample_actions`` and ``env_step``) versus the
   same loop without them. One manager, same pre-sampled actions; the two variants alternate
   within each round (which one goes first alternates too); the with/without ratio is taken
   per round and its median reported.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
from pathlib import Path
from time import perf_counter, thread_time

import numpy as np
from gymnasium.vector.utils import batch_space

import envmgr
from benchmarks._common import envs as bench_envs
from envmgr import SubprocessEnvManager, timers

bench_envs.make_picklable()


def empty_loop(n: int) -> tuple[float, float]:
    c0, t0 = thread_time(), perf_counter()
    for _ in range(n):
        pass
    return perf_counter() - t0, thread_time() - c0


def timer_loop(n: int) -> tuple[float, float]:
    hierarchical_timer = timers.hierarchical_timer
    c0, t0 = thread_time(), perf_counter()
    for _ in range(n):
        with hierarchical_timer("x"):
            pass
    return perf_counter() - t0, thread_time() - c0


def plain_call_loop(n: int) -> tuple[float, float]:
    def f() -> None:
        pass

    c0, t0 = thread_time(), perf_counter()
    for _ in range(n):
        f()
    return perf_counter() - t0, thread_time() - c0


def timed_call_loop(n: int) -> float:
    @timers.timed
    def f() -> None:
        pass

    c0, t0 = thread_time(), perf_counter()
    for _ in range(n):
        f()
    return perf_counter() - t0, thread_time() - c0


def per_call_costs(calls: int, rounds: int) -> dict[str, object]:
    """Seconds per call of each loop (wall and thread CPU), loops interleaved within every round.

    The wall-clock median is the headline number. On a busy machine the thread-CPU median
    (time this thread actually ran, so preemption by other processes is left out) and the
    fastest round are steadier; all three are reported.
    """
    loops = {
        "empty_loop": empty_loop,
        "timer": timer_loop,
        "plain_call": plain_call_loop,
        "timed_call": timed_call_loop,
    }
    wall: dict[str, list[float]] = {k: [] for k in loops}
    cpu: dict[str, list[float]] = {k: [] for k in loops}
    timers.reset_timers()
    for fn in loops.values():  # warm-up
        fn(calls // 10)
    for _ in range(rounds):
        for name, fn in loops.items():
            w, c = fn(calls)
            wall[name].append(w / calls * 1e6)
            cpu[name].append(c / calls * 1e6)
        timers.reset_timers()  # keep the tree (and its counts) from growing across rounds
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_cpu = {k: statistics.median(v) for k, v in cpu.items()}
    low = {k: min(v) for k, v in wall.items()}
    return {
        "calls_per_round": calls,
        "rounds": rounds,
        "wall_us_samples": wall,
        "thread_cpu_us_samples": cpu,
        "median_wall_us": med,
        "median_thread_cpu_us": med_cpu,
        "min_wall_us": low,
        "timer_us": med["timer"],
        "timer_net_us": med["timer"] - med["empty_loop"],
        "timer_cpu_us": med_cpu["timer"],
        "timer_min_us": low["timer"],
        "timed_decorator_net_us": med["timed_call"] - med["plain_call"],
    }


def throughput(
    seconds: float, rounds: int, n_workers: int, envs_per_worker: int
) -> dict[str, object]:
    n = n_workers * envs_per_worker
    probe = bench_envs.make_cartpole()
    space = batch_space(probe.action_space, n)
    probe.close()
    space.seed(0)
    actions = np.stack([space.sample() for _ in range(1000)])
    m = len(actions)
    hierarchical_timer = timers.hierarchical_timer
    cursor = 0

    def run(envs: SubprocessEnvManager, with_timers: bool) -> float:
        nonlocal cursor
        k = cursor
        batches = 0
        step = envs.step
        t0 = perf_counter()
        deadline = t0 + seconds
        now = t0
        if with_timers:
            while now < deadline:
                with hierarchical_timer("sample_actions"):
                    a = actions[k % m]
                with hierarchical_timer("env_step"):
                    step(a)
                k += 1
                batches += 1
                now = perf_counter()
        else:
            while now < deadline:
                a = actions[k % m]
                step(a)
                k += 1
                batches += 1
                now = perf_counter()
        cursor = k
        return batches * n / (now - t0)

    samples: dict[str, list[float]] = {"with_timers": [], "without_timers": []}
    ratios: list[float] = []
    timers.reset_timers()
    with SubprocessEnvManager(bench_envs.make_cartpole, n_workers, envs_per_worker) as envs:
        envs.reset(seed=0)
        run_for = seconds
        seconds = 0.3
        run(envs, True)
        run(envs, False)
        seconds = run_for
        for r in range(rounds):
            order = [True, False] if r % 2 == 0 else [False, True]
            got = {}
            for with_timers in order:
                got[with_timers] = run(envs, with_timers)
            samples["with_timers"].append(got[True])
            samples["without_timers"].append(got[False])
            ratios.append(got[True] / got[False])
            timers.reset_timers()
    return {
        "env": "CartPole-v1",
        "n_workers": n_workers,
        "envs_per_worker": envs_per_worker,
        "seconds_per_sample": seconds,
        "rounds": rounds,
        "samples_steps_per_second": samples,
        "ratio_per_round": ratios,
        "median_steps_per_second": {k: statistics.median(v) for k, v in samples.items()},
        "median_ratio_with_over_without": statistics.median(ratios),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Cost of envmgr's hierarchical timers.")
    p.add_argument(
        "--calls", type=int, default=200_000, help="timer calls per round (default: 200000)"
    )
    p.add_argument("--rounds", type=int, default=7, help="rounds of the per-call test (default: 7)")
    p.add_argument(
        "--seconds", type=float, default=1.0, help="seconds per throughput sample (default: 1)"
    )
    p.add_argument(
        "--throughput-rounds", type=int, default=10, help="throughput rounds (default: 10)"
    )
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=32)
    p.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    args = p.parse_args(argv)

    calls = per_call_costs(args.calls, args.rounds)
    print(f"hierarchical_timer per call ({args.calls:,} calls x {args.rounds} rounds, median):")
    print(
        f"  with hierarchical_timer('x'): pass   {calls['timer_us']:.3f} µs wall "
        f"({calls['timer_net_us']:.3f} µs net of the empty loop's "
        f"{calls['median_wall_us']['empty_loop'] * 1e3:.0f} ns/iteration); "
        f"{calls['timer_cpu_us']:.3f} µs thread CPU; fastest round {calls['timer_min_us']:.3f} µs"
    )
    print(
        f"  @timed empty function                 "
        f"{calls['timed_decorator_net_us']:.3f} µs wall more than "
        f"a plain call ({calls['median_wall_us']['plain_call'] * 1e3:.0f} ns)"
    )
    print(
        "  rounds (µs/call, wall): "
        + ", ".join(f"{x:.3f}" for x in calls["wall_us_samples"]["timer"])
    )

    tp = throughput(args.seconds, args.throughput_rounds, args.workers, args.envs_per_worker)
    n = args.workers * args.envs_per_worker
    med = tp["median_steps_per_second"]
    print()
    print(
        f"envmgr CartPole-v1, {args.workers} workers x {args.envs_per_worker} envs ({n} envs), "
        f"{args.throughput_rounds} interleaved rounds x {args.seconds:g} s:"
    )
    print(f"  without timers: {med['without_timers']:,.0f} env-steps/s (median)")
    print(f"  with 2 timers per batch step: {med['with_timers']:,.0f} env-steps/s (median)")
    print(
        f"  ratio with/without: {tp['median_ratio_with_over_without']:.3f} "
        "(median of per-round ratios: " + ", ".join(f"{r:.3f}" for r in tp["ratio_per_round"]) + ")"
    )
    batch_us = 1e6 * n / med["without_timers"]
    print(
        f"  for scale: a batch step takes {batch_us:,.0f} µs; two timers are "
        f"{2 * calls['timer_us']:.2f} µs of it ({2 * calls['timer_us'] / batch_us * 100:.2f}%)"
    )

    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(
                {
                    "per_call": calls,
                    "throughput": tp,
                    "python": sys.version,
                    "platform": platform.platform(),
                    "nproc": os.cpu_count(),
                    "envmgr": envmgr.__version__,
                },
                f,
                indent=1,
            )
        print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
