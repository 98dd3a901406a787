#!/usr/bin/env python
"""Soak test: step for a long time while workers are SIGKILLed at random.

Not part of CI. Usage (from the repository root)::

    python -m benchmarks.probes.soak --steps 1000000 --kill-every 2.0
    python -m benchmarks.probes.soak --steps 200000 --kill-every 0.5 --context fork --json out.json

CartPole-v1 in ``--workers`` x ``--envs-per-worker`` envs (2 x 16 by default), with
a restart budget that never runs out (``--max-restarts`` large, counted over a
short ``--restart-window``). A background thread SIGKILLs a random worker every
``--kill-every`` seconds. The main loop steps with random actions and checks that
every step returns a full batch of the right shapes.

``--steps`` counts env steps (one batch step is ``num_envs`` env steps).

Reported:

* env steps requested and returned, and **steps lost** (must be 0: a kill must
  cost a truncated episode, never a missing or short batch, nor an exception);
* kills sent, restarts (``envs.restarts``) and steps flagged with
  ``infos["envmgr_restarted"]``; every kill that hit a worker should show up as
  exactly one restart;
* RSS and open file descriptors of the parent, and summed over the workers, at
  start (after a warm-up) and at the end; the parent's child-process count, to
  spot unreaped workers.

Exit status: 0 when no step was lost and kills and restarts agree, else 1.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr import SubprocessEnvManager


def make_cartpole() -> gym.Env:  # type: ignore[type-arg]
    return gym.make("CartPole-v1")


# ------------------------------------------------------------------ /proc readings


def rss_kib(pid: int | str = "self") -> int | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def fd_count(pid: int | str = "self") -> int | None:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None


def process_state(pid: int) -> str | None:
    """State letter of ``pid`` (``R``, ``S``, ``Z``...), or ``None`` if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every child of ``pid``."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append((int(entry), fields[0]))
    return out


def snapshot(envs: SubprocessEnvManager) -> dict[str, Any]:
    me = os.getpid()
    kids = children(me)
    # Under forkserver the workers are the forkserver's children, not ours.
    grandkids = [c for pid, _ in kids for c in children(pid)]
    workers = list(envs.worker_pids)
    w_rss = [rss_kib(p) for p in workers]
    w_fds = [fd_count(p) for p in workers]
    return {
        "parent_rss_kib": rss_kib(),
        "parent_fds": fd_count(),
        "parent_threads": threading.active_count(),
        "workers_rss_kib": sum(r for r in w_rss if r is not None),
        "workers_fds": sum(n for n in w_fds if n is not None),
        "children": len(kids),
        "zombie_children": sum(1 for _, s in kids + grandkids if s == "Z"),
        "grandchildren": len(grandkids),
    }


# ------------------------------------------------------------------ the killer


