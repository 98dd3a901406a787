#!/usr/bin/env python
"""Where a batch step's time goes with ``caller_envs``, segment by segment, from timestamps.

Usage (from the repository root)::

    python -m benchmarks.probes.timeline_caller --env halfcheetah --n 8 --batches 3000 \\
        --out benchmarks/results/record/timeline_caller_halfcheetah.txt

The layout: one worker steps the first ``n / 2`` envs, the calling process the other
``n / 2`` (``caller_envs``), two processes on two cores as in the ceiling. Both processes
note ``time.perf_counter()`` (``CLOCK_MONOTONIC``, one clock for both) at these points of
every batch, as :mod:`timeline` does for the default layout::

    caller  step() -- post -- own group: envs + own work -- served -- woke -- step() returns
    worker             pick-up -- own group: envs + own work -- served -- publish

Segments, per batch:

* *front end*: from the loop calling ``step`` to the post (action checks, the action write);
* *to the group*: from the post to that side's group starting its step (the caller's own
  dispatch; the worker's spin noticing the command);
* *env steps*: the envs' own ``step`` (and autoreset) time, as the group times it;
* *own work in the group*: the rest of the group's step (reading actions, the loop's
  bookkeeping, writing observations, rewards and flags);
* *after the group*: from the group's step returning to its answer being ready (the info
  write to shared memory, the answer), and for the worker its publish;
* *waiting for the worker*: the caller, from its own answer to seeing the batch done;
* *read back*: from there to ``step`` returning (the batch copied out, infos built);
* *the loop*: from ``step`` returning to the next call (here, indexing pre-sampled actions).

The caller's path is the batch's critical path whenever the worker finishes first, so the
report adds up what is on it besides env steps (*the caller's own work*), and times the
lock-step bound (:class:`ceiling.LockStep`, the same two processes behind a bare barrier) and
the ceiling in the same run. A report as JSON (``--json``) feeds ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks._common import envs as bench_envs
from benchmarks._common import realenv_peers  # noqa: F401  (adds the real envs to envs.FACTORIES)
from benchmarks._common.ceiling import Ceiling, LockStep
from benchmarks._common.run_context import machine_info
from benchmarks._common.timing import sample_actions
from benchmarks.probes.timeline import Notes, _wrap, parser
from envmgr import SubprocessEnvManager
from envmgr.backends.local import caller_group, doorbell, worker, worker_doorbell
from envmgr.envside import serve, single_group

_clock = time.perf_counter

#: The segments on the caller's path, in order; with its env steps they make its batch.
CALLER_PATH = [
    "front end (step called -> post)",
    "to the group, caller",
    "own work in the group, caller",
    "after the group, caller",
    "read back (woke -> step returns)",
    "the loop (step returns -> next call)",
]


def instrument(notes: Notes) -> None:
    """Wrap the methods whose calls mark the segments (this process and its forks)."""
    note = notes.note

    def group_step(f: Callable[..., Any]) -> Callable[..., Any]:
        def step(self: Any, actions: Any) -> Any:
            before = sum(self.env_sec)
            start = _clock()
            got = f(self, actions)
            note("ended", _clock())
            note("started", start)
            note("env", sum(self.env_sec) - before)
            return got

        return step

    def marked(name: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        def wrap(f: Callable[..., Any]) -> Callable[..., Any]:
            def call(*args: Any, **kwargs: Any) -> Any:
                got = f(*args, **kwargs)
                note(name, _clock())
                return got

            return call

        return wrap

    def announce(f: Callable[..., Any]) -> Callable[..., Any]:
        def post(self: Any, *args: Any) -> None:
            note("post", _clock())
            f(self, *args)

        return post

    def step_done(f: Callable[..., Any]) -> Callable[..., Any]:
        def done(self: Any, *args: Any) -> None:
            f(self, *args)
            note("published", _clock())

        return done

    _wrap(single_group.SingleEnvGroup, "step", group_step)
    # The caller group's step and the worker's loop each call serve_step by name.
    _wrap(serve, "serve_step", marked("served"))
    worker.serve_step = serve.serve_step  # type: ignore[attr-defined]
    caller_group.serve_step = serve.serve_step  # type: ignore[attr-defined]
    _wrap(doorbell.ParentDoorbell, "post_command", announce)
    _wrap(doorbell.ParentDoorbell, "wait_all", marked("woke"))
    _wrap(worker_doorbell.WorkerDoorbell, "step_done", step_done)


def segments(notes: Notes, caller: int, skip: int) -> dict[str, np.ndarray]:
    """Per-batch segments in µs, the batches after the first ``skip``."""
    mine = {k: notes.load(k)[caller] for k in ("call", "post", "started", "ended", "env")}
    mine |= {k: notes.load(k)[caller] for k in ("served", "woke", "returned")}
    (pid,) = (p for p in notes.load("started") if p != caller)
    other = {k: notes.load(k)[pid] for k in ("started", "ended", "env", "served", "published")}
    rows: dict[str, list[float]] = {}
    for b in range(skip, len(mine["post"]) - 1):
        post = mine["post"][b]
        # The worker's notes include its reset's publish: find this batch's by time.
        k = int(np.searchsorted(other["started"], post))
        q = int(np.searchsorted(other["published"], post))
        if k >= len(other["served"]) or q >= len(other["published"]):
            break
        row = {
            "front end (step called -> post)": post - mine["call"][b],
            "to the group, caller": mine["started"][b] - post,
            "env steps, caller": mine["env"][b],
            "own work in the group, caller": mine["ended"][b] - mine["started"][b] - mine["env"][b],
            "after the group, caller": mine["served"][b] - mine["ended"][b],
            "waiting for the worker, caller": mine["woke"][b] - mine["served"][b],
            "read back (woke -> step returns)": mine["returned"][b] - mine["woke"][b],
            "the loop (step returns -> next call)": mine["call"][b + 1] - mine["returned"][b],
            "pick-up, worker": other["started"][k] - post,
            "env steps, worker": other["env"][k],
            "own work in the group, worker": other["ended"][k]
            - other["started"][k]
            - other["env"][k],
            "after the group and publish, worker": other["published"][q] - other["ended"][k],
            "batch (post -> next post)": mine["post"][b + 1] - post,
        }
        for key, value in row.items():
            rows.setdefault(key, []).append(value * 1e6)
    return {key: np.array(values) for key, values in rows.items()}


def run_manager(env: str, n: int, batches: int, skip: int, directory: str) -> dict[str, Any]:
    """Step ``batches + skip`` batches of the caller layout with every process noting."""
    notes = Notes(directory, batches + skip)
    instrument(notes)
    actions = sample_actions(env, n, seed=0)
    factory = bench_envs.FACTORIES[env]
    half = n // 2
    with SubprocessEnvManager(
        [factory] * n, n_workers=1, envs_per_worker=half, caller_envs=half, context="fork"
    ) as vec:
        vec.reset(seed=0)
        notes.lists.clear()  # the caller's notes start at the first step
        for k in range(batches + skip + 2):
            notes.note("call", _clock())
            vec.step(actions[k % len(actions)])
            notes.note("returned", _clock())
    return segments(notes, os.getpid(), skip)


def bounds(env: str, n: int, seconds: float) -> dict[str, float]:
    """µs per batch of the lock-step bound and the ceiling (mean of its processes)."""
    actions = sample_actions(env, n, seed=0)
    out = {}
    for name, cls in (("lock-step", LockStep), ("ceiling", Ceiling)):
        runner = cls("serial", env, actions, 2)
        try:
            runner.warm_up(0.3)
            sample = runner.timed(seconds)
        finally:
            runner.close()
        per = sample.get("per_process", [sample])
        out[name] = float(np.mean([r["seconds"] / r["batches"] * 1e6 for r in per]))
    return out


def report(args: argparse.Namespace, got: dict[str, np.ndarray], bound: dict[str, float]) -> dict:
    """The medians, the caller's own work on its path, and the bounds beside the batch."""
    medians = {key: float(np.median(us)) for key, us in got.items()}
    own = sum(medians[key] for key in CALLER_PATH)
    info = machine_info("not used")
    return {
        "command": f"python -m {__spec__.name} " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"),
        "git_commit": info["git_commit"],
        "git_dirty": info["git_dirty"],
        "usable_cpus": info["usable_cpus"],
        "env": args.env,
        "n_envs": args.n,
        "batches": len(got["batch (post -> next post)"]),
        "median_us": medians,
        "p90_us": {key: float(np.percentile(us, 90)) for key, us in got.items()},
        "caller_own_us": own,
        "caller_own_share_of_env": own / medians["env steps, caller"],
        "bounds_us": bound,
    }


