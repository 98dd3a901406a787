#!/usr/bin/env python
"""What the front end's action check costs per batch, in each ``check_actions`` mode.

Times ``ActionChecks.check_batch`` (the call ``step`` makes before anything is sent) on
a valid batch of ``--n-envs`` actions for a few action spaces, in one process with no
worker: the check reads only the space and the batch. Each round is ``timeit`` of
``--number`` calls after a warm-up call (the first check of a dtype is done once per
manager); the result is the median over ``--rounds`` rounds, modes and spaces
interleaved within each round.

Rerun, and put the result into README.md::

    python -m benchmarks.report.record_outputs check-cost
    python -m benchmarks.report.doc_tables --write

or on its own: ``python -m benchmarks.probes.check_cost [--rounds 7] [--json PATH]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.frontend.action_checks import ActionChecks
from envmgr.frontend.validation import ACTION_CHECK_MODES
from envmgr.protocol.layout import Layout

#: (label, space, batch of n valid actions); the batch dtypes are what a policy hands over.
Case = tuple[str, gym.Space[Any], Callable[[int], Any]]


def cases() -> list[Case]:
    box = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    bits = gym.spaces.MultiBinary(8)
    aim = gym.spaces.Dict({"aim": gym.spaces.Box(-1.0, 1.0, (2,)), "fire": gym.spaces.Discrete(2)})
    return [
        ("Discrete(2), int64 batch", gym.spaces.Discrete(2), lambda n: np.zeros(n, np.int64)),
        ("Box(6,) float32, float32 batch", box, lambda n: np.zeros((n, 6), np.float32)),
        ("MultiBinary(8), int8 batch", bits, lambda n: np.zeros((n, 8), np.int8)),
        ("MultiBinary(8), int64 batch", bits, lambda n: np.zeros((n, 8), np.int64)),
        ("Dict(aim: Box(2,), fire: Discrete(2))", aim,
         lambda n: {"aim": np.zeros((n, 2), np.float32), "fire": np.zeros(n, np.int64)}),
    ]  # fmt: skip


def measure(n_envs: int, rounds: int, number: int) -> dict[str, Any]:
    """Median µs per ``check_batch`` call for every case and mode, with every round kept."""
    layout = Layout.split(n_envs, 2)
    timers: dict[tuple[str, str], timeit.Timer] = {}
    for label, space, batch in cases():
        for mode in ACTION_CHECK_MODES:
            checks = ActionChecks(space, layout, "worker", mode)
            actions = batch(n_envs)
            checks.check_batch(actions)  # the first check of a dtype, done once per manager
            g = {"check": checks.check_batch, "actions": actions}
            timers[label, mode] = timeit.Timer("check(actions)", globals=g)
    per_round: dict[tuple[str, str], list[float]] = {k: [] for k in timers}
    for _ in range(rounds):
        for key, timer in timers.items():
            per_round[key].append(timer.timeit(number) / number * 1e6)
    return {
        "config": {"n_envs": n_envs, "rounds": rounds, "number": number},
        "modes": list(ACTION_CHECK_MODES),
        "cases": [
            {
                "space": label,
                "mode": mode,
                "median_us": statistics.median(us),
                "rounds_us": [round(x, 4) for x in us],
            }
            for (label, mode), us in per_round.items()
        ],
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n-envs", type=int, default=64, help="batch size (default 64)")
    p.add_argument("--rounds", type=int, default=7, help="rounds; the median is reported")
    p.add_argument("--number", type=int, default=20_000, help="calls timed per round")
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args(argv)
    result = measure(args.n_envs, args.rounds, args.number)
    print(f"µs per check_batch call, batch of {args.n_envs}, median of {args.rounds} rounds")
    print(f"{'space':<40}" + "".join(f"{m:>10}" for m in result["modes"]))
    by_space: dict[str, dict[str, float]] = {}
    for c in result["cases"]:
        by_space.setdefault(c["space"], {})[c["mode"]] = c["median_us"]
    for space, us in by_space.items():
        print(f"{space:<40}" + "".join(f"{us[m]:>10.2f}" for m in result["modes"]))
    if args.json is not None:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
