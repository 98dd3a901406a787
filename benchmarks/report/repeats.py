"""Repeat runs of the real-env suite, kept as rows of ``results/repeats.csv``.

One run moves a ratio by 0.1-0.2 on a shared VM, so the targets table of
docs/performance.md reads every repeat beside the run of record. A repeat keeps only what
that table reads: a row per implementation of each (env, n_envs) the run measured::

    realenv.json --rows_of--> started, commit, cpu, env, n_envs, impl, ratio to the
                              ceiling (median, min, max over the rounds), env-steps/s
    repeats.csv  --runs-->    one report per run, in realenv.json's shape (those fields)

Add a repeat (the command for one is in benchmarks/README.md)::

    python -m benchmarks.report.repeats add /tmp/repeat/realenv.json
"""

from __future__ import annotations

import argparse
import csv
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks._common.paths import RESULTS

REPEATS = RESULTS / "repeats.csv"
FIELDS = [
    "started",
    "commit",
    "cpu",
    "env",
    "n_envs",
    "impl",
    "ratio_to_ceiling",
    "ratio_min",
    "ratio_max",
    "steps_per_second",
]


def rows_of(report: dict[str, Any]) -> list[dict[str, str]]:
    """The rows of one realenv.json report: one per implementation of each configuration.

    Numbers are written at full precision (``repr``), so a table read from the rows equals
    one read from the report.
    """
    machine = report.get("machine", {})
    rows = []
    for config in report["configs"]:
        rates = config["median_steps_per_second"]
        for impl, rate in rates.items():
            got = config["ratios"].get(f"{impl}/ceiling")
            rounds = got["per_round"] if got else []
            rows.append(
                {
                    "started": str(report.get("started", "")),
                    "commit": str(machine.get("git_commit", "?")),
                    "cpu": str(machine.get("cpu_model") or "?"),
                    "env": config["env"],
                    "n_envs": str(config["n_envs"]),
                    "impl": impl,
                    "ratio_to_ceiling": repr(got["median"]) if got else "",
                    "ratio_min": repr(min(rounds)) if rounds else "",
                    "ratio_max": repr(max(rounds)) if rounds else "",
                    "steps_per_second": repr(rate),
                }
            )
    return rows


def runs(path: Path = REPEATS) -> list[dict[str, Any]]:
    """Every run in ``path``, as a report with the fields of realenv.json the tables read."""
    reports: dict[tuple[str, str], dict[str, Any]] = {}
    with path.open(newline="", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            report = reports.setdefault(
                (row["started"], row["commit"]),
                {
                    "started": row["started"],
                    "machine": {"git_commit": row["commit"], "cpu_model": row["cpu"]},
                    "configs": [],
                },
            )
            key = (row["env"], int(row["n_envs"]))
            configs = {(c["env"], c["n_envs"]): c for c in report["configs"]}
            if key not in configs:
                configs[key] = {
                    "env": key[0],
                    "n_envs": key[1],
                    "median_steps_per_second": {},
                    "ratios": {},
                }
                report["configs"].append(configs[key])
            config = configs[key]
            config["median_steps_per_second"][row["impl"]] = float(row["steps_per_second"])
            if row["ratio_to_ceiling"]:
                config["ratios"][f"{row['impl']}/ceiling"] = {
                    "median": float(row["ratio_to_ceiling"]),
                    "min": float(row["ratio_min"]),
                    "max": float(row["ratio_max"]),
                }
    return list(reports.values())


def write(path: Path, rows: list[dict[str, str]]) -> None:
    """Append ``rows`` to ``path``, writing the header first if the file is new."""
    new = not path.exists()
    with path.open("a", newline="", encoding="utf-8") as f:
        out = csv.DictWriter(f, fieldnames=FIELDS, lineterminator="\n")
        if new:
            out.writeheader()
        out.writerows(rows)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Add real-env repeat runs to results/repeats.csv.")
    sub = p.add_subparsers(dest="command", required=True)
    add = sub.add_parser("add", help="append each realenv.json's rows")
    add.add_argument("reports", nargs="+", type=Path, help="realenv.json files of repeat runs")
    add.add_argument("--csv", type=Path, default=REPEATS, help=f"(default {REPEATS})")
    args = p.parse_args(argv)
    for report in args.reports:
        rows = rows_of(json.loads(report.read_text(encoding="utf-8")))
        write(args.csv, rows)
        print(f"{report}: {len(rows)} rows added to {args.csv}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
