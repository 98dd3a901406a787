#!/usr/bin/env python
"""What a system call costs here, as Python makes it: the floor under every wake-up.

Times, in one process, a few calls that enter the kernel and return at once, next to one
that does not (``time.perf_counter_ns``: clock_gettime through the vDSO, no syscall):
``os.getppid()`` (one bare syscall; glibc does not cache it), ``select.poll().poll(0)``
on an empty pipe, and ``os.write`` + ``os.read`` of one byte on a pipe (two syscalls).
Each round is ``timeit`` of ``--number`` calls, the calls interleaved round by round;
the result is the median over ``--rounds`` rounds, per call, Python's call included.

Rerun, and put the result into README.md and docs/performance.md::

    python -m benchmarks.report.record_outputs syscall
    python -m benchmarks.report.doc_tables --write

or on its own: ``python -m benchmarks.probes.syscall_cost [--rounds 7] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import statistics
import time
import timeit
from pathlib import Path
from typing import Any

#: name -> what it does, shown in the result.
CALLS = {
    "perf_counter_ns": "time.perf_counter_ns(): no syscall (vDSO), for scale",
    "getppid": "os.getppid(): one bare syscall",
    "poll": "select.poll().poll(0) on an empty pipe: one syscall",
    "pipe_write_read": "os.write + os.read of 1 byte on a pipe: two syscalls",
}


def measure(rounds: int, number: int) -> dict[str, Any]:
    """Median ns per call of each of ``CALLS``, with every round kept."""
    r, w = os.pipe()
    try:
        poller = select.poll()
        poller.register(r, select.POLLIN)
        poll = poller.poll

        def pipe_write_read() -> None:
            os.write(w, b"x")
            os.read(r, 1)

        timers = {
            "perf_counter_ns": timeit.Timer("f()", globals={"f": time.perf_counter_ns}),
            "getppid": timeit.Timer("f()", globals={"f": os.getppid}),
            "poll": timeit.Timer("f(0)", globals={"f": poll}),
            "pipe_write_read": timeit.Timer("f()", globals={"f": pipe_write_read}),
        }
        per_round: dict[str, list[float]] = {k: [] for k in timers}
        for _ in range(rounds):
            for name, timer in timers.items():
                per_round[name].append(timer.timeit(number) / number * 1e9)
    finally:
        os.close(r)
        os.close(w)
    return {
        "config": {"rounds": rounds, "number": number},
        "calls": {
            name: {
                "what": CALLS[name],
                "median_ns": statistics.median(ns),
                "rounds_ns": [round(x, 1) for x in ns],
            }
            for name, ns in per_round.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="rounds; the median is reported")
    p.add_argument("--number", type=int, default=200_000, help="calls timed per round")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args(argv)
    result = measure(args.rounds, args.number)
    print(f"ns per call, median of {args.rounds} rounds x {args.number:,} calls")
    for c in result["calls"].values():
        print(f"{c['median_ns']:>10,.0f}  {c['what']}")
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
