"""Small costs the prose of README.md and docs/*.md quotes, from recorded results.

The action check per ``check_actions`` mode, a bare syscall, a Ray actor call against a
pipe round trip, and how far identical workers' env times drift apart: each is rendered
from a record in ``benchmarks/results/record/outputs/`` written by
``python -m benchmarks.report.record_outputs check-cost | syscall | ray-call | demo | examples``
(the note under each block names its rerun command), then
``python -m benchmarks.report.doc_tables --write``.

Registered with ``doc_tables.table``; see that module for the markers and the check. Each
block's text is a function of its record's path, so a record written elsewhere (a test's
scratch directory) renders the same way.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from benchmarks.report.tables import load_json, markdown, table
from benchmarks.report.tables_outputs import OUTPUTS, _failed, _where, note


def _parsed(path: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """A one-run record, its parsed result (``None`` if the run failed) and its note."""
    report = load_json(path)
    (run,) = report["runs"]
    if "parsed" not in run:
        return report, None, _failed(run) + "\n" + note(path, report)
    return report, run["parsed"], note(path, report)


def _us(x: float) -> str:
    """Two decimals below 1 µs, one below 100 µs, whole µs above."""
    return f"{x:.2f}" if x < 1 else f"{x:.1f}" if x < 100 else f"{x:,.0f}"


# ----------------------------------------------------------------- check_actions


def check_cost_table(path: Path = OUTPUTS / "check_cost.json") -> str:
    """µs per ``check_batch`` call of a valid batch, one row per space, one column per mode."""
    report, p, where = _parsed(path)
    if p is None:
        return where
    modes = p["modes"]
    by_space: dict[str, dict[str, float]] = {}
    for c in p["cases"]:
        by_space.setdefault(c["space"], {})[c["mode"]] = c["median_us"]
    rows = [[space, *(_us(us[m]) for m in modes)] for space, us in by_space.items()]
    cfg = p["config"]
    head = [f"µs per valid batch of {cfg['n_envs']}", *(f'`"{m}"`' for m in modes)]
    lead = (
        f"Cost of the check `step` makes (`ActionChecks.check_batch`), median of "
        f"{cfg['rounds']} rounds x {cfg['number']:,} calls:"
    )
    return f"{lead}\n\n{markdown(head, rows, 'l' + 'r' * len(modes))}\n\n{where}"


@table("check-cost")
def check_cost() -> str:
    return check_cost_table()


# ----------------------------------------------------------------- syscall


def syscall_sentence(path: Path = OUTPUTS / "syscall_cost.json") -> str:
    """What a bare syscall costs as Python makes it, next to a call that makes none."""
    report, p, where = _parsed(path)
    if p is None:
        return where
    c = {k: v["median_ns"] / 1e3 for k, v in p["calls"].items()}
    return (
        f"A bare syscall (`os.getppid()`) costs {c['getppid']:.2f} µs here, "
        f"`select.poll().poll(0)` {c['poll']:.2f} µs and a one-byte pipe write and read "
        f"{c['pipe_write_read']:.2f} µs (Python's call included; "
        f"`time.perf_counter_ns()`, which makes no syscall, {c['perf_counter_ns']:.2f} µs).\n"
        + where
    )


@table("syscall-cost")
def syscall_cost() -> str:
    return syscall_sentence()


# ----------------------------------------------------------------- Ray call


def ray_call_table(path: Path = OUTPUTS / "ray_call.json") -> str:
    """Every round trip of the record, and what pickling the payload saves."""
    report, p, where = _parsed(path)
    if p is None:
        return where

    def ms(k: dict[str, Any]) -> str:
        lo, hi = min(k["rounds_us"]) / 1e3, max(k["rounds_us"]) / 1e3
        return f"{k['median_us'] / 1e3:.3f} ({lo:.3f}-{hi:.3f})"

    rows = [[k["what"], ms(k)] for k in p["kinds"].values()]
    head = [f"round trip (Ray {p['ray']})", f"ms: median of {p['config']['rounds']} rounds (range)"]
    ratio = p["packed_over_arrays"]
    return (
        f"{markdown(head, rows, 'lr')}\n\n"
        f"Sent as one pickled `bytes` each way, the {p['n_envs']}-env step's round trip took "
        f"{ratio['median']:.2f}x the time of a tuple of arrays (median of the per-round ratios, "
        f"{min(ratio['per_round']):.2f}-{max(ratio['per_round']):.2f}x).\n" + where
    )


@table("ray-call")
def ray_call() -> str:
    return ray_call_table()


# ----------------------------------------------------------------- identical workers

#: The worker view's last line: how far the busiest worker's env time is above the median.
_LEAD = re.compile(r"^straggler: .*?([\d.]+)% above the median", re.M)


def worker_leads(paths: list[Path]) -> list[tuple[str, float]]:
    """(command, the busiest worker's lead in %) of every recorded run that printed one."""
    found = []
    for path in paths:
        for run in load_json(path)["runs"]:
            m = _LEAD.search(run.get("stdout", ""))
            if m:
                found.append((run["command"], float(m[1])))
    return found


WORKER_RECORDS = [
    OUTPUTS / name for name in ("demo.json", "example_sb3_ppo.json", "example_train_cartpole.json")
]


def worker_noise_sentence(paths: list[Path] = WORKER_RECORDS) -> str:
    """The spread of identical workers' env times in the recorded runs, from their worker view."""
    leads = worker_leads(paths)
    if not leads:
        return "No recorded run printed a worker view."
    values = [x for _, x in leads]
    files = ", ".join(f"`{_where(p)}`" for p in paths)
    return (
        f"In the {len(leads)} recorded runs of the demo and the examples (identical envs in "
        f"every worker), the busiest worker's env time was {min(values):.1f}-{max(values):.1f}% "
        f"above the median worker's.\n*From the `straggler:` lines in {files}; rerun: "
        "`python -m benchmarks.report.record_outputs demo` and `... examples`.*"
    )


@table("worker-noise")
def worker_noise() -> str:
    return worker_noise_sentence()
