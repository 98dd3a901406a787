"""Multi-agent envs side by side: envmgr's ``make_parallel`` against the serial loop, the
machine's ceiling, SuperSuit and PufferLib, on PettingZoo ``ParallelEnv``s.

Usage (from the repository root)::

    python -m benchmarks.suites.multiagent                   # the full run, about 15 minutes
    python -m benchmarks.suites.multiagent --quick           # smoke run: 1 round, 0.3 s each
    python -m benchmarks.suites.multiagent --envs battle --n-envs 8 --impls serial,ceiling,envmgr

The envs (``--envs``: ``spread-3``, ``spread-10``, ``battle``, ``kaz``, ``synthetic``; see
:mod:`benchmarks._common.agent_envs`), each at 8 and 32 envs (``spread-3`` also at 16) unless
``--n-envs``.

The implementations (``--impls``; built in :mod:`benchmarks._common.agent_peers`), ``n``
envs in all:

* ``serial``: ``SerialRows``, one process stepping every env and packing its agent
  dicts into arrays as envmgr does (an obs row per agent slot, rewards, flags, zeros for
  absent agents, next-step autoreset);
* ``ceiling``: the same loop over ``n / 2`` envs in each of two processes at once, with no
  communication (``ceiling.Ceiling``'s processes); its rate is their summed rate (the most
  two processes can do here);
* ``supersuit``: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), n, num_cpus=2,
  base_class="gymnasium")``, with ``black_death_v3`` first where agents die;
* ``puffer``, ``puffer-async``: PufferLib's ``Multiprocessing`` backend over
  ``PettingZooPufferEnv``, 2 workers, whole batches (``batch_size=n``), or half batches
  (``batch_size=n/2``: one worker's envs are handed back while the other steps);
  ``puffer-1w``: one worker, whole batches (its workers and its parent all spin, so on
  2 cores one worker may beat two); ``puffer-copy`` (not run by default): the half
  batches with ``zero_copy=False``;
* ``envmgr``: ``make_parallel(env_fn, n)`` (its default workers);
  ``envmgr-caller``: ``make_parallel(env_fn, n, n_workers=1, caller_envs=n // 2)``.

The method: every measurement runs in a fresh interpreter (this module with ``--child``),
built, reset with seed 0, warmed up and then timed for ``--seconds`` of random actions
drawn once per configuration. Rounds are interleaved (each round measures every
implementation once per configuration, in an order that rotates), and ratios are taken
within a round: reported are the median over ``--rounds`` and the min-max. A peer that
raises is a row with its error; one that crashes is a row with the signal. Agent-steps are
agent rows per batch (dead agents' rows included, as every implementation here keeps them).

For envmgr, after the timed window and outside it, a short window (under the manager's
``timer_interval``, starting at a timer flush, so no timer shipment falls in it; bytes are
counted from the third step after the flush, once the flush's own traffic is over) measures:

* the workers' packing per live agent-step: the ``agents.pack`` node under
  ``step/env.step`` of the merged timer tree (``workers/worker_root``);
* the parent's unpacking per live agent-step: ``AgentVectorEnv.step`` minus the
  ``manager.step`` inside it;
* bytes pickled per batch: the workers' ``/proc/<pid>/io`` ``wchar`` minus one wake-up
  byte per batch (two workers finishing at once may both write it, so up to one byte per
  batch is wake-ups, never a pickle of tens of bytes), and ``rchar`` per batch (which
  counts file reads too: KAZ loads sprites as zombies appear); beside them, the bytes
  written per batch over the whole timed window, timer shipments included.

Writes ``multiagent.json`` and ``multiagent.txt`` (``quick.*`` with ``--quick``) to
``--out`` (default ``benchmarks/results/multiagent/``) with the machine and commit.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from time import perf_counter
from typing import Any

import numpy as np

from benchmarks._common.agent_envs import ENV_LABELS, ENVS
from benchmarks._common.agent_measure import measure
from benchmarks._common.agent_peers import DEFAULT_IMPLS, IMPLS, PUFFER_IMPLS, skip_reason
from benchmarks._common.fresh_child import parse_suite_args, run_child, suite_main
from benchmarks._common.paths import RESULTS
from benchmarks._common.run_context import dist_versions, machine_info
from benchmarks._common.timing import median, per_round_ratios, rotated, spread
from benchmarks.report.text import fmt_spread, padded_table, targets_table

DEFAULT_N_ENVS = {"spread-3": [8, 16, 32]}
#: Longest a child may take beyond its warm-up and timed seconds.
CHILD_OVERHEAD_TIMEOUT = 240.0
QUICK = {"rounds": 1, "seconds": 0.3, "warmup": 0.1, "profile": 0.1}
QUICK_N_ENVS = [4]
#: The versions the report records beside the machine's.
VERSIONS = (
    "envmgr", "numpy", "gymnasium", "pettingzoo", "mpe2", "magent2", "pygame-ce",
    "SuperSuit", "pufferlib-core",
)  # fmt: skip


# ============================================================================ one measurement


def measure_in_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``measure(spec)`` in a fresh interpreter; the sample, or ``{"error": why}``."""
    limit = CHILD_OVERHEAD_TIMEOUT + spec["warmup"] + spec["seconds"] + spec["profile"]
    return run_child(__spec__.name, spec, limit)


