"""Variable-size observations: envmgr's shared-memory store against pickled transports and
the machine's ceiling, on a synthetic entity env and on KAZ's entity lists.

Usage (from the repository root)::

    python -m benchmarks.suites.ragged                 # 3 rounds of 5 s, about 6 minutes
    python -m benchmarks.suites.ragged --quick         # smoke run: 1 round, 0.3 s, 4 envs
    python -m benchmarks.suites.ragged --envs kaz-sequence --impls ceiling,envmgr

The configurations (``--envs``):

* ``entities``, 16 envs: the synthetic entity env (8-64 entities of 16 float32 features,
  about 20 µs per step; :mod:`benchmarks._common.entity_env`), through ``ceiling``,
  ``envmgr`` (2 workers), ``envmgr-caller`` (1 worker, the parent stepping half the envs:
  ``caller_envs``), ``envmgr-pickled`` (``ragged="pickled"``), ``async``
  (``AsyncVectorEnv(shared_memory=False)``) and ``sb3`` (``SubprocVecEnv``, its env padding
  to 64 entities); see :mod:`benchmarks._common.entity_measure`;
* ``kaz-sequence``, 8 envs: PettingZoo's ``knights_archers_zombies_v11`` with
  ``obs_method="vector-sequence"`` (``Sequence(Box(-1, 1, (11,)), stack=True)`` per agent),
  as multi-agent rows (:mod:`benchmarks._common.agent_measure`): ``serial`` (one process
  packing the agents' observations into padded arrays plus lengths), ``ceiling`` (that loop
  over half the envs in each of two processes, no communication), ``envmgr``
  (``make_parallel``'s default layout), ``envmgr-caller`` (``n_workers=1,
  caller_envs=n // 2``) and ``envmgr-padded`` (the default layout, ``ragged="padded"``).

The method, as :mod:`benchmarks.suites.multiagent`'s: every measurement runs in a fresh
interpreter (this module with ``--child``), built, reset with seed 0, warmed up and timed
for ``--seconds`` of random actions; rounds are interleaved (every implementation once per
configuration, the order rotated), ratios are taken within a round, and the report gives
the median (min-max) over rounds. For envmgr, after the timed window, a window of
``--profile`` seconds from a timer flush counts the bytes the workers pickled per step
(:mod:`benchmarks._common.worker_traffic`).

Writes ``ragged.json`` and ``ragged.txt`` (``quick.*`` with ``--quick``) to ``--out``
(default ``benchmarks/results/ragged/``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

from benchmarks._common import agent_measure, entity_measure
from benchmarks._common.agent_envs import ENV_LABELS
from benchmarks._common.entity_env import FEATURES, MAX_ENTITIES, MIN_ENTITIES, WORK_SECONDS
from benchmarks._common.fresh_child import parse_suite_args, run_child, suite_main
from benchmarks._common.paths import RESULTS
from benchmarks._common.run_context import dist_versions, machine_info
from benchmarks._common.timing import per_round_ratios, rotated, spread
from benchmarks.report.text import fmt_spread, padded_table, targets_table

KAZ_IMPLS = ["serial", "ceiling", "envmgr", "envmgr-caller", "envmgr-padded"]
#: Each configuration's implementations and envs.
CONFIGS: dict[str, dict[str, Any]] = {
    "entities": {"impls": entity_measure.IMPLS, "n_envs": 16},
    "kaz-sequence": {"impls": KAZ_IMPLS, "n_envs": 8},
}
LABELS = {
    "entities": f"entities {MIN_ENTITIES}-{MAX_ENTITIES} x {FEATURES} float32, "
    f"~{WORK_SECONDS * 1e6:.0f} us/step",
    "kaz-sequence": ENV_LABELS["kaz-sequence"],
}
ENVMGR_IMPLS = entity_measure.ENVMGR_IMPLS | {"envmgr-padded"}
QUICK = {"rounds": 1, "seconds": 0.3, "warmup": 0.1, "profile": 0.1}
QUICK_N_ENVS = 4
#: Longest a child may take beyond its warm-up, timed and profile seconds.
CHILD_OVERHEAD_TIMEOUT = 240.0
VERSIONS = ("envmgr", "numpy", "gymnasium", "pettingzoo", "pygame-ce", "stable_baselines3")
#: Per-sample figures summarized as median (min-max), where a sample has them.
SPREAD_KEYS = (
    "env_steps_per_second",
    "agent_steps_per_second",
    "parent_cpu_ms_per_batch",
    "pickled_bytes_per_batch",
    "read_bytes_per_batch",
    "timed_written_bytes_per_batch",
)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement (the body of a ``--child`` run), by configuration."""
    if spec["env"] == "entities":
        return entity_measure.measure(spec)
    return agent_measure.measure(spec)


