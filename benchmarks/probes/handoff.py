#!/usr/bin/env python
"""The cost of envmgr's hand-off itself: parent CPU per worker count, and the wake-up floor.

Usage (from the repository root; both also run inside ``throughput.py``)::

    python -m benchmarks.probes.handoff scaling --workers 1,2,4,8,16 --envs-per-worker 4
    python -m benchmarks.probes.handoff floor --workers 1,2

``scaling``: envmgr on the no-op env with 4 envs per worker, for 1, 2, 4, 8 and 16 workers,
all built at once and timed in interleaved rounds. Reported: the parent process's CPU time
per batch step (``time.process_time``, so waiting for the workers does not count), and the
least-squares slope in µs per added worker: the per-worker part of the parent's cost,
which decides the ceiling on machines with many cores.

``floor``: the least a batch round trip can cost with envmgr's wake-up mechanism. A parent
and ``W`` worker processes ping-pong on exactly the pieces envmgr uses
(:mod:`envmgr.backends.local.doorbell`: command and done words in shared memory, the worker spinning
then sleeping on its pipe, the last worker waking the parent through the shared wake-up
pipe) with nothing else: no envs, no actions, no observations. Timed in the same rounds as
envmgr's own one-batch round trip on the no-op env with ``W`` workers x 1 env; envmgr /
floor says how much the rest of a step (checks, copies, the worker's env loop) adds.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np

from benchmarks._common import envs as bench_envs
from benchmarks._common.floor import FloorPingPong
from benchmarks._common.timing import (
    Runner,
    medians,
    per_round_ratios,
    rotated,
    sample_actions,
    timed_sample,
)
from envmgr import SubprocessEnvManager

bench_envs.make_picklable()

# ============================================================================ measurements


def _rounds(
    runners: list[Runner], n_envs: dict[str, int], args: argparse.Namespace, label: str, bar: Any
) -> dict[str, list[dict[str, Any]]]:
    """Time ``runners`` in interleaved rounds; samples by implementation."""
    samples: dict[str, list[dict[str, Any]]] = {r.impl: [] for r in runners}
    for rnd in range(args.repeats):
        for r in rotated(runners, rnd):
            bar.set_description(f"{label}: round {rnd + 1} {r.impl}")
            s = timed_sample(r, n_envs[r.impl], args.seconds, args.pre_sample_steps)
            s["round"] = rnd
            samples[r.impl].append(s)
        bar.update(1)
    return samples


def measure_overhead(
    layouts: list[tuple[int, int]], args: argparse.Namespace, bar: Any
) -> list[dict[str, Any]]:
    """envmgr on the no-op env: wall and parent-CPU µs per batch step, per layout.

    The envs do (almost) nothing, so the wall time per batch step is the manager's own cost:
    the parent's bookkeeping plus the round trip to the workers. The serial loop over the
    same number of no-op envs is timed alongside, as the cost of the envs themselves;
    check_actions=False (and with copy=False) shows what the check and the copy cost.
    """
    from benchmarks._common.ceiling import SerialLoop

    out = []
    for workers, per_worker in layouts:
        n = workers * per_worker
        actions = sample_actions("noop", n, 7)
        variants = {
            "envmgr": {},
            "envmgr-nocheck": {"check_actions": False},
            "envmgr-nocopy-nocheck": {"check_actions": False, "copy": False},
        }
        runners: list[Runner] = []
        try:
            for name, kwargs in variants.items():
                bar.set_description(f"overhead {workers}x{per_worker}: build {name}")
                mgr = SubprocessEnvManager(bench_envs.make_noop, workers, per_worker, **kwargs)
                runners.append(Runner(name, mgr, actions))
                mgr.reset(seed=0)
            runners.append(Runner("serial", SerialLoop(bench_envs.make_noop, n), actions))
            runners[-1].vec.reset(seed=0)
            for r in runners:
                r.warm_up(args.warmup)
            samples = _rounds(
                runners, dict.fromkeys(variants, n) | {"serial": n}, args, "overhead", bar
            )
        finally:
            for r in runners:
                r.vec.close()
        out.append(
            {
                "n_workers": workers,
                "envs_per_worker": per_worker,
                "n_envs": n,
                "samples": samples,
                "median_us_per_batch": medians(samples, "us_per_batch"),
                "median_parent_cpu_us_per_batch": medians(samples, "parent_cpu_us_per_batch"),
            }
        )
    return out


def measure_scaling(
    workers_list: list[int], envs_per_worker: int, args: argparse.Namespace, bar: Any
) -> dict[str, Any]:
    """Parent CPU µs per batch step on the no-op env for each worker count (issue 13 item 4)."""
    runners: list[Runner] = []
    n_envs: dict[str, int] = {}
    try:
        for w in workers_list:
            n = w * envs_per_worker
            bar.set_description(f"scaling: build {w} workers x {envs_per_worker}")
            mgr = SubprocessEnvManager(bench_envs.make_noop, w, envs_per_worker)
            r = Runner(f"{w}", mgr, sample_actions("noop", n, 7))
            runners.append(r)
            mgr.reset(seed=0)
            r.warm_up(args.warmup)
            n_envs[r.impl] = n
        samples = _rounds(runners, n_envs, args, "scaling", bar)
    finally:
        for r in runners:
            r.vec.close()
    cpu = medians(samples, "parent_cpu_us_per_batch")
    xs = np.array(workers_list, dtype=float)
    ys = np.array([cpu[str(w)] for w in workers_list])
    slope = float(np.polyfit(xs, ys, 1)[0]) if len(xs) > 1 else float("nan")
    return {
        "env": "noop",
        "envs_per_worker": envs_per_worker,
        "workers": workers_list,
        "samples": samples,
        "median_parent_cpu_us_per_batch": cpu,
        "median_us_per_batch": medians(samples, "us_per_batch"),
        "slope_parent_cpu_us_per_worker": slope,
    }


def measure_floor(workers_list: list[int], args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """The wake-up floor against envmgr's one-batch no-op round trip (issue 13 item 5)."""
    out: dict[str, Any] = {"layouts": []}
    for w in workers_list:
        runners: list[Runner] = []
        entry: dict[str, Any] = {"n_workers": w, "envs_per_worker": 1}
        try:
            mgr = SubprocessEnvManager(bench_envs.make_noop, w, 1)
            actions = sample_actions("noop", w, 7)
            runners.append(Runner("envmgr", mgr, actions))
            mgr.reset(seed=0)
            spin = getattr(mgr, "spin_seconds", 1e-3)  # envmgr's default where not exposed
            parent_spin = getattr(mgr, "parent_spin_seconds", 0.0)
            entry["spin_seconds"], entry["parent_spin_seconds"] = spin, parent_spin
            try:
                floor = FloorPingPong(w, spin, parent_spin)
            except Exception as exc:  # the signalling API moved: say so, keep the rest
                entry["error"] = f"floor unavailable: {type(exc).__name__}: {exc}"
            else:
                runners.append(Runner("floor", floor, actions))
            for r in runners:
                r.warm_up(args.warmup)
            samples = _rounds(runners, {"envmgr": w, "floor": w}, args, f"floor {w}x1", bar)
        finally:
            for r in runners:
                r.vec.close()
        entry["samples"] = samples
        entry["median_us_per_batch"] = medians(samples, "us_per_batch")
        entry["median_parent_cpu_us_per_batch"] = medians(samples, "parent_cpu_us_per_batch")
        entry["ratio_envmgr_over_floor"] = per_round_ratios(
            samples, "envmgr", "floor", key="us_per_batch"
        )
        out["layouts"].append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["scaling", "floor"])
    p.add_argument(
        "--workers", default=None, help="worker counts (scaling: 1,2,4,8,16; floor: 1,2)"
    )
    p.add_argument("--envs-per-worker", type=int, default=4, help="scaling only (default: 4)")
    p.add_argument("--seconds", type=float, default=1.0, help="per sample (default: 1)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default: 5)")
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--pre-sample-steps", type=int, default=10)
    args = p.parse_args(argv)
    from tqdm import tqdm

    from benchmarks.report.text import floor_text, scaling_text

    default = "1,2,4,8,16" if args.what == "scaling" else "1,2"
    workers = [int(x) for x in (args.workers or default).split(",") if x.strip()]
    rounds = args.repeats * (1 if args.what == "scaling" else len(workers))
    with tqdm(total=rounds, file=sys.stderr) as bar:
        if args.what == "scaling":
            text = scaling_text(measure_scaling(workers, args.envs_per_worker, args, bar))
        else:
            text = floor_text(measure_floor(workers, args, bar))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
