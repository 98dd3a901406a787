#!/usr/bin/env python
"""Side-by-side throughput of envmgr and its peers, in one process run.

Usage (from the repository root; ``envmgr bench`` runs this script with the same options)::

    python -m benchmarks.suites.throughput          # the full default run (2 cores: ~15 min)
    python -m benchmarks.suites.throughput --quick  # a tiny smoke run (< 1 min)
    python -m benchmarks.suites.throughput --envs noop,cartpole --n-envs 8,64 --seconds 1 --out x/

For every (env, n_envs) configuration, all implementations are built side by side:

* ``serial``  -- a plain Python loop over ``n_envs`` envs in this process, with
  next-step autoreset like gymnasium's, writing into preallocated batch arrays
  (no info merging, no copies: the floor of pure-Python overhead, and one core's worth);
* ``ceiling`` -- ``W`` independent processes, each running that serial loop over its
  ``n_envs / W`` envs at the same time, with no communication: the machine's ceiling
  for this work (see ``ceiling.py``);
* ``sync``    -- ``gymnasium.vector.SyncVectorEnv``;
* ``async``   -- ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)``, one process per env;
* ``envmgr``  -- ``envmgr.SubprocessEnvManager(n_workers=W, envs_per_worker=n_envs // W)``;
* ``envmgr-nocopy`` -- the same with ``copy=False`` (by default only for the image env,
  where observations are large enough for the copy to matter);
* ``envmgr-firstready`` -- a manager of the same layout stepped through ``send``/``recv``,
  one worker's envs per ``recv``, whichever worker finishes first;
* ``envpool`` -- ``envpool.make("CartPole-v1", env_type="gymnasium", num_threads=W)``,
  CartPole only, when envpool imports.

The ``cartpole-vector`` env is the batched case (``vector_case.py``): Gymnasium's
``CartPoleVectorEnv`` in-process, its two-process ceiling, the same two processes in
lock-step (a bare barrier per step), envmgr hosting one vector env per worker (and with
the caller hosting one of the blocks), envmgr with single envs, and EnvPool, at 256 to
16,384 envs.

Every implementation is fed the same pre-sampled action batches (reused cyclically, each
implementation walking the same sequence), is reset with the same seed, and is warmed up
before timing. Timed samples are interleaved: each round times every implementation once
(starting with a different one each round), so machine noise hits all of them alike.
Reported per implementation: the median env-steps/s over rounds. Ratios envmgr/peer are
taken within each round, then the median over rounds is reported.

Also measured (``handoff.py``, ``run_context.py``): envmgr's cost per batch step on the
no-op env, its parent CPU per batch step over 1-16 workers, its one-batch round trip
against the wake-up floor, and its set-up time under each start method.

Results go to a JSON file (every raw sample plus machine info), a PNG plot and a text file
holding the printed tables, in the current directory unless ``--out`` says otherwise.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shlex
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import envmgr
from benchmarks._common import envs as bench_envs
from benchmarks._common import peers, run_context, vector_case
from benchmarks._common.timing import (
    Runner,
    medians,
    per_round_ratios,
    rotated,
    sample_actions,
    timed_sample,
)
from benchmarks.probes import handoff
from benchmarks.report import text as bench_report
from envmgr.cli.common import Parser

bench_envs.make_picklable()

ALL_ENVS = ["noop", "cartpole", "compute", "image", "straggler", "cartpole-vector"]


def run_config(
    env: str, n: int, args: argparse.Namespace, status: dict[str, tuple[bool, str]], bar: Any
) -> dict[str, Any]:
    """Build every implementation for (env, n), then time them in interleaved rounds."""
    result: dict[str, Any] = {"env": env, "n_envs": n, "skipped": {}, "errors": {}, "samples": {}}
    actions_seed = 1000 + n
    actions = sample_actions(peers.base_env(env), n, actions_seed)
    result["actions_seed"] = actions_seed
    runners: list[Any] = []
    for impl in peers.wanted(env, args.impls, args.nocopy_envs):
        reason = peers.skip_reason(impl, env, n, args.workers, status["envpool"][0])
        if reason is not None:
            result["skipped"][impl] = reason
            continue
        bar.set_description(f"{env} n={n}: build {impl}")
        vec = None
        try:
            t0 = perf_counter()
            vec = peers.build(impl, env, n, args.workers, actions)
            # The ceiling and lock-step runs reset their own envs and are their own runners.
            own = impl in ("ceiling", "lockstep")
            runner = vec if own else Runner(impl, vec, actions)
            if not own:
                vec.reset(seed=0)
            runner.warm_up(args.warmup)
            result.setdefault("build_seconds", {})[impl] = perf_counter() - t0
            runners.append(runner)
        except Exception as exc:
            result["errors"][impl] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc(file=sys.stderr)
            if vec is not None:
                vec.close()
        bar.update(1)
    try:
        for r in range(args.repeats):
            # Rotate the order every round: no implementation always goes first.
            for runner in rotated(runners, r):
                bar.set_description(f"{env} n={n}: round {r + 1}/{args.repeats} {runner.impl}")
                if runner.impl in result["errors"]:
                    bar.update(1)
                    continue
                try:
                    s = timed_sample(runner, n, args.seconds, args.pre_sample_steps)
                except Exception as exc:  # keep the other implementations' numbers
                    result["errors"][runner.impl] = f"round {r}: {type(exc).__name__}: {exc}"
                    traceback.print_exc(file=sys.stderr)
                    bar.update(1)
                    continue
                s["round"] = r
                result["samples"].setdefault(runner.impl, []).append(s)
                bar.update(1)
    finally:
        for runner in runners:
            try:
                runner.vec.close()
            except Exception:
                traceback.print_exc(file=sys.stderr)
        runners.clear()
        gc.collect()
    summarize(result)
    return result


def summarize(result: dict[str, Any]) -> None:
    """Medians per implementation; per-round ratios envmgr/peer and their median."""
    samples = result["samples"]
    result["median_steps_per_second"] = medians(samples, "steps_per_second")
    result["median_us_per_batch"] = medians(samples, "us_per_batch")
    result["median_parent_cpu_us_per_batch"] = medians(samples, "parent_cpu_us_per_batch")
    ratios: dict[str, dict[str, Any]] = {}
    # ceiling/serial (ceiling/vector in the batched case): what the extra cores deliver.
    pairs = [(mine, peer) for mine in peers.MINE for peer in peers.PEERS]
    pairs += [("ceiling", "serial"), ("ceiling", "vector"), ("lockstep", "ceiling")]
    for mine, peer in pairs:
        ratio = per_round_ratios(samples, mine, peer)
        if ratio is not None:
            ratios[f"{mine}/{peer}"] = ratio
    result["ratios"] = ratios


# ============================================================================ main


def parse_list(s: str, kind: Callable[[str], Any] = str) -> list[Any]:
    return [kind(x.strip()) for x in s.split(",") if x.strip()]


#: What ``--quick`` changes, unless the option is given explicitly.
QUICK = {
    "envs": "noop,cartpole,image,cartpole-vector",
    "impls": "serial,ceiling,sync,async,envmgr,envpool",
    "n_envs": "8",
    "vector_n_envs": "256",
    "seconds": 0.4,
    "repeats": 2,
    "warmup": 0.1,
    "setup_repeats": 1,
    "overhead_layouts": "2x32",
    "scaling_workers": "1,2,4",
    "floor_workers": "1",
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    # envmgr's parser: a usage error is one line on stderr, as `envmgr bench` promises.
    p = Parser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--envs", default=",".join(ALL_ENVS), help="benchmark envs (default: %(default)s)"
    )
    p.add_argument(
        "--n-envs",
        default="8,16,64",
        help="numbers of envs (default: %(default)s: every issue target is at 16 or 64)",
    )
    p.add_argument(
        "--vector-n-envs",
        default="256,2048,16384",
        help="numbers of envs for cartpole-vector (default: %(default)s)",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=2,
        help="envmgr workers, ceiling processes, envpool threads (default: 2)",
    )
    p.add_argument(
        "--seconds", type=float, default=2.0, help="seconds per timed sample (default: 2)"
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument(
        "--impls",
        default=",".join(peers.DEFAULT_IMPLS),
        help=f"implementations, from {','.join(peers.ALL_IMPLS)} (default: %(default)s; "
        "cartpole-vector always adds vector, lockstep and the envmgr-hosted variants)",
    )
    p.add_argument(
        "--nocopy-envs",
        default="image",
        help="envs on which envmgr copy=False is also timed (default: %(default)s; '' for none)",
    )
    p.add_argument(
        "--warmup", type=float, default=0.3, help="warm-up seconds after building (default: 0.3)"
    )
    p.add_argument(
        "--pre-sample-steps",
        type=int,
        default=10,
        help="untimed batch steps before every sample (default: 10)",
    )
    p.add_argument(
        "--setup-repeats", type=int, default=3, help="set-up samples per start method (default: 3)"
    )
    p.add_argument("--setup-envs-per-worker", type=int, default=16, help="(default: 16)")
    p.add_argument(
        "--overhead-layouts",
        default="2x32,2x64",
        help="WORKERSxENVS_PER_WORKER layouts for the no-op overhead run (default: %(default)s)",
    )
    p.add_argument(
        "--scaling-workers",
        default="1,2,4,8,16",
        help="worker counts for the parent-CPU series (default: %(default)s)",
    )
    p.add_argument(
        "--scaling-envs-per-worker",
        type=int,
        default=4,
        help="no-op envs per worker in that series (default: 4)",
    )
    p.add_argument(
        "--floor-workers",
        default="1,2",
        help="worker counts for the round trip against the wake-up floor (default: %(default)s)",
    )
    p.add_argument(
        "--skip-extras",
        action="store_true",
        help="skip the overhead, scaling, floor and set-up measurements",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="output directory (default: the current directory), or a .json file path; "
        "writes throughput.json, .png and .txt (quick.* with --quick)",
    )
    p.add_argument(
        "--plot", type=Path, default=None, help="PNG output (default: the JSON path with .png)"
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny configuration, < 1 minute")
    # How the program names itself in usage and errors (`envmgr bench` passes its own name).
    p.add_argument("--prog", default=None, help=argparse.SUPPRESS)
    raw = list(sys.argv[1:] if argv is None else argv)
    for k, a in enumerate(raw):
        if a == "--prog" and k + 1 < len(raw):
            p.prog = raw[k + 1]
        elif a.startswith("--prog="):
            p.prog = a.split("=", 1)[1]
    args = p.parse_args(raw)
    args.argv = raw
    if args.quick:
        given = {a.split("=")[0] for a in raw}
        for name, value in QUICK.items():
            if "--" + name.replace("_", "-") not in given:
                setattr(args, name, value)
    args.envs = parse_list(args.envs)
    args.n_envs = parse_list(args.n_envs, int)
    args.vector_n_envs = parse_list(args.vector_n_envs, int)
    args.impls = parse_list(args.impls)
    args.nocopy_envs = parse_list(args.nocopy_envs)
    args.scaling_workers = parse_list(args.scaling_workers, int)
    args.floor_workers = parse_list(args.floor_workers, int)
    try:
        args.overhead_layouts = [
            tuple(int(v) for v in s.split("x")) for s in parse_list(args.overhead_layouts)
        ]
    except ValueError:
        p.error(f"--overhead-layouts: expected WORKERSxENVS like 2x32, got {args.overhead_layouts}")
    for e in args.envs:
        if e not in ALL_ENVS:
            p.error(f"unknown env {e!r}; choose from {','.join(ALL_ENVS)}")
    for i in args.impls:
        if i not in peers.ALL_IMPLS:
            p.error(f"unknown implementation {i!r}; choose from {','.join(peers.ALL_IMPLS)}")
    counts = [*args.n_envs, *args.vector_n_envs, *args.scaling_workers, *args.floor_workers]
    if args.workers < 1 or any(c < 1 for c in counts) or args.scaling_envs_per_worker < 1:
        p.error("--workers and every count of envs or workers must be positive")
    if args.seconds <= 0 or args.repeats < 1:
        p.error("--seconds must be > 0 and --repeats >= 1")
    stem = "quick" if args.quick else "throughput"
    out = Path.cwd() if args.out is None else args.out
    args.out = out if out.suffix == ".json" else out / f"{stem}.json"
    if args.plot is None:
        args.plot = args.out.with_suffix(".png")
    return args


def typed_command(args: argparse.Namespace) -> str:
    """The command as the user typed it: ``envmgr bench``'s own ``--prog`` is left out."""
    shown: list[str] = []
    skip = False
    for a in args.argv:
        if skip:
            skip = False
        elif a == "--prog":
            skip = True
        elif not a.startswith("--prog="):
            shown.append(a)
    return " ".join([args.prog or f"python -m {__spec__.name}", shlex.join(shown)]).rstrip()


