"""Which layout is fastest for an env on this machine: envmgr.tune, then the winner built.

``tune`` times each layout that applies (more or fewer workers, first-ready, the caller's
own block, a hosted batched env) in interleaved rounds beside the machine's ceiling, and
says why the winner wins. ``result.call`` is the ``envmgr.make(...)`` line to copy.

Run: python examples/tune_layout.py [--env ID] [--seconds S]
ENVMGR_EXAMPLE_TINY=1 measures for a fraction of a second.
"""

import argparse
import os

import envmgr
from envmgr.tune import tune

TINY = os.environ.get("ENVMGR_EXAMPLE_TINY") == "1"
parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--env", default="CartPole-v1")
parser.add_argument("--num-envs", type=int, default=8)
parser.add_argument("--seconds", type=float, default=0.5 if TINY else 30.0)
args = parser.parse_args()

if __name__ == "__main__":
    result = tune(args.env, num_envs=args.num_envs, seconds=args.seconds, rounds=1 if TINY else 3)
    print(result)
    print("building the winner:", result.call)
    with eval(result.call, {"envmgr": envmgr}) as envs:  # the printed call, as written
        envs.reset(seed=0)
        envs.step(envs.action_space.sample())
        print(f"{envs.num_envs} envs stepped with the fastest layout")
