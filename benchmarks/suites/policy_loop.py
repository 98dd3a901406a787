#!/usr/bin/env python
"""A training loop's view: CartPole with a small numpy MLP policy choosing every action.

Usage (from the repository root)::

    python -m benchmarks.suites.policy_loop                  # 64 envs, 5 rounds x 2 s (~3 min)
    python -m benchmarks.suites.policy_loop --quick          # smoke run (~5 s)
    python -m benchmarks.suites.policy_loop --caller-envs 16 --out mine/

Results (``policy_loop.json`` and ``.txt``; ``policy_loop_quick.*`` with ``--quick``, which git
ignores) go to ``benchmarks/results/record/``, wherever it is run from, unless
``--out`` names another directory.

Throughput tables time the envs alone; in training, the policy runs between steps, and
while it runs the workers wait (sync) or step (pool mode). Each loop here is
``obs -> policy(obs) -> step(actions) -> obs`` on CartPole-v1, 64 envs:

* ``serial``: the 64 envs stepped one after another in this process (``ceiling.SerialLoop``);
* ``sync``: ``SubprocessEnvManager`` 2 workers x 32, ``step`` on the whole batch;
* ``pool``: the same layout in first-ready mode: ``recv`` one worker's 32 envs, run the
  policy on them, ``send`` their actions back, so one worker steps while the policy runs;
* ``caller``: ``workers - 1`` worker processes and the parent stepping ``--caller-envs``
  envs itself (default ``n_envs // workers``) between handing off and collecting
  (``caller_envs=``): two processes on two cores, as in the ceiling.

Two policies: ``mlp`` (4-64-64-2, tanh, argmax: a few tens of µs) and ``mlp-heavy``
(4-320-320-2: about 200 µs per 64-row batch on the 2-core reference machine; the run prints what
each costs here). BLAS runs single-threaded (set before numpy loads): on two cores, BLAS
threads spinning between calls take the workers' CPU.

All loops are timed in interleaved rounds; reported: the median env-steps/s of each loop,
and per-round ratios to serial with the same policy, and pool / sync.
"""

from __future__ import annotations

import os

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import argparse
import json
import sys
import time
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from benchmarks._common import envs as bench_envs
from benchmarks._common.ceiling import SerialLoop
from benchmarks._common.paths import RECORD
from benchmarks._common.run_context import machine_info
from benchmarks._common.timing import (
    Runner,
    median,
    medians,
    per_round_ratios,
    rotated,
    timed_sample,
)
from benchmarks.report.text import fmt_rate, fmt_ratio
from envmgr import SubprocessEnvManager

bench_envs.make_picklable()

#: Hidden layer widths of the two policies.
POLICIES = {"mlp": (64, 64), "mlp-heavy": (320, 320)}
MODES = ["serial", "sync", "pool", "caller"]