def text(rep: dict[str, Any]) -> str:
    """The report as the table the results file keeps."""
    half = rep["n_envs"] // 2
    lines = [
        f"envmgr caller_envs, {rep['env']}: 1 worker x {half} envs + the caller's {half}, fork",
        f"{rep['batches']} batches; µs per batch",
        f"{'segment':42s} {'median':>8s} {'p90':>8s}",
    ]
    for key, median in rep["median_us"].items():
        lines.append(f"{key:42s} {median:8.1f} {rep['p90_us'][key]:8.1f}")
    batch, bound = rep["median_us"]["batch (post -> next post)"], rep["bounds_us"]
    lines += [
        f"the caller's own work on its path (all but env steps and waiting): "
        f"{rep['caller_own_us']:.1f} µs, {rep['caller_own_share_of_env']:.2f} of its env steps",
        f"same run, µs per batch: lock-step {bound['lock-step']:.1f}, ceiling "
        f"{bound['ceiling']:.1f}; envmgr's median batch {batch:.1f} is "
        f"{bound['lock-step'] / batch:.2f} of lock-step's rate, {bound['ceiling'] / batch:.2f} "
        "of the ceiling's",
        f"{rep['date']}, envmgr @ {rep['git_commit']}"
        f"{' (uncommitted changes)' if rep['git_dirty'] else ''}, {rep['usable_cpus']} CPUs",
        f"command: {rep['command']}",
    ]
    return "\n".join(lines) + "\n"


def main() -> None:
    p = parser(__doc__, "envs in all, half the caller's", "the bounds' timed samples")
    p.add_argument("--json", help="also write the report as JSON here")
    args = p.parse_args()
    if args.n < 2 or args.n % 2:
        p.error("--n must be even and at least 2")
    with tempfile.TemporaryDirectory() as tmp:
        got = run_manager(args.env, args.n, args.batches, 200, tmp)
    rep = report(args, got, bounds(args.env, args.n, args.seconds))
    out = text(rep)
    print(out, end="")
    if args.out:
        Path(args.out).write_text(out)
    if args.json:
        Path(args.json).write_text(json.dumps(rep, indent=1) + "\n")


if __name__ == "__main__":
    main()
