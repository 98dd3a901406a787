"""Ray's floor: how much of a ``RayEnvManager`` step is envmgr's own work on top of Ray's
round trip, whether first-ready stepping hides the round trip, and where Ray meets the
local manager on one machine.

Usage (from the repository root)::

    python -m benchmarks.suites.ray_floor                  # the full run, about 8 minutes
    python -m benchmarks.suites.ray_floor --quick          # smoke run: tiny durations
    python -m benchmarks.suites.ray_floor --envs cartpole --actors 2 --rounds 5

The configurations: ``cartpole`` (CartPole-v1) and ``noop`` (an env that does nothing, with
an observation of ``--noop-bytes`` bytes) with ``--actors`` actors (1, 2, 4) of
``--envs-per-actor`` envs (8) each; ``halfcheetah`` (HalfCheetah-v5) and ``pong``
(``ALE/Pong-v5``) at ``--real-n-envs`` envs (8) over ``--real-actors`` actors (2), where
MuJoCo and ale-py are installed. What each measures, all as µs per batch of ``n`` env-steps:

* ``bare``: Ray's round trip alone: one call to each of as many actors with no envs at
  once (``ray.get([...])``), carrying the actions' rows in and arrays of the answer's
  size out (observations, float64 rewards, two bool flags);
* ``bare-packed``: the same, each way as one pickled ``bytes`` (how envmgr ships answers
  below 256 KiB), the pickling included;
* ``step``: ``RayEnvManager.step``; from its timers, envmgr's own time per step on both
  sides: the driver's (its ``step`` node minus the ``workers`` wait under it) and an
  actor's (the merged ``worker_root/step`` minus the env calls under it);
* ``first-ready`` (2 actors or more, all on the one node): ``send``/``recv``, each
  actor's envs sent their next actions as soon as its answer lands, so every actor has
  a step in flight; "hidden" is the share of the bare round trip it saves per batch,
  ``(step - first-ready) / bare``;
* ``local``: ``SubprocessEnvManager`` with the same envs, as many workers as actors.

The method: every measurement runs in a fresh interpreter (this module with ``--child``):
one for Ray's side of a configuration (a new Ray instance, ``ray.init(address="local",
num_cpus=2)`` on 127.0.0.2 without dashboard or usage reports, shut down at the end; in it
the echo actors and the manager, each kind warmed up and timed for ``--seconds`` in an
order that rotates with the round), one for the local manager. Starting Ray costs 8-10 s
here (a Ray child takes 15-20 s in all), hence Ray's kinds share an instance, and the
timed windows are short (``--seconds`` 0.5 after ``--warmup`` 0.25); their ratios are taken
within the instance. Rounds are interleaved (each round measures every configuration, the
two sides in an order that rotates); reported are the median over ``--rounds`` (3) and the
min-max. From the ``noop`` rows, the env-step cost from which Ray reaches half and 90% of
the local manager's throughput, if per-batch time is each one's own floor plus the env
work of ``n / min(actors, cores)`` envs.

Writes ``ray_floor.json`` and ``ray_floor.txt`` (``quick.*`` with ``--quick``) to
``--out`` (default ``benchmarks/results/ray_floor/``) with the machine and commit.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from time import perf_counter
from typing import Any

from benchmarks._common import ray_rigs
from benchmarks._common.fresh_child import parse_suite_args, run_child, suite_main
from benchmarks._common.paths import RESULTS
from benchmarks._common.run_context import machine_info
from benchmarks._common.timing import per_round_ratios, rotated, spread
from benchmarks.report.text import fmt_spread, padded_table, targets_table

ENVS = ["cartpole", "noop", "halfcheetah", "pong"]
ENV_LABELS = {
    "cartpole": "CartPole-v1",
    "noop": "no-op",
    "halfcheetah": "HalfCheetah-v5",
    "pong": "ALE/Pong-v5",
}
#: The module each env needs beyond gymnasium.
NEEDS = {"halfcheetah": "mujoco", "pong": "ale_py"}
REAL_ENVS = set(NEEDS)
RAY_KINDS = ["bare", "bare-packed", "step", "first-ready"]
KINDS = [*RAY_KINDS, "local"]
#: Longest a child may take beyond its warm-ups and timed seconds (starting Ray, and
#: MuJoCo or ALE in every actor, on a loaded 2-core machine).
CHILD_OVERHEAD_TIMEOUT = 240.0
QUICK = {"rounds": 1, "seconds": 0.1, "warmup": 0.05}
#: The most envmgr's step may cost over a bare round trip with the same payload.
TARGET_STEP_OVER_BARE = 1.2
#: Shares of the local manager's throughput the break-even estimate is given for.
BREAK_EVEN_SHARES = (0.5, 0.9)
VERSIONS = ("envmgr", "ray", "numpy", "gymnasium", "mujoco", "ale-py")


# ============================================================================ one measurement


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """One side of one configuration: the body of a ``--child`` run."""
    make = ray_rigs.factory(spec["env"], spec["noop_bytes"])
    actions = ray_rigs.action_batches(make, spec["n_envs"], 1000 + spec["n_envs"])
    if spec["side"] == "local":
        return {"kinds": {"local": measure_local(spec, make, actions)}}
    return measure_ray(spec, make, actions)


def measure_local(spec: dict[str, Any], make: Any, actions: Any) -> dict[str, Any]:
    t0 = perf_counter()
    envs = ray_rigs.local_manager(make, spec["n_actors"], spec["envs_per_actor"])
    try:
        built = perf_counter() - t0
        ray_rigs.timed(envs.step, actions, spec["warmup"])
        sample = ray_rigs.timed(envs.step, actions, spec["seconds"])
    finally:
        envs.close()
    return sample | {"build_seconds": built}


def measure_ray(spec: dict[str, Any], make: Any, actions: Any) -> dict[str, Any]:
    """Ray's kinds in one new Ray instance, in the order ``spec["kinds"]`` gives."""
    from envmgr import timers

    t0 = perf_counter()
    ray = ray_rigs.start_local_ray()
    try:
        started = perf_counter() - t0
        rig = ray_rigs.RayRig(ray, make, spec["n_actors"], spec["envs_per_actor"])
        built = perf_counter() - t0 - started
        kinds: dict[str, Any] = {}
        try:
            for kind in spec["kinds"]:
                if kind == "first-ready":
                    rig.first_ready(actions, spec["warmup"])
                    kinds[kind] = rig.first_ready(actions, spec["seconds"])
                    continue
                step = {"bare": rig.bare, "bare-packed": rig.packed, "step": rig.step}[kind]
                ray_rigs.timed(step, actions, spec["warmup"])
                before = ray_rigs.timer_totals(timers.get_timer_tree())  # a flush
                kinds[kind] = ray_rigs.timed(step, actions, spec["seconds"])
                if kind == "step":
                    after = ray_rigs.timer_totals(timers.get_timer_tree())
                    kinds[kind] |= ray_rigs.own_times(before, after)
        finally:
            rig.close()
        answer_bytes = rig.answer_bytes
    finally:
        ray.shutdown()
    return {
        "kinds": kinds,
        "answer_bytes_per_actor": answer_bytes,
        "ray_start_seconds": started,
        "build_seconds": built,
    }