class MLPPolicy:
    """A fixed random tanh MLP: observations (rows, 4) -> greedy actions (rows,)."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...], n_actions: int, seed: int) -> None:
        rng = np.random.default_rng(seed)
        sizes = [obs_dim, *hidden, n_actions]
        self.layers = [
            (
                (rng.standard_normal((a, b)) / np.sqrt(a)).astype(np.float32),
                np.zeros(b, dtype=np.float32),
            )
            for a, b in zip(sizes[:-1], sizes[1:], strict=True)
        ]

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32)
        last = len(self.layers) - 1
        for i, (w, b) in enumerate(self.layers):
            x = x @ w + b
            if i < last:
                np.tanh(x, out=x)
        return x.argmax(axis=1)

    def cost_us(self, rows: int, calls: int = 300) -> float:
        """Median µs per call on ``rows`` random observations, here and now."""
        obs = np.random.default_rng(1).standard_normal((rows, 4)).astype(np.float32)
        times = []
        for _ in range(5):
            t0 = perf_counter()
            for _ in range(calls):
                self(obs)
            times.append((perf_counter() - t0) / calls * 1e6)
        return median(times)


class BatchLoop:
    """Serial, sync or caller mode: one ``step`` is policy + one batch step of all envs."""

    def __init__(self, vec: Any, policy: MLPPolicy) -> None:
        self.vec, self.policy = vec, policy
        self.obs = vec.reset(seed=0)[0]
        self.envs_per_call = vec.num_envs

    def step(self, _: Any = None) -> None:
        self.obs = self.vec.step(self.policy(self.obs))[0]


class PoolLoop:
    """First-ready mode: one ``step`` is recv one worker, policy on its envs, send back."""

    def __init__(self, mgr: SubprocessEnvManager, policy: MLPPolicy) -> None:
        self.vec, self.policy = mgr, policy
        self.per_worker = mgr.num_envs // mgr.n_workers
        self.envs_per_call = self.per_worker
        obs = mgr.reset(seed=0)[0]
        mgr.send(policy(obs))

    def step(self, _: Any = None) -> None:
        obs, *_rest, ids = self.vec.recv(batch_size=self.per_worker)
        self.vec.send(self.policy(obs), ids)


def build_caller(n: int, workers: int, k: int) -> SubprocessEnvManager:
    """The caller steps ``k`` of the ``n`` envs itself, ``workers - 1`` processes the rest:
    as many processes as the ceiling, the policy on the caller's core between steps."""
    return SubprocessEnvManager(
        bench_envs.make_cartpole, num_envs=n, n_workers=max(1, workers - 1), caller_envs=k
    )


