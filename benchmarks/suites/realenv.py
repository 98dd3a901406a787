#!/usr/bin/env python
"""Real envs side by side: Pong, HalfCheetah and Humanoid through envmgr and its peers.

Usage (from the repository root; needs ``pip install -e ".[bench,sb3]"``)::

    python -m benchmarks.suites.realenv                  # the full run (see benchmarks/README.md)
    python -m benchmarks.suites.realenv --quick          # smoke run, under a minute
    python -m benchmarks.suites.realenv --envs halfcheetah --n-envs 8 --rounds 5 --out mine/

The envs:

* ``pong``: ALE ``ALE/Pong-v5`` with ``frameskip=1``, then ``AtariPreprocessing(frame_skip=4,
  screen_size=84, grayscale_obs=True, noop_max=30)``, then ``FrameStackObservation(4)``;
* ``halfcheetah``: ``HalfCheetah-v5``; ``humanoid``: ``Humanoid-v5`` (MuJoCo, with infos).

The implementations (``--impls``), ``W`` = ``--workers`` (2):

* ``serial``, ``ceiling``, ``lockstep``: ``ceiling.py``'s plain loop, ``W`` free-running
  processes stepping ``n / W`` envs each with no communication (the ceiling), and the same
  processes behind a bare barrier every step (the lock-step bound: the most any design that
  waits for the whole batch can reach);
* ``doorbell``: the default layout's own bound, ``floor.FloorPingPong`` with work: ``W``
  processes stepping ``n / W`` envs each when envmgr's doorbell announces a step, and a
  parent that sleeps until the last one wakes it (``W + 1`` processes, as envmgr's
  ``step``), with no actions, observations or infos crossing;
* ``envmgr`` (``step``, ``W x n/W``), ``envmgr-firstready`` (``send``/``recv`` with
  ``batch_size = n / W``), ``envmgr-caller`` (``W - 1`` workers plus ``caller_envs = n / W``),
  all built by ``peers.build``;
* ``async``: Gymnasium's ``AsyncVectorEnv``; ``subproc``: SB3's ``SubprocVecEnv``;
* ``puffer-2``, ``puffer-1``: PufferLib 3's ``Multiprocessing`` backend with 2 / 1 workers
  (``GymnasiumPufferEnv``, ``overwork=True``: it refuses more workers than physical cores);
* ``envpool``: EnvPool's own C++ ports (``Pong-v5``, ``HalfCheetah-v4``, ``Humanoid-v4``)
  with ``W`` threads: different code from the Python envs, reported beside them.

Every measurement runs in a fresh interpreter (this script with ``--child``): nothing one
implementation leaves behind (threads, forkservers, torch's pools, a warm allocator) can
slow or speed the next. Rounds are interleaved: each round measures every implementation
once, in an order that rotates, so load on the shared machine lands on all alike. Reported:
median env-steps/s over rounds, and each implementation's ratio to the ceiling taken within
each round, as the min-max over rounds; for envmgr's layouts also the benchmark process's
CPU per batch. JSON, a text table and a PNG go to ``--out``
(default ``benchmarks/results/record/realenv/``; ``quick.*`` with ``--quick``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from benchmarks._common.paths import RECORD, child_env
from benchmarks._common.realenv_peers import (
    ALL_ENVS,
    ALL_IMPLS,
    ENVMGR_LAYOUTS,
    ENVPOOL_IDS,
    KNOWN_IMPLS,
    OWN_TIMING,
    build,
    skip_reason,
)
from benchmarks._common.timing import (
    Runner,
    median,
    per_round_ratios,
    rotated,
    sample_actions,
    timed_sample,
)
from benchmarks.report import realenv_report

#: Longest a child may take beyond its warm-up and timed seconds (32 Humanoid processes
#: importing MuJoCo on a loaded 2-core machine take a while).
CHILD_OVERHEAD_TIMEOUT = 300.0
#: ``--quick``: every implementation once on one env (each child costs 1-4 s of start-up).
QUICK = {
    "envs": "halfcheetah",
    "n_envs": "4",
    "rounds": 1,
    "seconds": 0.15,
    "warmup": 0.05,
    "pre_steps": 2,
}


# ============================================================================ one measurement


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Build, reset, warm up and time one implementation: the body of a ``--child`` run."""
    env, n, impl = spec["env"], spec["n_envs"], spec["impl"]
    t0 = time.perf_counter()
    actions = sample_actions(env, n, 1000 + n)
    vec = build(impl, env, n, spec["workers"], actions)
    try:
        own = impl in OWN_TIMING  # they reset their own envs and time themselves
        runner = vec if own else Runner(impl, vec, actions)
        if not own:
            vec.reset(seed=0)
        build_seconds = time.perf_counter() - t0
        runner.warm_up(spec["warmup"])
        sample = timed_sample(runner, n, spec["seconds"], spec["pre_steps"])
    finally:
        vec.close()
    sample.pop("per_process", None)
    sample["build_seconds"] = build_seconds
    return sample


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``measure(spec)`` in a fresh interpreter; the sample, or ``{"error": why}``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "sample.json"
        cmd = [sys.executable, "-m", __spec__.name, "--child", json.dumps(spec)]
        cmd += ["--child-out", str(out)]
        limit = CHILD_OVERHEAD_TIMEOUT + spec["warmup"] + spec["seconds"]
        t0 = time.perf_counter()
        try:
            # cwd: MuJoCo writes MUJOCO_LOG.TXT into the working directory on every
            # warning (Gymnasium's XML models draw a deprecation one); it goes with tmp.
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=limit, cwd=tmp, env=child_env()
            )
        except subprocess.TimeoutExpired:
            return {"error": f"no result within {limit:.0f} s"}
        wall = time.perf_counter() - t0
        if proc.returncode != 0 or not out.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
        sample: dict[str, Any] = json.loads(out.read_text())
    sample["child_wall_seconds"] = wall
    return sample


