"""An open manager's link to its backend: the one state, waits, restarts and timers.

The public API (:mod:`~envmgr.frontend.vector_env`), the per-env calls
(:mod:`~envmgr.frontend.calls`) and first-ready stepping
(:mod:`~envmgr.frontend.first_ready`) each hold a reference to the manager's one
:class:`Session` and go through its methods; none of them keeps state of its own.

What a lost group costs is chosen by the call's :class:`~envmgr.frontend.state.CallKind`:
a step or reset replaces it under the restart budget (:meth:`Session.recover`), a
per-env call breaks the manager, a timer flush leaves it for the next step or reset.
A healthy group past ``max_worker_steps`` or ``max_worker_memory`` is replaced the same
way, planned and not charged to the budget (:meth:`Session.recycle_due`, with
:mod:`~envmgr.frontend.recycling`).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from time import perf_counter
from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from envmgr import timers
from envmgr.backends.base import Backend, LostGroup, WaitResult, remote_exception
from envmgr.errors import (
    BrokenWorkerError,
    ClosedManagerError,
    RemoteTraceback,
    WorkerFailure,
    add_note,
)
from envmgr.frontend.options import seconds
from envmgr.frontend.recycling import Recycler
from envmgr.frontend.resets import reset_arguments
from envmgr.frontend.restarts import RestartBudget
from envmgr.frontend.results import BatchReader
from envmgr.frontend.state import (
    CLOSED,
    CLOSED_PHASE,
    IDLE,
    CallKind,
    PendingCall,
    Phase,
    State,
)
from envmgr.protocol.messages import AttachRagged, FlushTimers, Ready, Reset, StepResponse
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.timers.merge import WorkerTimers

__all__ = ["Session", "Batch", "Replaced"]

#: ``(obs, rewards, terminations, truncations, infos)``.
Batch = tuple[Any, np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]
#: Groups replaced during a wait: their envs and the note those envs' infos carry.
Replaced = dict[int, tuple[range, str]]
#: Why a group whose restart an interrupt cut off is lost (the next call restarts it).
_CUT_OFF = "its restart was cut off by an interrupt in this process"


class Session:
    """One manager's state, sequence numbers, waits, restart policy and worker timers.

    Args:
        backend: The backend running the groups.
        owner: The manager's class name, for ``AsyncVectorEnv``'s closed message.
        noun: What one group is called (``"worker"``); ``nouns``: several.
        budget: The restart budget.
        step_timeout: Default seconds a wait may take (``None``: no limit).
        start_timeout: Seconds a replacement may take to start and reset.
        timer_interval: Seconds between timer shipments (see ``WorkerTimers``).
        shutdown: The manager's shutdown, which a failure that is not recovered calls.
            Held weakly: the session must not keep its manager alive.
        recycler: Which groups are due for a planned replacement (``None``: no limits).
    """

    def __init__(
        self,
        backend: Backend,
        *,
        owner: str,
        noun: str,
        nouns: str,
        budget: RestartBudget,
        step_timeout: float | None,
        start_timeout: float | None,
        timer_interval: float,
        shutdown: Callable[[bool], None],
        recycler: Recycler | None = None,
    ) -> None:
        self.backend = backend
        self.layout = backend.layout
        self.owner, self.noun, self.nouns = owner, noun, nouns
        self.budget = budget
        self.step_timeout = step_timeout
        self.start_timeout = start_timeout
        #: Closed until :meth:`opened`: a manager whose start failed takes no calls.
        self.state: State = CLOSED
        self.failures: list[WorkerFailure] = []
        self.groups = list(range(self.layout.n_groups))
        self.seq = 0
        self.autoreset_mode = AutoresetMode.NEXT_STEP
        self.worker_timers = WorkerTimers(timer_interval, self.flush_timers, self.layout.n_groups)
        self.reader: BatchReader | None = None
        self.buffers: SharedBuffers | None = None
        #: Re-laid observation stores not yet announced to their group (it was stepping).
        self._untold: dict[int, Any] = {}
        self._shutdown = weakref.WeakMethod(shutdown)
        self.recycler = recycler

    def opened(
        self, buffers: SharedBuffers, reader: BatchReader, autoreset_mode: AutoresetMode
    ) -> None:
        """Every group started and the batch arrays are attached: calls may come."""
        self.buffers, self.reader, self.autoreset_mode = buffers, reader, autoreset_mode
        self.state = IDLE

    # ================================================================ names

    def where(self, g: int) -> str:
        """Group ``g`` named for messages (``"worker 1 (envs 2-3)"``)."""
        return self.backend.where(g)

    def next_seq(self) -> int:
        """A new sequence number; answers echo it, so an older answer is told apart."""
        self.seq += 1
        return self.seq

    def timeout(self, timeout: float | None) -> float | None:
        """Return ``timeout``, or the manager's ``step_timeout`` when it is ``None``.

        A bad one is refused before anything waits (a deadline that passes at once would end a
        healthy worker).
        """
        return self.step_timeout if timeout is None else seconds("timeout", timeout)

    # ================================================================ call order

    def require_usable(self, name: str) -> Backend:
        """The backend, unless the manager is closed or broken (then say so for call ``name``)."""
        state = self.state
        # check_usable refuses exactly these; looked at here, send/recv make one call less.
        if state.phase is CLOSED_PHASE or state.cause is not None:
            state.check_usable(self.owner, name)
        return self.backend

    def require_idle(self, name: str) -> Backend:
        """The backend, if no call is pending and no ``send()`` step in flight."""
        if self.state is not IDLE:
            self.state.check_idle(self.owner, self.nouns, name)
        return self.backend

    def begin(self, call: PendingCall) -> None:
        """``call`` was sent: it is pending until :meth:`take`."""
        self.state = State.pending(call)

    def take(self, kind: CallKind) -> PendingCall:
        """End the pending ``kind`` call and return it."""
        call = self.state.check_pending(self.owner, kind)
        self.state = IDLE
        return call

    def mark_in_flight(self, seqs: Mapping[int, int]) -> None:
        """The groups of ``seqs`` (group -> seq) started a step or reset ``recv()`` collects."""
        self.state = self.state.joined(seqs)

    def mark_received(self, groups: Sequence[int]) -> None:
        """``groups`` answered their ``send()`` (or reset): no longer in flight."""
        self.state = self.state.landed(groups)

    # ================================================================ failures

    def mark_broken(self, failure: BaseException) -> None:
        """Mark the manager broken by ``failure`` (the first one stays the cause); stop it."""
        if not self.state.closed:
            # Before the shutdown: an interrupt cutting it off must not leave an open
            # manager in front of stopped groups.
            self.state = State.broken(failure)
        shutdown = self._shutdown()
        if shutdown is not None:
            shutdown(False)

    def raise_remote(self, err: Any, fatal: bool = False) -> None:
        """Raise what a group reported; ``fatal``: the group exited after it (break first)."""
        g = err.worker_index
        exc = remote_exception(err, self.where(g), self.layout.range(g))
        if fatal or err.phase == "make" or err.seq == -1:
            self.mark_broken(exc)
        raise exc from RemoteTraceback(err.traceback)

    # ================================================================ waits

    def wait(
        self,
        seqs: Mapping[int, int],
        timeout: float | None,
        kind: CallKind,
        label: str = "",
        need: int | None = None,
        resets: Mapping[int, Reset] | None = None,
    ) -> tuple[dict[int, Any], Replaced]:
        """Wait for the answers to ``seqs`` (group -> seq; the first ``need``), then settle them.

        :meth:`settle` takes them in; ``label`` names the call in messages (default:
        ``kind``'s).
        """
        got = self.backend.wait(seqs, timeout, need, label or kind.value)
        return self.resolve_answers(got, kind, resets)

    def resolve_answers(
        self, got: WaitResult, kind: CallKind, resets: Mapping[int, Reset] | None = None
    ) -> tuple[dict[int, Any], Replaced]:
        """Fatal errors raised, lost groups replaced (or not, by ``kind``), errors raised.

        Returns:
            The answers by group, and the groups replaced on the way.
        """
        self.check_not_closed_under(kind.value)
        if got.fatal is not None:
            self.raise_remote(got.fatal, fatal=True)
        answers = got.answers
        replaced: Replaced = {}
        for g, lost in sorted(got.lost.items()) if got.lost else ():
            if kind is CallKind.FLUSH:
                # Its unshipped timings are gone with it; the next step or reset finds
                # it lost again (the backend still sees it dead or silent) and replaces
                # it under the restart policy, with the note its envs' infos carry.
                continue
            if not kind.replaces_lost:
                self.failures.append(lost.failure)
                self.mark_broken(lost.failure)
                raise lost.failure
            note = f"{self.where(g)}: {lost.reason}"  # names the group that failed
            answers[g] = self.recover(g, lost, None if resets is None else resets.get(g))
            replaced[g] = (self.layout.range(g), note)
        if got.errors or got.raised is not None:
            # Groups that answered (even with an error) are done with their send().
            self.mark_received([*answers, *(e.worker_index for e in got.errors)])
            if got.raised is not None:
                raise got.raised
            self.raise_remote(got.errors[0])
        return answers, replaced

    def recover(self, g: int, lost: LostGroup, reset: Reset | None) -> StepResponse:
        """Replace group ``g`` under the restart budget; its answer to the reset it then does.

        A group cut mid-step is reset (and, in next-step mode, reset once more at
        the next step); one cut mid-reset carries out the reset asked for.
        """
        first = lost.failure
        self.failures.append(first)
        if self.budget.max_restarts <= 0:
            self.mark_broken(first)
            raise first
        answer = self.replace_group(g, "restart", lost.reason, first, reset)
        assert answer is not None
        return answer

    def recycle_due(self, resets_all: Sequence[int] = ()) -> None:
        """Replace the groups found over a recycling limit, before the call about to post.

        Args:
            resets_all: Groups whose every env the coming reset resets: their
                replacement is not reset first (that reset is its first).
        """
        recycler = self.recycler
        assert recycler is not None
        self.flush_timers()  # a retired group's timings would go with it
        # Under "workers", beside the restarts, which nest there too.
        with timers.hierarchical_timer("workers", self.worker_timers.stack):
            for g, note in sorted(recycler.due.items()):
                # A clean stop, so that its envs are closed; replace() ends what is left.
                self.backend.retire(g, self.next_seq())
                self.replace_group(g, "recycle", note, None, None, then_reset=g not in resets_all)

    def replace_group(
        self,
        g: int,
        why: str,
        reason: str,
        first: BaseException | None,
        reset: Reset | None,
        *,
        then_reset: bool = True,
    ) -> StepResponse | None:
        """Replace group ``g`` and reset its replacement; the reset's answer.

        Args:
            g: The group.
            why: ``"restart"`` (a failure, charged to the budget) or ``"recycle"`` (planned:
                the first replacement is not charged; one that dies before it is ready is
                a failure, and charged). Names the timer node (``restart_worker_1``).
            reason: What happened, for messages.
            first: The failure that made the restart (``None`` for a recycle).
            reset: The reset to carry out (``None``: all its envs, see
                :meth:`_reset_replacement`).
            then_reset: Reset the replacement (default), or not (the coming call
                resets all its envs); then ``None`` is returned.
        """
        backend = self.backend
        recycling = why == "recycle"
        charged = not recycling
        after = reason if first is None else str(first)
        while True:
            self.check_not_closed_under(why)
            spent = self.budget.charge(g) if charged else None
            if spent is not None:
                message = f"{self.where(g)} failed ({reason}) {spent}, so the manager is closed"
                broken = BrokenWorkerError(message, g, self.layout.range(g))
                broken.__cause__ = first
                self.mark_broken(broken)
                raise broken from first
            with timers.hierarchical_timer(
                f"{why}_{self.noun}_{g}", self.worker_timers.stack
            ) as replaced:
                stage = "replace"
                try:
                    again = backend.replace(g, self.start_timeout)
                    stage = "reset"
                    if charged:
                        self.budget.done(g)
                    elif self.recycler is not None:
                        self.recycler.recycles[g] += 1
                    if isinstance(again, Ready):
                        if self.recycler is not None:
                            self.recycler.started(g)
                        self.merge_start(replaced, {g: again})
                        if not then_reset:
                            self._adopt(g, None)
                            return None
                        answer = self._reset_replacement(g, reset)
                        if not isinstance(answer, LostGroup):
                            if recycling:
                                self._adopt(g, answer)
                            return answer
                        again = answer
                except BaseException as exc:
                    # Ctrl-C cut the replacement (or its reset) off: the group is left
                    # lost, and the next call restarts it (under the same budget), where
                    # the backend can do that. The replacement's factory raised: broken.
                    # A reset's error is raised as at any reset.
                    if not isinstance(exc, Exception):
                        if not backend.abandon(g, _CUT_OFF):
                            self.mark_broken(exc)
                    else:
                        # What made the replacement is otherwise only in `failures`.
                        verb = "built" if stage == "replace" else "reset"
                        add_note(exc, f"raised while envmgr {verb} a replacement, after: {after}")
                        if stage == "replace":
                            self.mark_broken(exc)
                    raise
            # The replacement died or hung before it was ready: one more failure of
            # this group, under the budget.
            reason = f"its replacement {again.reason.removeprefix('it ')}"
            charged = True

    def _adopt(self, g: int, answer: StepResponse | None) -> None:
        """Take in a recycled group's replacement: its info columns are its own.

        Its reset's answer, the one the caller is not given, says which.
        """
        reader = self.reader
        if reader is not None:
            reader.adopt(g, answer)

    def _reset_replacement(self, g: int, reset: Reset | None) -> StepResponse | LostGroup:
        """Reset a replacement of group ``g``: as asked (``reset``), else all its envs.

        A replacement's envs were never reset: when ``reset`` has a mask, those it leaves
        out are reset first (all the group's envs, without seeds or options), so that
        every env has an observation, and the masked ones then get the reset asked for.
        """
        n = len(self.layout.range(g))
        if reset is None:
            next_step = self.autoreset_mode == AutoresetMode.NEXT_STEP
            return self._reset_group(g, Reset(-1, (None,) * n, None, None, False, next_step))
        if reset.mask is not None and not all(reset.mask):
            first = self._reset_group(g, Reset(-1, (None,) * n, None, None, False))
            if isinstance(first, LostGroup):
                return first
        return self._reset_group(g, Reset(-1, reset.seeds, reset.options, reset.mask, False))

    def _reset_group(self, g: int, template: Reset) -> StepResponse | LostGroup:
        """Send ``template`` (with a new seq) to group ``g`` alone: its answer, or its loss."""
        seq = self.next_seq()
        self.backend.post({g: replace(template, seq=seq)})
        got = self.backend.wait({g: seq}, self.start_timeout, None, "restart reset")
        if got.fatal is not None:
            self.raise_remote(got.fatal, fatal=True)
        if got.errors:
            self.raise_remote(got.errors[0])
        if g in got.answers:
            return got.answers[g]  # type: ignore[no-any-return]
        return got.lost[g]

    def batch_from_answers(
        self, answers: dict[int, Any], replaced: Replaced, ship: bool, ids: Any
    ) -> Batch:
        """The batch (or rows ``ids``) with the answers' infos; timers merged if shipped."""
        if ship:
            self.merge_timers(answers)
        reader = self.reader
        assert reader is not None
        batch = reader.read_answers(answers, replaced, ids)
        if reader.grows or self._untold:
            self.relay_ragged(reader)
        return batch

    def relay_ragged(self, reader: BatchReader) -> None:
        """Give each group whose rows spilled a larger store, and wait for it to move there.

        The group maps the new store and writes its latest observations into it before it
        answers; its header word says it moved, so an answer lost on the way (an interrupt
        here) costs nothing: the store is taken up when the header says so
        (:meth:`SharedBuffers.settle`). A group lost meanwhile is found at the next call.
        Under ``ragged="padded"`` every group of the block moves; one with a step in flight
        is told once it has landed (a later answer's call).
        """
        buffers = self.buffers
        assert buffers is not None
        grows, reader.grows = reader.grows, {}
        with timers.hierarchical_timer("ragged.relay", self.worker_timers.stack):
            if grows:
                self._untold.update(buffers.relay(grows))
            in_flight = self.state.in_flight
            tell = {g: layout for g, layout in self._untold.items() if g not in in_flight}
            if not tell:
                return
            for g in tell:
                del self._untold[g]
            seq = self.next_seq()
            self.backend.post({g: AttachRagged(seq, layout) for g, layout in tell.items()})
            self.backend.wait(dict.fromkeys(tell, seq), self.start_timeout, None, "re-lay")
            buffers.settle()
            for g in tell:
                if g not in buffers.pending:
                    reader.spills[g] = {}  # its latest observations are in the new store

    # ================================================================ reset / step

    def post_reset(
        self, seed: int | Sequence[int | None] | None, options: dict[str, Any] | None
    ) -> PendingCall:
        """Send a reset to the groups owning the envs it resets; the call to wait for."""
        backend = self.require_usable("reset")
        seeds, options, mask = reset_arguments(seed, options, self.layout.num_envs)
        if self.recycler is not None and self.recycler.due:
            ranges = zip(self.groups, map(self.layout.range, self.groups), strict=True)
            whole = [g for g, r in ranges if mask is None or mask[r.start : r.stop].all()]
            self.recycle_due(whole)  # before the seq: a replacement starts at the last one
        ship = self.worker_timers.timers_due()
        seq = self.next_seq()
        commands: dict[int, Reset] = {}
        for g in self.groups:
            r = self.layout.range(g)
            if mask is None or mask[r.start : r.stop].any():
                sub = None if mask is None else tuple(bool(b) for b in mask[r.start : r.stop])
                commands[g] = Reset(seq, tuple(seeds[r.start : r.stop]), options, sub, ship)
        backend.post(commands)
        self.worker_timers.unshipped = True
        return PendingCall(CallKind.RESET, dict.fromkeys(commands, seq), ship, commands)

    def start_step(self, actions: Any) -> tuple[int, bool]:
        """Hand checked actions to every group: the step's seq and whether timers ship."""
        recycler = self.recycler
        if recycler is not None and recycler.due:
            self.recycle_due()
        ship = self.worker_timers.timers_due()
        self.seq = seq = self.seq + 1
        self.backend.post_step(self.groups, seq, ship, actions, None)
        self.worker_timers.unshipped = True
        return seq, ship

    def finish_step(self, seq: int, ship: bool, timeout: float | None) -> Batch:
        """Wait for batch step ``seq``; the usual step is read straight from the arrays."""
        t0 = perf_counter()
        got = self.backend.wait_step(seq, timeout)
        reader = self.reader
        assert reader is not None
        if got is None:
            self.worker_timers.target.add_time(perf_counter() - t0)  # type: ignore[union-attr]
            batch = reader.read_shared()
        else:
            waited = perf_counter() - t0
            # Under "workers", which already holds the seconds waited (restarts nest there).
            with timers.hierarchical_timer("workers", self.worker_timers.stack) as node:
                node.total += waited
                answers, replaced = self.resolve_answers(got, CallKind.STEP)
            batch = self.batch_from_answers(answers, replaced, ship, None)
        recycler = self.recycler
        return batch if recycler is None else recycler.end_of_step(batch, reader.add_info)

    # ================================================================ timers

    def merge_timers(self, answers: dict[int, Any]) -> None:
        """Merge the timer trees shipped with ``answers`` into the current target."""
        self.worker_timers.merge(
            (self.backend.timer_name(g), a.timer_root, a.gauges)
            for g, a in sorted(answers.items())
            if a is not None
        )
        if len(answers) == len(self.groups) and self.state.phase is not Phase.IN_FLIGHT:
            self.worker_timers.shipped()

    def merge_start(self, node: Any, readies: dict[int, Ready]) -> None:
        """Merge the groups' start-up trees (shipped in their Ready) under ``node``."""
        name = self.backend.timer_name
        self.worker_timers.merge(
            ((name(g), r.timer_root, r.gauges) for g, r in readies.items()), node
        )

    def flush_timers(self, timeout: float | None = None) -> None:
        """Pull every group's unshipped timings into the current target, when idle.

        Args:
            timeout: Seconds to wait for the groups; default ``step_timeout``.
        """
        if not self.worker_timers.unshipped or self.state is not IDLE:
            return
        seq = self.next_seq()
        call = PendingCall(CallKind.FLUSH, dict.fromkeys(self.groups, seq))
        # Pending while it runs, so that a flush never nests: an inner one would take
        # the answers the outer one waits for and leave it reading a pipe for ever.
        self.begin(call)
        try:
            self.backend.post({g: FlushTimers(seq) for g in self.groups})
            answers, _ = self.wait(call.seqs, self.timeout(timeout), CallKind.FLUSH)
            self.merge_timers(answers)
        finally:
            if self.state.call is call:
                self.state = IDLE

    # ================================================================ shutdown

    def close_under_call(self) -> None:
        """Mark the manager closed and stop its groups, while another thread's call is inside.

        Closed from another thread, the call's wait ends and it raises ClosedManagerError
        (:meth:`settle`) instead of reading, or restarting, what close frees.
        """
        self.state = CLOSED
        for g in self.groups:
            try:
                self.backend.abandon(g, "the manager was closed by another thread")
            except Exception:
                pass  # a group with no process to stop (the caller's): nothing to end

    def check_not_closed_under(self, name: str) -> None:
        """Raise ClosedManagerError if another thread closed the manager while ``name`` waited.

        ``name`` is a call, or a restart in one.
        """
        if self.state is CLOSED:
            raise ClosedManagerError(
                f"{self.owner} was closed by another thread while its {name} waited"
            )

    def release(self, graceful: bool) -> None:
        """Stop the timers and the backend and drop the batch arrays (idempotent)."""
        self.worker_timers.close()
        self.reader = None  # views handed out stay valid: they keep the memory mapped
        self.buffers = None
        self.backend.shutdown(graceful)
