"""What a benchmark run records about itself: the machine, envmgr's set-up time, pickling."""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from importlib import metadata
from time import perf_counter
from typing import Any

import gymnasium as gym
import numpy as np

import envmgr
from benchmarks._common import envs as bench_envs
from benchmarks._common.paths import REPO
from benchmarks._common.timing import median
from envmgr import SubprocessEnvManager

START_METHODS = ["fork", "forkserver", "spawn"]


def measure_setup(args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """Construct + first reset + close of a 2-worker CartPole manager, per start method.

    Runs first in the process, so the forkserver's own start-up (once per process) lands in
    its first sample; the median of ``--setup-repeats`` is reported, with every sample kept.
    """
    methods = [m for m in START_METHODS if m in mp.get_all_start_methods()]
    res: dict[str, Any] = {
        "n_workers": args.workers,
        "envs_per_worker": args.setup_envs_per_worker,
        "env": "CartPole-v1",
        "samples": {m: [] for m in methods},
    }
    for rep in range(args.setup_repeats):
        for method in methods:
            bar.set_description(f"set-up {method} {rep + 1}/{args.setup_repeats}")
            t0 = perf_counter()
            m = SubprocessEnvManager(
                bench_envs.make_cartpole, args.workers, args.setup_envs_per_worker, context=method
            )
            t1 = perf_counter()
            m.reset(seed=0)
            t2 = perf_counter()
            m.close()
            t3 = perf_counter()
            res["samples"][method].append(
                {"construct": t1 - t0, "reset": t2 - t1, "close": t3 - t2, "total": t3 - t0}
            )
            bar.update(1)
    res["median_total_seconds"] = {
        m: median([s["total"] for s in ss]) for m, ss in res["samples"].items()
    }
    return res


def check_spawn_pickling() -> str:
    """The benchmark envs reach spawn workers by value: build one in a spawn worker."""
    with SubprocessEnvManager(bench_envs.make_straggler, 1, 2, context="spawn") as m:
        m.reset(seed=0)
        m.step(np.zeros(2, dtype=np.int64))
        imported = m.call("bench_module_imported")
    if any(imported):
        return "ok, but the worker imported the benchmarks module by name (not by value)"
    return "ok: the env classes reached the spawn worker by value (module not imported there)"


def dist_versions(dists: Sequence[str]) -> dict[str, str]:
    """Each installed distribution's version, or ``"not installed"``."""

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return {d: version(d) for d in dists}


def machine_info(envpool_msg: str) -> dict[str, Any]:
    def git(*cmd: str) -> str | None:
        try:
            return subprocess.run(
                ["git", *cmd], cwd=REPO, capture_output=True, text=True, timeout=10, check=True
            ).stdout.strip()
        except Exception:
            return None

    cpu_model = None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu_model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    status = git("status", "--porcelain")
    try:
        import cloudpickle

        cloudpickle_version = cloudpickle.__version__
    except Exception:
        cloudpickle_version = None
    return {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "cpu_model": cpu_model,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "python": sys.version,
        "python_implementation": platform.python_implementation(),
        "numpy": np.__version__,
        "gymnasium": gym.__version__,
        "envmgr": envmgr.__version__,
        "cloudpickle": cloudpickle_version,
        "envpool": envpool_msg,
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "default_mp_start_method": mp.get_start_method(allow_none=True),
        "envmgr_default_context": envmgr.default_start_method(),
    }