# ============================================================================ the run


def summarize(config: dict[str, Any]) -> None:
    """Medians per implementation and per-round ratios to the ceiling (and to serial)."""
    samples = config["samples"]
    config["median_steps_per_second"] = {
        impl: median([s["steps_per_second"] for s in ss]) for impl, ss in samples.items()
    }
    config["median_parent_cpu_us_per_batch"] = {
        impl: median([s["parent_cpu_us_per_batch"] for s in ss])
        for impl, ss in samples.items()
        if impl in ENVMGR_LAYOUTS
    }
    ratios = {}
    for impl in samples:
        for base in ("ceiling", "serial", "ale-vector-ceiling"):
            r = per_round_ratios(samples, impl, base)
            if r is not None and r["per_round"] and impl != base:
                ratios[f"{impl}/{base}"] = r
    config["ratios"] = ratios


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every configuration, ``args.rounds`` interleaved rounds; saved after every round."""
    from benchmarks._common.run_context import machine_info

    configs = [
        {"env": e, "n_envs": n, "samples": {}, "errors": {}, "skipped": {}}
        for e in args.envs
        for n in args.n_envs
    ]
    report: dict[str, Any] = {
        "command": " ".join([f"python -m {__spec__.name}", *args.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "argv")},
        "machine": machine_info(envpool_msg=_version("envpool")),
        "versions": {
            p: _version(p) for p in ("ale_py", "mujoco", "stable_baselines3", "pufferlib")
        },
        "envpool_ids": ENVPOOL_IDS,
        "configs": configs,
    }
    t_start = time.perf_counter()
    total = args.rounds * len(configs) * len(args.impls)
    done = 0
    for r in range(args.rounds):
        for c in configs:
            for impl in rotated(list(args.impls), r):
                done += 1
                reason = skip_reason(impl, c["n_envs"], args.workers, c["env"])
                if reason is not None:
                    c["skipped"][impl] = reason
                    continue
                if impl in c["errors"]:
                    continue  # failed once: it would fail again, and each try costs a start-up
                spec = {
                    "env": c["env"],
                    "n_envs": c["n_envs"],
                    "impl": impl,
                    "workers": args.workers,
                    "seconds": args.seconds,
                    "warmup": args.warmup,
                    "pre_steps": args.pre_steps,
                }
                sample = run_child(spec)
                tag = f"[{done}/{total}] round {r + 1} {c['env']} n={c['n_envs']} {impl}"
                if "error" in sample:
                    c["errors"][impl] = sample["error"]
                    print(f"{tag}: FAILED {sample['error']}", file=sys.stderr, flush=True)
                    continue
                sample["round"] = r
                c["samples"].setdefault(impl, []).append(sample)
                print(
                    f"{tag}: {sample['steps_per_second']:,.0f} steps/s "
                    f"({sample['child_wall_seconds']:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            summarize(c)
        report["wall_seconds"] = time.perf_counter() - t_start
        save(report)
    return report


def _version(module: str) -> str:
    """The module's version, or why it is not there (without importing it here)."""
    from importlib import metadata

    dist = {
        "ale_py": "ale-py",
        "stable_baselines3": "stable-baselines3",
        "pufferlib": "pufferlib-core",
    }.get(module, module)
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "not installed"


