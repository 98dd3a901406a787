"""The timer-cost table of README.md, from benchmarks/suites/timer_overhead.py's JSON record.

Registered with ``doc_tables.table``; see that module for the markers and the check.
"""

from __future__ import annotations

from benchmarks.report.tables import caption, load_json, markdown, newest, table


@table("timer-cost")
def timer_cost() -> str:
    """What a timer costs alone, and what two per batch step do to envmgr's throughput."""
    path = newest("timer_overhead.json")
    report = load_json(path)
    per, run = report["per_call"], report["throughput"]
    ratios = run["ratio_per_round"]
    rows = [
        [
            '`with hierarchical_timer("x"): pass`, enter + exit (median of '
            f"{per['rounds']} rounds x {per['calls_per_round']:,} calls)",
            f"{per['timer_us']:.2f} µs",
        ],
        [
            "`@timed` on an empty function, beyond a plain call",
            f"{per['timed_decorator_net_us']:.2f} µs",
        ],
        [
            f"envmgr {run['env']} {run['n_workers']} x {run['envs_per_worker']}: throughput with "
            f"two timers per batch step / without (median of {run['rounds']} per-round ratios)",
            f"{run['median_ratio_with_over_without']:.2f} ({min(ratios):.2f}-{max(ratios):.2f})",
        ],
    ]
    more = f"`python -m benchmarks.suites.timer_overhead`, {report['nproc']} CPUs"
    return caption(path, None, more) + markdown(["what", "cost"], rows, "lr")
