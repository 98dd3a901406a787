"""An icicle (top-down flame) chart of a timer tree, written as a PNG with matplotlib.

Needs the ``plot`` extra: ``pip install "envmgr[plot]"``. matplotlib is imported only when
:func:`plot_icicle` runs, and only through its object-oriented Agg API, so importing this
module is free and the global pyplot backend of the caller is never touched.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from os import PathLike
from typing import Any

from envmgr.timers.reading import (
    check_tree,
    child_nodes,
    node_count,
    short_seconds,
    summing_children,
    total_seconds,
)

__all__ = ["plot_icicle"]

PLOT_EXTRA_HINT = 'pip install "envmgr[plot]"'


@dataclass
class _Box:
    name: str
    depth: int
    x: float
    width: float
    total: float
    count: int
    parallel: bool
    scale: float  # drawn width / real total (< 1 inside shrunk parallel subtrees)
    shrunk: bool  # this node is where the shrinking starts (its scale < its parent's)


def _layout(
    tree: dict[str, Any],
    max_depth: int | None,
    min_width: float,
    keep_worker_root: bool,
) -> list[_Box]:
    """Place every node: a child starts where its elder sibling ends.

    When children add up to more than their parent (parallel workers), all of them are shrunk to
    fit.
    """
    root_total = total_seconds(tree)
    boxes: list[_Box] = []
    stack: list[tuple[str, Any, int, float, float, float]] = [
        (str(tree.get("name", "root")), tree, 0, 0.0, 1.0, 1.0)
    ]
    while stack:
        name, node, depth, x, scale, parent_scale = stack.pop()
        total = total_seconds(node)
        width = total * scale
        if width <= 0 or width < min_width * root_total:
            continue
        boxes.append(
            _Box(
                name,
                depth,
                x,
                width,
                total,
                node_count(node),
                bool(node.get("is_parallel")),
                scale,
                scale < 0.999 * parent_scale,
            )
        )
        if max_depth is not None and depth >= max_depth:
            continue
        kids = list(child_nodes(node).items()) if keep_worker_root else summing_children(node)
        kids = sorted(
            ((k, v) for k, v in kids if total_seconds(v) > 0), key=lambda kv: -total_seconds(kv[1])
        )
        kids_total = sum(total_seconds(v) for _, v in kids)
        child_scale = scale * min(1.0, total / kids_total) if kids_total > 0 else scale
        cx = x
        for k, v in kids:
            stack.append((k, v, depth + 1, cx, child_scale, scale))
            cx += total_seconds(v) * child_scale
    return boxes


def _color(cmap: Any, name: str, lo: float, hi: float) -> Any:
    # A stable colour per timer name, so the same timer looks the same in every row and run.
    h = (zlib.crc32(name.encode()) % 1000) / 1000.0
    return cmap(lo + (hi - lo) * h)


def plot_icicle(
    tree: Any,
    path: str | PathLike[str],
    title: str | None = None,
    *,
    max_depth: int | None = None,
    min_width: float = 0.002,
    keep_worker_root: bool = False,
    width: float = 16.0,
    dpi: int = 110,
) -> None:
    """Draws the timer tree as an icicle chart and saves it (PNG unless ``path`` says else).

    The root spans the full width (its total, in seconds); each row below holds the children
    of the row above, left to right from the largest, each as wide as its total. Timers that
    ran in worker processes are blue and marked ``||``. Their times are summed over workers
    running at once, so where children add up to more than their parent (``workers`` holding
    ``worker_0``, ``worker_1``, ...) they are shrunk together to fit inside it; their labels
    keep the real totals and show the drawing scale (``drawn x0.42``). ``worker_root`` is left
    out when ``worker_<i>`` nodes are present, as it is their sum.

    Args:
        tree: A timer tree: the dict from ``timers.get_timer_tree()``, a ``timers.json``
            document (ML-Agents' included) or a ``TimerNode``.
        path: Output file; the extension picks the format (``.png``, ``.svg``, ``.pdf``).
        title: Title above the chart; default names the root and its wall time.
        max_depth: Draw rows down to this depth only (root = 0).
        min_width: Skip boxes (and what is below them) narrower than this fraction of the root.
        keep_worker_root: Draw ``worker_root`` beside the ``worker_<i>`` nodes.
        width: Figure width in inches.
        dpi: Resolution of raster output.

    Raises:
        ImportError: If matplotlib is not installed (the message names the extra).
        TimerTreeError: If ``tree`` is not a timer tree.
        ValueError: If the root's total time is 0 (nothing to draw).
    """
    tree = check_tree(tree)
    try:
        from matplotlib import colormaps
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.patches import Patch, Rectangle
    except ImportError as exc:
        raise ImportError(f"plot_icicle needs matplotlib: {PLOT_EXTRA_HINT}") from exc

    root_total = total_seconds(tree)
    if root_total <= 0:
        raise ValueError("nothing to plot: the root's total time is 0")
    boxes = _layout(tree, max_depth, min_width, keep_worker_root)
    levels = max(b.depth for b in boxes) + 1

    row_in = 0.62  # inches per row: room for two lines of 8 pt text
    top_in, bottom_in = 0.7, 1.05
    height = top_in + bottom_in + levels * row_in
    fig = Figure(figsize=(width, height), dpi=dpi)
    FigureCanvasAgg(fig)
    left, right = 0.012, 0.988
    ax = fig.add_axes((left, bottom_in / height, right - left, levels * row_in / height))
    ax.set_xlim(0.0, root_total)
    ax.set_ylim(-levels + 1 - 0.02, 1.0)
    ax.set_yticks([])
    for side in ("left", "right", "top"):
        ax.spines[side].set_visible(False)
    ax.tick_params(axis="x", labelsize=8)
    ax.set_xlabel(
        f"seconds of the root's wall time ({short_seconds(root_total)} in all)", fontsize=9
    )

    warm, cool = colormaps["YlOrRd"], colormaps["Blues"]
    px_per_s = (right - left) * width * dpi / root_total
    fontsize = 8.0
    char_px = 0.6 * fontsize * dpi / 72.0
    any_scaled = False
    for b in boxes:
        parallel_color = _color(cool, b.name, 0.25, 0.55)
        face = parallel_color if b.parallel else _color(warm, b.name, 0.15, 0.5)
        ax.add_patch(
            Rectangle(
                (b.x, -b.depth), b.width, 0.92, facecolor=face, edgecolor="white", linewidth=0.6
            )
        )
        mark = "|| " if b.parallel else ""
        total = short_seconds(b.total)
        any_scaled |= b.shrunk
        note = f" (drawn x{b.scale:.2g})" if b.shrunk else ""
        calls = f", {b.count} calls" if b.count > 1 else ""
        candidates = [
            f"{mark}{b.name}\n{total}{calls}{note}",
            f"{mark}{b.name}\n{total}{note}",
            f"{mark}{b.name}\n{total}",
            f"{mark}{b.name}",
        ]
        room = b.width * px_per_s - 6.0
        label = next(
            (c for c in candidates if max(map(len, c.split("\n"))) * char_px <= room), None
        )
        if label is None:
            fit = int(room // char_px) - 1
            label = f"{mark}{b.name}"[:fit] + "…" if fit >= 3 else None
        if label:
            ax.text(
                b.x + 3.0 / px_per_s,
                -b.depth + 0.46,
                label,
                fontsize=fontsize,
                va="center",
                ha="left",
                clip_on=True,
            )

    fig.suptitle(
        title or f"{tree.get('name', 'root')}: {short_seconds(root_total)} wall time",
        fontsize=11,
        y=1.0 - 0.18 / height,
        va="top",
    )
    handles = [
        Patch(facecolor=_color(warm, "x", 0.3, 0.3), label="timer in this process"),
        Patch(
            facecolor=_color(cool, "x", 0.4, 0.4),
            label="|| parallel: timer in worker processes, time summed over workers",
        ),
    ]
    fig.legend(
        handles=handles,
        loc="lower left",
        bbox_to_anchor=(left, 0.0),
        ncol=2,
        fontsize=8,
        frameon=False,
    )
    if any_scaled:
        fig.text(
            right,
            0.12 / height,
            "workers ran at the same time: their boxes are shrunk to fit their parent "
            "('drawn xS'); labels give real totals",
            fontsize=8,
            ha="right",
            va="bottom",
        )
    fig.savefig(path)