# ============================================================================ the run


def per_round(samples: dict[str, list[dict[str, Any]]], mine: str, base: str) -> list[float]:
    """``mine / base`` agent-steps/s within each round both were measured in."""
    ratios = per_round_ratios(samples, mine, base, "agent_steps_per_second")
    return [] if ratios is None else ratios["per_round"]


def summarize(config: dict[str, Any]) -> None:
    """Each implementation's medians and spreads, and its per-round ratio to the ceiling."""
    rows: dict[str, Any] = {}
    for impl, ss in config["samples"].items():
        row: dict[str, Any] = {
            "agent_steps_per_second": spread([s["agent_steps_per_second"] for s in ss]),
            "env_steps_per_second": spread([s["env_steps_per_second"] for s in ss]),
            "of_ceiling": spread(per_round(config["samples"], impl, "ceiling")),
        }
        for key in (
            "parent_cpu_ms_per_batch",
            "worker_pack_us_per_agent",
            "parent_unpack_us_per_agent",
            "pickled_bytes_per_batch",
            "read_bytes_per_batch",
            "timed_written_bytes_per_batch",
            "live_agents_per_batch",
        ):
            values = [s[key] for s in ss if s.get(key) is not None]
            if values:
                row[key] = spread(values)
        rows[impl] = row
    config["summary"] = rows


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every configuration, ``args.rounds`` interleaved rounds; saved after every round."""
    configs = [
        {"env": e, "n_envs": n, "samples": {}, "errors": {}, "skipped": {}}
        for e in args.envs
        for n in (args.n_envs or DEFAULT_N_ENVS.get(e, [8, 32]))
    ]
    report: dict[str, Any] = {
        "command": " ".join(["python -m benchmarks.suites.multiagent", *args.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "argv", "child")},
        "machine": machine(),
        "configs": configs,
    }
    t_start = perf_counter()
    total = args.rounds * len(configs) * len(args.impls)
    done = 0
    for r in range(args.rounds):
        for c in configs:
            for impl in rotated(list(args.impls), r):
                done += 1
                reason = skip_reason(impl, c["n_envs"])
                if reason is not None:
                    c["skipped"][impl] = reason
                    continue
                if impl in c["errors"]:
                    continue  # failed once: it would again, and each try costs a start-up
                spec = {
                    "env": c["env"],
                    "n_envs": c["n_envs"],
                    "impl": impl,
                    "seconds": args.seconds,
                    "warmup": args.warmup,
                    "profile": args.profile,
                }
                sample = measure_in_child(spec)
                tag = f"[{done}/{total}] round {r + 1} {c['env']} n={c['n_envs']} {impl}"
                if "error" in sample:
                    c["errors"][impl] = sample["error"]
                    if "traceback" in sample:
                        c.setdefault("tracebacks", {})[impl] = sample["traceback"]
                    print(f"{tag}: FAILED {sample['error']}", file=sys.stderr, flush=True)
                    continue
                sample["round"] = r
                c["samples"].setdefault(impl, []).append(sample)
                print(
                    f"{tag}: {sample['agent_steps_per_second']:,.0f} agent-steps/s "
                    f"({sample['child_wall_seconds']:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
            summarize(c)
        report["wall_seconds"] = perf_counter() - t_start
        save(report)
    report["targets"] = targets(report)
    save(report)
    return report


def machine() -> dict[str, Any]:
    """The CPU, the date, the commit and the versions of everything compared."""
    return machine_info("not used") | {"versions": dist_versions(VERSIONS)}


# ============================================================================ report


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The lead's targets, each with what was measured and whether it was met."""
    out: list[dict[str, Any]] = []

    def add(name: str, value: float, met: bool, shown: str) -> None:
        met_or_none = None if np.isnan(value) else met
        out.append({"target": name, "value": value, "shown": shown, "met": met_or_none})

    def at_least(name: str, value: float, bound: float) -> None:
        add(f"{name} >= {bound:g}", value, value >= bound, f"{value:.2f}")

    for c in report["configs"]:
        env, n, samples = c["env"], c["n_envs"], c["samples"]
        own = c.get("summary", {}).get("envmgr")
        if own is None:
            continue
        ratio = own["of_ceiling"]["median"]
        if env == "spread-3" and n == 16:
            at_least("spread-3 n=16 envmgr / ceiling", ratio, 0.8)
        if env == "battle":
            at_least(f"battle n={n} envmgr / ceiling", ratio, 0.75)
        if env == "synthetic" and "supersuit" in samples:
            at_least(
                f"synthetic n={n} envmgr / SuperSuit",
                median(per_round(samples, "envmgr", "supersuit")),
                2.0,
            )
        puffers = [median(per_round(samples, "envmgr", p)) for p in PUFFER_IMPLS if p in samples]
        if env == "synthetic" and puffers:
            at_least(f"synthetic n={n} envmgr / best PufferLib", min(puffers), 1.0)
        pickled = own.get("pickled_bytes_per_batch")
        if pickled is not None:  # the worst round; under a byte per batch is wake-ups
            worst = pickled["max"]
            add(
                f"{env} n={n} envmgr bytes pickled per step = 0",
                worst,
                worst < 1.0,
                f"{worst:.1f} B",
            )
    return out


