"""The per-worker summary of a timer tree: where each worker process spent its time.

It also says which worker, if any, held the batch back.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from typing import Any

from envmgr.timers.reading import (
    UNTIMED,
    WORKER_RE,
    check_tree,
    child_nodes,
    format_seconds,
    node_count,
    short_seconds,
    total_seconds,
)

__all__ = [
    "STRAGGLER_EXCESS",
    "worker_summary",
    "WorkerStats",
]

#: A worker is named a straggler when its env time is at least this much above the median
#: worker's. Workers stepping identical envs differ from scheduling noise alone, more on a
#: busy machine (the README's worker-noise passage gives the recorded spread), so a smaller
#: excess says nothing about the worker; 20% leaves room for a loaded shared VM.
STRAGGLER_EXCESS = 0.20


# ------------------------------------------------------------------ per-worker summary


class WorkerStats:
    """One worker's time, summed over the nodes of its trees.

    Attributes:
        total: Seconds in the worker's trees.
        env: Seconds in env calls.
        wait: Seconds waiting for a command.
        transfer: Seconds sending answers, and of steps and resets outside env calls.
        env_calls: Env calls of every kind (``env.*`` nodes).
        env_steps: ``env.step`` calls.
        env_resets: ``env.reset`` calls.
    """

    __slots__ = ("total", "env", "wait", "transfer", "env_calls", "env_steps", "env_resets")

    def __init__(self) -> None:
        self.total = self.env = self.wait = self.transfer = 0.0
        self.env_calls = self.env_steps = self.env_resets = 0

    def add(self, node: Mapping[str, Any]) -> None:
        """Add one of the worker's tree nodes to the sums."""
        self.total += total_seconds(node)
        for name, child in child_nodes(node).items():
            if name == "wait_command":
                self.wait += total_seconds(child)
            elif name == "send_response":
                self.transfer += total_seconds(child)
            elif name.startswith("env."):
                self._add_env(name, child)
            else:
                # A command ("step", "reset", ...): env calls inside it are env time, the
                # rest (reading actions, writing observations to shared memory) is transfer.
                inner = 0.0
                for sub_name, sub in child_nodes(child).items():
                    if sub_name.startswith("env."):
                        inner += total_seconds(sub)
                        self._add_env(sub_name, sub)
                if name in ("step", "reset"):
                    self.transfer += max(0.0, total_seconds(child) - inner)

    def _add_env(self, name: str, node: Mapping[str, Any]) -> None:
        self.env += total_seconds(node)
        self.env_calls += node_count(node)
        if name == "env.step":
            self.env_steps += node_count(node)
        elif name == "env.reset":
            self.env_resets += node_count(node)

    @property
    def other(self) -> float:
        """Seconds in none of env, wait or transfer."""
        return max(0.0, self.total - self.env - self.wait - self.transfer)


def _find_workers(
    tree: Mapping[str, Any],
) -> tuple[dict[int, WorkerStats], list[tuple[str, float, int]]]:
    """Return per-worker stats summed over every place worker trees were merged.

    Those places come too, as (path, parent's total, parent's count).
    """
    workers: dict[int, WorkerStats] = {}
    places: list[tuple[str, float, int]] = []
    stack: list[tuple[str, Mapping[str, Any]]] = [("", tree)]
    while stack:
        path, node = stack.pop()
        found = False
        for name, child in child_nodes(node).items():
            m = WORKER_RE.fullmatch(name)
            if m:
                found = True
                workers.setdefault(int(m.group(1)), WorkerStats()).add(child)
            elif name != "worker_root":
                stack.append((f"{path}/{name}" if path else name, child))
        if found:
            places.append(
                (path or str(tree.get("name", "root")), total_seconds(node), node_count(node))
            )
    places.reverse()  # the stack visits later siblings first
    return workers, places