# ============================================================================ report


# ============================================================================ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--envs", default=",".join(ALL_ENVS), help="(default: %(default)s)")
    p.add_argument("--n-envs", default="8,32", help="(default: %(default)s)")
    p.add_argument("--impls", default=",".join(ALL_IMPLS), help="(default: %(default)s)")
    p.add_argument(
        "--workers", type=int, default=2, help="envmgr workers, ceiling processes, EnvPool threads"
    )
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--seconds", type=float, default=3.0, help="timed seconds per sample")
    p.add_argument("--warmup", type=float, default=1.0, help="untimed seconds after building")
    p.add_argument("--pre-steps", type=int, default=10, help="untimed batches before the sample")
    p.add_argument(
        "--out",
        type=Path,
        default=RECORD / "realenv",
        help="output directory (default: benchmarks/results/record/realenv/); "
        "writes realenv.json, .txt, .png (quick.* with --quick)",
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quick", action="store_true", help="halfcheetah at n=4, 1 round, < 60 s")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-out", type=Path, default=None, help=argparse.SUPPRESS)
    raw = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(raw)
    args.argv = raw
    if args.child is not None:
        return args
    if args.quick:
        given = {a.split("=")[0] for a in raw}
        for name, value in QUICK.items():
            if "--" + name.replace("_", "-") not in given:
                setattr(args, name, value)
    args.envs = [e for e in str(args.envs).split(",") if e]
    args.n_envs = [int(n) for n in str(args.n_envs).split(",") if n]
    args.impls = [i for i in str(args.impls).split(",") if i]
    for e in args.envs:
        if e not in ALL_ENVS:
            p.error(f"unknown env {e!r}; choose from {','.join(ALL_ENVS)}")
    for i in args.impls:
        if i not in KNOWN_IMPLS:
            p.error(f"unknown implementation {i!r}; choose from {','.join(KNOWN_IMPLS)}")
    if args.workers < 1 or any(n < 1 for n in args.n_envs):
        p.error("--workers and every --n-envs must be positive")
    if args.seconds <= 0 or args.rounds < 1:
        p.error("--seconds must be > 0 and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        try:
            sample = measure(json.loads(args.child))
        except Exception:
            traceback.print_exc()
            return 1
        args.child_out.write_text(json.dumps(sample))
        return 0
    stem = "quick" if args.quick else "realenv"
    out_json = args.out / f"{stem}.json"
    args.out.mkdir(parents=True, exist_ok=True)

    def save(report: dict[str, Any]) -> None:
        out_json.write_text(json.dumps(report, indent=1, default=str))

    report = run(args, save)
    text = realenv_report.tables(report)
    out_json.with_suffix(".txt").write_text(text)
    written = [out_json, out_json.with_suffix(".txt")]
    if not args.no_plot:
        realenv_report.plot(report, out_json.with_suffix(".png"))
        written.append(out_json.with_suffix(".png"))
    print(text)
    names = ", ".join(os.path.relpath(p) for p in written)
    print(f"wrote {names}; Python {platform.python_version()}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