def measure_in_child(spec: dict[str, Any]) -> dict[str, Any]:
    """``measure(spec)`` in a fresh interpreter; the sample, or ``{"error": why}``."""
    kinds = len(spec.get("kinds", ["local"]))
    limit = CHILD_OVERHEAD_TIMEOUT + kinds * 2 * (spec["warmup"] + spec["seconds"])
    return run_child(__spec__.name, spec, limit)


# ============================================================================ the run


def configurations(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every ``(env, actors, envs per actor)`` of the run, with why one is skipped."""
    configs = []
    for env in args.envs:
        if env in REAL_ENVS:
            layouts = [(k, args.real_n_envs // k) for k in args.real_actors]
        else:
            layouts = [(k, args.envs_per_actor) for k in args.actors]
        for k, per in layouts:
            c: dict[str, Any] = {
                "env": env,
                "n_actors": k,
                "envs_per_actor": per,
                "n_envs": k * per,
                "samples": {},
                "errors": {},
                "skipped": {},
            }
            missing = NEEDS.get(env)
            if missing is not None and importlib.util.find_spec(missing) is None:
                c["skipped"]["all"] = f"{missing} is not installed"
            if k < 2:
                c["skipped"]["first-ready"] = "needs 2 actors or more"
            configs.append(c)
    return configs


def run(args: argparse.Namespace, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """Every configuration, ``args.rounds`` interleaved rounds; saved after every round."""
    configs = configurations(args)
    report: dict[str, Any] = {
        "command": " ".join([f"python -m {__spec__.name}", *args.argv]),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "args": {k: v for k, v in vars(args).items() if k not in ("out", "argv", "child")},
        "machine": machine(),
        "configs": configs,
    }
    t_start = perf_counter()
    live = [c for c in configs if "all" not in c["skipped"]]
    total, done = args.rounds * len(live) * 2, 0
    for r in range(args.rounds):
        for c in live:
            for side in rotated(["ray", "local"], r):
                done += 1
                if side in c["errors"]:
                    continue  # failed once: it would again, and each try costs a start-up
                kinds = [k for k in rotated(RAY_KINDS, r) if k not in c["skipped"]]
                spec = {
                    "side": side,
                    "kinds": kinds if side == "ray" else ["local"],
                    **{k: c[k] for k in ("env", "n_actors", "envs_per_actor", "n_envs")},
                    **{k: getattr(args, k) for k in ("seconds", "warmup", "noop_bytes")},
                }
                sample = measure_in_child(spec)
                tag = f"[{done}/{total}] round {r + 1} {c['env']} {c['n_actors']}x"
                tag += f"{c['envs_per_actor']} {side}"
                if "error" in sample:
                    c["errors"][side] = sample["error"]
                    if "traceback" in sample:
                        c.setdefault("tracebacks", {})[side] = sample["traceback"]
                    print(f"{tag}: FAILED {sample['error']}", file=sys.stderr, flush=True)
                    continue
                measured = sample.pop("kinds")
                for kind, s in measured.items():
                    c["samples"].setdefault(kind, []).append(s | {"round": r})
                c.setdefault("children", []).append(sample | {"round": r, "side": side})
                shown = ", ".join(f"{k} {s['us_per_batch']:,.0f} µs" for k, s in measured.items())
                wall = sample["child_wall_seconds"]
                print(f"{tag}: {shown} ({wall:.1f} s)", file=sys.stderr, flush=True)
            summarize(c)
        report["wall_seconds"] = perf_counter() - t_start
        save(report)
    report["break_even"] = break_even(report)
    report["targets"] = targets(report)
    save(report)
    return report


def machine() -> dict[str, Any]:
    """The CPU, the date, the commit and the versions of what is measured."""

    def version(dist: str) -> str:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "not installed"

    return machine_info("not used") | {"versions": {d: version(d) for d in VERSIONS}}


def summarize(config: dict[str, Any]) -> None:
    """Medians and spreads per kind, the per-round ratios, and envmgr's own times."""
    samples = config["samples"]

    def ratio(mine: str, base: str) -> dict[str, float]:
        r = per_round_ratios(samples, mine, base, "us_per_batch")
        return spread([] if r is None else r["per_round"])

    def hidden() -> dict[str, float]:
        by_round = {k: {s["round"]: s["us_per_batch"] for s in samples.get(k, [])} for k in KINDS}
        rounds = set(by_round["step"]) & set(by_round["first-ready"]) & set(by_round["bare"])
        return spread(
            [
                (by_round["step"][r] - by_round["first-ready"][r]) / by_round["bare"][r]
                for r in sorted(rounds)
            ]
        )

    steps = samples.get("step", [])
    config["summary"] = {
        "us_per_batch": {k: spread([s["us_per_batch"] for s in ss]) for k, ss in samples.items()},
        "step_over_bare": ratio("step", "bare"),
        "step_over_bare_packed": ratio("step", "bare-packed"),
        "first_ready_over_step": ratio("first-ready", "step"),
        "hidden_share_of_round_trip": hidden(),
        # Throughput Ray / local is local's time per batch over Ray's.
        "ray_over_local": ratio("local", "step"),
        "first_ready_over_local": ratio("local", "first-ready"),
        "timers": {
            key: spread([s[key] for s in steps if key in s])
            for key in ("driver_own_us", "driver_wait_us", "actor_own_us", "env_us_per_step")
        },
    }


def break_even(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The env-step cost from which Ray reaches a share of local's throughput, per no-op
    layout: with ``T = F + w c`` per batch on both (``F`` the no-op row's time per batch,
    ``w = n / min(actors, cores)`` envs per core, ``c`` µs per env step), Ray / local
    reaches ``f`` from ``c = (f F_ray - F_local) / ((1 - f) w)`` (none: from any cost)."""
    cores = report["machine"].get("usable_cpus") or os.cpu_count() or 1
    out = []
    for c in report["configs"]:
        us = c.get("summary", {}).get("us_per_batch", {})
        if c["env"] != "noop" or "step" not in us or "local" not in us:
            continue
        f_ray, f_local = us["step"]["median"], us["local"]["median"]
        per_core = c["n_envs"] / min(c["n_actors"], cores)
        costs = {
            f"{share:g}": max(0.0, (share * f_ray - f_local) / ((1 - share) * per_core))
            for share in BREAK_EVEN_SHARES
        }
        out.append(
            {
                "n_actors": c["n_actors"],
                "envs_per_actor": c["envs_per_actor"],
                "ray_us_per_batch": f_ray,
                "local_us_per_batch": f_local,
                "env_us_per_step_for_share": costs,
            }
        )
    return out


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """envmgr step / bare round trip <= 1.2 with the same payload, per configuration."""
    out = []
    for c in report["configs"]:
        ratio = c.get("summary", {}).get("step_over_bare")
        if ratio is None or math.isnan(ratio["median"]):  # not measured
            continue
        value = ratio["median"]
        out.append(
            {
                "target": f"{c['env']} {c['n_actors']}x{c['envs_per_actor']} envmgr step / "
                f"bare round trip <= {TARGET_STEP_OVER_BARE:g}",
                "value": value,
                "shown": f"{value:.2f} ({ratio['min']:.2f}-{ratio['max']:.2f})",
                "met": value <= TARGET_STEP_OVER_BARE,
            }
        )
    return out


# ============================================================================ report


def tables(report: dict[str, Any]) -> str:
    """The round trip against the step, envmgr's own times, first-ready and local."""
    m = report["machine"]
    a = report["args"]
    lines = [
        f"Ray floor, {m['date']}, commit {m['git_commit']}"
        + (" (dirty)" if m["git_dirty"] else ""),
        f"{m['cpu_model']}, {m['usable_cpus']} usable CPUs, Python {m['python'].split()[0]}, "
        f"Ray {m['versions']['ray']}",
        f"{a['rounds']} interleaved rounds x {a['seconds']:g} s; median (min-max) over rounds; "
        "ratios within a round; µs per batch of n env-steps",
        "",
    ]
    head1 = ["env", "actors x envs", "answer B/actor", "bare", "bare packed", "envmgr step"]
    head1 += ["step / bare", "step / packed"]
    head2 = ["env", "actors x envs", "driver own", "driver waiting", "actor own / call"]
    head2 += ["env µs / step"]
    head3 = ["env", "actors x envs", "first-ready", "hidden of bare", "local", "Ray / local"]
    head3 += ["first-ready / local"]
    rows1: list[list[str]] = []
    rows2: list[list[str]] = []
    rows3: list[list[str]] = []
    for c in report["configs"]:
        base = [ENV_LABELS[c["env"]], f"{c['n_actors']} x {c['envs_per_actor']}"]
        why = c["skipped"].get("all") or "; ".join(f"{k}: {e}" for k, e in c["errors"].items())
        s = c.get("summary")
        if s is None:
            rows1.append(base + [f"skipped: {why}" if "all" in c["skipped"] else why])
            continue
        us, t = s["us_per_batch"], s["timers"]
        nbytes = [ch.get("answer_bytes_per_actor") for ch in c.get("children", [])]
        shown_bytes = next((f"{b:,}" for b in nbytes if b is not None), "-")
        times = [fmt_spread(us.get(k)) for k in ("bare", "bare-packed", "step")]
        ratios = [fmt_spread(s[k], 2) for k in ("step_over_bare", "step_over_bare_packed")]
        rows1.append([*base, shown_bytes, *times, *ratios])
        own = [fmt_spread(t[k]) for k in ("driver_own_us", "driver_wait_us", "actor_own_us")]
        rows2.append([*base, *own, fmt_spread(t["env_us_per_step"], 2)])
        rows3.append(
            [
                *base,
                fmt_spread(us.get("first-ready")),
                fmt_spread(s["hidden_share_of_round_trip"], 2),
                fmt_spread(us.get("local")),
                fmt_spread(s["ray_over_local"], 2),
                fmt_spread(s["first_ready_over_local"], 2) + (f" (failed: {why})" if why else ""),
            ]
        )
    lines += ["Ray's round trip and envmgr's step", *padded_table(head1, rows1), ""]
    lines += ["envmgr's own time per step, from its timers (µs)", *padded_table(head2, rows2), ""]
    lines += ["First-ready stepping and the local manager", *padded_table(head3, rows3), ""]
    lines.append("Where Ray meets the local manager (from the no-op rows; an estimate):")
    for b in report.get("break_even", []):
        costs = b["env_us_per_step_for_share"]
        shares = ", ".join(f"{float(f):.0%} from {v:,.0f} µs" for f, v in costs.items())
        lines.append(
            f"  {b['n_actors']} x {b['envs_per_actor']}: Ray {b['ray_us_per_batch']:,.0f} µs, "
            f"local {b['local_us_per_batch']:,.0f} µs per batch; Ray / local reaches "
            f"{shares} per env step"
        )
    if not report.get("break_even"):
        lines.append("  (no no-op rows measured)")
    lines += targets_table("Targets", report.get("targets", []))
    return "\n".join(lines) + "\n"


# ============================================================================ main


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.suites.ray_floor",
        description=(__doc__ or "").split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--envs", default=",".join(ENVS), help="(default: %(default)s)")
    p.add_argument("--actors", default="1,2,4", help="actors, cartpole and noop (%(default)s)")
    p.add_argument("--envs-per-actor", type=int, default=8, help="cartpole, noop (%(default)s)")
    p.add_argument("--real-n-envs", type=int, default=8, help="halfcheetah, pong (%(default)s)")
    p.add_argument("--real-actors", default="2", help="halfcheetah, pong (%(default)s)")
    p.add_argument("--noop-bytes", type=int, default=4096, help="no-op obs bytes (%(default)s)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (%(default)s)")
    p.add_argument("--seconds", type=float, default=0.5, help="timed seconds per kind")
    p.add_argument("--warmup", type=float, default=0.25, help="untimed seconds before each")
    p.add_argument(
        "--out",
        type=Path,
        default=RESULTS / "ray_floor",
        help="output directory (ray_floor.json/.txt; quick.* with --quick)",
    )
    p.add_argument("--quick", action="store_true", help="1 round, 0.1 s each: a smoke run")
    args = parse_suite_args(p, argv, QUICK)
    if args.child is not None:
        return args
    args.envs = [e for e in str(args.envs).split(",") if e]
    for e in args.envs:
        if e not in ENVS:
            p.error(f"unknown env {e!r}; choose from {','.join(ENVS)}")
    args.actors, args.real_actors = _ints(args.actors), _ints(args.real_actors)
    if not args.actors or not args.real_actors or min(args.actors + args.real_actors) < 1:
        p.error("--actors and --real-actors must be positive integers")
    bad = [k for k in args.real_actors if args.real_n_envs % k]
    if bad:
        p.error(f"--real-n-envs {args.real_n_envs} does not split over {bad} actors")
    if args.envs_per_actor < 1 or args.noop_bytes < 1:
        p.error("--envs-per-actor and --noop-bytes must be >= 1")
    if args.seconds <= 0 or args.warmup < 0 or args.rounds < 1:
        p.error("--seconds must be > 0, --warmup >= 0 and --rounds >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    return suite_main(parse_args(argv), "ray_floor", measure, run, tables)


if __name__ == "__main__":
    raise SystemExit(main())
