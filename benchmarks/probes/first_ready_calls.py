#!/usr/bin/env python
"""What the parent does per ``recv`` in a first-ready loop, in counts that load cannot move.

Usage (from a checkout's root; ``--compare`` runs another checkout's envmgr too)::

    python -m benchmarks.probes.first_ready_calls --env compute --n-envs 32
    python -m benchmarks.probes.first_ready_calls --env cartpole --compare /tmp/envmgr-before

The loop is ``throughput.py``'s ``envmgr-firstready`` (2 workers, ``recv`` one worker's
envs, ``send`` them straight back), profiled with :mod:`cProfile` after a warm-up. Per
``recv`` (with its ``send``) it prints every call the profiler sees, the Python-level
ones, the scans of the done words (``first_done``) and the waits' system calls
(``poll``, ``os.read`` of the wake-up pipe, ``sched_yield``). Timings of these µs-scale
calls drift 2x with the other load of a shared 2-core machine; the counts do not, except
``poll``: how often the parent found the workers still busy and slept (the rest of a
sleeping ``recv``'s counts follow from it).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks._common.paths import envmgr_from

WORKERS = 2


def measure(env: str, n_envs: int, recvs: int) -> dict[str, float]:
    """Per-``recv`` counts of ``recvs`` recv+send pairs, with the envmgr on ``sys.path``."""
    import numpy as np

    from benchmarks._common import envs as bench_envs
    from envmgr import SubprocessEnvManager

    bench_envs.make_picklable()
    per = n_envs // WORKERS
    prof = cProfile.Profile()
    with SubprocessEnvManager(
        bench_envs.FACTORIES[env], n_workers=WORKERS, envs_per_worker=per
    ) as mgr:
        mgr.reset(seed=0)
        actions = np.zeros(n_envs, dtype=np.int64)
        mgr.send(actions)
        for k in (100, recvs):  # a warm-up, then the profiled loop
            if k == recvs:
                prof.enable()
            for _ in range(k):
                *_, ids = mgr.recv(batch_size=per)
                mgr.send(actions[ids], ids)
        prof.disable()
        for _ in range(WORKERS):
            mgr.recv(batch_size=per)
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]

    def count(pred: Callable[[str, str], bool]) -> float:
        return sum(v[1] for (fn, _, name), v in stats.items() if pred(fn, name)) / recvs

    return {
        "calls": count(lambda fn, name: True),
        "python calls": count(lambda fn, name: fn != "~"),
        "first_done": count(lambda fn, name: name == "first_done"),
        "poll": count(lambda fn, name: "'poll' of 'select.poll'" in name),
        "os.read": count(lambda fn, name: name == "<built-in method posix.read>"),
        "sched_yield": count(lambda fn, name: "sched_yield" in name),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--env", default="compute", help="a benchmarks/_common/envs.py factory name")
    p.add_argument("--n-envs", type=int, default=32, help="envs over the 2 workers")
    p.add_argument("--recvs", type=int, default=1000, help="recv+send pairs profiled")
    p.add_argument("--compare", default=None, help="another checkout to measure too")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        counts = measure(args.env, args.n_envs, args.recvs)
        print("  ".join(f"{k} {v:.2f}" for k, v in counts.items()))
        return 0
    roots = [Path.cwd()] + ([Path(args.compare).resolve()] if args.compare else [])
    for root in roots:
        # A fresh interpreter per checkout, its envmgr first on the path (the workers
        # it starts inherit PYTHONPATH, so they import the same one).
        cmd = [sys.executable, "-m", __spec__.name, "--child", "--env", args.env]
        cmd += ["--n-envs", str(args.n_envs), "--recvs", str(args.recvs)]
        with envmgr_from(root) as (where, env):
            run = subprocess.run(cmd, env=env, cwd=where, capture_output=True, text=True)
        said = run.stdout.strip() if run.returncode == 0 else f"failed\n{run.stderr}"
        print(f"{root}: {args.env} {WORKERS}x{args.n_envs // WORKERS}, per recv: {said}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
