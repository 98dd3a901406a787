"""The throughput plot: one panel per env, every implementation's env-steps/s (PNG on disk)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks._common.timing import median
from benchmarks.report.text import LABELS

MARKERS = {
    "serial": "o",
    "ceiling": "*",
    "lockstep": "x",
    "sync": "s",
    "async": "^",
    "envmgr": "D",
    "envmgr-nocopy": "d",
    "envmgr-firstready": "P",
    "envmgr-caller": "<",
    "envmgr-hosted": "X",
    "envmgr-hosted-caller": "p",
    "vector": "h",
    "envpool": "v",
}


#: One colour per implementation, no two alike (matplotlib's ten were too few: the extra ones
#: came out as near-copies of its olive and brown).
COLOURS = {
    "serial": "#000000",
    "ceiling": "#7f7f7f",
    "lockstep": "#17becf",
    "sync": "#9467bd",
    "async": "#8c564b",
    "envmgr": "#1f77b4",
    "envmgr-nocopy": "#e377c2",
    "envmgr-firstready": "#2ca02c",
    "envmgr-caller": "#ff7f0e",
    "envmgr-hosted": "#393b79",
    "envmgr-hosted-caller": "#7b4173",
    "vector": "#bcbd22",
    "envpool": "#d62728",
}


def figure(configs: list[dict[str, Any]], title: str) -> Any:
    """One panel per env: median env-steps/s against n_envs, min-max error bars.

    The legend sits below the panels and the ratio notes under each panel's axis label,
    so neither covers a marker.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_names = list(dict.fromkeys(c["env"] for c in configs))
    cols = min(3, len(env_names))
    rows = (len(env_names) + cols - 1) // cols
    fig, axes = plt.subplots(
        rows, cols, figsize=(5 * cols, 4.4 * rows + 1), squeeze=False, layout="constrained"
    )
    handles: dict[str, Any] = {}
    for ax, env in zip(axes.flat, env_names, strict=False):
        cs = sorted((c for c in configs if c["env"] == env), key=lambda c: c["n_envs"])
        for impl in LABELS:
            pts = [(c["n_envs"], c["samples"][impl]) for c in cs if impl in c["samples"]]
            if not pts:
                continue
            xs = [p[0] for p in pts]
            rates = [[s["steps_per_second"] for s in p[1]] for p in pts]
            med = [median(r) for r in rates]
            lo = [m - min(r) for m, r in zip(med, rates, strict=True)]
            hi = [max(r) - m for m, r in zip(med, rates, strict=True)]
            handles[impl] = ax.errorbar(
                xs,
                med,
                yerr=[lo, hi],
                marker=MARKERS[impl],
                color=COLOURS[impl],
                linestyle="--" if impl == "ceiling" else "-",
                capsize=3,
                label=LABELS[impl],
            )
        notes = []
        for mine in ("envmgr", "envmgr-hosted", "envmgr-hosted-caller"):
            got = [(c["n_envs"], c["ratios"].get(f"{mine}/ceiling", {}).get("median")) for c in cs]
            got = [(n, r) for n, r in got if r is not None]
            if got:
                notes.append(f"{mine}/ceiling: " + ", ".join(f"{n}: {r:.2f}" for n, r in got))
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ticks = sorted({c["n_envs"] for c in cs})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(x) for x in ticks])
        ax.set_title(env)
        ax.set_xlabel("\n".join(["n_envs", *notes]), fontsize=8)
        ax.set_ylabel("env-steps/s (median, min-max)")
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(env_names) :]:
        ax.set_visible(False)
    fig.legend(
        list(handles.values()),
        [LABELS[i] for i in handles],
        loc="outside lower center",
        ncols=min(len(handles), 7),
        fontsize=8,
    )
    fig.suptitle(title, fontsize=10)
    return fig


def plot_title(report: dict[str, Any]) -> str:
    """The plot's title: what ran, where, and how long, from the run's JSON report."""
    m, cfg = report["machine"], report["config"]
    return (
        f"env-steps/s, {cfg['workers']} workers; {m['nproc']} CPUs, Python "
        f"{str(m['python']).split()[0]}, gymnasium {m['gymnasium']}, envmgr {m['envmgr']}, "
        f"{str(report.get('started_at', ''))[:10]}; "
        f"{cfg['repeats']} rounds x {cfg['seconds']:g} s"
    )


def plot(configs: list[dict[str, Any]], path: Path, title: str) -> None:
    """Draw ``figure`` to ``path`` (PNG, or the format its extension names)."""
    import matplotlib.pyplot as plt

    fig = figure(configs, title)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