class Killer(threading.Thread):
    """SIGKILLs a random worker of ``envs`` every ``every`` seconds."""

    def __init__(self, envs: SubprocessEnvManager, every: float, seed: int) -> None:
        super().__init__(name="soak-killer", daemon=True)
        self.envs = envs
        self.every = every
        self.rng = random.Random(seed)
        self.stop = threading.Event()
        self.kills: list[tuple[float, int, int]] = []  # (time, worker, pid)
        # Kills that found the worker already dead (killed before and not yet
        # replaced: a zombie, or gone): they cannot cause a restart of their own.
        self.missed = 0

    def run(self) -> None:
        killed: set[int] = set()
        while not self.stop.wait(self.every):
            w = self.rng.randrange(self.envs.n_workers)
            pid = self.envs.worker_pids[w]
            if pid in killed or process_state(pid) in (None, "Z", "X"):
                self.missed += 1
                continue
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                self.missed += 1
                continue
            killed.add(pid)
            self.kills.append((time.monotonic(), w, pid))


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--steps", type=int, default=1_000_000, help="env steps to run (default 1e6)")
    p.add_argument("--kill-every", type=float, default=2.0, help="seconds between worker kills")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--envs-per-worker", type=int, default=16)
    p.add_argument("--context", default=None, help="fork, forkserver or spawn (default: envmgr's)")
    p.add_argument("--max-restarts", type=int, default=1_000_000)
    p.add_argument("--restart-window", type=float, default=1.0)
    p.add_argument("--step-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--report-every", type=float, default=10.0, help="seconds between progress lines"
    )
    p.add_argument("--json", default=None, help="also write the summary to this file")
    args = p.parse_args(argv)

    envs = SubprocessEnvManager(
        make_cartpole,
        args.workers,
        args.envs_per_worker,
        context=args.context,
        max_restarts=args.max_restarts,
        restart_window=args.restart_window,
        step_timeout=args.step_timeout,
    )
    n = envs.num_envs
    rng = np.random.default_rng(args.seed)
    pool = [rng.integers(0, 2, size=n) for _ in range(256)]  # CartPole: Discrete(2)
    requested = returned = batch_steps = flagged_steps = flagged_envs = 0
    error: str | None = None
    killer = Killer(envs, args.kill_every, args.seed)
    with envs:
        envs.reset(seed=args.seed)
        for i in range(100):  # warm-up before the first reading
            envs.step(pool[i % len(pool)])
        start = snapshot(envs)
        print(
            f"soak: {args.steps} env steps, {args.workers} workers x {args.envs_per_worker} envs, "
            f"context={envs.context}, a kill every {args.kill_every} s",
            flush=True,
        )
        t0 = last_report = time.monotonic()
        killer.start()
        try:
            while requested < args.steps:
                requested += n
                obs, rew, term, trunc, infos = envs.step(pool[batch_steps % len(pool)])
                batch_steps += 1
                got = obs.shape[0]
                if not (obs.shape == (n, 4) and rew.shape == term.shape == trunc.shape == (n,)):
                    shapes = f"{obs.shape} {rew.shape} {term.shape} {trunc.shape}"
                    error = f"step {batch_steps}: bad batch shapes {shapes}"
                    break
                returned += got
                mask = infos.get("_envmgr_restarted")
                if mask is not None and mask.any():
                    flagged_steps += 1
                    flagged_envs += int(mask.sum())
                    if not trunc[mask].all():
                        error = f"step {batch_steps}: restarted envs not truncated"
                        break
                now = time.monotonic()
                if now - last_report >= args.report_every:
                    last_report = now
                    print(
                        f"  {returned:>10} env steps, {returned / (now - t0):>9.0f}/s, "
                        f"kills {len(killer.kills)}, restarts {sum(envs.restarts)}",
                        flush=True,
                    )
        except BaseException as exc:  # noqa: BLE001 - any failure is the finding
            error = f"step {batch_steps + 1}: {type(exc).__name__}: {exc}"
            if isinstance(exc, KeyboardInterrupt):
                error = "interrupted"
        finally:
            killer.stop.set()
            killer.join()
        elapsed = time.monotonic() - t0
        # Let the last kill land and be repaired, so kills and restarts can be compared.
        if error is None and not envs.closed:
            for i in range(20):
                requested += n
                obs, *_ = envs.step(pool[i % len(pool)])
                returned += obs.shape[0]
        end = snapshot(envs) if not envs.closed else {}
        restarts = list(envs.restarts)
    lost = requested - returned
    summary = {
        "env_steps_requested": requested,
        "env_steps_returned": returned,
        "steps_lost": lost,
        "batch_steps": batch_steps,
        "seconds": round(elapsed, 2),
        "env_steps_per_second": round(returned / elapsed) if elapsed > 0 else None,
        "kills": len(killer.kills),
        "kills_missed": killer.missed,
        "restarts": sum(restarts),
        "restarts_per_worker": restarts,
        "flagged_steps": flagged_steps,
        "flagged_envs": flagged_envs,
        "start": start,
        "end": end,
        "error": error,
        "config": vars(args) | {"context": envs.context},
    }
    ok = error is None and lost == 0 and summary["restarts"] == summary["kills"]
    summary["ok"] = ok
    print()
    print(f"env steps requested/returned  {requested} / {returned}")
    print(f"steps lost                    {lost}")
    print(
        f"batch steps                   {batch_steps} in {elapsed:.1f} s "
        f"({summary['env_steps_per_second']} env steps/s)"
    )
    print(
        f"kills / restarts              {len(killer.kills)} / {sum(restarts)} "
        f"(per worker {restarts}); "
        f"{killer.missed} kill attempts found the worker already dead"
    )
    print(f"steps with restarted envs     {flagged_steps} ({flagged_envs} envs flagged)")
    for key in (
        "parent_rss_kib",
        "parent_fds",
        "parent_threads",
        "workers_rss_kib",
        "workers_fds",
        "children",
        "grandchildren",
        "zombie_children",
    ):
        print(f"{key:<30}{start.get(key)!s:>10} -> {end.get(key, '-')!s}")
    if error:
        print(f"ERROR: {error}")
    print("OK" if ok else "FAILED")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
