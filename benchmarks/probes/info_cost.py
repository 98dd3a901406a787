"""What infos and large observations cost per batch, in one process (no workers).

Part A, infos: a batch of 32 envs in 2 groups whose every env returns four numeric
info keys, as HalfCheetah-v5 does (three np.float64, one np.float32):

* the parent's CPU to read one batch (``BatchReader.read_shared``) with no infos, with
  the keys in shared-memory columns (today; also with the second group meeting the keys
  in the reverse order, so that its columns lie at other offsets), and with them
  pickled: unpickling the two answers, then either Gymnasium's ``_add_info`` once per
  env (before the columns) or the key-at-a-time merge (what still pickles now: strings,
  dicts, Ray);
* each group's CPU to hand over its 16 infos: columns written, or the answer pickled.

Part B, observations: one copy into shared memory (the worker) and one out (the parent,
``copy=True``) of an observation of 4 x 84 x 84 uint8 (Atari, frame-stacked) and of
100 KB, per env.

Every figure is a median over ``--repeats`` timeit runs, so compare figures of one run.

    python -m benchmarks.probes.info_cost --out benchmarks/results/record/info_cost.txt
"""

from __future__ import annotations

import argparse
import pickle
import statistics
import sys
import timeit
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import SyncVectorEnv

from envmgr.envside.info_writer import InfoWriter
from envmgr.frontend.infos import merge_pairs
from envmgr.frontend.results import BatchReader
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import StepResponse
from envmgr.protocol.shared_memory import SharedBuffers

N, GROUPS = 32, 2


def median_us(fn: Any, number: int, repeats: int) -> float:
    """Median microseconds per call over ``repeats`` runs of ``number`` calls."""
    return statistics.median(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def cheetah_info(rng: np.random.Generator) -> dict[str, Any]:
    x = rng.normal(size=3)
    return {
        "x_position": np.float64(x[0]),
        "x_velocity": np.float64(x[1]),
        "reward_forward": np.float64(x[1]),
        "reward_ctrl": np.float32(x[2]),
    }


def part_infos(repeats: int) -> list[str]:
    space = gym.spaces.Box(-1, 1, (17,), np.float64)
    layout = Layout.split(N, GROUPS)
    size = N // GROUPS
    add_info = SyncVectorEnv([lambda: gym.make("CartPole-v1")] * N)._add_info
    rng = np.random.default_rng(0)
    infos = [[(i, cheetah_info(rng)) for i in range(size)] for _ in range(GROUPS)]

    def reader(buffers: SharedBuffers) -> BatchReader:
        return BatchReader(buffers, layout, space, True, add_info)

    plain = SharedBuffers.private(space, gym.spaces.Discrete(2), N, GROUPS)
    no_infos = reader(plain)
    columns = SharedBuffers.private(space, gym.spaces.Discrete(2), N, GROUPS)
    with_columns = reader(columns)
    writers = [InfoWriter(columns.info_arena[g * size : (g + 1) * size]) for g in range(GROUPS)]
    for g, w in enumerate(writers):
        w.split(infos[g])
        with_columns.columns.update(g, w.schema())
    # The second group met the keys in the reverse order: no whole-batch view per key.
    apart = SharedBuffers.private(space, gym.spaces.Discrete(2), N, GROUPS)
    laid_apart = reader(apart)
    for g in range(GROUPS):
        w = InfoWriter(apart.info_arena[g * size : (g + 1) * size])
        w.split([(i, dict(reversed(info.items())) if g else info) for i, info in infos[g]])
        laid_apart.columns.update(g, w.schema())
    answers = [pickle.dumps(StepResponse(g, 1, tuple(infos[g]))) for g in range(GROUPS)]

    def before() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for g, blob in enumerate(answers):
            for i, info in pickle.loads(blob).infos:
                out = add_info(out, info, g * size + i)
        return out

    def pickled_now() -> dict[str, Any]:
        pairs = [
            (g * size + i, info) for g, b in enumerate(answers) for i, info in pickle.loads(b).infos
        ]
        return merge_pairs({}, pairs, N, add_info)

    want = before()
    for got in (with_columns.read_shared()[4], laid_apart.read_shared()[4]):
        assert got.keys() == want.keys() and all(np.array_equal(got[k], want[k]) for k in got)
    number = 2000
    rows = [
        ("parent: read a batch, no infos", median_us(no_infos.read_shared, number, repeats)),
        (
            "parent: read a batch, 4 keys in columns",
            median_us(with_columns.read_shared, number, repeats),
        ),
        (
            "parent: read a batch, 4 keys, groups laid out apart",
            median_us(laid_apart.read_shared, number, repeats),
        ),
        ("parent: 4 keys pickled, _add_info per env (before)", median_us(before, number, repeats)),
        ("parent: 4 keys pickled, merged a key at a time", median_us(pickled_now, number, repeats)),
        (
            "group of 16: write 4 keys to columns",
            median_us(lambda: writers[0].split(infos[0]), number, repeats),
        ),
        (
            "group of 16: pickle the answer (before)",
            median_us(lambda: pickle.dumps(StepResponse(0, 1, tuple(infos[0]))), number, repeats),
        ),
    ]
    base = rows[0][1]
    lines = [f"Part A: {N} envs in {GROUPS} groups, four numeric info keys per env per step"]
    for name, us in rows:
        extra = (
            f"  (+{us - base:.1f} us over no infos)"
            if name.startswith("parent: read a batch, 4 keys")
            else ""
        )
        lines.append(f"  {name:<52} {us:8.1f} us{extra}")
    return lines


def part_observations(repeats: int) -> list[str]:
    lines = ["Part B: an observation's copies per env (into shared memory, and out with copy=True)"]
    for label, shape in (("4 x 84 x 84 uint8 (28 KB)", (4, 84, 84)), ("100 KB uint8", (100_000,))):
        space = gym.spaces.Box(0, 255, shape, np.uint8)
        buffers = SharedBuffers.private(space, gym.spaces.Discrete(2), 8, 2)
        obs = np.full(shape, 7, np.uint8)
        view = buffers.observations[3]
        into = median_us(lambda view=view, obs=obs: np.copyto(view, obs), 2000, repeats)
        whole = buffers.observations
        out = median_us(lambda whole=whole: whole.copy(), 500, repeats) / 8
        lines.append(f"  {label:<28} in {into:6.1f} us, out {out:6.1f} us per env")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None, help="also write the report here")
    args = parser.parse_args(argv)
    lines = [
        f"# python -m {__spec__.name}" + (f" --out {args.out}" if args.out else ""),
        *part_infos(args.repeats),
        *part_observations(args.repeats),
    ]
    text = "\n".join(lines) + "\n"
    sys.stdout.write(text)
    if args.out is not None:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
