#!/usr/bin/env python
"""The cost of envmgr's hand-off itself: parent CPU per worker count, and the wake-up floor.

Usage (from the repository root; both also run inside ``throughput.py``)::

    python benchmarks/handoff.py scaling --workers 1,2,4,8,16 --envs-per-worker 4
    python benchmarks/handoff.py floor --workers 1,2

``scaling``: envmgr on the no-op env with 4 envs per worker, for 1, 2, 4, 8 and 16 workers,
all built at once and timed in interleaved rounds. Reported: the parent process's CPU time
per batch step (``time.process_time``, so waiting for the workers does not count), and the
least-squares slope in µs per added worker: the per-worker part of the parent's cost,
which decides the ceiling on machines with many cores.

``floor``: the least a batch round trip can cost with envmgr's wake-up mechanism. A parent
and ``W`` worker processes ping-pong on exactly the pieces envmgr uses
(:mod:`envmgr.backends.local.doorbell`: command and done words in shared memory, the worker spinning
then sleeping on its pipe, the last worker waking the parent through the shared wake-up
pipe) with nothing else: no envs, no actions, no observations. Timed in the same rounds as
envmgr's own one-batch round trip on the no-op env with ``W`` workers x 1 env; envmgr /
floor says how much the rest of a step (checks, copies, the worker's env loop) adds.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import select
import sys
import traceback
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

import envs as bench_envs  # noqa: E402
from timing import (  # noqa: E402
    Runner,
    medians,
    per_round_ratios,
    rotated,
    sample_actions,
    timed_sample,
)

from envmgr import SubprocessEnvManager  # noqa: E402

bench_envs.make_picklable()

_ROW = 8  # int64 words per control row, as in envmgr.backends.local.doorbell
#: Longest wait for a floor worker to start (spawn imports numpy and envmgr).
START_TIMEOUT = 60.0


# ============================================================================ the floor


def _floor_worker(
    conn: Connection,
    wake: Connection,
    shm_name: str,
    rows: int,
    index: int,
    spin: float,
    work: tuple[str, int, np.ndarray] | None = None,
) -> None:
    """Answer every announced step through envmgr's WorkerDoorbell: at once, or after
    stepping a block of ``work = (env name, seed, actions)`` envs (:class:`FloorPingPong`)."""
    shm = SharedMemory(name=shm_name)
    block = None
    try:
        try:
            from envmgr.backends.local.worker_doorbell import WorkerDoorbell

            if work is not None:
                from ceiling import build_block

                name, seed, actions = work
                block = build_block("serial", name, actions.shape[1])
                block.reset(seed=seed)

            control: np.ndarray = np.ndarray((rows, _ROW), dtype=np.int64, buffer=shm.buf)
            parent = os.getppid()
            bell = WorkerDoorbell(
                control, index, conn, wake.fileno(), spin, lambda: os.getppid() == parent
            )
        except Exception:  # the signalling interface changed: tell the parent why
            conn.send_bytes(traceback.format_exc().encode())
            return
        # The doorbell takes the command word it finds as already seen: the parent must
        # not announce anything before this point, so say when it is reached.
        conn.send_bytes(b"ready")
        step = None if block is None else block.step
        k = 0
        while True:
            got = bell.wait()
            if not isinstance(got, tuple):  # None: parent gone; bytes: told to stop
                break
            if step is not None:
                step(actions[k % len(actions)])
                k += 1
            bell.step_done(got[0], False)
        del bell, control
    finally:
        if block is not None:
            block.close()
        shm.close()


class FloorPingPong:
    """A parent and ``n_workers`` processes ping-ponging on envmgr's doorbell, nothing else.

    ``step(_)`` is one batch round trip: announce a step to every worker, sleep until the
    last one has answered, exactly as the manager's step path does around its real work.

    With ``work``, each worker also steps its block of envs (``ceiling.py``'s plain loop,
    its own columns of the actions) before it answers: the default layout's lock-step
    bound. The structure is envmgr's (a sleeping parent woken by the last worker, three
    processes on two cores for two workers); no actions, observations or infos cross.

    Args:
        n_workers: Worker processes.
        spin_seconds: The workers' spin budget (use the manager's).
        parent_spin_seconds: How long the parent busy-polls before sleeping (the manager's).
        work: ``(env name in envs.FACTORIES, actions (batches, n_envs, ...))``; the envs
            are split between the workers in order, env ``i`` reset with seed ``i``.
    """

    def __init__(
        self,
        n_workers: int,
        spin_seconds: float,
        parent_spin_seconds: float = 0.0,
        work: tuple[str, np.ndarray] | None = None,
    ) -> None:
        from envmgr.backends.local.doorbell import KIND_STEP, ParentDoorbell
        from envmgr.backends.local.wait import Until

        self.kind = KIND_STEP
        self.ready = Until.READY
        self.parent_spin = parent_spin_seconds
        rows = n_workers + 1
        self.shm = SharedMemory(create=True, size=rows * _ROW * 8)
        self.control: np.ndarray = np.ndarray((rows, _ROW), dtype=np.int64, buffer=self.shm.buf)
        self.control[:] = 0
        ctx = mp.get_context("spawn")
        self.wake_r, self.wake_w = ctx.Pipe(duplex=False)
        os.set_blocking(self.wake_r.fileno(), False)
        self.conns: list[Connection] = []
        self.procs: list[Any] = []
        try:
            shares: list[tuple[str, int, np.ndarray] | None] = [None] * n_workers
            if work is not None:
                name, actions = work
                n = actions.shape[1]
                sizes = [n // n_workers + (1 if w < n % n_workers else 0) for w in range(n_workers)]
                starts = np.cumsum([0, *sizes])
                shares = [
                    (name, int(a), np.ascontiguousarray(actions[:, a : a + size]))
                    for a, size in zip(starts, sizes, strict=False)
                ]
            for w in range(n_workers):
                mine, theirs = ctx.Pipe(duplex=True)
                proc = ctx.Process(
                    target=_floor_worker,
                    args=(theirs, self.wake_w, self.shm.name, rows, w, spin_seconds, shares[w]),
                    daemon=True,
                )
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
            for w, conn in enumerate(self.conns):
                if not conn.poll(START_TIMEOUT):
                    raise TimeoutError(f"floor worker {w} did not start in {START_TIMEOUT} s")
                got = conn.recv_bytes()
                if got != b"ready":
                    raise RuntimeError(f"floor worker {w} failed: {got.decode()[-600:]}")
            self.poller = select.poll()
            self.poller.register(self.wake_r.fileno(), select.POLLIN)
            for proc in self.procs:
                self.poller.register(proc.sentinel, select.POLLIN)
            self.bell = ParentDoorbell(self.control, self.conns, self.wake_r.fileno(), self.poller)
            self.workers = range(n_workers)
            self.seq = 0
        except BaseException:
            self.close()
            raise

    def reset(self, *, seed: int | None = None) -> None:
        """Nothing: the workers reset their envs when they build them."""

    def step(self, _actions: Any = None) -> None:
        bell, seq = self.bell, self.seq + 1
        self.seq = seq
        bell.announce(self.workers, seq, self.kind)
        # The manager's own batch wait (spin for parent_spin_seconds, then sleep until the
        # finisher rings); anything but READY is a poll event other than the wake-up: a
        # sentinel.
        while bell.wait_all(seq, self.parent_spin) is not self.ready:
            if not all(p.is_alive() for p in self.procs):
                raise RuntimeError("a floor worker died")

    def close(self) -> None:
        for conn in self.conns:
            try:
                conn.send_bytes(b"stop")
            except OSError:
                pass
        for proc in self.procs:
            proc.join(5)
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
        for c in (*self.conns, self.wake_r, self.wake_w):
            c.close()
        self.conns, self.procs = [], []
        # The doorbell's memoryviews pin the segment's buffer: drop them before closing it.
        self.bell = None  # type: ignore[assignment]
        self.control = np.empty(0)
        self.shm.close()
        self.shm.unlink()


# ============================================================================ measurements


def _rounds(
    runners: list[Runner], n_envs: dict[str, int], args: argparse.Namespace, label: str, bar: Any
) -> dict[str, list[dict[str, Any]]]:
    """Time ``runners`` in interleaved rounds; samples by implementation."""
    samples: dict[str, list[dict[str, Any]]] = {r.impl: [] for r in runners}
    for rnd in range(args.repeats):
        for r in rotated(runners, rnd):
            bar.set_description(f"{label}: round {rnd + 1} {r.impl}")
            s = timed_sample(r, n_envs[r.impl], args.seconds, args.pre_sample_steps)
            s["round"] = rnd
            samples[r.impl].append(s)
        bar.update(1)
    return samples


def measure_overhead(
    layouts: list[tuple[int, int]], args: argparse.Namespace, bar: Any
) -> list[dict[str, Any]]:
    """envmgr on the no-op env: wall and parent-CPU µs per batch step, per layout.

    The envs do (almost) nothing, so the wall time per batch step is the manager's own cost:
    the parent's bookkeeping plus the round trip to the workers. The serial loop over the
    same number of no-op envs is timed alongside, as the cost of the envs themselves;
    check_actions=False (and with copy=False) shows what the check and the copy cost.
    """
    from ceiling import SerialLoop

    out = []
    for workers, per_worker in layouts:
        n = workers * per_worker
        actions = sample_actions("noop", n, 7)
        variants = {
            "envmgr": {},
            "envmgr-nocheck": {"check_actions": False},
            "envmgr-nocopy-nocheck": {"check_actions": False, "copy": False},
        }
        runners: list[Runner] = []
        try:
            for name, kwargs in variants.items():
                bar.set_description(f"overhead {workers}x{per_worker}: build {name}")
                mgr = SubprocessEnvManager(bench_envs.make_noop, workers, per_worker, **kwargs)
                runners.append(Runner(name, mgr, actions))
                mgr.reset(seed=0)
            runners.append(Runner("serial", SerialLoop(bench_envs.make_noop, n), actions))
            runners[-1].vec.reset(seed=0)
            for r in runners:
                r.warm_up(args.warmup)
            samples = _rounds(
                runners, dict.fromkeys(variants, n) | {"serial": n}, args, "overhead", bar
            )
        finally:
            for r in runners:
                r.vec.close()
        out.append(
            {
                "n_workers": workers,
                "envs_per_worker": per_worker,
                "n_envs": n,
                "samples": samples,
                "median_us_per_batch": medians(samples, "us_per_batch"),
                "median_parent_cpu_us_per_batch": medians(samples, "parent_cpu_us_per_batch"),
            }
        )
    return out


def measure_scaling(
    workers_list: list[int], envs_per_worker: int, args: argparse.Namespace, bar: Any
) -> dict[str, Any]:
    """Parent CPU µs per batch step on the no-op env for each worker count (issue 13 item 4)."""
    runners: list[Runner] = []
    n_envs: dict[str, int] = {}
    try:
        for w in workers_list:
            n = w * envs_per_worker
            bar.set_description(f"scaling: build {w} workers x {envs_per_worker}")
            mgr = SubprocessEnvManager(bench_envs.make_noop, w, envs_per_worker)
            r = Runner(f"{w}", mgr, sample_actions("noop", n, 7))
            runners.append(r)
            mgr.reset(seed=0)
            r.warm_up(args.warmup)
            n_envs[r.impl] = n
        samples = _rounds(runners, n_envs, args, "scaling", bar)
    finally:
        for r in runners:
            r.vec.close()
    cpu = medians(samples, "parent_cpu_us_per_batch")
    xs = np.array(workers_list, dtype=float)
    ys = np.array([cpu[str(w)] for w in workers_list])
    slope = float(np.polyfit(xs, ys, 1)[0]) if len(xs) > 1 else float("nan")
    return {
        "env": "noop",
        "envs_per_worker": envs_per_worker,
        "workers": workers_list,
        "samples": samples,
        "median_parent_cpu_us_per_batch": cpu,
        "median_us_per_batch": medians(samples, "us_per_batch"),
        "slope_parent_cpu_us_per_worker": slope,
    }


def measure_floor(workers_list: list[int], args: argparse.Namespace, bar: Any) -> dict[str, Any]:
    """The wake-up floor against envmgr's one-batch no-op round trip (issue 13 item 5)."""
    out: dict[str, Any] = {"layouts": []}
    for w in workers_list:
        runners: list[Runner] = []
        entry: dict[str, Any] = {"n_workers": w, "envs_per_worker": 1}
        try:
            mgr = SubprocessEnvManager(bench_envs.make_noop, w, 1)
            actions = sample_actions("noop", w, 7)
            runners.append(Runner("envmgr", mgr, actions))
            mgr.reset(seed=0)
            spin = getattr(mgr, "spin_seconds", 1e-3)  # envmgr's default where not exposed
            parent_spin = getattr(mgr, "parent_spin_seconds", 0.0)
            entry["spin_seconds"], entry["parent_spin_seconds"] = spin, parent_spin
            try:
                floor = FloorPingPong(w, spin, parent_spin)
            except Exception as exc:  # the signalling API moved: say so, keep the rest
                entry["error"] = f"floor unavailable: {type(exc).__name__}: {exc}"
            else:
                runners.append(Runner("floor", floor, actions))
            for r in runners:
                r.warm_up(args.warmup)
            samples = _rounds(runners, {"envmgr": w, "floor": w}, args, f"floor {w}x1", bar)
        finally:
            for r in runners:
                r.vec.close()
        entry["samples"] = samples
        entry["median_us_per_batch"] = medians(samples, "us_per_batch")
        entry["median_parent_cpu_us_per_batch"] = medians(samples, "parent_cpu_us_per_batch")
        entry["ratio_envmgr_over_floor"] = per_round_ratios(
            samples, "envmgr", "floor", key="us_per_batch"
        )
        out["layouts"].append(entry)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=["scaling", "floor"])
    p.add_argument(
        "--workers", default=None, help="worker counts (scaling: 1,2,4,8,16; floor: 1,2)"
    )
    p.add_argument("--envs-per-worker", type=int, default=4, help="scaling only (default: 4)")
    p.add_argument("--seconds", type=float, default=1.0, help="per sample (default: 1)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved rounds (default: 5)")
    p.add_argument("--warmup", type=float, default=0.3)
    p.add_argument("--pre-sample-steps", type=int, default=10)
    args = p.parse_args(argv)
    from bench_report import floor_text, scaling_text
    from tqdm import tqdm

    default = "1,2,4,8,16" if args.what == "scaling" else "1,2"
    workers = [int(x) for x in (args.workers or default).split(",") if x.strip()]
    rounds = args.repeats * (1 if args.what == "scaling" else len(workers))
    with tqdm(total=rounds, file=sys.stderr) as bar:
        if args.what == "scaling":
            text = scaling_text(measure_scaling(workers, args.envs_per_worker, args, bar))
        else:
            text = floor_text(measure_floor(workers, args, bar))
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