def todo(args: argparse.Namespace) -> list[tuple[str, int]]:
    """Every (env, n_envs) configuration of the run, in order."""
    return [
        (e, n)
        for e in args.envs
        for n in (args.vector_n_envs if e in vector_case.VECTOR_ENVS else args.n_envs)
    ]


def progress_total(args: argparse.Namespace, status: dict[str, tuple[bool, str]]) -> int:
    """Units of work for the progress bar: builds, samples and extras."""
    units = 1
    for e, n in todo(args):
        for impl in peers.wanted(e, args.impls, args.nocopy_envs):
            reason = peers.skip_reason(impl, e, n, args.workers, status["envpool"][0])
            units += 0 if reason else 1 + args.repeats
    if not args.skip_extras:
        units += args.setup_repeats * len(run_context.START_METHODS)
        units += args.repeats * (len(args.overhead_layouts) + 1 + len(args.floor_workers))
    return units


def extra(report: dict[str, Any], key: str, measure: Callable[..., Any], *args: Any) -> None:
    """``report[key] = measure(*args)``; a failure is recorded, not fatal to the long run."""
    try:
        report[key] = measure(*args)
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        report.setdefault("extra_errors", {})[key] = f"{type(exc).__name__}: {exc}"


def run(args: argparse.Namespace, status: dict[str, tuple[bool, str]]) -> dict[str, Any]:
    """Every measurement of the run, as the JSON report."""
    from tqdm import tqdm

    t_start = perf_counter()
    report: dict[str, Any] = {
        "benchmark": "envmgr throughput",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": typed_command(args),
        "machine": run_context.machine_info(status["envpool"][1]),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "config": {
            **{k: v for k, v in vars(args).items() if k not in ("out", "plot", "prog", "argv")},
            "envpool_num_threads": args.workers,
            "ceiling_processes": args.workers,
            "async_context": "multiprocessing default",
            "envmgr_context": envmgr.default_start_method(),
        },
        "env_step_cost_us": {},
    }
    bar = tqdm(
        total=progress_total(args, status),
        file=sys.stderr,
        unit="task",
        dynamic_ncols=True,
        smoothing=0.0,
    )
    try:
        # What one step of each env costs here, serially (medians): context for the table.
        bar.set_description("measuring env step costs; checking spawn pickling")
        for e in args.envs:
            cost = bench_envs.measure_step_cost(peers.base_env(e), steps=500)
            report["env_step_cost_us"][peers.base_env(e)] = cost
        report["spawn_pickling_check"] = run_context.check_spawn_pickling()
        bar.update(1)
        if not args.skip_extras:
            extra(report, "setup", run_context.measure_setup, args, bar)
        report["configs"] = [run_config(e, n, args, status, bar) for e, n in todo(args)]
        if not args.skip_extras:
            extra(report, "overhead", handoff.measure_overhead, args.overhead_layouts, args, bar)
            extra(
                report,
                "scaling",
                handoff.measure_scaling,
                args.scaling_workers,
                args.scaling_envs_per_worker,
                args,
                bar,
            )
            extra(report, "floor", handoff.measure_floor, args.floor_workers, args, bar)
    finally:
        bar.close()
    report["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["wall_seconds"] = perf_counter() - t_start
    return report


def tables(report: dict[str, Any], args: argparse.Namespace) -> str:
    """The printed result: every table of the run, as Markdown."""
    configs = report["configs"]
    flat = [c for c in configs if c["env"] not in vector_case.VECTOR_ENVS]
    vector = [c for c in configs if c["env"] in vector_case.VECTOR_ENVS]
    out = [
        f"## Throughput (env-steps/s, median of {args.repeats} interleaved rounds "
        f"x {args.seconds:g} s; envmgr = {args.workers} workers x n_envs/{args.workers}; "
        f"ceiling = {args.workers} independent processes; ratios: median of per-round ratios)",
    ]
    if flat:
        pairs = [("envmgr", p) for p in peers.PEERS if p != "vector"]
        impls = [i for i in peers.ALL_IMPLS if i not in peers.VECTOR_ONLY]
        pairs += [
            ("envmgr-nocopy", "ceiling"),
            ("envmgr-firstready", "ceiling"),
            ("envmgr-caller", "ceiling"),
            ("lockstep", "ceiling"),
        ]
        pairs.append(("ceiling", "serial"))
        out.append(bench_report.markdown_table(flat, impls, pairs))
    if vector:
        out.append(
            "Batched envs (one CartPoleVectorEnv per process or worker; envmgr hosted: "
            "one vector env per worker):"
        )
        pairs = [("envmgr-hosted", p) for p in ("vector", "ceiling", "lockstep", "envpool")]
        pairs += [("envmgr-hosted-caller", p) for p in ("ceiling", "lockstep", "envpool")]
        pairs += [("envmgr", "ceiling"), ("ceiling", "vector"), ("lockstep", "ceiling")]
        out.append(bench_report.markdown_table(vector, vector_case.VECTOR_IMPLS, pairs))
    # EnvPool's state is said once: why it was skipped, or which version ran.
    notes = sorted(
        {
            f"skipped {i}: {r}"
            for c in configs
            for i, r in c["skipped"].items()
            if i in args.impls and i != "envpool"
        }
    )
    for c in configs:
        notes += [f"ERROR {c['env']} n={c['n_envs']} {i}: {r}" for i, r in c["errors"].items()]
    notes += [f"ERROR in {k}: {v}" for k, v in report.get("extra_errors", {}).items()]
    envpool_ran = any("envpool" in c["samples"] for c in configs)
    if envpool_ran:
        notes.append(f"EnvPool: {report['machine']['envpool']}")
    elif any(r == "envpool unavailable" for c in configs for r in c["skipped"].values()):
        notes.append(f"EnvPool skipped: {report['machine']['envpool']}")
    if notes:
        out.append("\n".join(notes))
    if "overhead" in report:
        out.append(bench_report.overhead_text(report["overhead"]))
    if "scaling" in report:
        out.append(bench_report.scaling_text(report["scaling"]))
    if "floor" in report:
        out.append(bench_report.floor_text(report["floor"]))
    if "setup" in report:
        out.append(bench_report.setup_text(report["setup"]))
    goals = bench_report.goals_text(report)
    if goals:
        out.append(goals)
    costs = ", ".join(f"{e} {v:.1f}" for e, v in report["env_step_cost_us"].items())
    tail = [f"env step cost in-process (median µs): {costs}"]
    tail.append(f"spawn pickling check: {report['spawn_pickling_check']}")
    la0, la1 = report["loadavg_start"], report["loadavg_end"]
    if la0 and la1:
        tail.append(
            f"load average at start {la0[0]:.2f}, at end {la1[0]:.2f} (1 min) "
            f"on {report['machine']['nproc']} CPUs"
        )
    tail.append(f"command: {report['command']}")
    out.append("\n".join(tail))
    return "\n\n".join(out) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    status = {"envpool": (False, "not requested")}
    if "envpool" in args.impls and any(e in peers.ENVPOOL_ENVS for e in args.envs):
        status["envpool"] = peers.envpool_status()
    report = run(args, status)

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    text = tables(report, args)
    args.out.with_suffix(".txt").write_text(text)
    written = [args.out, args.out.with_suffix(".txt")]
    if not args.no_plot:
        bench_report.plot(report["configs"], args.plot, bench_report.plot_title(report))
        written.append(args.plot)
    print()
    print(text)
    print(
        f"wrote {', '.join(os.path.relpath(p) for p in written)} in {report['wall_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