# ============================================================================ the run


def summarize(config: dict[str, Any]) -> None:
    """Each implementation's spreads and its per-round ratios to the ceiling (and, on the
    entity env, to AsyncVectorEnv)."""
    samples = config["samples"]

    def ratios(mine: str, base: str) -> dict[str, float]:
        got = per_round_ratios(samples, mine, base, "env_steps_per_second")
        return spread([] if got is None else got["per_round"])

    rows: dict[str, Any] = {}
    for impl, ss in samples.items():
        row = {"of_ceiling": ratios(impl, "ceiling"), "of_async": ratios(impl, "async")}
        for key in SPREAD_KEYS:
            values = [s[key] for s in ss if s.get(key) is not None]
            if values:
                row[key] = spread(values)
        rows[impl] = row
    config["summary"] = rows


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every configuration, ``args.rounds`` interleaved rounds; saved after every round."""
    configs = [
        {
            "env": env,
            "n_envs": args.n_envs or CONFIGS[env]["n_envs"],
            "impls": [i for i in CONFIGS[env]["impls"] if not args.impls or i in args.impls],
            "samples": {},
            "errors": {},
        }
        for env in args.envs
    ]
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.suites.ragged", *args.argv]),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "argv", "child")},
        "machine": machine_info("not used") | {"versions": dist_versions(VERSIONS)},
        "configs": configs,
    }
    t_start = perf_counter()
    for r in range(args.rounds):
        for c in configs:
            for impl in rotated(c["impls"], r):
                if impl in c["errors"]:
                    continue  # failed once: it would again, and each try costs a start-up
                spec = {"env": c["env"], "n_envs": c["n_envs"], "impl": impl}
                spec |= {k: getattr(args, k) for k in ("seconds", "warmup", "profile")}
                limit = CHILD_OVERHEAD_TIMEOUT + args.warmup + args.seconds + args.profile
                sample = run_child(__spec__.name, spec, limit)
                tag = f"round {r + 1}/{args.rounds} {c['env']} n={c['n_envs']} {impl}"
                if "error" in sample:
                    c["errors"][impl] = sample["error"]
                    print(f"{tag}: FAILED {sample['error']}", file=sys.stderr, flush=True)
                    continue
                sample["round"] = r
                c["samples"].setdefault(impl, []).append(sample)
                rate = sample["env_steps_per_second"]
                print(f"{tag}: {rate:,.0f} env-steps/s", file=sys.stderr, flush=True)
            summarize(c)
        report["wall_seconds"] = perf_counter() - t_start
        save(report)
    report["targets"] = targets(report)
    save(report)
    return report


# ============================================================================ report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, each with what was measured and whether it was met."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float, met: bool, shown: str) -> None:
        met_or_none = None if value != value else met  # NaN: not measured
        out.append({"target": name, "value": value, "shown": shown, "met": met_or_none})

    for c in report["configs"]:
        env, n, summary = c["env"], c["n_envs"], c.get("summary", {})
        own = summary.get("envmgr")
        if own is None:
            continue
        bound = 0.75 if env == "entities" else 0.8
        ratio = own["of_ceiling"]["median"]
        add(f"{env} n={n} envmgr / ceiling >= {bound:g}", ratio, ratio >= bound, f"{ratio:.2f}")
        if env == "entities":
            ratio = own["of_async"]["median"]
            add(f"{env} n={n} envmgr / async >= 2", ratio, ratio >= 2, f"{ratio:.2f}")
        for impl in sorted(ENVMGR_IMPLS - {"envmgr-pickled"}):
            pickled = summary.get(impl, {}).get("pickled_bytes_per_batch")
            if pickled is not None:  # the worst round; under a byte per batch is wake-ups
                worst = pickled["max"]
                name = f"{env} n={n} {impl} bytes pickled per step = 0"
                add(name, worst, worst < 1.0, f"{worst:.1f} B")
    return out


def tables(report: dict[str, Any]) -> str:
    """Per configuration, throughput and envmgr's bytes; then the targets."""
    m, a = report["machine"], report["args"]
    lines = [
        f"Variable-size observations, {m['date']}, commit {m['git_commit']}"
        + (" (dirty)" if m["git_dirty"] else ""),
        f"{m['cpu_model']}, {m['usable_cpus']} usable CPUs, Python {m['python'].split()[0]}",
        f"{a['rounds']} interleaved rounds x {a['seconds']:g} s; median (min-max) over rounds; "
        "ratios within a round",
    ]
    for c in report["configs"]:
        agents = c["env"] != "entities"
        lines += ["", f"{LABELS[c['env']]}, {c['n_envs']} envs"]
        head = ["impl", "env-steps/s", *(["agent-steps/s"] if agents else [])]
        head += ["/ ceiling", *([] if agents else ["/ async"]), "parent ms/batch"]
        head += ["pickled B/step", "written B/step incl. timers", "read B/step"]
        rows = []
        for impl in c["impls"]:
            s = c.get("summary", {}).get(impl)
            if s is None:
                rows.append([impl, f"FAILED: {c['errors'].get(impl, 'not measured')}"])
                continue
            row = [impl, fmt_spread(s["env_steps_per_second"])]
            row += [fmt_spread(s["agent_steps_per_second"])] if agents else []
            row += ["1" if impl == "ceiling" else fmt_spread(s["of_ceiling"], 2)]
            row += [] if agents else [fmt_spread(s["of_async"], 2)]
            row += [fmt_spread(s.get("parent_cpu_ms_per_batch"), 3)]
            for key, digits in (
                ("pickled_bytes_per_batch", 1),
                ("timed_written_bytes_per_batch", 1),
                ("read_bytes_per_batch", 0),
            ):
                row.append(fmt_spread(s.get(key), digits))
            rows.append(row)
        lines += padded_table(head, rows)
    lines += targets_table("Targets (envmgr = the default layout)", report.get("targets", []))
    return "\n".join(lines) + "\n"


