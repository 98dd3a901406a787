#!/usr/bin/env python
"""What one Ray actor call costs here, against a pipe round trip between two processes.

Three round trips, driver to one actor and back, each timed call by call, ``--calls`` calls
in a row per round (a round's value: its median call), the kinds interleaved round by round
after ``--warmup`` seconds of calls; the result is the median over ``--rounds`` rounds, and
each Ray kind's ratio to ``ray_arrays`` the median of the per-round ratios:

* ``ray_bare``: ``ray.get(actor.echo.remote(None))``, nothing carried;
* ``ray_arrays``: a 64-env CartPole step's arrays as Ray passes them: the actions
  (int64) in, a tuple of observations, rewards, terminated and truncated out;
* ``ray_packed``: the same, each way as one pickled ``bytes`` (how ``RayEnvManager``
  sends payloads below 256 KiB), the pickling and unpickling included.

Before Ray starts, ``pipe`` times a ``multiprocessing`` pipe round trip (a forked child
answering 16 bytes with 16 bytes), the transport of envmgr's pickled commands; it moves
with where the scheduler puts the two processes (one core or two), more from run to run
than between the rounds of one run. Ray runs
on this machine alone (``ray.init(num_cpus=2, include_dashboard=False)``, usage stats
off) and is shut down at the end; the run takes well under a minute.

Rerun, and put the result into README.md and docs/ray.md::

    python -m benchmarks.report.record_outputs ray-call
    python -m benchmarks.report.doc_tables --write

or on its own: ``python -m benchmarks.probes.ray_call [--rounds 9] [--calls 200] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import pickle
import statistics
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import numpy as np

N_ENVS = 64
KINDS = {
    "pipe": "multiprocessing pipe round trip to a child process, 16 bytes each way",
    "ray_bare": "Ray actor call, nothing carried",
    "ray_arrays": f"Ray actor call carrying a {N_ENVS}-env CartPole step as a tuple of arrays",
    "ray_packed": f"the same {N_ENVS}-env step as one pickled bytes each way",
}


def step_answer(n: int) -> tuple[np.ndarray, ...]:
    """What a CartPole step of ``n`` envs answers: observations, rewards and two flags."""
    return (
        np.zeros((n, 4), np.float32),
        np.zeros(n, np.float64),
        np.zeros(n, np.bool_),
        np.zeros(n, np.bool_),
    )


class Echo:
    """The actor: answers at once, with nothing or with a step's arrays."""

    def __init__(self, n: int) -> None:
        self.answer = step_answer(n)
        self.packed = pickle.dumps(self.answer, protocol=pickle.HIGHEST_PROTOCOL)

    def echo(self, x: Any) -> Any:
        return x

    def arrays(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        return self.answer

    def packed_step(self, payload: bytes) -> bytes:
        pickle.loads(payload)
        return pickle.dumps(self.answer, protocol=pickle.HIGHEST_PROTOCOL)


def _echo_child(conn: Connection) -> None:
    while (msg := conn.recv_bytes()) != b"":
        conn.send_bytes(msg)


def per_call_us(fn: Callable[[], Any], calls: int) -> float:
    """The median µs of ``calls`` calls of ``fn``, each timed on its own."""
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def pipe_rounds(rounds: int, calls: int) -> list[float]:
    """µs per pipe round trip, one value per round (measured before Ray starts: fork)."""
    parent, child = mp.get_context("fork").Pipe()
    proc = mp.get_context("fork").Process(target=_echo_child, args=(child,), daemon=True)
    proc.start()
    msg = b"x" * 16

    def trip() -> None:
        parent.send_bytes(msg)
        parent.recv_bytes()

    try:
        per_call_us(trip, 100)  # warm up
        return [per_call_us(trip, calls) for _ in range(rounds)]
    finally:
        parent.send_bytes(b"")
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()


def ray_rounds(rounds: int, calls: int, warmup: float) -> dict[str, list[float]]:
    """µs per Ray round trip of each kind, one value per round, after ``warmup`` seconds of
    calls (Ray's own processes are still starting for a few seconds after ``ray.init``)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = ray.remote(num_cpus=0)(Echo).remote(N_ENVS)  # type: ignore[attr-defined]
        actions = np.zeros(N_ENVS, np.int64)

        def packed() -> None:
            payload = pickle.dumps(actions, protocol=pickle.HIGHEST_PROTOCOL)
            pickle.loads(ray.get(actor.packed_step.remote(payload)))

        fns: dict[str, Callable[[], Any]] = {
            "ray_bare": lambda: ray.get(actor.echo.remote(None)),
            "ray_arrays": lambda: ray.get(actor.arrays.remote(actions)),
            "ray_packed": packed,
        }
        end = time.perf_counter() + warmup
        while time.perf_counter() < end:
            for fn in fns.values():
                per_call_us(fn, 10)
        out: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(rounds):
            for name, fn in fns.items():
                out[name].append(per_call_us(fn, calls))
        return out
    finally:
        ray.shutdown()


def measure(rounds: int, calls: int, warmup: float) -> dict[str, Any]:
    per_round = {"pipe": pipe_rounds(rounds, calls * 10)} | ray_rounds(rounds, calls, warmup)
    import ray

    pairs = zip(per_round["ray_packed"], per_round["ray_arrays"], strict=True)
    ratios = [packed / arrays for packed, arrays in pairs]
    return {
        "config": {
            "rounds": rounds,
            "ray_calls": calls,
            "pipe_calls": calls * 10,
            "warmup_seconds": warmup,
        },
        "n_envs": N_ENVS,
        "ray": ray.__version__,
        "kinds": {
            k: {
                "what": KINDS[k],
                "median_us": statistics.median(us),
                "rounds_us": [round(x, 2) for x in us],
            }
            for k, us in per_round.items()
        },
        "packed_over_arrays": {
            "median": statistics.median(ratios),
            "per_round": [round(x, 3) for x in ratios],
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=9, help="rounds; the median is reported")
    p.add_argument("--calls", type=int, default=200, help="Ray calls per round (pipe: 10x)")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of Ray calls first")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args(argv)
    result = measure(args.rounds, args.calls, args.warmup)
    print(f"µs per round trip, median of {args.rounds} rounds (Ray {result['ray']})")
    for k in result["kinds"].values():
        print(f"{k['median_us']:>10,.1f}  {k['what']}")
    ratio = result["packed_over_arrays"]["median"]
    print(f"pickled bytes / tuple of arrays: {ratio:.2f}x (median of per-round ratios)")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
