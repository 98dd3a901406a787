"""Variable-size observations: envmgr's shared-memory store against pickled transports.

A synthetic entity env (16 envs; 8-64 entities of 16 float32 features; about 20 µs of
work per step) stepped by::

    envmgr          SubprocessEnvManager, 2 workers: entities in shared memory
    envmgr_pickled  the same with ragged="pickled" (every observation pickled)
    async           gymnasium AsyncVectorEnv(shared_memory=False)
    sb3             SB3 SubprocVecEnv; it cannot stack lists of different lengths, so
                    its env pads them itself to 64 entities (what an SB3 user would do)
    ceiling         two processes, each stepping 8 envs in a plain loop, no messages

Each measurement runs in a fresh interpreter (``--one MODE``); rounds are interleaved
(every mode once per round, the order rotated), and the report gives each mode's median
env-steps/s and its ratio to the ceiling's median. Run from the repository root::

    python -m benchmarks.ragged_bench               # rounds of 10 s each
    python -m benchmarks.ragged_bench --quick       # a smoke run: tiny durations
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from multiprocessing import get_context
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

NUM_ENVS = 16
WORKERS = 2
FEATURES = 16
MIN_ENTITIES, MAX_ENTITIES = 8, 64
WORK_SECONDS = 20e-6
MODES = ("ceiling", "envmgr", "envmgr_pickled", "async", "sb3")


class EntityBenchEnv(gym.Env):  # type: ignore[type-arg]
    """Entities of 16 features, 8 to 64 of them per step; ``padded`` pads them to 64 in
    a fixed Box (for SB3, which stacks observations)."""

    def __init__(self, padded: bool = False) -> None:
        entities = spaces.Sequence(spaces.Box(-1, 1, (FEATURES,), np.float32), stack=True)
        self.padded = padded
        if padded:
            entities = spaces.Box(-1, 1, (MAX_ENTITIES, FEATURES), np.float32)
        self.observation_space = spaces.Dict(
            {"global": spaces.Box(-1, 1, (8,), np.float32), "entities": entities}
        )
        self.action_space = spaces.Discrete(4)
        self._pool = np.random.default_rng(0).uniform(-1, 1, (256, FEATURES)).astype(np.float32)
        self._global = np.zeros(8, np.float32)
        self.t = 0

    def _obs(self) -> dict[str, Any]:
        n = int(self.np_random.integers(MIN_ENTITIES, MAX_ENTITIES + 1))
        start = int(self.np_random.integers(0, 256 - n))
        entities = self._pool[start : start + n].copy()
        if self.padded:
            full = np.zeros((MAX_ENTITIES, FEATURES), np.float32)
            full[:n] = entities
            entities = full
        return {"global": self._global.copy(), "entities": entities}

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        end = time.perf_counter() + WORK_SECONDS
        while time.perf_counter() < end:
            pass
        self.t += 1
        return self._obs(), 0.0, False, self.t >= 500, {}


def _half(envs: int, seconds: float, out: Any) -> None:
    """The ceiling's process: ``envs`` envs stepped in a loop, autoreset by hand."""
    group = [EntityBenchEnv() for _ in range(envs)]
    for i, env in enumerate(group):
        env.reset(seed=i)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for env in group:
            _, _, term, trunc, _ = env.step(0)
            if term or trunc:
                env.reset()
        steps += envs
    out.put(steps)


def _ceiling(seconds: float) -> float:
    ctx = get_context("fork")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_half, args=(NUM_ENVS // WORKERS, seconds, out)) for _ in range(WORKERS)
    ]
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def _make(mode: str) -> Any:
    fns = [EntityBenchEnv] * NUM_ENVS
    if mode in ("envmgr", "envmgr_pickled"):
        from envmgr import SubprocessEnvManager

        ragged = "pickled" if mode == "envmgr_pickled" else "gymnasium"
        return SubprocessEnvManager(fns, WORKERS, ragged=ragged, capacity=MAX_ENTITIES)
    if mode == "async":
        return gym.vector.AsyncVectorEnv(fns, shared_memory=False)
    if mode == "sb3":
        from stable_baselines3.common.vec_env import SubprocVecEnv

        return SubprocVecEnv([lambda: EntityBenchEnv(padded=True)] * NUM_ENVS)
    raise ValueError(f"unknown mode {mode!r}")


def measure(mode: str, seconds: float) -> float:
    """Env-steps per second of ``mode`` over about ``seconds`` (after a short warm-up)."""
    if mode == "ceiling":
        return _ceiling(seconds)
    envs = _make(mode)
    actions = np.zeros(NUM_ENVS, dtype=np.int64)
    try:
        envs.reset() if mode == "sb3" else envs.reset(seed=0)
        step = envs.step
        for _ in range(20):
            step(actions)
        steps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            step(actions)
            steps += 1
        return steps * NUM_ENVS / (time.perf_counter() - t0)
    finally:
        envs.close()


def _fresh(mode: str, seconds: float) -> float:
    """:func:`measure` in a fresh interpreter."""
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.ragged_bench",
        "--one",
        mode,
        "--seconds",
        str(seconds),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout.strip().splitlines()[-1])["rate"])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--quick", action="store_true", help="a smoke run: 0.3 s, 1 round")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # one measurement, printed as JSON
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps({"mode": args.one, "rate": measure(args.one, args.seconds)}))
        return
    if args.quick:
        args.seconds, args.rounds = 0.3, 1
    modes = args.modes.split(",")
    rates: dict[str, list[float]] = {m: [] for m in modes}
    for r in range(args.rounds):
        order = modes[r % len(modes) :] + modes[: r % len(modes)]
        for mode in order:
            rates[mode].append(_fresh(mode, args.seconds))
    ceiling = statistics.median(rates["ceiling"]) if "ceiling" in rates else float("nan")
    print(
        f"{NUM_ENVS} envs, {MIN_ENTITIES}-{MAX_ENTITIES} entities x {FEATURES} float32, "
        f"~{WORK_SECONDS * 1e6:.0f} us/step; {args.rounds} rounds of {args.seconds} s"
    )
    print(f"{'mode':16} {'env-steps/s':>12} {'of ceiling':>11}")
    for mode in modes:
        median = statistics.median(rates[mode])
        print(f"{mode:16} {median:12.0f} {median / ceiling:11.2f}")


if __name__ == "__main__":
    main()