# ============================================================================ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.ragged",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--envs", default=",".join(CONFIGS), help="(default: %(default)s)")
    p.add_argument("--impls", default="", help="only these implementations (default: all)")
    p.add_argument("--n-envs", type=int, default=None, help="envs (default: 16 and 8)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument("--seconds", type=float, default=5.0, help="timed seconds (default: 5)")
    p.add_argument("--warmup", type=float, default=0.5, help="untimed seconds before timing")
    p.add_argument("--profile", type=float, default=0.3, help="envmgr's bytes window, seconds")
    p.add_argument("--out", type=Path, default=RESULTS / "ragged", help="output directory")
    p.add_argument("--quick", action="store_true", help="1 round, 0.3 s, 4 envs: a smoke run")
    args = parse_suite_args(p, argv, QUICK)
    if args.child is not None:
        return args
    if args.quick:
        args.n_envs = args.n_envs or QUICK_N_ENVS
    args.envs = [e for e in args.envs.split(",") if e]
    args.impls = [i for i in args.impls.split(",") if i]
    for e in args.envs:
        if e not in CONFIGS:
            p.error(f"unknown env {e!r}; choose from {','.join(CONFIGS)}")
    known = {i for c in CONFIGS.values() for i in c["impls"]}
    for i in args.impls:
        if i not in known:
            p.error(f"unknown implementation {i!r}; choose from {','.join(sorted(known))}")
    if args.n_envs is not None and (args.n_envs < 2 or args.n_envs % 2):
        p.error("--n-envs must be even (two processes, or half the envs in the caller)")
    if args.seconds <= 0 or args.rounds < 1 or args.profile <= 0:
        p.error("--seconds and --profile must be > 0 and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(parse_args(argv), "ragged", measure, run, tables)


if __name__ == "__main__":
    raise SystemExit(main())