def build_loops(args: argparse.Namespace) -> tuple[list[Runner], dict]:
    """Every (mode, policy) loop; the managers are shared by the policies of one mode."""
    n, w = args.n_envs, args.workers
    policies = {name: MLPPolicy(4, hidden, 2, seed=0) for name, hidden in POLICIES.items()}
    runners: list[Runner] = []
    skipped: dict[str, str] = {}
    dummy = np.zeros((1, 1), dtype=np.int64)  # the loops choose their own actions
    for mode in MODES:
        for pname, policy in policies.items():
            try:
                if mode == "serial":
                    loop: Any = BatchLoop(SerialLoop(bench_envs.make_cartpole, n), policy)
                elif mode == "sync":
                    loop = BatchLoop(
                        SubprocessEnvManager(bench_envs.make_cartpole, w, n // w), policy
                    )
                elif mode == "pool":
                    loop = PoolLoop(
                        SubprocessEnvManager(bench_envs.make_cartpole, w, n // w), policy
                    )
                else:
                    k = args.caller_envs if args.caller_envs is not None else n // w
                    loop = BatchLoop(build_caller(n, w, k), policy)
            except Exception as exc:
                skipped[f"{mode}/{pname}"] = f"{type(exc).__name__}: {exc}"
                continue
            runners.append(Runner(f"{mode}/{pname}", loop, dummy))
    return runners, skipped


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The run's options; ``--quick`` sets its short timings."""
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--n-envs", type=int, default=64, help="envs (default: 64)")
    p.add_argument("--workers", type=int, default=2, help="envmgr workers (default: 2)")
    p.add_argument(
        "--caller-envs",
        type=int,
        default=None,
        help="caller mode's K (default: one block of the ceiling's, n_envs // workers)",
    )
    p.add_argument("--seconds", type=float, default=2.0, help="per sample (default: 2)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default: 5)")
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--pre-sample-steps", type=int, default=10)
    p.add_argument(
        "--out",
        type=Path,
        default=RECORD,
        help="output directory (default: benchmarks/results beside this script)",
    )
    p.add_argument("--quick", action="store_true", help="2 rounds x 0.1 s (a smoke run)")
    args = p.parse_args(argv)
    if args.n_envs % args.workers or args.n_envs < 1:
        p.error(f"--n-envs {args.n_envs} must be a positive multiple of --workers {args.workers}")
    if args.quick:
        args.seconds, args.repeats, args.warmup = 0.1, 2, 0.05
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    runners, skipped = build_loops(args)
    policies = {name: MLPPolicy(4, hidden, 2, seed=0) for name, hidden in POLICIES.items()}
    cost = {
        name: {rows: pol.cost_us(rows) for rows in (args.n_envs, args.n_envs // args.workers)}
        for name, pol in policies.items()
    }
    samples: dict[str, list[dict[str, Any]]] = {r.impl: [] for r in runners}
    t_start = perf_counter()
    try:
        for r in runners:
            r.warm_up(args.warmup)
        for rnd in range(args.repeats):
            for r in rotated(runners, rnd):
                s = timed_sample(r, r.vec.envs_per_call, args.seconds, args.pre_sample_steps)
                s["round"] = rnd
                samples[r.impl].append(s)
            print(f"round {rnd + 1}/{args.repeats} done", file=sys.stderr)
    finally:
        for r in runners:
            r.vec.vec.close()
    rates = medians(samples, "steps_per_second")
    ratios: dict[str, Any] = {}
    for name in samples:
        mode, pname = name.split("/")
        ratios[f"{name} / serial"] = per_round_ratios(samples, name, f"serial/{pname}")
        if mode == "pool":
            ratios[f"{name} / sync"] = per_round_ratios(samples, name, f"sync/{pname}")
    report = {
        "benchmark": "envmgr policy loop",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(
            [f"python -m {__spec__.name}", *(sys.argv[1:] if argv is None else argv)]
        ),
        "machine": machine_info("not used"),
        "config": {k: v for k, v in vars(args).items() if k != "out"},
        "policy_cost_us": cost,
        "skipped": skipped,
        "samples": samples,
        "median_steps_per_second": rates,
        "ratios": ratios,
        "wall_seconds": perf_counter() - t_start,
    }
    text = table(report, args)
    out_dir = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "policy_loop_quick" if args.quick else "policy_loop"
    (out_dir / f"{stem}.json").write_text(json.dumps(report, indent=1, default=str))
    (out_dir / f"{stem}.txt").write_text(text)
    print(text)
    print(f"wrote {os.path.relpath(out_dir / stem)}.json and .txt")
    return 0


def table(report: dict[str, Any], args: argparse.Namespace) -> str:
    """The printed result as Markdown."""
    n, w = args.n_envs, args.workers
    lines = [
        f"## Policy loop: CartPole-v1, {n} envs, envmgr {w} workers x {n // w} "
        f"(median of {args.repeats} interleaved rounds x {args.seconds:g} s; "
        "ratios: median of per-round ratios)",
        "",
        "| loop | policy | env-steps/s | / serial | pool / sync |",
        "|---|---|---:|---:|---:|",
    ]
    rates, ratios = report["median_steps_per_second"], report["ratios"]
    for name in rates:
        mode, pname = name.split("/")
        vs_serial = (ratios.get(f"{name} / serial") or {}).get("median")
        vs_sync = (ratios.get(f"{name} / sync") or {}).get("median")
        lines.append(
            f"| {mode} | {pname} | {fmt_rate(rates[name])} | {fmt_ratio(vs_serial)} "
            f"| {fmt_ratio(vs_sync) if mode == 'pool' else ''} |"
        )
    lines.append("")
    for pname in POLICIES:  # issue 13's target: the best envmgr loop >= 1.3x serial
        best = [
            ((ratios.get(f"{mode}/{pname} / serial") or {}).get("median"), mode)
            for mode in MODES[1:]
            if f"{mode}/{pname}" in rates
        ]
        best = [(r, m) for r, m in best if r is not None]
        if best:
            r, m = max(best)
            verdict = "met" if r >= 1.3 else "not met"
            lines.append(
                f"target, {pname}: best envmgr loop {m} {r:.2f}x serial (>= 1.3x: {verdict})"
            )
    for pname, by_rows in report["policy_cost_us"].items():
        costs = ", ".join(f"{us:,.0f} µs on {rows} rows" for rows, us in by_rows.items())
        lines.append(f"policy {pname} {POLICIES[pname]}: {costs}")
    for what, why in report["skipped"].items():
        lines.append(f"skipped {what}: {why}")
    lines.append(f"command: {report['command']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
