#!/usr/bin/env python
"""Where a batch step's time goes in the default layout, segment by segment, from timestamps.

Usage (from the repository root)::

    python -m benchmarks.probes.timeline --env halfcheetah --n 8 --batches 3000
    python -m benchmarks.probes.timeline --env cartpole --n 64 --out timeline_cartpole.txt

envmgr's default layout (2 workers, each stepping ``n / 2`` envs, and a parent that sleeps
until the last worker rings it) steps ``--batches`` batches while every process notes
``time.perf_counter()`` (``CLOCK_MONOTONIC``, one clock for all processes) at these points:

    parent   post ---------------------------------------------- wake ----- post
    worker       pick-up  own  env steps  own+infos  publish (ring)

The notes come from wrappers around the doorbells' and the env group's methods, installed
before the workers are forked (start method ``fork``, so the wrappers reach them); each note
is a ``perf_counter()`` call and a list append, well under a microsecond. For each batch:

* *pick-up*: from the parent's post to the worker seeing the command (its spin);
* *env steps*: the envs' own ``step`` (and autoreset) time, as the group times it;
* *worker's own*: the rest from the command to its publish: reading actions, the step
  loop, writing observations, rewards and info columns to shared memory;
* *publish*: storing DONE (the last worker also rings the parent's wake-up pipe);
* *wake*: from the last worker's publish to the parent's batch wait returning (woken
  from its ``poll``, or seeing it while it spins);
* *parent*: from that return to the next post: envmgr's read of the batch, the caller's
  loop (here, picking the next pre-sampled actions) and the next step's checks and writes;
* *imbalance*: how much later the last worker finished than the first.

The ceiling's batch (two processes, each stepping ``n / 2`` envs in a plain loop, no
communication: ``ceiling.py``) is timed in the same run, so the table ends with the
overhead every batch carries over it.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import envs as bench_envs
from benchmarks._common import realenv_peers  # noqa: F401  (adds the real envs to envs.FACTORIES)
from benchmarks._common.ceiling import Ceiling
from benchmarks._common.run_context import machine_info
from benchmarks._common.timing import sample_actions
from envmgr import SubprocessEnvManager
from envmgr.backends.local import doorbell, worker_doorbell
from envmgr.envside import single_group

_clock = time.perf_counter


class Notes:
    """Per-process timestamp lists, each saved as ``<dir>/<name>_<pid>.npy`` once full."""

    def __init__(self, directory: str, count: int) -> None:
        self.directory = directory
        self.count = count
        self.lists: dict[str, list[float]] = {}

    def note(self, name: str, value: float) -> None:
        got = self.lists.setdefault(name, [])
        if len(got) < self.count:
            got.append(value)
            if len(got) == self.count:
                np.save(f"{self.directory}/{name}_{os.getpid()}.npy", np.array(got))

    def load(self, name: str) -> dict[int, np.ndarray]:
        """Every process's notes of ``name``, by pid."""
        out = {}
        for path in glob.glob(f"{self.directory}/{name}_*.npy"):
            match = re.search(r"_(\d+)\.npy$", path)
            assert match is not None
            out[int(match.group(1))] = np.load(path)
        return out


