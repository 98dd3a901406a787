"""The Ray backend: one actor per group, commands as actor calls, one ``ray.wait`` loop.

Data flow of one step::

    post_step: each actor's rows of the actions -> actor.run.remote(Step)  (one call per actor)
    wait:      ray.wait on the calls' refs; each answer's arrays (observations,
               rewards, flags) are copied into the driver's batch arrays at the
               actor's rows; a RayError means the actor is lost (RayActorDiedError),
               a passed deadline that it overran (WorkerTimeoutError)

The actor (:mod:`envmgr.backends.ray.actor`) serves commands with the same
:class:`~envmgr.envside.group.EnvGroup` a worker process uses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from time import monotonic
from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.backends.base import LostGroup, WaitResult, group_shares, remote_exception, unsendable
from envmgr.backends.ray.actor import actor_class, pack, unpack
from envmgr.backends.ray.hints import import_fix
from envmgr.envside.serve import error_response
from envmgr.errors import RayActorDiedError, RemoteTraceback, WorkerDiedError, WorkerTimeoutError
from envmgr.protocol.info_columns import ROW_BYTES
from envmgr.protocol.layout import Layout
from envmgr.protocol.messages import Command, ErrorResponse, Ready, Step, StepResponse
from envmgr.protocol.ragged import RaggedStore
from envmgr.protocol.shared_memory import SharedBuffers
from envmgr.protocol.trees import scatter_tree

__all__ = ["RayBackend", "RayActorDiedError", "ActorInfo"]


@dataclass
class ActorInfo:
    """Where one actor of the manager runs.

    Attributes:
        index: The actor's index in the manager.
        envs: Global indices of its envs.
        node_id: Ray node id (hex).
        node_ip: The node's IP address.
        pid: The actor's process id.
        actor_id: Ray actor id (hex).
        restarts: How many times it was replaced (restarts and recycles).
    """

    index: int
    envs: range
    node_id: str = ""
    node_ip: str = ""
    pid: int = 0
    actor_id: str = ""
    restarts: int = 0

    @property
    def timer_name(self) -> str:
        """The actor's node name in the timer tree: ``actor_<index>@<node ip>``."""
        return f"actor_{self.index}@{self.node_ip}"