def tables(report: dict[str, Any]) -> str:
    """The throughput table, envmgr's packing and traffic, and the targets."""
    m = report["machine"]
    lines = [
        f"Multi-agent benchmark, {m['date']}, commit {m['git_commit']}"
        + (" (dirty)" if m["git_dirty"] else ""),
        f"{m['cpu_model']}, {m['usable_cpus']} usable CPUs, Python {m['python'].split()[0]}",
        f"{report['args']['rounds']} interleaved rounds x {report['args']['seconds']:g} s; "
        "median (min-max) over rounds; ratios within a round",
        "",
        "Throughput",
    ]
    head = ["env", "n", "impl", "agent-steps/s", "env-steps/s", "/ ceiling", "parent ms/batch"]
    rows = []
    for c in report["configs"]:
        label = ENV_LABELS[c["env"]]
        for impl in report["args"]["impls"]:
            s = c.get("summary", {}).get(impl)
            base = [label, str(c["n_envs"]), impl]
            if s is not None:
                cpu = s.get("parent_cpu_ms_per_batch")
                rows.append(
                    base
                    + [
                        fmt_spread(s["agent_steps_per_second"]),
                        fmt_spread(s["env_steps_per_second"]),
                        "1" if impl == "ceiling" else fmt_spread(s["of_ceiling"], 2),
                        "-" if cpu is None else f"{cpu['median']:.3f}",
                    ]
                )
            elif impl in c["errors"]:
                rows.append(base + [f"FAILED: {c['errors'][impl]}", "", "", ""])
            elif impl in c["skipped"]:
                rows.append(base + [f"skipped: {c['skipped'][impl]}", "", "", ""])
    lines += padded_table(head, rows)
    lines += ["", "envmgr: packing per live agent-step, bytes per batch (outside the timed window)"]
    head = [
        "env", "n", "impl", "live agents", "worker pack us/agent", "parent unpack us/agent",
        "pickled B/step", "read B/step", "written B/step incl. timers",
    ]  # fmt: skip
    rows = []
    for c in report["configs"]:
        for impl in ("envmgr", "envmgr-caller"):
            s = c.get("summary", {}).get(impl)
            if s is None or "worker_pack_us_per_agent" not in s:
                continue
            rows.append(
                [
                    ENV_LABELS[c["env"]],
                    str(c["n_envs"]),
                    impl,
                    f"{s['live_agents_per_batch']['median']:.0f}",
                    fmt_spread(s["worker_pack_us_per_agent"], 2),
                    fmt_spread(s["parent_unpack_us_per_agent"], 2),
                    f"{s['pickled_bytes_per_batch']['max']:.1f}",
                    f"{s['read_bytes_per_batch']['median']:.1f}",
                    f"{s['timed_written_bytes_per_batch']['median']:.1f}",
                ]
            )
    lines += padded_table(head, rows)
    lines += targets_table(
        "Targets (envmgr = make_parallel's default layout)", report.get("targets", [])
    )
    return "\n".join(lines) + "\n"