def _wrap(owner: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
    setattr(owner, name, make(getattr(owner, name)))


def instrument(notes: Notes) -> None:
    """Wrap the methods whose calls mark the segments (this process and its forks)."""
    note = notes.note

    def worker_wait(f: Callable[..., Any]) -> Callable[..., Any]:
        def wait(self: Any) -> Any:
            got = f(self)
            if isinstance(got, tuple):  # a step announced in shared memory
                note("pick", _clock())
            return got

        return wait

    def step_done(f: Callable[..., Any]) -> Callable[..., Any]:
        def done(self: Any, seq: int, has_message: bool) -> None:
            note("publish", _clock())
            f(self, seq, has_message)
            note("published", _clock())

        return done

    def group_step(f: Callable[..., Any]) -> Callable[..., Any]:
        def step(self: Any, actions: Any) -> Any:
            before = sum(self.env_sec)
            got = f(self, actions)
            note("env", sum(self.env_sec) - before)
            return got

        return step

    def announce(f: Callable[..., Any]) -> Callable[..., Any]:
        def post(self: Any, workers: Any, seq: int, kind: int) -> None:
            note("post", _clock())
            f(self, workers, seq, kind)

        return post

    def wait_all(f: Callable[..., Any]) -> Callable[..., Any]:
        def wait(self: Any, seq: int, *args: Any, **kwargs: Any) -> Any:
            got = f(self, seq, *args, **kwargs)
            note("woke", _clock())
            return got

        return wait

    _wrap(worker_doorbell.WorkerDoorbell, "wait", worker_wait)
    _wrap(worker_doorbell.WorkerDoorbell, "step_done", step_done)
    _wrap(single_group.SingleEnvGroup, "step", group_step)
    _wrap(doorbell.ParentDoorbell, "post_command", announce)
    _wrap(doorbell.ParentDoorbell, "wait_all", wait_all)


def segments(notes: Notes, skip: int) -> dict[str, np.ndarray]:
    """Per-batch segments in µs, the batches after the first ``skip`` (warm-up, resets)."""
    (post,) = notes.load("post").values()
    (woke,) = notes.load("woke").values()
    pick, env = notes.load("pick"), notes.load("env")
    publish, published = notes.load("publish"), notes.load("published")
    workers = sorted(pick)
    rows: dict[str, list[float]] = {}
    for b in range(skip, len(post) - 1):
        t = post[b]
        row: dict[str, float] = {}
        ends = []
        for w, pid in enumerate(workers):
            # A command seen in shared memory is always a step, so the k-th pick-up and
            # the k-th group step are one batch; publish also marks resets (by time, then).
            k = int(np.searchsorted(pick[pid], t))
            q = int(np.searchsorted(publish[pid], t))
            if k >= min(len(pick[pid]), len(env[pid])) or q >= len(published[pid]):
                break
            row[f"pick-up, worker {w}"] = pick[pid][k] - t
            row[f"env steps, worker {w}"] = env[pid][k]
            row[f"worker's own, worker {w}"] = publish[pid][q] - pick[pid][k] - env[pid][k]
            row[f"publish, worker {w}"] = published[pid][q] - publish[pid][q]
            ends.append(publish[pid][q])
        else:
            i = int(np.searchsorted(woke, max(ends)))
            if i >= len(woke) or woke[i] > post[b + 1]:
                continue
            row["wake (last publish -> parent runs)"] = woke[i] - max(ends)
            row["parent (runs -> next post)"] = post[b + 1] - woke[i]
            row["imbalance (last - first finish)"] = max(ends) - min(ends)
            row["batch (post -> next post)"] = post[b + 1] - t
            for key, value in row.items():
                rows.setdefault(key, []).append(value * 1e6)
    return {key: np.array(values) for key, values in rows.items()}


def parser(doc: str, n_help: str, seconds_help: str) -> argparse.ArgumentParser:
    """The options a timeline script takes (``--env --n --batches --seconds --out``)."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="halfcheetah", choices=sorted(bench_envs.FACTORIES))
    p.add_argument("--n", type=int, default=8, help=n_help)
    p.add_argument("--batches", type=int, default=3000, help="batches noted")
    p.add_argument("--seconds", type=float, default=2.0, help=seconds_help)
    p.add_argument("--out", help="also write the report here")
    return p


def main() -> None:
    p = parser(__doc__, "envs in all, split over 2 workers", "the ceiling's timed sample")
    args = p.parse_args()
    load = os.getloadavg()[0]
    factory = bench_envs.FACTORIES[args.env]
    actions = sample_actions(args.env, args.n, seed=0)
    skip = 200
    lines = [f"envmgr default layout, {args.env}: 2 workers x {args.n // 2} envs, fork"]
    with tempfile.TemporaryDirectory() as tmp:
        notes = Notes(tmp, args.batches + skip)
        instrument(notes)
        with SubprocessEnvManager([factory] * args.n, n_workers=2, context="fork") as vec:
            vec.reset(seed=0)
            notes.lists.clear()  # the parent's notes start at the first step
            for k in range(args.batches + skip + 2):
                vec.step(actions[k % len(actions)])
        got = segments(notes, skip)
    ceiling = Ceiling("serial", args.env, actions, 2)
    try:
        ceiling.warm_up(0.3)
        sample = ceiling.timed(args.seconds)
    finally:
        ceiling.close()
    per_batch = [r["seconds"] / r["batches"] * 1e6 for r in sample["per_process"]]
    batch = got["batch (post -> next post)"]
    lines.append(f"{len(batch)} batches; µs per batch")
    lines.append(f"{'segment':40s} {'median':>8s} {'mean':>8s} {'p10':>8s} {'p90':>8s}")
    for key, us in got.items():
        q10, q50, q90 = np.percentile(us, [10, 50, 90])
        lines.append(f"{key:40s} {q50:8.1f} {us.mean():8.1f} {q10:8.1f} {q90:8.1f}")
    c = float(np.mean(per_batch))
    lines.append(
        f"ceiling, same run: {' and '.join(f'{x:.1f}' for x in per_batch)} µs per batch of "
        f"{args.n // 2} envs in its two processes; envmgr's mean batch {batch.mean():.1f} µs "
        f"carries {batch.mean() - c:.1f} µs over their mean ({c / batch.mean():.2f} of the "
        "ceiling's rate)"
    )
    info = machine_info("not used")
    lines.append(
        f"{time.strftime('%Y-%m-%d')}, envmgr @ {info['git_commit']}"
        f"{' (uncommitted changes)' if info['git_dirty'] else ''}, {info['usable_cpus']} CPUs, "
        f"load average {load:.2f} at the start"
    )
    lines.append(f"command: python -m {__spec__.name} {' '.join(sys.argv[1:])}")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
