"""The Stable-Baselines3 table of README.md, read from benchmarks/suites/sb3_ppo.py's JSON
(benchmarks/results/record/sb3_ppo_halfcheetah.json).

Registered with ``doc_tables.table``; see that module for the markers and the check.
"""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks._common.paths import RECORD
from benchmarks.report.tables import load_json, markdown, public_command, rel, table

SB3_HALFCHEETAH = RECORD / "sb3_ppo_halfcheetah.json"


def _label(config: str, n_envs: int) -> str:
    """How the README names a configuration of ``sb3_ppo.py``."""
    if config == "dummy":
        return "`DummyVecEnv` (in process)"
    if config == "subproc":
        return f"`SubprocVecEnv` ({n_envs} processes)"
    if config == "envmgr":
        return "`EnvmgrVecEnv` (default: 2 workers)"
    args = []
    for part in config.split("-")[1:]:
        if "x" in part:
            args.append(f"n_workers={part.split('x')[0]}")
        elif part.startswith("caller"):
            args.append(f"caller_envs={part[len('caller') :]}")
        elif part == "nocheck":
            args.append("check_actions=False")
        else:
            args.append(part)
    return f"`EnvmgrVecEnv(..., {', '.join(args)})`"


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def _against(report: dict[str, Any], config: str, base: str) -> str:
    """Learn time over ``base``'s: the ratio of the medians, (min-max) over the rounds."""
    if config == base or base not in report["runs"]:
        return "–"
    runs = report["runs"]
    med = statistics.median
    ratio = med(r["learn"] for r in runs[config]) / med(r["learn"] for r in runs[base])
    rounds = [c["learn"] / b["learn"] for c, b in zip(runs[config], runs[base], strict=True)]
    return f"{ratio:.2f}x ({min(rounds):.2f}-{max(rounds):.2f})"


@table("sb3-ppo-halfcheetah")
def sb3_ppo_halfcheetah() -> str:
    """PPO's learn time through each vector env, on HalfCheetah-v5."""
    report = load_json(SB3_HALFCHEETAH)
    args = report["args"]
    rows = []
    for config, runs in report["runs"].items():
        rows.append(
            [
                _label(config, args["n_envs"]),
                _spread([r["learn"] for r in runs]),
                _spread([r["rollout"] for r in runs]),
                f"{statistics.median(r['setup'] for r in runs):.2f}",
                _against(report, config, "dummy"),
                _against(report, config, "subproc"),
            ]
        )
    head = [
        "vec env",
        "learn s",
        "rollout s",
        "start-up s",
        "learn time / DummyVecEnv's",
        "learn time / SubprocVecEnv's",
    ]
    caption = (
        f"*From `{rel(SB3_HALFCHEETAH)}` (`{public_command(report['command'])}`, "
        f"{str(report.get('started', ''))[:10]}, torch {report.get('torch', '?')}); "
        f"`PPO('MlpPolicy', env, seed=0).learn({args['steps']:,})` on {args['env']} with "
        f"{args['n_envs']} envs, {args['rounds']} interleaved rounds: median (min-max). "
        "Ratios below 1 are faster.*\n\n"
    )
    return caption + markdown(head, rows, "l" + "r" * (len(head) - 1))