def worker_summary(tree: Any) -> str:
    """Summarises where each worker process spent its time.

    Every ``worker_<i>`` subtree in the tree is found (the manager merges worker trees under
    ``workers`` wherever the loop stepped, e.g. both under ``env_reset`` and ``env_step``) and
    summed per worker. Each worker's time is split into:

    * env: every ``env.*`` call (``env.step``, and ``env.reset`` from resets and autoresets);
    * waiting: ``wait_command``, idle until the parent sends the next command;
    * transfer: ``send_response`` plus the self time of ``step`` / ``reset`` (reading actions,
      writing results to shared memory);
    * other: the rest of the worker's wall time (its loop, time not yet attributed).

    A final line names the straggler: the worker with the most env time, when that is at least
    ``STRAGGLER_EXCESS`` (20%) above the median worker's; below that it says by how much the
    busiest worker led, and that this is within noise.

    Args:
        tree: A timer tree (see :func:`format_tree`).

    Returns:
        The summary as text; a one-line note when the tree has no ``worker_<i>`` nodes.
    """
    tree = check_tree(tree)
    workers, places = _find_workers(tree)
    if not workers:
        return "no per-worker timers in this tree (no worker_<i> nodes)"

    lines = []
    where = ", ".join(_place(p) for p, _, _ in places)
    lines.append(f"per-worker time, summed over {len(places)} merge point(s): {where}")
    for path, total, count in places:
        if count:
            lines.append(
                f"  parent waited in {_place(path)}: {short_seconds(total)} over {count} call(s) "
                f"({short_seconds(total / count)} per call)"
            )

    def pct(part: float, whole: float) -> str:
        return f"{100.0 * part / whole:5.1f}%" if whole > 0 else "     -"

    header = (
        f"{'worker':<10} {'total':>11} {'env':>11} {'%':>6} {'waiting':>11} {'%':>6} "
        f"{'transfer':>11} {'%':>6} {'other':>11} {'env calls':>10} {'per call':>11}"
    )
    lines.append(header)
    lines.append("-" * len(header))
    everyone = WorkerStats()
    for index in sorted(workers):
        s = workers[index]
        lines.append(_worker_row(f"worker_{index}", s, pct))
        for slot in WorkerStats.__slots__:
            setattr(everyone, slot, getattr(everyone, slot) + getattr(s, slot))
    if len(workers) > 1:
        lines.append(_worker_row("all", everyone, pct))
    lines += [
        "env = env.* calls; waiting = wait_command, idle until the parent's next command;",
        "transfer = send_response plus the step/reset timers' own time: reading actions and",
        "writing observations, rewards and infos to shared memory or the pipe; other = the rest",
        "of the worker's wall time (its own loop)",
    ]
    if everyone.total > 0:
        shares = {
            "env": everyone.env,
            "waiting": everyone.wait,
            "transfer": everyone.transfer,
        }
        top = max(shares, key=lambda k: shares[k])
        share = 100.0 * shares[top] / everyone.total
        verdict = {
            "env": f"env-bound: workers spent {share:.0f}% of their time in env calls",
            "waiting": f"parent-bound: workers spent {share:.0f}% of their time waiting for "
            "the next command",
            "transfer": f"transfer-bound: workers spent {share:.0f}% of their time moving "
            "actions and results",
        }[top]
        lines.append(f"verdict: {verdict}")
    lines.append(_straggler_line(workers))
    return "\n".join(lines)


def _worker_row(label: str, s: WorkerStats, pct: Any) -> str:
    per_call = format_seconds(s.env / s.env_calls) if s.env_calls else ""
    return (
        f"{label:<10} {format_seconds(s.total):>11} {format_seconds(s.env):>11} "
        f"{pct(s.env, s.total):>6} {format_seconds(s.wait):>11} {pct(s.wait, s.total):>6} "
        f"{format_seconds(s.transfer):>11} {pct(s.transfer, s.total):>6} "
        f"{format_seconds(s.other):>11} {s.env_calls:>10} {per_call:>11}"
    )


def _place(path: str) -> str:
    """A merge point's path as shown: a ``workers`` node under the root says what it holds."""
    return f"workers {UNTIMED}" if path == "workers" else path


def _straggler_line(workers: dict[int, WorkerStats]) -> str:
    """The worker with the most env time, named a straggler only past ``STRAGGLER_EXCESS``."""
    if len(workers) < 2:
        return "straggler: n/a (only one worker)"
    env = {i: s.env for i, s in workers.items()}
    median = statistics.median(env.values())
    slowest = max(sorted(env), key=lambda i: env[i])
    fastest = min(sorted(env), key=lambda i: env[i])
    if median <= 0:
        return "straggler: n/a (no env time recorded)"
    excess = 100.0 * (env[slowest] - median) / median
    rule = f"{100 * STRAGGLER_EXCESS:.0f}%"
    if excess < 100.0 * STRAGGLER_EXCESS:
        return (
            f"straggler: none (worker_{slowest} has the most env time, {excess:.1f}% above the "
            f"median {short_seconds(median)}: under the {rule} that identical workers can "
            "differ by from noise alone)"
        )
    s = workers[slowest]
    calls = (
        f" ({s.env_calls} calls, {short_seconds(s.env / s.env_calls)} each)" if s.env_calls else ""
    )
    return (
        f"straggler: worker_{slowest} spent {short_seconds(env[slowest])} in env calls{calls}, "
        f"{excess:.1f}% above the median {short_seconds(median)} (named from {rule}); "
        f"fastest: worker_{fastest}, {short_seconds(env[fastest])}"
    )
