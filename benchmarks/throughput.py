#!/usr/bin/env python
"""Side-by-side throughput of envmgr and its peers, in one process run.

Usage (from the repository root)::

    python benchmarks/throughput.py                 # the full default run (~8-9 min, 2 cores)
    python benchmarks/throughput.py --quick         # a tiny smoke run (< 1 min)
    python benchmarks/throughput.py --envs noop,cartpole --n-envs 8,64 --seconds 1 \\
        --out benchmarks/results/mine.json --plot benchmarks/results/mine.png

For every (env, n_envs) configuration, all implementations are built side by side:

* ``serial``  -- a plain Python loop over ``n_envs`` envs in this process, with
  next-step autoreset like gymnasium's, writing into preallocated batch arrays
  (no info merging, no copies: the floor of pure-Python overhead);
* ``sync``    -- ``gymnasium.vector.SyncVectorEnv``;
* ``async``   -- ``gymnasium.vector.AsyncVectorEnv(shared_memory=True)``, one process per env;
* ``envmgr``  -- ``envmgr.SubprocessEnvManager(n_workers=W, envs_per_worker=n_envs // W)``;
* ``envmgr-nocopy`` -- the same with ``copy=False`` (by default only for the image env,
  where observations are large enough for the copy to matter);
* ``envpool`` -- ``envpool.make("CartPole-v1", env_type="gymnasium", num_threads=W)``,
  CartPole only, when envpool imports.

Every implementation is fed the same pre-sampled action batches (1000 per configuration,
reused cyclically, each implementation walking the same sequence), is reset with the same
seed, and is warmed up before timing. Timed samples are interleaved: each round times every
implementation once (starting with a different one each round), so machine noise hits all of
them alike. Reported per implementation: the median env-steps/s over rounds. Ratios
envmgr/peer are taken within each round, then the median over rounds is reported.

Also measured: envmgr's wall time per batch step on the no-op env (its own overhead, as the
envs do nothing) and its set-up time (construct + first reset + close) under each start method.

Results go to a JSON file (every raw sample plus machine info) and a PNG plot.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter, process_time
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
# benchmarks/ is not a package: make `import envs` work here (spawn/forkserver children
# inherit sys.path), and ship the env classes by value anyway (make_picklable below).
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import envs as bench_envs  # noqa: E402
import gymnasium as gym  # noqa: E402
import numpy as np  # noqa: E402
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv  # noqa: E402
from gymnasium.vector.utils import batch_space, create_empty_array  # noqa: E402

import envmgr  # noqa: E402
from envmgr import SubprocessEnvManager  # noqa: E402

bench_envs.make_picklable()

ALL_ENVS = ["noop", "cartpole", "compute", "image", "straggler"]
ALL_IMPLS = ["serial", "sync", "async", "envmgr", "envmgr-nocopy", "envmgr-firstready", "envpool"]
DEFAULT_IMPLS = ["serial", "sync", "async", "envmgr", "envpool"]
#: The peers envmgr is compared with, in table order.
PEERS = ["serial", "sync", "async", "envpool"]
ENVPOOL_ENVS = {"cartpole": "CartPole-v1"}
N_ACTION_BATCHES = 1000
START_METHODS = ["fork", "forkserver", "spawn"]


# ============================================================================ implementations


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


class FirstReady:
    """envmgr's first-ready mode: each ``step`` call does one batch's worth of env
    steps through ``send``/``recv``, serving whichever worker finishes first."""

    def __init__(self, factory: Any, n: int, workers: int) -> None:
        self.mgr = SubprocessEnvManager(factory, n_workers=workers, envs_per_worker=n // workers)
        self.workers = workers
        self.per_worker = n // workers
        self.started = False

    def reset(self, seed: int | None = None) -> Any:
        return self.mgr.reset(seed=seed)

    def step(self, actions: np.ndarray) -> None:
        mgr = self.mgr
        if not self.started:
            mgr.send(actions)
            self.started = True
        for _ in range(self.workers):
            *_, ids = mgr.recv(batch_size=self.per_worker)
            mgr.send(actions[ids], ids)

    def close(self) -> None:
        self.mgr.close()


class EnvpoolCartPole:
    """envpool's C++ CartPole-v1, seeded at construction (envpool's reset takes no seed)."""

    def __init__(self, n: int, threads: int, seed: int = 0) -> None:
        import envpool

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.env = envpool.make(
                "CartPole-v1", env_type="gymnasium", num_envs=n, num_threads=threads, seed=seed
            )

    def reset(self, *, seed: int | None = None) -> Any:
        return self.env.reset()

    def step(self, actions: np.ndarray) -> Any:
        return self.env.step(actions)

    def close(self) -> None:
        self.env.close()


def envpool_status() -> tuple[bool, str]:
    """Whether envpool works here (a real make + reset + step), and why not if it does not."""
    try:
        import envpool  # noqa: F401

        e = EnvpoolCartPole(4, 1)
        e.reset(seed=0)
        e.step(np.zeros(4, dtype=np.int64))
        e.close()
        return True, f"envpool {envpool.__version__}"
    except Exception as exc:  # ImportError, missing shared libraries, ABI mismatch ...
        return False, f"{type(exc).__name__}: {exc}".strip()[:300]


def build(impl: str, env: str, n: int, workers: int) -> Any:
    """Construct implementation ``impl`` stepping ``n`` copies of benchmark env ``env``."""
    factory = bench_envs.FACTORIES[env]
    if impl == "serial":
        return SerialLoop(factory, n)
    if impl == "sync":
        return SyncVectorEnv([factory] * n)
    if impl == "async":
        return AsyncVectorEnv([factory] * n, shared_memory=True)
    if impl in ("envmgr", "envmgr-nocopy"):
        return SubprocessEnvManager(
            factory, n_workers=workers, envs_per_worker=n // workers, copy=(impl == "envmgr")
        )
    if impl == "envmgr-firstready":
        return FirstReady(factory, n, workers)
    if impl == "envpool":
        return EnvpoolCartPole(n, threads=workers)
    raise ValueError(f"unknown implementation {impl!r}")


def applicable(
    impl: str, env: str, n: int, workers: int, args: argparse.Namespace, envpool_ok: bool
) -> str | None:
    """``None`` if ``impl`` runs on (env, n); else the reason it is skipped."""
    if impl in ("envmgr", "envmgr-nocopy", "envmgr-firstready") and n % workers:
        return f"n_envs={n} is not a multiple of --workers={workers}"
    if (
        impl == "envmgr-nocopy"
        and env not in args.nocopy_envs
        and "envmgr-nocopy" not in args.impls
    ):
        return "copy=False variant not requested for this env"
    if impl == "envpool":
        if env not in ENVPOOL_ENVS:
            return "envpool has no equivalent of this env"
        if not envpool_ok:
            return "envpool unavailable"
    return None


# ============================================================================ timing


def sample_actions(env: str, n: int, seed: int) -> np.ndarray:
    """``N_ACTION_BATCHES`` batches of actions for ``n`` envs, drawn once per configuration."""
    probe = bench_envs.FACTORIES[env]()
    space = batch_space(probe.action_space, n)
    probe.close()
    space.seed(seed)
    return np.stack([space.sample() for _ in range(N_ACTION_BATCHES)])


class Runner:
    """One built implementation plus its position in the shared action sequence."""

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

    def timed(self, seconds: float) -> dict[str, float]:
        """Step for ``seconds``; returns batch steps, wall and parent CPU seconds."""
        actions, k, step = self.actions, self.cursor, self.vec.step
        m = len(actions)
        batches = 0
        c0 = process_time()
        t0 = perf_counter()
        deadline = t0 + seconds
        while True:
            step(actions[k % m])
            k += 1
            batches += 1
            now = perf_counter()
            if now >= deadline:
                break
        cpu = process_time() - c0
        self.cursor = k
        return {"batches": batches, "seconds": now - t0, "cpu_seconds": cpu}


def median(xs: Sequence[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


def run_config(
    env: str, n: int, args: argparse.Namespace, envpool_ok: bool, bar: Any
) -> dict[str, Any]:
    """Build every implementation for (env, n), then time them in interleaved rounds."""
    result: dict[str, Any] = {"env": env, "n_envs": n, "skipped": {}, "errors": {}, "samples": {}}
    actions_seed = 1000 + n
    actions = sample_actions(env, n, actions_seed)
    result["actions_seed"] = actions_seed
    runners: list[Runner] = []
    for impl in ALL_IMPLS:
        if impl not in args.impls and not (impl == "envmgr-nocopy" and env in args.nocopy_envs):
            continue
        reason = applicable(impl, env, n, args.workers, args, envpool_ok)
        if reason is not None:
            result["skipped"][impl] = reason
            continue
        bar.set_description(f"{env} n={n}: build {impl}")
        try:
            t0 = perf_counter()
            vec = build(impl, env, n, args.workers)
            vec.reset(seed=0)
            runner = Runner(impl, vec, actions)
            runner.warm_up(args.warmup)
            result.setdefault("build_seconds", {})[impl] = perf_counter() - t0
            runners.append(runner)
        except Exception as exc:
            result["errors"][impl] = f"{type(exc).__name__}: {exc}"
            traceback.print_exc(file=sys.stderr)
        bar.update(1)
    try:
        for r in range(args.repeats):
            # Rotate the order every round: no implementation always goes first.
            order = runners[r % len(runners) :] + runners[: r % len(runners)] if runners else []
            for runner in order:
                bar.set_description(f"{env} n={n}: round {r + 1}/{args.repeats} {runner.impl}")
                if runner.impl in result["errors"]:
                    bar.update(1)
                    continue
                try:
                    runner.steps(args.pre_sample_steps)  # wake workers / warm caches after idling
                    s = runner.timed(args.seconds)
                except Exception as exc:  # keep the other implementations' numbers
                    result["errors"][runner.impl] = f"round {r}: {type(exc).__name__}: {exc}"
                    traceback.print_exc(file=sys.stderr)
                    bar.update(1)
                    continue
                s["round"] = r
                s["loadavg_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
                s["steps_per_second"] = s["batches"] * n / s["seconds"]
                s["us_per_batch"] = s["seconds"] / s["batches"] * 1e6
                s["parent_cpu_us_per_batch"] = s["cpu_seconds"] / s["batches"] * 1e6
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
    """Median steps/s per implementation; per-round ratios envmgr/peer and their median."""
    samples = result["samples"]
    by_round = {
        impl: {s["round"]: s["steps_per_second"] for s in ss} for impl, ss in samples.items()
    }
    result["median_steps_per_second"] = {
        impl: median([s["steps_per_second"] for s in ss]) for impl, ss in samples.items()
    }
    result["median_us_per_batch"] = {
        impl: median([s["us_per_batch"] for s in ss]) for impl, ss in samples.items()
    }
    result["median_parent_cpu_us_per_batch"] = {
        impl: median([s["parent_cpu_us_per_batch"] for s in ss]) for impl, ss in samples.items()
    }
    ratios: dict[str, dict[str, Any]] = {}
    for mine in ("envmgr", "envmgr-nocopy", "envmgr-firstready"):
        if mine not in by_round:
            continue
        for peer in PEERS:
            if peer not in by_round:
                continue
            rounds = sorted(set(by_round[mine]) & set(by_round[peer]))
            per_round = [by_round[mine][r] / by_round[peer][r] for r in rounds]
            ratios[f"{mine}/{peer}"] = {"per_round": per_round, "median": median(per_round)}
    result["ratios"] = ratios


# ============================================================================ envmgr extras


def measure_overhead(
    args: argparse.Namespace, layouts: Sequence[tuple[int, int]], bar: Any
) -> list[dict]:
    """envmgr on the no-op env: wall and parent-CPU µs per batch step, per layout.

    The envs do (almost) nothing, so the wall time per batch step is the manager's own cost:
    the parent's bookkeeping plus the round trip to the workers. The serial loop over the
    same number of no-op envs is timed alongside, as the cost of the envs themselves.
    check_actions=False is timed too, to show what the parent's action check costs.
    """
    out = []
    for workers, per_worker in layouts:
        n = workers * per_worker
        actions = sample_actions("noop", n, 7)

        def make(variant: str, workers: int = workers, per_worker: int = per_worker) -> Any:
            if variant == "serial":
                return SerialLoop(bench_envs.make_noop, workers * per_worker)
            return SubprocessEnvManager(
                bench_envs.make_noop,
                workers,
                per_worker,
                check_actions=(variant == "envmgr"),
                copy=(variant != "envmgr-nocopy-nocheck"),
            )

        runners = []
        for name in ("envmgr", "envmgr-nocheck", "envmgr-nocopy-nocheck", "serial"):
            bar.set_description(f"overhead {workers}x{per_worker}: build {name}")
            vec = make(name)
            vec.reset(seed=0)
            r = Runner(name, vec, actions)
            r.warm_up(args.warmup)
            runners.append(r)
        samples: dict[str, list[dict[str, float]]] = {r.impl: [] for r in runners}
        try:
            for rnd in range(args.repeats):
                order = runners[rnd % len(runners) :] + runners[: rnd % len(runners)]
                for r in order:
                    bar.set_description(
                        f"overhead {workers}x{per_worker}: round {rnd + 1} {r.impl}"
                    )
                    r.steps(args.pre_sample_steps)
                    s = r.timed(args.seconds)
                    s["us_per_batch"] = s["seconds"] / s["batches"] * 1e6
                    s["parent_cpu_us_per_batch"] = s["cpu_seconds"] / s["batches"] * 1e6
                    samples[r.impl].append(s)
                bar.update(1)
        finally:
            for r in runners:
                r.vec.close()
        out.append(
            {
                "n_workers": workers,
                "envs_per_worker": per_worker,
                "n_envs": n,
                "samples": samples,
                "median_us_per_batch": {
                    k: median([s["us_per_batch"] for s in v]) for k, v in samples.items()
                },
                "median_parent_cpu_us_per_batch": {
                    k: median([s["parent_cpu_us_per_batch"] for s in v]) for k, v in samples.items()
                },
            }
        )
    return out


def measure_setup(args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """Construct + first reset + close of a 2-worker CartPole manager, per start method.

    Runs first in the process, so the forkserver's own start-up (once per process) lands in
    its first sample; the median of ``--setup-repeats`` is reported, with every sample kept.
    """
    methods = [
        m for m in START_METHODS if m in __import__("multiprocessing").get_all_start_methods()
    ]
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


# ============================================================================ reporting


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
        "git_commit": git("rev-parse", "--short", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "default_mp_start_method": __import__("multiprocessing").get_start_method(allow_none=True),
        "envmgr_default_context": envmgr.default_start_method(),
    }


LABELS = {
    "serial": "serial",
    "sync": "Sync",
    "async": "Async",
    "envmgr": "envmgr",
    "envmgr-nocopy": "envmgr copy=False",
    "envmgr-firstready": "envmgr first-ready",
    "envpool": "envpool",
}


def fmt_rate(x: float | None) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:,.0f}"


def fmt_ratio(x: float | None) -> str:
    if x is None or x != x:
        return "–"
    return f"{x:.2f}x"


def markdown_table(configs: list[dict[str, Any]], impls: list[str]) -> str:
    shown = [
        i
        for i in ALL_IMPLS
        if i in impls or any(i in c["median_steps_per_second"] for c in configs)
    ]
    shown = [i for i in shown if any(i in c["median_steps_per_second"] for c in configs)]
    head = [
        "env",
        "n_envs",
        *[f"{LABELS[i]} steps/s" for i in shown],
        *[f"envmgr/{p}" for p in PEERS],
    ]
    lines = [
        "| " + " | ".join(head) + " |",
        "|" + "|".join(["---"] * 2 + ["---:"] * (len(head) - 2)) + "|",
    ]
    for c in configs:
        med = c["median_steps_per_second"]
        row = [c["env"], str(c["n_envs"])]
        row += [fmt_rate(med.get(i)) for i in shown]
        row += [fmt_ratio(c["ratios"].get(f"envmgr/{p}", {}).get("median")) for p in PEERS]
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def overhead_text(overhead: list[dict[str, Any]]) -> str:
    lines = [
        "envmgr per-batch-step cost on the no-op env (median over rounds; the envs do nothing, "
        "so this is the manager's own cost):",
        "",
        "| layout | variant | wall µs/batch | parent CPU µs/batch | wall µs per env-step |",
        "|---|---|---:|---:|---:|",
    ]
    for o in overhead:
        layout = f"{o['n_workers']} workers x {o['envs_per_worker']} envs ({o['n_envs']} total)"
        for k, wall in o["median_us_per_batch"].items():
            cpu = o["median_parent_cpu_us_per_batch"][k]
            lines.append(
                f"| {layout} | {k} | {wall:,.1f} | {cpu:,.1f} | {wall / o['n_envs']:.2f} |"
            )
    return "\n".join(lines)


def setup_text(setup: dict[str, Any]) -> str:
    lines = [
        f"envmgr set-up time, {setup['n_workers']} workers x {setup['envs_per_worker']} envs "
        f"CartPole-v1: construct + first reset + close "
        f"(median of {len(next(iter(setup['samples'].values())))}; "
        "all samples in order):",
        "",
        "| start method | median total | construct | reset | close | samples (total) |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for m, ss in setup["samples"].items():
        totals = ", ".join(f"{s['total'] * 1e3:,.0f}" for s in ss)
        lines.append(
            f"| {m} | {median([s['total'] for s in ss]) * 1e3:,.0f} ms "
            f"| {median([s['construct'] for s in ss]) * 1e3:,.0f} ms "
            f"| {median([s['reset'] for s in ss]) * 1e3:,.1f} ms "
            f"| {median([s['close'] for s in ss]) * 1e3:,.0f} ms "
            f"| {totals} ms |"
        )
    return "\n".join(lines)


def plot(configs: list[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_names = list(dict.fromkeys(c["env"] for c in configs))
    cols = min(3, len(env_names))
    rows = (len(env_names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.8 * rows), squeeze=False)
    markers = {
        "serial": "o",
        "sync": "s",
        "async": "^",
        "envmgr": "D",
        "envmgr-nocopy": "d",
        "envmgr-firstready": "P",
        "envpool": "v",
    }
    for ax, env in zip(axes.flat, env_names, strict=False):
        cs = sorted((c for c in configs if c["env"] == env), key=lambda c: c["n_envs"])
        for impl in ALL_IMPLS:
            pts = [(c["n_envs"], c["samples"][impl]) for c in cs if impl in c["samples"]]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            rates = [[s["steps_per_second"] for s in p[1]] for p in pts]
            med = [median(r) for r in rates]
            lo = [m - min(r) for m, r in zip(med, rates, strict=True)]
            hi = [max(r) - m for m, r in zip(med, rates, strict=True)]
            ax.errorbar(xs, med, yerr=[lo, hi], marker=markers[impl], capsize=3, label=LABELS[impl])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xticks(sorted({c["n_envs"] for c in cs}))
        ax.set_xticklabels([str(x) for x in sorted({c["n_envs"] for c in cs})])
        ax.set_title(env)
        ax.set_xlabel("n_envs")
        ax.set_ylabel("env-steps/s (median, min-max)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(env_names) :]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ============================================================================ main


def parse_list(s: str, kind: Callable[[str], Any] = str) -> list[Any]:
    return [kind(x.strip()) for x in s.split(",") if x.strip()]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "--envs", default=",".join(ALL_ENVS), help="benchmark envs (default: %(default)s)"
    )
    p.add_argument("--n-envs", default="8,32,64", help="numbers of envs (default: %(default)s)")
    p.add_argument(
        "--workers", type=int, default=2, help="envmgr workers / envpool threads (default: 2)"
    )
    p.add_argument(
        "--seconds", type=float, default=2.0, help="seconds per timed sample (default: 2)"
    )
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument(
        "--impls",
        default=",".join(DEFAULT_IMPLS),
        help=f"implementations, from {','.join(ALL_IMPLS)} (default: %(default)s)",
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
        "--skip-extras", action="store_true", help="skip the overhead and set-up measurements"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="JSON output (default: benchmarks/results/throughput.json)",
    )
    p.add_argument(
        "--plot", type=Path, default=None, help="PNG output (default: the JSON path with .png)"
    )
    p.add_argument("--no-plot", action="store_true")
    p.add_argument("--quick", action="store_true", help="tiny configuration, < 1 minute")
    args = p.parse_args(argv)
    if args.quick:
        given = set(a.split("=")[0] for a in (argv if argv is not None else sys.argv[1:]))
        if "--envs" not in given:
            args.envs = "noop,cartpole,image"
        if "--n-envs" not in given:
            args.n_envs = "8"
        if "--seconds" not in given:
            args.seconds = 0.4
        if "--repeats" not in given:
            args.repeats = 2
        if "--warmup" not in given:
            args.warmup = 0.1
        if "--setup-repeats" not in given:
            args.setup_repeats = 1
        if "--overhead-layouts" not in given:
            args.overhead_layouts = "2x32"
    args.envs = parse_list(args.envs)
    args.n_envs = parse_list(args.n_envs, int)
    args.impls = parse_list(args.impls)
    args.nocopy_envs = parse_list(args.nocopy_envs)
    args.overhead_layouts = [
        tuple(int(v) for v in s.split("x")) for s in parse_list(args.overhead_layouts)
    ]
    for e in args.envs:
        if e not in bench_envs.FACTORIES:
            p.error(f"unknown env {e!r}; choose from {','.join(ALL_ENVS)}")
    for i in args.impls:
        if i not in ALL_IMPLS:
            p.error(f"unknown implementation {i!r}; choose from {','.join(ALL_IMPLS)}")
    if args.out is None:
        args.out = HERE / "results" / ("quick.json" if args.quick else "throughput.json")
    if args.plot is None:
        args.plot = args.out.with_suffix(".png")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    from tqdm import tqdm

    t_start = perf_counter()
    envpool_ok, envpool_msg = (False, "not requested")
    if "envpool" in args.impls and any(e in ENVPOOL_ENVS for e in args.envs):
        envpool_ok, envpool_msg = envpool_status()
        if not envpool_ok:
            print(f"envpool skipped: {envpool_msg}", file=sys.stderr)

    configs_todo = [(e, n) for e in args.envs for n in args.n_envs]
    n_impl_units = 0
    for e, n in configs_todo:
        for impl in ALL_IMPLS:
            if impl not in args.impls and not (impl == "envmgr-nocopy" and e in args.nocopy_envs):
                continue
            if applicable(impl, e, n, args.workers, args, envpool_ok) is None:
                n_impl_units += 1 + args.repeats
    n_setup = 0 if args.skip_extras else args.setup_repeats * len(START_METHODS)
    n_overhead = 0 if args.skip_extras else args.repeats * len(args.overhead_layouts)
    bar = tqdm(
        total=n_impl_units + n_setup + n_overhead + 1,
        file=sys.stderr,
        unit="task",
        dynamic_ncols=True,
        smoothing=0.0,
    )

    report: dict[str, Any] = {
        "benchmark": "envmgr throughput",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": " ".join(
            [
                os.path.relpath(sys.argv[0], REPO) if argv is None else "throughput.py",
                *(sys.argv[1:] if argv is None else argv),
            ]
        ),
        "machine": machine_info(envpool_msg),
        "loadavg_start": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "config": {
            "envs": args.envs,
            "n_envs": args.n_envs,
            "workers": args.workers,
            "seconds": args.seconds,
            "repeats": args.repeats,
            "impls": args.impls,
            "nocopy_envs": args.nocopy_envs,
            "warmup_seconds": args.warmup,
            "pre_sample_steps": args.pre_sample_steps,
            "action_batches": N_ACTION_BATCHES,
            "quick": args.quick,
            "envpool_num_threads": args.workers,
            "async_context": "multiprocessing default ("
            + str(
                __import__("multiprocessing").get_start_method(allow_none=True) or "fork on Linux"
            )
            + ")",
            "envmgr_context": envmgr.default_start_method(),
        },
        "env_step_cost_us": {},
    }
    # What one step of each env costs here, serially (medians): context for the table.
    bar.set_description("measuring env step costs; checking spawn pickling")
    for e in args.envs:
        report["env_step_cost_us"][e] = bench_envs.measure_step_cost(e, steps=500)
    report["spawn_pickling_check"] = check_spawn_pickling()
    bar.update(1)

    try:
        if not args.skip_extras:
            report["setup"] = measure_setup(args, bar)
        configs = []
        for e, n in configs_todo:
            configs.append(run_config(e, n, args, envpool_ok, bar))
        report["configs"] = configs
        if not args.skip_extras:
            report["overhead"] = measure_overhead(args, args.overhead_layouts, bar)
    finally:
        bar.close()
    report["loadavg_end"] = os.getloadavg() if hasattr(os, "getloadavg") else None
    report["wall_seconds"] = perf_counter() - t_start

    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1, default=str)
    if not args.no_plot:
        m = report["machine"]
        title = (
            f"env-steps/s, {args.workers} workers; {m['nproc']} CPUs, Python "
            f"{platform.python_version()}, gymnasium {m['gymnasium']}, envmgr {m['envmgr']} "
            f"@ {m['git_commit']}{'+dirty' if m['git_dirty'] else ''}; "
            f"{args.repeats} rounds x {args.seconds:g} s"
        )
        plot(configs, args.plot, title)

    print()
    print(
        f"## Throughput (env-steps/s, median of {args.repeats} interleaved rounds "
        f"x {args.seconds:g} s; envmgr = {args.workers} workers x n_envs/{args.workers}; "
        "ratios: median of per-round ratios)"
    )
    print()
    print(markdown_table(configs, args.impls))
    skipped = sorted(
        {
            f"{i}: {r}"
            for c in configs
            for i, r in c["skipped"].items()
            if i in args.impls and r != "envpool has no equivalent of this env"
        }
    )
    errors = [
        f"{c['env']} n={c['n_envs']} {i}: {r}" for c in configs for i, r in c["errors"].items()
    ]
    for s in skipped:
        print(f"\nskipped {s}")
    for s in errors:
        print(f"\nERROR {s}")
    if "envpool" in args.impls and any(e in ENVPOOL_ENVS for e in args.envs):
        print(f"\nenvpool: {envpool_msg}" + ("" if envpool_ok else " (skipped)"))
    if "overhead" in report:
        print()
        print(overhead_text(report["overhead"]))
    if "setup" in report:
        print()
        print(setup_text(report["setup"]))
    print()
    print(
        "env step cost in-process (median µs): "
        + ", ".join(f"{e} {v:.1f}" for e, v in report["env_step_cost_us"].items())
    )
    print(f"spawn pickling check: {report['spawn_pickling_check']}")
    la0, la1 = report["loadavg_start"], report["loadavg_end"]
    if la0 and la1:
        print(
            f"load average at start {la0[0]:.2f}, at end {la1[0]:.2f} (1 min) "
            f"on {report['machine']['nproc']} CPUs"
        )
    print(
        f"\nwrote {os.path.relpath(args.out)}"
        + ("" if args.no_plot else f" and {os.path.relpath(args.plot)}")
        + f" in {report['wall_seconds']:.0f} s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
