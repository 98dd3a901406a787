#!/usr/bin/env python
"""The parent's cost per batch step in instructions: a count that machine noise cannot move.

Usage (from the repository root; needs valgrind, e.g. ``apt-get install valgrind``)::

    python -m benchmarks.probes.parent_instructions                  # 1 x 4 and 2 x 64, no-op env
    python -m benchmarks.probes.parent_instructions --layouts 2x64 --compare ../old-checkout
    python -m benchmarks.probes.parent_instructions --layouts 1x4,2x4,4x4,8x4,16x4  # per worker
    python -m benchmarks.probes.parent_instructions --env noop-info --layouts 1x4+4  # caller_envs=4

``--env noop-info`` gives every env HalfCheetah-v5's four numeric info keys, so the
count covers the info columns on both sides. A layout ``WxE+C`` adds ``caller_envs=C``:
the parent then steps C envs itself while the worker steps its own, and its count is
the whole of one side of the batch's critical path (its envs' serve, info writes
included, and the parent's own work), as the worker's side is the same serve.

On a shared 2-vCPU VM, µs of parent CPU per batch step drift by 2x within an hour as the
host's load changes, which hides a 30% change of envmgr's own cost. Instructions do not
drift: ``valgrind --tool=callgrind`` counts what the parent process executes (workers
are not traced), the same for the same code whatever else the machine is doing. Each
layout runs twice, stepping 200 and 5,200 batches after the same start-up; the
difference over 5,000 is the parent's instructions per batch step (start-up and import
cancel out). Under valgrind the parent runs ~50x slower, so two things that depend on
the clock are held still: workers spin for a minute (``spin_seconds=60``), so the parent
never has to wake one (it would otherwise find every worker asleep, which a real run
rarely does), and workers ship their timer trees only at the end
(``timer_interval=3600``), as a real run does once a second, not every few steps.

``--compare DIR`` also measures the envmgr in checkout ``DIR`` (put first on
``PYTHONPATH``): before/after a change, in one run.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from contextlib import ExitStack
from pathlib import Path

from benchmarks._common.paths import child_env, envmgr_from

STEPS = (200, 5200)


def child(workers: int, envs: int, caller: int, steps: int, env_name: str) -> None:
    """Build the manager, step ``steps`` batches of ``env_name`` envs, close."""
    import numpy as np

    import envmgr
    from benchmarks._common import envs as bench_envs

    bench_envs.make_picklable()
    actions = np.zeros((8, workers * envs + caller), dtype=np.int64)
    factory = bench_envs.FACTORIES[env_name]
    manager = envmgr.SubprocessEnvManager
    kwargs = {"caller_envs": caller} if caller else {}
    with manager(factory, workers, envs, spin_seconds=60.0, timer_interval=3600.0, **kwargs) as m:
        m.reset(seed=0)
        for i in range(steps):
            m.step(actions[i % 8])


def count(layout: tuple[int, int, int], steps: int, env_name: str, checkout: Path | None) -> int:
    """Instructions the parent executed in one run of :func:`child`."""
    cmd = [
        "valgrind",
        "--tool=callgrind",
        "--trace-children=no",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        __spec__.name,
        "--child",
        ",".join(map(str, (*layout, steps, env_name))),
    ]
    with ExitStack() as stack:
        where, env = None, child_env()
        if checkout is not None:
            where, env = stack.enter_context(envmgr_from(checkout))
        env["PYTHONHASHSEED"] = "0"  # set and dict orders, hence their work, alike every run
        out = subprocess.run(cmd, env=env, cwd=where, capture_output=True, text=True, check=True)
    found = re.search(r"Collected : (\d+)", out.stderr)
    if found is None:
        raise RuntimeError(f"no instruction count in valgrind's output:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--layouts", default="1x4,2x64", help="WORKERSxENVS[+CALLER] (default: %(default)s)"
    )
    p.add_argument("--env", default="noop", choices=("noop", "noop-info"), help="the envs")
    p.add_argument("--compare", type=Path, default=None, help="another checkout to measure too")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        *numbers, env_name = args.child.split(",")
        child(*(int(x) for x in numbers), env_name)
        return 0
    if shutil.which("valgrind") is None:
        print("needs valgrind (Debian/Ubuntu: apt-get install valgrind)", file=sys.stderr)
        return 1
    checkouts: list[tuple[str, Path | None]] = [("this checkout", None)]
    if args.compare is not None:
        checkouts.insert(0, (str(args.compare), args.compare.resolve()))
    print(f"envs: {args.env}\n")
    print("| envmgr | layout | parent instructions per batch step |")
    print("|---|---|---:|")
    found: dict[str, dict[tuple[int, int], float]] = {name: {} for name, _ in checkouts}
    for text in args.layouts.split(","):
        workers_envs, _, caller = text.partition("+")
        workers, envs = (int(x) for x in workers_envs.split("x"))
        layout = (workers, envs, int(caller or 0))
        label = f"{workers} x {envs}" + (f" + caller {caller}" if caller else "")
        for name, checkout in checkouts:
            a, b = (count(layout, s, args.env, checkout) for s in STEPS)
            per_step = (b - a) / (STEPS[1] - STEPS[0])
            if not caller:  # (the per-worker slope below is of the plain layouts)
                found[name][(workers, envs)] = per_step
            print(f"| {name} | {label} | {per_step:,.0f} |", flush=True)
    # The parent's own work per added worker (same envs per worker, least squares): the
    # part that decides the batch rate on many cores, free of the scheduling noise that
    # 16 processes on 2 cores add to CPU seconds.
    for name, counts in found.items():
        for per in sorted({e for _, e in counts}):
            xs = sorted(w for w, e in counts if e == per)
            if len(xs) < 2:
                continue
            ys = [counts[(w, per)] for w in xs]
            mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
            slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
                (x - mx) ** 2 for x in xs
            )
            print(f"\n{name}, {per} envs per worker: {slope:,.0f} instructions per added worker")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