# ============================================================================ main


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.multiagent",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--envs", default=",".join(ENVS), help="(default: %(default)s)")
    p.add_argument(
        "--n-envs", default=None, help="envs per configuration (default: 8,32; spread-3 8,16,32)"
    )
    p.add_argument("--impls", default=",".join(DEFAULT_IMPLS), help="(default: %(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    p.add_argument(
        "--seconds", type=float, default=1.0, help="timed seconds per measurement (default: 1)"
    )
    p.add_argument("--warmup", type=float, default=0.3, help="untimed seconds before timing")
    p.add_argument(
        "--profile", type=float, default=0.3, help="envmgr's packing/bytes window, seconds"
    )
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "multiagent",
        help="output directory (multiagent.json/.txt; quick.* with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="1 round, 0.3 s, 4 envs: a smoke run")
    args = parse_suite_args(p, argv, QUICK)
    if args.child is not None:
        return args
    if args.quick:
        if args.n_envs is None:
            args.n_envs = ",".join(map(str, QUICK_N_ENVS))
    args.envs = [e for e in str(args.envs).split(",") if e]
    args.impls = [i for i in str(args.impls).split(",") if i]
    args.n_envs = [int(n) for n in args.n_envs.split(",") if n] if args.n_envs else None
    for e in args.envs:
        if e not in ENVS:
            p.error(f"unknown env {e!r}; choose from {','.join(ENVS)}")
    for i in args.impls:
        if i not in IMPLS:
            p.error(f"unknown implementation {i!r}; choose from {','.join(IMPLS)}")
    if args.n_envs is not None and any(n < 1 for n in args.n_envs):
        p.error("every --n-envs must be positive")
    if args.seconds <= 0 or args.rounds < 1 or args.profile <= 0:
        p.error("--seconds and --profile must be > 0 and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(parse_args(argv), "multiagent", measure, run, tables)


if __name__ == "__main__":
    raise SystemExit(main())