class RayBackend:
    """Actors over Ray (see the module docstring).

    Args:
        ray: The ``ray`` module.
        layout: The groups.
        payloads: Each group's cloudpickled :class:`~envmgr.envside.group.GroupSpec`.
        actor_opts: ``.options(...)`` per actor.
        start_timeout: Seconds to place and start an actor.
        close_timeout: Seconds :meth:`shutdown` waits for actors to close their envs.
        get_timeout: Seconds to fetch an answer ``ray.wait`` said was ready.
    """

    def __init__(
        self,
        ray: Any,
        layout: Layout,
        payloads: list[bytes],
        actor_opts: list[dict[str, Any]],
        *,
        start_timeout: float | None,
        close_timeout: float,
        get_timeout: float,
    ) -> None:
        self.ray = ray
        self.layout = layout
        self._payloads = payloads
        self._opts = actor_opts
        self.start_timeout = start_timeout
        self.close_timeout = close_timeout
        self.get_timeout = get_timeout
        self.actors: list[Any] = []
        self.actor_info = [ActorInfo(g, layout.range(g)) for g in range(layout.n_groups)]
        self.buffers: SharedBuffers | None = None
        self._calls: dict[int, tuple[int, Any]] = {}  # group -> (seq, ref) of its call
        self._cut: dict[int, str] = {}  # group -> why its restart was abandoned (see abandon)
        self._rss: dict[int, int] = {}  # group -> its actor's resident bytes, as last told
        self._rss_calls: dict[int, Any] = {}  # group -> the ref of its pending report

    # ================================================================ names

    def where(self, g: int) -> str:
        """Return group ``g``'s name in messages, with its node, node id and pid when known."""
        where = self.layout.where("ray actor", g)
        info = self.actor_info[g]
        if info.node_ip:
            where += f" on node {info.node_ip} (node id {info.node_id[:12]}, pid {info.pid})"
        return where

    def timer_name(self, g: int) -> str:
        """Return the name of group ``g``'s node in the timer tree: its actor's."""
        return self.actor_info[g].timer_name

    # ================================================================ start-up

    def _new_actor(self, g: int) -> Any:
        return actor_class(self.ray).options(**self._opts[g]).remote(self._payloads[g], g)

    def start(self) -> list[Ready]:
        """Start every actor and return their start-up answers.

        An actor that does not start within ``start_timeout`` raises WorkerTimeoutError, naming
        the resources it asked for and those the cluster has free.
        """
        ray = self.ray
        self.actors = [self._new_actor(g) for g in range(self.layout.n_groups)]
        refs = [a.start.remote() for a in self.actors]
        _, not_ready = ray.wait(refs, num_returns=len(refs), timeout=self.start_timeout)
        if not_ready:
            g = refs.index(not_ready[0])
            raise WorkerTimeoutError(
                f"{self.where(g)}: it did not start within {self.start_timeout} s: could it be "
                f"placed? It asks for {self._opts[g]}; the cluster has "
                f"{ray.available_resources()} free",
                g,
                self.layout.range(g),
            )
        return [self._started(g, ref) for g, ref in enumerate(refs)]

    def _started(self, g: int, ref: Any) -> Ready:
        exceptions = self.ray.exceptions
        try:
            answer, node_id, node_ip, pid = self.ray.get(ref, timeout=self.get_timeout)
        except exceptions.RayTaskError as err:  # not the actor's death: start() raised
            failed = self._task_error(g, -1, "start", err)
            exc = remote_exception(failed, self.where(g), self.layout.range(g))
            raise exc from RemoteTraceback(failed.traceback)
        except exceptions.RayError as err:
            raise self._died(g, "start", err).failure from err
        info = self.actor_info[g]
        info.node_id, info.node_ip, info.pid = node_id, node_ip, pid
        try:
            info.actor_id = self.actors[g]._actor_id.hex()
        except Exception:
            info.actor_id = ""
        if isinstance(answer, ErrorResponse):
            answer = self._explained(answer, -1, "make")
            exc = remote_exception(answer, self.where(g), self.layout.range(g))
            raise exc from RemoteTraceback(answer.traceback)
        return answer  # type: ignore[no-any-return]

    def attach(
        self,
        observation_space: gym.Space[Any],
        action_space: gym.Space[Any],
        ragged: Any = None,
        info_row_bytes: int = ROW_BYTES,
    ) -> Any:
        """The driver's private batch arrays; answers are copied in at each actor's rows."""
        layout = self.layout
        spaces = (observation_space, action_space)
        self.buffers = SharedBuffers.private(
            *spaces, layout.num_envs, layout.n_groups, info_row_bytes
        )
        self.buffers.add_ragged(layout.sizes, ragged, shared=False)
        return self.buffers

    # ================================================================ commands

    def post(self, commands: Mapping[int, Command]) -> None:
        """Send ``commands`` to their actors, all packed before any is sent."""
        packed = {}
        for g, cmd in commands.items():
            try:  # all of them before any is sent: a call reaches every group or none
                packed[g] = pack(cmd, getattr(cmd, "actions", None))
            except Exception as exc:
                raise unsendable(cmd, exc) from exc
        for g, cmd in commands.items():
            if g in self._cut:  # its actor is gone: the wait reports it lost
                self._calls[g] = (cmd.seq, None)
                continue
            self._calls[g] = (cmd.seq, self.actors[g].run.remote(packed[g]))

    def post_step(
        self, groups: Sequence[int], seq: int, ship: bool, actions: Any, ids: np.ndarray | None
    ) -> None:
        """Send a batch step to ``groups``, each with its share of ``actions``."""
        buffers = self.buffers
        assert buffers is not None
        stores = buffers.action_stores
        if stores is not None:
            # Each actor's rows in its store (checked, as the workers' are), which rides in
            # the step's message as padded arrays plus lengths.
            stores.place(actions, groups, ids)
            self.post({g: Step(seq, ship, stores.stores[g]) for g in groups})
            return
        shares = group_shares(buffers.layout.action_space, actions, self.layout, groups, ids)
        self.post({g: Step(seq, ship, shares[g]) for g in groups})

    # ================================================================ waiting

    def wait(
        self, seqs: Mapping[int, int], timeout: float | None, need: int | None, phase: str
    ) -> WaitResult:
        """Wait for the actors' answers to ``seqs`` (group -> seq); one past ``timeout`` is lost."""
        ray = self.ray
        deadline = None if timeout is None else monotonic() + timeout
        want = len(seqs) if need is None else min(need, len(seqs))
        got = WaitResult()
        for g in seqs:
            if g in self._cut:
                got.lost[g] = self._abandoned(g)
        waiting = {self._calls[g][1]: g for g in seqs if g not in got.lost}
        while waiting and len(got.answers) + len(got.lost) + len(got.errors) < want:
            left = None if deadline is None else max(0.0, deadline - monotonic())
            todo = want - len(got.answers) - len(got.lost) - len(got.errors)
            ready, _ = ray.wait(list(waiting), num_returns=min(todo, len(waiting)), timeout=left)
            if not ready:  # the deadline passed: the oldest calls overran it
                late = sorted(waiting.items(), key=lambda item: (seqs[item[1]], item[1]))
                for ref, g in late[:todo]:
                    del waiting[ref]
                    reason = f"it did not answer {phase} within {timeout} s"
                    failure = WorkerTimeoutError(
                        f"{self.where(g)}: {reason}", g, self.layout.range(g)
                    )
                    got.lost[g] = LostGroup(reason, failure)
                break
            for ref in ready:
                g = waiting.pop(ref)
                self._fetch(g, ref, seqs[g], phase, got)
        for g in list(got.answers) + list(got.lost) + [e.worker_index for e in got.errors]:
            self._calls.pop(g, None)
        return got

    def wait_step(self, seq: int, timeout: float | None) -> WaitResult:
        """:meth:`wait` for batch step ``seq`` of every actor (answers always carry the rows)."""
        return self.wait(dict.fromkeys(range(self.layout.n_groups), seq), timeout, None, "step")

    def ready(self, seqs: Mapping[int, int], need: int) -> list[int] | None:
        """Answers arrive as objects to fetch: always the general :meth:`wait`."""
        return None

    def _fetch(self, g: int, ref: Any, seq: int, phase: str, got: WaitResult) -> None:
        exceptions = self.ray.exceptions
        try:
            answer = unpack(self.ray.get(ref, timeout=self.get_timeout))
        except exceptions.RayTaskError as err:  # the actor's method itself failed
            got.errors.append(self._task_error(g, seq, phase, err))
            return
        except exceptions.RayError as err:
            # RayActorError (ActorDiedError, ActorUnavailableError), a lost node or
            # result object, a crashed worker: the actor is gone.
            got.lost[g] = self._died(g, phase, err)
            return
        if isinstance(answer, ErrorResponse):
            got.errors.append(self._explained(answer, seq, phase))
            return
        if isinstance(answer, StepResponse) and answer.arrays is not None:
            self._store(g, answer.arrays)
        got.answers[g] = answer

    def _store(self, g: int, arrays: tuple[Any, ...]) -> None:
        """Copy an actor's rows of the batch into the driver's batch arrays."""
        buffers = self.buffers
        assert buffers is not None
        r = self.layout.range(g)
        rows = slice(r.start, r.stop)
        obs, rewards, terms, truncs, seconds, steps = arrays
        if isinstance(obs, RaggedStore) and buffers.ragged is not None:
            store = buffers.ragged[g]
            assert store is not None
            store.load(obs)  # grows with the actor's store
        elif obs is not None and buffers.observations is not None:
            scatter_tree(buffers.observations, rows, obs)
        if rewards is not None:  # None: a timers flush, which carries the step times only
            buffers.rewards[rows] = rewards
            buffers.terminations[rows] = terms
            buffers.truncations[rows] = truncs
        if seconds is not None:
            buffers.env_seconds[rows] = seconds
            buffers.env_steps[rows] = steps

    def _explained(self, answer: ErrorResponse, seq: int, phase: str) -> ErrorResponse:
        """``answer`` as the answer to call ``seq`` (``phase``), with any import fix.

        The fix is for a module the actor could not import. An actor that could not
        unpickle a command answers without its seq and phase
        (:func:`~envmgr.envside.serve.unreadable_command`): each Ray call has its own
        ref, so the call it answers is the one it was fetched for.
        """
        changes: dict[str, Any] = {}
        if answer.seq == -1 and seq != -1:
            changes.update(seq=seq, phase=f"{phase} ({answer.phase})")
        fix = import_fix(answer.type_name, answer.message)
        if fix:
            changes["fix"] = fix
        return replace(answer, **changes) if changes else answer

    def _task_error(self, g: int, seq: int, phase: str, err: Any) -> ErrorResponse:
        """The answer for an actor method that raised (Ray's ``RayTaskError`` ``err``).

        It is the actor's exception itself, with the actor's traceback, not Ray's wrapper.
        """
        cause = getattr(err, "cause", None) or err
        answer = error_response(g, seq, None, phase, cause)
        remote = getattr(err, "traceback_str", "") or ""
        return self._explained(replace(answer, traceback=remote or answer.traceback), seq, phase)

    def _died(self, g: int, phase: str, err: BaseException) -> LostGroup:
        info = self.actor_info[g]
        lines = [ln.strip() for ln in str(err).splitlines()]
        # Ray's message: a headline, tab-indented fields, then the cause.
        reason = (
            " ".join(ln for ln in lines if ln and ":" not in ln.split(" ", 1)[0])
            or type(err).__name__
        )
        node_alive = self._node_alive(info.node_id) if info.node_id else None
        if "node has died" in str(err) or isinstance(err, self.ray.exceptions.NodeDiedError):
            node_alive = False  # Ray said so before its node table caught up
        how = "was lost with its node" if node_alive is False else "died"
        what = f"it {how} during {phase}: {reason}"
        failure = RayActorDiedError(
            f"{self.where(g)}: {what}",
            g,
            self.layout.range(g),
            node_ip=info.node_ip or None,
            node_id=info.node_id or None,
            actor_id=info.actor_id or getattr(err, "actor_id", None),
            pid=info.pid or None,
            node_alive=node_alive,
            reason=reason,
        )
        return LostGroup(what, failure)

    def _abandoned(self, g: int) -> LostGroup:
        """Group ``g`` lost because :meth:`abandon` stopped its actor."""
        why, info = self._cut[g], self.actor_info[g]
        failure = RayActorDiedError(
            f"{self.where(g)}: {why}",
            g,
            self.layout.range(g),
            node_ip=info.node_ip or None,
            node_id=info.node_id or None,
            actor_id=info.actor_id or None,
            pid=info.pid or None,
            reason=why,
        )
        return LostGroup(why, failure)

    def _node_alive(self, node_id: str) -> bool | None:
        try:
            for n in self.ray.nodes():
                if n.get("NodeID") == node_id:
                    return bool(n.get("Alive"))
        except Exception:
            return None
        return None

    # ================================================================ replacing

    def replace(self, g: int, timeout: float | None) -> Ready | LostGroup:
        """Kill group ``g``'s actor and start a new one: its start-up answer, or its loss."""
        ray = self.ray
        self._calls.pop(g, None)
        self._cut.pop(g, None)
        self._rss.pop(g, None)
        self._rss_calls.pop(g, None)
        try:
            ray.kill(self.actors[g], no_restart=True)
        except Exception:
            pass
        self.actor_info[g].restarts += 1
        self.actors[g] = self._new_actor(g)
        ref = self.actors[g].start.remote()
        ready, _ = ray.wait([ref], timeout=timeout)
        if not ready:
            reason = f"it did not start within {timeout} s"
            return LostGroup(
                reason, WorkerTimeoutError(f"{self.where(g)}: {reason}", g, self.layout.range(g))
            )
        try:
            return self._started(g, ref)
        except WorkerDiedError as exc:
            return LostGroup(str(exc), exc)

    def recyclable(self) -> range:
        """The groups that may be recycled: every actor."""
        return range(self.layout.n_groups)

    def retire(self, g: int, seq: int) -> None:
        """Let actor ``g`` close its envs, for ``close_timeout``; :meth:`replace` kills it."""
        try:
            self.ray.wait([self.actors[g].close.remote()], timeout=self.close_timeout)
        except Exception:
            pass  # gone already: replace() starts a new one all the same

    def resident_bytes(self, g: int) -> int | None:
        """What actor ``g`` last reported of its own resident memory; asks for a new report.

        The actor reads ``/proc/self`` itself, so this holds on any node, and the report
        is collected at the next call without waiting: the actor answers it after the
        command it is serving.
        """
        ray = self.ray
        ref = self._rss_calls.get(g)
        if ref is not None:
            ready, _ = ray.wait([ref], timeout=0)
            if not ready:
                return self._rss.get(g)
            del self._rss_calls[g]
            try:
                rss = ray.get(ref, timeout=self.get_timeout)
            except ray.exceptions.RayError:
                rss = None  # a lost actor: the next wait reports it
            if rss is not None:
                self._rss[g] = rss
        if g < len(self.actors):
            self._rss_calls[g] = self.actors[g].resident_bytes.remote()
        return self._rss.get(g)

    def abandon(self, g: int, why: str) -> bool:
        """Leave group ``g`` lost: its actor is killed and its next command reported lost."""
        # Whatever the interrupt cut off, the actor recorded as group g's (the lost one,
        # or its replacement, started or not, reset or not) is killed, and the group's
        # next command is not sent but reported lost, saying why: the front end then
        # replaces it from the top. A replacement created but not yet recorded has no
        # handle left, so Ray ends it (an actor whose handles are gone is collected).
        self._calls.pop(g, None)
        self._cut[g] = why
        try:
            self.ray.kill(self.actors[g], no_restart=True)
        except Exception:
            pass  # already dead, or Ray is shutting down: nothing left to stop
        return True

    # ================================================================ shutdown

    def disown(self) -> None:
        """Do nothing: the actors are the cluster's, and a forked child holds only handles."""
        pass  # actors are the cluster's: a forked child holds handles only

    def shutdown(self, graceful: bool) -> None:
        """Kill every actor; ``graceful``: let each close its envs first (``close_timeout``)."""
        ray = self.ray
        actors, self.actors = self.actors, []
        self._calls.clear()
        self._rss_calls.clear()
        if actors and ray.is_initialized():
            if graceful:
                try:
                    refs = [a.close.remote() for a in actors]
                    ray.wait(refs, num_returns=len(refs), timeout=self.close_timeout)
                except Exception:
                    pass
            for a in actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:
                    pass
        self.buffers = None
