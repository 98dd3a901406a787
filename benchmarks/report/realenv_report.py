"""The tables and the plot of ``realenv.py``'s results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._common.realenv_peers import ENVMGR_LAYOUTS, ENVPOOL_IDS, KNOWN_IMPLS, LABELS


def _ratio(x: float) -> str:
    return f"{x:.2f}" if x >= 0.095 else f"{x:.3f}"  # (a starved peer still shows a digit)


def _spread(r: dict[str, Any] | None) -> str:
    if not r or not r["per_round"]:
        return "–"
    lo, hi = _ratio(min(r["per_round"])), _ratio(max(r["per_round"]))
    return lo if lo == hi else f"{lo}-{hi}"


def _rate_spread(samples: list[dict[str, Any]] | None) -> str:
    if not samples:
        return "–"
    rates = [s["steps_per_second"] for s in samples]
    lo, hi = f"{min(rates) / 1e3:.3g}", f"{max(rates) / 1e3:.3g}"
    return f"{lo}k" if lo == hi else f"{lo}-{hi}k"


def tables(report: dict[str, Any]) -> str:
    """The ratio table, the steps/s medians, the parent's CPU per batch, and what failed."""
    configs = report["configs"]
    impls = [i for i in KNOWN_IMPLS if any(i in c["samples"] for c in configs)]
    a = report["args"]
    head = ["case", *[LABELS[i] for i in impls]]
    lines = [
        f"## Real envs: ratio to the ceiling (min-max over {a['rounds']} interleaved rounds of "
        f"{a['seconds']:g} s, each in a fresh interpreter); serial and ceiling in env-steps/s",
        "",
        "| " + " | ".join(head) + " |",
        "|---|" + "---:|" * len(impls),
    ]
    for c in configs:
        row = [f"{c['env']}, n={c['n_envs']}"]
        for i in impls:
            if i in ("serial", "ceiling"):
                row.append(_rate_spread(c["samples"].get(i)))
            else:
                row.append(_spread(c["ratios"].get(f"{i}/ceiling")))
        lines.append("| " + " | ".join(row) + " |")
    lines += [
        "",
        "EnvPool runs its own C++ ports (" + ", ".join(f"{v}" for v in ENVPOOL_IDS.values()) + "),",
        "not the Python envs the other columns step. Lock-step: the ceiling's processes behind",
        "a bare barrier every step (ceiling.LockStep).",
        "",
        "## Median env-steps/s",
        "",
        "| case | " + " | ".join(LABELS[i] for i in impls) + " |",
        "|---|" + "---:|" * len(impls),
    ]
    for c in configs:
        med = c["median_steps_per_second"]
        cells = [f"{med[i]:,.0f}" if i in med else "–" for i in impls]
        lines.append(f"| {c['env']}, n={c['n_envs']} | " + " | ".join(cells) + " |")
    lines += [
        "",
        "## The benchmark process's CPU per batch (µs, median), envmgr layouts",
        "(caller_envs includes the caller's own env steps)",
        "",
        "| case | " + " | ".join(LABELS[i] for i in ENVMGR_LAYOUTS) + " |",
        "|---|" + "---:|" * len(ENVMGR_LAYOUTS),
    ]
    for c in configs:
        cpu = c["median_parent_cpu_us_per_batch"]
        cells = [f"{cpu[i]:.0f}" if i in cpu else "–" for i in ENVMGR_LAYOUTS]
        lines.append(f"| {c['env']}, n={c['n_envs']} | " + " | ".join(cells) + " |")
    notes = [
        f"- {c['env']}, n={c['n_envs']}, {impl}: {kind} {why}"
        for c in configs
        for kind, table in (("skipped:", c["skipped"]), ("FAILED:", c["errors"]))
        for impl, why in table.items()
    ]
    if notes:
        lines += ["", "## Skipped or failed", "", *notes]
    lines += ["", f"Command: `{report['command']}`; {report.get('wall_seconds', 0):.0f} s."]
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> None:
    """One bar group per case: each implementation's ratio to the ceiling, min-max whiskers."""
    configs = report["configs"]
    impls = [i for i in KNOWN_IMPLS if i != "ceiling" and any(i in c["samples"] for c in configs)]
    _bars(report, impls, path, "Real envs", "EnvPool: its own C++ ports")


#: The layout chart: envmgr's three layouts beside the bound each one's structure sets.
LAYOUT_CHART = ["lockstep", "doorbell", "envmgr", "envmgr-firstready", "envmgr-caller"]


def plot_layouts(report: dict[str, Any], path: Path) -> None:
    """envmgr's layouts and their bounds only: which layout to pick, case by case."""
    _bars(
        report, LAYOUT_CHART, path, "envmgr's layouts", "lock-step: two processes, a bare barrier"
    )


def _bars(report: dict[str, Any], impls: list[str], path: Path, what: str, note: str) -> None:
    """Bars of ``impls``' ratios to the ceiling per case, titled with the run's date."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = report["configs"]
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(configs) + 3), 4.5))
    width = 0.8 / max(1, len(impls))
    for k, impl in enumerate(impls):
        xs, meds, lo, hi = [], [], [], []
        for j, c in enumerate(configs):
            r = c["ratios"].get(f"{impl}/ceiling")
            if not r or not r["per_round"]:
                continue
            xs.append(j + (k - (len(impls) - 1) / 2) * width)
            meds.append(r["median"])
            lo.append(r["median"] - min(r["per_round"]))
            hi.append(max(r["per_round"]) - r["median"])
        colour = f"C{KNOWN_IMPLS.index(impl) % 10}"
        ax.bar(xs, meds, width, yerr=[lo, hi], capsize=2, label=LABELS[impl], color=colour)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="ceiling")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels([f"{c['env']}\nn={c['n_envs']}" for c in configs])
    ax.set_ylabel("env-steps/s / ceiling (median, min-max)")
    m = report["machine"]
    a = report["args"]
    ax.set_title(
        f"{what}, {m['nproc']} CPUs, {a['rounds']} rounds x {a['seconds']:g} s, "
        f"{str(report.get('started', ''))[:10]}\n{note}",
        fontsize=9,
    )
    ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
