"""The caller_envs timeline table of docs/performance.md, from ``probes/timeline_caller.py``'s
JSON records (``benchmarks/results/record/timeline_caller_*.json``).

Registered with ``doc_tables.table``; see that module for the markers and the check.
"""

from __future__ import annotations

from benchmarks._common.paths import RECORD
from benchmarks.report.tables import load_json, markdown, rel, table

#: The records, in the table's order.
RECORDS = ["halfcheetah", "halfcheetah_n32", "noop-info"]


@table("caller-timeline")
def caller_timeline() -> str:
    """Per record: the caller's env steps, its own work beside them, and the batch's rate
    against the bounds of the same run."""
    rows, sources = [], []
    for name in RECORDS:
        path = RECORD / f"timeline_caller_{name}.json"
        rep = load_json(path)
        med, bound = rep["median_us"], rep["bounds_us"]
        batch = med["batch (post -> next post)"]
        half = rep["n_envs"] // 2
        rows.append(
            [
                f"{rep['env']}, {half} + {half} envs",
                f"{med['env steps, caller']:,.1f}",
                f"{rep['caller_own_us']:,.1f}",
                f"{rep['caller_own_share_of_env']:.2f}",
                f"{bound['lock-step'] / batch:.2f}",
                f"{bound['ceiling'] / batch:.2f}",
            ]
        )
        sources.append(f"`{rel(path)}` ({rep['date']})")
    head = [
        "case (fork)",
        "the caller's env steps, µs",
        "its own work on its path, µs",
        "own / env steps",
        "batch rate / lock-step",
        "/ ceiling",
    ]
    text = (
        f"*From {', '.join(sources)}; medians over each run's batches; rerun: "
        "`python -m benchmarks.probes.timeline_caller --env ENV --n N --out ... --json ...`.*\n\n"
    )
    return text + markdown(head, rows, "lrrrrr")
