"""Small probes behind the design choices in benchmarks/README.md.

Run from the repository root:

    python -m benchmarks.probes.probe cores              # are the 2 CPUs equally fast right now?
    python -m benchmarks.probes.probe spin  --env compute --n 16
    python -m benchmarks.probes.probe spin  --env cartpole --n 64 --parent --budgets 0,0.001,0.005
    python -m benchmarks.probes.probe layout --env cartpole --n 64 --workers 2,4,8

``cores``: one CartPole loop alone, then two copies at once in separate processes
(no communication at all); if a concurrent copy is slower than the lone one, the
machine's second CPU is not a full core at that moment, and no multi-process
stepping can reach 2x there.

``spin`` and ``layout``: envmgr against the serial loop over the same envs, in
interleaved rounds (median of per-round ratios), for several worker spin budgets
or several worker counts (``spin --parent``: the parent's budget while it waits for a
batch, ``parent_spin_seconds``, the workers' left at the default).

``ray-graph`` (needs ``envmgr[ray]``): what a Ray batch step of two actors, each hosting a
``CartPoleVectorEnv`` of ``--n`` envs, costs on a local one-node Ray, as plain actor calls
and as a Ray compiled graph (``ray.dag``, shared-memory channels between the driver and
same-node actors), next to one in-process step of the same block. It says whether a
backend built on compiled graphs could bring RayEnvManager near the local manager here.

    python -m benchmarks.probes.probe ray-graph --n 2048

``column-copy``: writing a column-major (n, 4) float32 batch (a vectorized env's
``state.T``, as CartPole returns it) into a row-major array, numpy's one assignment
against ``envmgr.protocol.trees.copy_tree`` (a column at a time from 1,024 rows).

    python -m benchmarks.probes.probe column-copy

``sched`` (Linux, needs ``perf`` and the right to trace the scheduler, e.g. root): the
default layout (2 workers, a sleeping parent) stepped under ``perf sched record``; from
the trace, how long the parent waits for a core after the last worker wakes it (split
by whether that worker ran on the core the parent then ran on), and how long it runs
per wake-up. That is the part of each batch step no worker steps in.

    python -m benchmarks.probes.probe sched --env compute --n 16 --steps 1500
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from typing import Any

import numpy as np

from benchmarks._common import envs as bench_envs
from benchmarks._common.paths import child_env
from envmgr import SubprocessEnvManager


def _cartpole_loop(seconds: float) -> float:
    envs = [bench_envs.FACTORIES["cartpole"]() for _ in range(32)]
    for i, e in enumerate(envs):
        e.reset(seed=i)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        for e in envs:
            _, _, term, trunc, _ = e.step(n % 2)
            n += 1
            if term or trunc:
                e.reset()
    return (time.perf_counter() - t0) / n * 1e6


def cores(args: argparse.Namespace) -> None:
    for _ in range(args.rounds):
        alone = _cartpole_loop(args.seconds)
        r, w = os.pipe()
        pids = []
        for _k in range(2):
            pid = os.fork()
            if pid == 0:
                os.close(r)
                os.write(w, f"{_cartpole_loop(args.seconds):.2f} ".encode())
                os._exit(0)
            pids.append(pid)
        os.close(w)
        for pid in pids:
            os.waitpid(pid, 0)
        together = os.read(r, 100).decode().split()
        os.close(r)
        print(f"CartPole µs/step: alone {alone:.2f}; two at once {' and '.join(together)}")


def _compare(env: str, n: int, configs: list[dict[str, Any]], steps: int, rounds: int) -> None:
    factory = bench_envs.FACTORIES[env]
    serial = [factory() for _ in range(n)]
    for i, e in enumerate(serial):
        e.reset(seed=i)
    managers = []
    for cfg in configs:
        m = SubprocessEnvManager(factory, **cfg)
        m.reset(seed=0)
        managers.append(m)
    actions = np.random.default_rng(0).integers(0, 2, size=(steps, n))
    rates: list[list[float]] = [[] for _ in configs]
    serial_rates = []
    try:
        for _ in range(rounds):
            t0 = time.perf_counter()
            for a in actions:
                for e, x in zip(serial, a, strict=True):
                    _, _, term, trunc, _ = e.step(x)
                    if term or trunc:
                        e.reset()
            serial_rates.append(n * steps / (time.perf_counter() - t0))
            for k, m in enumerate(managers):
                for a in actions[:5]:
                    m.step(a)
                t0 = time.perf_counter()
                for a in actions:
                    m.step(a)
                rates[k].append(n * steps / (time.perf_counter() - t0))
    finally:
        for m in managers:
            m.close()
    print(f"{env}, {n} envs: serial median {statistics.median(serial_rates):,.0f} env-steps/s")
    for cfg, rs in zip(configs, rates, strict=True):
        ratio = statistics.median(a / b for a, b in zip(rs, serial_rates, strict=True))
        print(f"  {cfg}: median {statistics.median(rs):,.0f} env-steps/s, {ratio:.2f}x serial")


def spin(args: argparse.Namespace) -> None:
    budgets = [float(s) for s in args.budgets.split(",")]
    key = "parent_spin_seconds" if args.parent else "spin_seconds"
    configs = [{"n_workers": 2, "envs_per_worker": args.n // 2, key: b} for b in budgets]
    _compare(args.env, args.n, configs, args.steps, args.rounds)


def layout(args: argparse.Namespace) -> None:
    configs = [
        {"n_workers": int(w), "envs_per_worker": args.n // int(w)} for w in args.workers.split(",")
    ]
    _compare(args.env, args.n, configs, args.steps, args.rounds)


def ray_graph(args: argparse.Namespace) -> None:
    import gymnasium as gym
    import ray
    from ray.dag import InputNode, MultiOutputNode

    def block() -> Any:
        return gym.make_vec("CartPole-v1", num_envs=args.n, vectorization_mode="vector_entry_point")

    class Host:
        def __init__(self) -> None:
            self.env = block()
            self.env.reset(seed=0)

        def step(self, actions: np.ndarray) -> tuple[Any, ...]:
            return tuple(self.env.step(actions)[:4])

    actions = np.random.default_rng(0).integers(0, 2, (64, args.n))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=0)(Host)
        hosts = [actor.remote() for _ in range(2)]  # type: ignore[attr-defined]

        def plain(k: int) -> None:
            ray.get([h.step.remote(actions[k % 64]) for h in hosts])

        with InputNode() as inp:
            graph = MultiOutputNode([h.step.bind(inp) for h in hosts]).experimental_compile()

        def compiled(k: int) -> None:
            ray.get(graph.execute(actions[k % 64]))

        local = block()
        local.reset(seed=0)

        def in_process(k: int) -> None:
            local.step(actions[k % 64])

        timings: dict[str, list[float]] = {"plain actor calls": [], "compiled graph": []}
        timings["in-process step of one block"] = []
        runs = dict(zip(timings, (plain, compiled, in_process), strict=True))
        for fn in runs.values():  # warm up
            for k in range(20):
                fn(k)
        for _ in range(args.rounds):
            for name, fn in runs.items():
                t0 = time.perf_counter()
                for k in range(args.steps):
                    fn(k)
                timings[name].append((time.perf_counter() - t0) / args.steps * 1e6)
        graph.teardown()
    finally:
        ray.shutdown()
    print(f"2 actors x {args.n} envs (CartPoleVectorEnv), median of {args.rounds} rounds:")
    for name, us in timings.items():
        print(f"  {name}: {statistics.median(us):,.0f} µs per batch step")


def column_copy(args: argparse.Namespace) -> None:
    import timeit

    from envmgr.protocol.trees import copy_tree

    print("(n, 4) column-major float32 into row-major, µs per copy (best of 5 x 2,000):")
    for n in (16, 256, 1024, 8192):
        src = np.random.default_rng(0).random((4, n)).T.astype(np.float32)
        dst = np.zeros((n, 4), dtype=np.float32)

        def numpy_copy(src: np.ndarray = src, dst: np.ndarray = dst) -> None:
            dst[...] = src

        def envmgr_copy(src: np.ndarray = src, dst: np.ndarray = dst) -> None:
            copy_tree(dst, src)

        a, b = (
            min(timeit.repeat(f, number=2000, repeat=5)) / 2000 * 1e6
            for f in (numpy_copy, envmgr_copy)
        )
        print(f"  n={n:5d}: numpy {a:6.2f}  copy_tree {b:6.2f}")


def sched(args: argparse.Namespace) -> None:
    import subprocess
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        data, pid_file = os.path.join(tmp, "sched.data"), os.path.join(tmp, "pid")
        child = [sys.executable, "-W", "ignore", "-m", __spec__.name, "sched-child", pid_file]
        child += ["--env", args.env, "--n", str(args.n), "--steps", str(args.steps)]
        rec = subprocess.run(
            ["perf", "sched", "record", "-o", data, "--", *child],
            text=True,
            capture_output=True,
            env=child_env(),
        )
        if rec.returncode != 0:
            sys.exit(f"perf sched record failed (perf installed, tracing allowed?):\n{rec.stderr}")
        print(rec.stdout.strip())
        with open(pid_file) as f:
            parent = f"[{f.read().strip()}]"
        hist = subprocess.run(
            ["perf", "sched", "timehist", "-i", data, "-w"],
            text=True,
            capture_output=True,
            check=True,
        ).stdout.splitlines()
    waker_core: str | None = None
    delays: dict[bool, list[float]] = {True: [], False: []}
    runs: list[float] = []
    for line in hist:
        fields = line.split()
        if len(fields) < 3 or not fields[0][0].isdigit():
            continue
        core, task = fields[1], fields[2]
        if "awakened:" in line:
            if parent in line.split("awakened:")[1]:
                waker_core = core
        elif task.endswith(parent) and len(fields) >= 6 and waker_core is not None:
            delays[waker_core == core].append(float(fields[4]) * 1e3)  # ms -> µs
            runs.append(float(fields[5]) * 1e3)
            waker_core = None

    def spread(us: list[float]) -> str:
        if not us:
            return "none"
        q = sorted(us)
        return (
            f"median {statistics.median(q):.0f} µs (p10 {q[len(q) // 10]:.0f}, "
            f"p90 {q[9 * len(q) // 10]:.0f}; {len(q)} wake-ups)"
        )

    print(f"{args.env} 2 x {args.n // 2}, default layout, under perf sched:")
    print(f"  parent waits for a core, woken from that core:  {spread(delays[True])}")
    print(f"  parent waits for a core, woken from the other:  {spread(delays[False])}")
    print(f"  parent runs per wake-up (that core's worker waits): {spread(runs)}")


def sched_child(args: argparse.Namespace) -> None:
    with open(args.pid_file, "w") as f:
        f.write(str(os.getpid()))
    actions = np.random.default_rng(0).integers(0, 2, (64, args.n))
    with SubprocessEnvManager([bench_envs.FACTORIES[args.env]] * args.n, n_workers=2) as vec:
        vec.reset(seed=0)
        t0 = time.perf_counter()
        for k in range(args.steps):
            vec.step(actions[k % 64])
        us = (time.perf_counter() - t0) / args.steps * 1e6
    print(f"{args.steps} batch steps, {us:.0f} µs each (under tracing)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="probe", required=True)
    c = sub.add_parser("cores")
    c.add_argument("--seconds", type=float, default=2.0)
    c.add_argument("--rounds", type=int, default=3)
    c.set_defaults(func=cores)
    for name, func in (("spin", spin), ("layout", layout)):
        s = sub.add_parser(name)
        s.add_argument("--env", default="compute", choices=sorted(bench_envs.FACTORIES))
        s.add_argument("--n", type=int, default=16)
        s.add_argument("--steps", type=int, default=60)
        s.add_argument("--rounds", type=int, default=7)
        s.set_defaults(func=func)
    sub.choices["spin"].add_argument("--budgets", default="0,0.0002,0.0005,0.001,0.002")
    sub.choices["spin"].add_argument(
        "--parent", action="store_true", help="the budgets are the parent's (parent_spin_seconds)"
    )
    sub.choices["layout"].add_argument("--workers", default="2,4,8")
    r = sub.add_parser("ray-graph")
    r.add_argument("--n", type=int, default=2048)
    r.add_argument("--steps", type=int, default=200)
    r.add_argument("--rounds", type=int, default=5)
    r.set_defaults(func=ray_graph)
    sub.add_parser("column-copy").set_defaults(func=column_copy)
    for name, func in (("sched", sched), ("sched-child", sched_child)):
        s = sub.add_parser(name)
        if name == "sched-child":
            s.add_argument("pid_file")
        s.add_argument("--env", default="compute", choices=sorted(bench_envs.FACTORIES))
        s.add_argument("--n", type=int, default=16)
        s.add_argument("--steps", type=int, default=1500)
        s.set_defaults(func=func)
    args = p.parse_args()
    args.func(args)


if __name__ == "__main__":
    main()
