"""Why a layout wins, read from the merged timer tree of the measured runs.

Each layout is stepped under a timer node of its own, so its workers' trees merge beneath it
(``workers`` -> ``worker_<i>`` and ``worker_caller``; see the README's Timers section). From
those nodes, per batch:

* the parent's wait (``workers``) and its own work (the loop's wall time minus the wait);
* each worker's env time (``env.*``), time in its commands (busy), and ``send_response``,
  the answer it pickles and pipes when it has something to say (infos, an error).

The findings are plain sentences with the numbers behind them: "infos pickled every step",
"the parent waits for a core", "workers idle", "worker imbalance", "the caller's own work".
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from envmgr.timers.reading import child_nodes, node_count, short_seconds, total_seconds
from envmgr.timers.worker_view import WorkerStats
from envmgr.tune.layouts import Layout

__all__ = ["Reading", "explain", "findings", "read_layout"]

_GROUP_RE = re.compile(r"worker_(\d+|caller)")
#: An answer this long per batch, and this large a share of the worker's busy time, is
#: pickled infos rather than the few-µs "done" a worker without infos sends.
_SEND_FLOOR, _SEND_SHARE = 10e-6, 0.2
#: The parent's wait must exceed the busiest worker's busy time by this factor (and by
#: _WAIT_FLOOR) to be called waiting for a core rather than waiting for the workers.
_WAIT_FACTOR, _WAIT_FLOOR = 1.5, 10e-6
_IDLE_SHARE = 0.5
_IMBALANCE = 1.25
#: The caller's own work, as a share of its env calls, from which it is said to hold the
#: layout back: at 0.1 a caller layout already loses about a tenth of lock-step's rate.
_OWN_SHARE = 0.1


@dataclasses.dataclass(frozen=True)
class Group:
    """One worker (or the caller's block) as its merged timer node tells it; seconds in all.

    ``busy`` is the time in its commands (``step``, ``reset``, ``send_response``, ...), not
    ``wait_command`` and not the node's own time: a group's clock also runs while other
    layouts are timed, so only the time inside its commands belongs to this layout.
    """

    name: str
    calls: int
    env: float
    busy: float
    send: float

    def per_call(self, seconds: float) -> float:
        """``seconds`` spread over the calls this group served."""
        return seconds / self.calls if self.calls else 0.0


@dataclasses.dataclass(frozen=True)
class Reading:
    """What the timer tree says about one layout's measured runs.

    Attributes:
        batches: ``step`` calls (or ``recv`` calls, first-ready) timed.
        wait: The parent's wait per batch, seconds.
        own: The parent's own time per batch (its loop's wall time minus the wait), seconds.
        groups: Each worker's merged node (``worker_caller`` last, if any).
    """

    batches: int
    wait: float
    own: float
    groups: tuple[Group, ...]

    def group(self, name: str) -> Group | None:
        """The group named ``name`` (``worker_0``, ``worker_caller``), if measured."""
        return next((g for g in self.groups if g.name == name), None)

    @property
    def workers(self) -> list[Group]:
        """The worker processes (not the caller's block)."""
        return [g for g in self.groups if g.name != "worker_caller"]

    @property
    def idle_share(self) -> float:
        """The busiest worker's idle time per batch, as a share of the loop's time per batch.

        Idle time is the time not spent on its command. (A worker's own ``wait_command`` also
        runs while other layouts are timed, so the loop's clock is the one to divide by.)
        """
        batch = self.wait + self.own
        if not self.workers or batch <= 0:
            return 0.0
        busiest = max(g.per_call(g.busy) for g in self.workers)
        return max(0.0, 1.0 - busiest / batch)


def read_layout(node: Mapping[str, Any], batches: int, seconds: float) -> Reading:
    """Reads one layout's timer node (the loop's wall ``seconds`` over ``batches``)."""
    workers = child_nodes(node).get("workers") or {}
    wait = total_seconds(workers) if workers else 0.0
    groups = []
    for name, child in sorted(child_nodes(workers).items(), key=lambda kv: _group_key(kv[0])):
        if not _GROUP_RE.fullmatch(name):
            continue  # worker_root: the sum of the others
        stats = WorkerStats()
        stats.add(child)
        kids = child_nodes(child)
        busy = sum(total_seconds(c) for k, c in kids.items() if k != "wait_command")
        send = total_seconds(kids["send_response"]) if "send_response" in kids else 0.0
        groups.append(Group(name, node_count(child), stats.env, busy, send))
    per = 1.0 / batches if batches else 0.0
    return Reading(batches, wait * per, max(0.0, seconds - wait) * per, tuple(groups))


def _group_key(name: str) -> tuple[int, str]:
    m = _GROUP_RE.fullmatch(name)
    if m and m.group(1).isdigit():
        return int(m.group(1)), ""
    return 1 << 30, name  # worker_caller after the workers


def findings(
    layout: Layout, reading: Reading, cores: int, pickled_keys: Sequence[str]
) -> list[str]:
    """What stands out in one layout's timers, one sentence each, with its numbers.

    ``pickled_keys`` are the info keys a step returned that no info column holds (strings,
    dicts, large arrays): without them, a long ``send_response`` is the wake-up of the
    parent, not pickling.
    """
    out: list[str] = []
    workers = reading.workers
    lock_step = not layout.first_ready
    # first-ready workers ring the parent on every answer, so their send_response is the
    # wake-up, not pickling: only lock-step answers say something about the infos.
    if lock_step and workers and pickled_keys:
        w = max(workers, key=lambda g: g.per_call(g.send))
        send, busy = w.per_call(w.send), w.per_call(w.busy)
        if send >= _SEND_FLOOR and busy and send >= _SEND_SHARE * busy:
            out.append(
                f"infos pickled every step: {w.name}'s send_response took {short_seconds(send)} "
                f"per batch, {100 * send / busy:.0f}% of its busy time ({short_seconds(busy)}; "
                f"env calls {short_seconds(w.per_call(w.env))}): infos "
                f"{', '.join(pickled_keys[:4])}{', ...' if len(pickled_keys) > 4 else ''}"
            )
    if lock_step and workers and not layout.caller_envs and layout.n_workers + 1 > cores:
        busiest = max(g.per_call(g.busy) for g in workers)
        if reading.wait >= _WAIT_FACTOR * busiest and reading.wait - busiest >= _WAIT_FLOOR:
            out.append(
                f"the parent waits for a core: it waited {short_seconds(reading.wait)} per "
                f"batch for workers busy {short_seconds(busiest)} at most; "
                f"{layout.n_workers + 1} processes share {cores} cores"
            )
    if lock_step and workers and reading.idle_share >= _IDLE_SHARE:
        out.append(
            f"workers idle: even the busiest worker waited {100 * reading.idle_share:.0f}% of "
            f"each batch ({short_seconds(reading.wait + reading.own)}) for its next command; "
            f"the parent's own work ({short_seconds(reading.own)} per batch) and the hand-offs "
            "sit between their steps"
        )
    caller = reading.group("worker_caller")
    if lock_step and layout.caller_envs and caller is not None and caller.env > 0:
        # The loop outside the wait, and the block's work around its env calls: both on
        # the caller's path every batch. (The dispatch to the block is in the wait, not
        # counted: this is a lower bound.)
        env = caller.per_call(caller.env)
        own = reading.own + caller.per_call(caller.busy - caller.env)
        if own >= _OWN_SHARE * env:
            out.append(
                f"the caller's own work: {short_seconds(own)} per batch beside its "
                f"{layout.caller_envs} envs' {short_seconds(env)} ({100 * own / env:.0f}%; "
                "its loop outside the wait, its block's work around the env calls): every "
                f"batch adds it to the env calls, so this layout runs at about "
                f"{env / (env + own):.2f} of lock-step's rate here; more envs per side lower "
                "the share"
            )
    # Per call: first-ready workers serve different numbers of calls, a slow one fewer.
    envs = {g.name: g.per_call(g.env) for g in reading.groups}
    if len(envs) >= 2:
        median = statistics.median(envs.values())
        slow = max(envs, key=lambda k: envs[k])
        if median > 0 and envs[slow] >= _IMBALANCE * median:
            out.append(
                f"worker imbalance: {slow} spent {short_seconds(envs[slow])} per batch in env "
                f"calls, {100 * (envs[slow] / median - 1):.0f}% above the median "
                f"{short_seconds(median)}"
            )
    return out


def _env_per_batch(reading: Reading) -> float:
    """Mean env time per batch of one worker process."""
    workers = reading.workers
    return statistics.fmean(g.per_call(g.env) for g in workers) if workers else 0.0


def explain(
    best: Layout,
    default: Layout,
    readings: Mapping[Layout, Reading],
    num_envs: int,
) -> list[str]:
    """Why ``best`` beats the default layout, from both layouts' timers (one line each)."""
    if best == default:
        return []
    b, d = readings[best], readings[default]
    out: list[str] = []
    if best.hosted:
        share = (num_envs - best.caller_envs) // max(1, best.n_workers)
        out += [
            f"each worker steps its {share} envs in one batched call: "
            f"{short_seconds(_env_per_batch(b))} of env time per batch, against "
            f"{short_seconds(_env_per_batch(d))} for single envs in the default layout",
            "hosted envs come from the id's vector entry point, a separate implementation "
            "of the env: check that it is the env you mean to train on",
        ]
    caller = b.group("worker_caller")
    if best.caller_envs and caller is not None:
        own = caller.per_call(caller.busy)
        out += [
            f"the caller steps {best.caller_envs} envs itself on the core it would spend "
            f"waiting: in the default layout the parent waited {short_seconds(d.wait)} per "
            f"batch; here it spent {short_seconds(own)} on its own envs and waited "
            f"{short_seconds(max(0.0, b.wait - own))} for its worker",
            "caller_envs runs those envs in your process: an env that crashes the interpreter "
            "takes your loop with it, and a hung one cannot be timed out",
        ]
    if best.first_ready:
        out.append(
            "each worker is sent its next actions as soon as it finishes, so no worker waits "
            f"for the others: in the default layout the busiest worker waited "
            f"{100 * d.idle_share:.0f}% of each batch for its next command, and the parent "
            f"{short_seconds(d.wait)} per batch for the slowest"
        )
    if not out:
        out.append(
            f"{best.n_workers} workers of {num_envs // best.n_workers} envs: the parent waited "
            f"{short_seconds(b.wait)} per batch and did {short_seconds(b.own)} of its own "
            f"work, against {short_seconds(d.wait)} and {short_seconds(d.own)} with "
            f"{default.n_workers} workers"
        )
    return out
