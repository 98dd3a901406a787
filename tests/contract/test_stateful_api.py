"""Random sequences of public calls and faults, against ``SyncVectorEnv`` and the state table.

A hypothesis ``RuleBasedStateMachine`` drives one manager (local, ``caller_envs`` or Ray:
the ``backend`` fixture) beside a ``SyncVectorEnv`` of the same envs, the model, through
``reset`` (with and without a mask), ``step``, ``step_async``/``step_wait``,
``send``/``recv``, ``call``/``get_attr`` and ``close``, and through faults: a worker
killed, a step that overruns ``step_timeout`` (an env blocked until it is killed), and a
Ctrl-C at a random moment of a ``step`` or ``reset`` (a timer thread's signal whose
handler raises, as ``faults/test_interrupts.py`` delivers one), after which a step must
work.

What it checks:

* Results equal the model's for every env the model can still follow. A replaced group's
  envs, and every env after an interrupted call, are *diverged* until a reset resets them
  with a seed on both sides.
* Each call out of order is refused with the error ``envmgr/frontend/state.py``
  documents: ``ClosedManagerError`` after ``close()``, ``AlreadyPendingCallError`` while
  a ``step_async`` is pending or ``send()`` steps are in flight, ``NoAsyncCallError`` for
  a wait without its call, and after a failure the manager does not recover from (a
  per-env call meeting a lost group), that failure, then ``BrokenManagerError``.
* Never a hang: every wait has a timeout (``step_timeout``, ``recv``'s), and the test's
  own time limit stands behind them. Never a leak: each example's manager is closed,
  and ``conftest.py``'s leak check runs after the test.

Budget: ``ENVMGR_STATEFUL_EXAMPLES`` examples per backend (default 6, 3 on Ray, and 25
when ``CI`` is set), of at most :data:`STEPS` rules each.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any

import cloudpickle
import gymnasium as gym
import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import SyncVectorEnv
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from envmgr.errors import (
    AlreadyPendingCallError,
    BrokenManagerError,
    ClosedManagerError,
    NoAsyncCallError,
    WorkerDiedError,
)

cloudpickle.register_pickle_by_value(sys.modules[__name__])

GROUPS, PER_GROUP = 2, 2
NUM_ENVS = GROUPS * PER_GROUP
#: Seconds a step, reset or call may take: met only by the env blocked on purpose.
STEP_TIMEOUT = 1.0
#: Rules per example at most.
STEPS = 10
#: How long the blocked env blocks at most (it is killed long before).
_BLOCK_S = 60.0


def _examples(backend: str = "local") -> int:
    """Examples per backend: ``ENVMGR_STATEFUL_EXAMPLES``, else 25 under CI, else 6 (3 on
    Ray, whose every example starts actors)."""
    given = os.environ.get("ENVMGR_STATEFUL_EXAMPLES")
    if given:
        return int(given)
    if os.environ.get("CI"):
        return 25
    return 3 if backend == "ray" else 6


pytestmark = pytest.mark.timeout(60 + 20 * _examples())


class Blockable(gym.Wrapper[Any, Any, Any, Any]):
    """CartPole whose next step blocks after ``block_next_step()`` (until killed)."""

    blocking = False

    def block_next_step(self) -> None:
        self.blocking = True

    def step(self, action: Any) -> Any:
        if self.blocking:
            time.sleep(_BLOCK_S)
        return super().step(action)


def make_env() -> gym.Env[Any, Any]:
    return Blockable(gym.make("CartPole-v1"))


class CtrlC(KeyboardInterrupt):
    """What the one-shot interrupt raises (a KeyboardInterrupt, as Ctrl-C's handler)."""


class OneInterrupt:
    """A signal handler raising :class:`CtrlC` once, ``delay`` seconds after :meth:`run`
    calls, inside that call only: a timer thread sends this process SIGUSR1 (SIGALRM is
    pytest-timeout's), and the handler raises in the main thread wherever it is.

    Where envmgr holds Ctrl-C back (SIGINT's handler swapped while it starts and records
    a process), a real Ctrl-C would wait, and so does this: it is not raised there.
    """

    def __init__(self) -> None:
        self.armed = False
        self.ctrl_c: Any = None

    def _handler(self, signum: int, frame: Any) -> None:
        if self.armed and signal.getsignal(signal.SIGINT) is self.ctrl_c:
            self.armed = False
            raise CtrlC

    def run(self, delay: float, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call(...)``'s result, or :class:`CtrlC` if the interrupt cut it off."""
        self.ctrl_c = signal.getsignal(signal.SIGINT)
        old = signal.signal(signal.SIGUSR1, self._handler)
        ring = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGUSR1))
        # An exception raised inside a gc callback (hypothesis times its collections) is
        # printed and dropped by Python: none runs while the interrupt may land.
        callbacks = gc.callbacks[:]
        gc.callbacks.clear()
        try:
            try:
                self.armed = True
                ring.start()
                return call(*args, **kwargs)
            finally:
                self.armed = False
        except CtrlC as cut:  # the handler raises once at most: it disarms itself
            return cut
        finally:
            self.armed = False
            ring.cancel()
            ring.join()
            signal.signal(signal.SIGUSR1, old)
            gc.callbacks[:] = callbacks


def _same(a: Any, b: Any, rows: list[int], what: str) -> None:
    np.testing.assert_array_equal(np.asarray(a)[rows], np.asarray(b)[rows], err_msg=what)


actions_st = st.lists(st.integers(0, 1), min_size=NUM_ENVS, max_size=NUM_ENVS).map(
    lambda a: np.array(a, dtype=np.int64)
)
seeds_st = st.integers(0, 2**16)
# Gymnasium refuses a mask with no env in it.
masks_st = (
    st.lists(st.booleans(), min_size=NUM_ENVS, max_size=NUM_ENVS)
    .filter(any)
    .map(lambda m: np.array(m, dtype=np.bool_))
)


class ApiMachine(RuleBasedStateMachine):
    """One manager and its model; :func:`machine_for` binds the backend."""

    backend: Backend

    def __init__(self) -> None:
        super().__init__()
        self.envs: Any = None
        self.model = SyncVectorEnv([make_env] * NUM_ENVS)
        #: "idle", "pending" (a step_async), "in flight" (send), "broken" or "closed".
        self.phase = "idle"
        self.pending_actions: np.ndarray | None = None
        self.diverged: set[int] = set()
        self.lost: set[int] = set()  # groups killed or blocked, not yet replaced
        self.breaker: BaseException | None = None

    # ------------------------------------------------------------------ helpers

    @property
    def workers(self) -> list[int]:
        """Groups that run in a process or actor (the caller's block cannot be killed)."""
        return list(range(GROUPS - (self.backend.name == "caller")))

    def followed(self) -> list[int]:
        return [i for i in range(NUM_ENVS) if i not in self.diverged]

    def group_envs(self, g: int) -> set[int]:
        return set(range(g * PER_GROUP, (g + 1) * PER_GROUP))

    def refused(self, call: Any, *args: Any, **kwargs: Any) -> bool:
        """Whether the state refuses a new call; if so, check it is with the right error."""
        expected = {
            "closed": ClosedManagerError,
            "broken": BrokenManagerError,
            "pending": AlreadyPendingCallError,
            "in flight": AlreadyPendingCallError,
        }.get(self.phase)
        if expected is None:
            return False
        with pytest.raises(expected):
            call(*args, **kwargs)
        return True

    def replaced(self) -> None:
        """A step or reset replaced every lost group: their envs start afresh."""
        for g in self.lost:
            self.diverged |= self.group_envs(g)
        self.lost.clear()

    def check_step(self, got: Any, want: Any) -> None:
        rows = self.followed()
        for k, what in enumerate(("observations", "rewards", "terminations", "truncations")):
            assert np.asarray(got[k]).shape[0] == NUM_ENVS, what
            _same(got[k], want[k], rows, f"{what} of envs {rows}")

    # ------------------------------------------------------------------ set-up

    @initialize(seed=seeds_st)
    def open_and_reset(self, seed: int) -> None:
        self.envs = self.backend(
            make_env, GROUPS, PER_GROUP, step_timeout=STEP_TIMEOUT, max_restarts=1000
        )
        got, _ = self.envs.reset(seed=seed)
        want, _ = self.model.reset(seed=seed)
        _same(got, want, list(range(NUM_ENVS)), "first reset")

    def teardown(self) -> None:
        if self.envs is not None:
            with warnings.catch_warnings():  # a step_async left pending: Gymnasium warns
                warnings.simplefilter("ignore")
                self.envs.close()
        self.model.close()

    # ------------------------------------------------------------------ calls

    @rule(seed=seeds_st, mask=st.none() | masks_st)
    def reset(self, seed: int, mask: np.ndarray | None) -> None:
        if mask is None:
            if self.refused(self.envs.reset, seed=seed):
                return
            got, _ = self.envs.reset(seed=seed)
            want, _ = self.model.reset(seed=seed)
            self.replaced()
            self.diverged.clear()
        else:
            seeds = [seed + i for i in range(NUM_ENVS)]
            options = {"reset_mask": mask}
            if self.refused(self.envs.reset, seed=seeds, options=dict(options)):
                return
            got, _ = self.envs.reset(seed=seeds, options=dict(options))
            want, _ = self.model.reset(seed=seeds, options=dict(options))
            self.replaced()
            self.diverged -= set(np.flatnonzero(mask).tolist())
        _same(got, want, self.followed(), "reset observations")

    @rule(actions=actions_st)
    def step(self, actions: np.ndarray) -> None:
        if self.refused(self.envs.step, actions):
            return
        got = self.envs.step(actions)
        self.replaced()
        self.check_step(got, self.model.step(actions))

    @rule(actions=actions_st)
    def step_async(self, actions: np.ndarray) -> None:
        if self.refused(self.envs.step_async, actions):
            return
        self.envs.step_async(actions)
        self.phase, self.pending_actions = "pending", actions

    @rule()
    def step_wait(self) -> None:
        if self.phase in ("idle", "in flight"):
            with pytest.raises(NoAsyncCallError):
                self.envs.step_wait()
            return
        if self.phase != "pending":
            self.refused(self.envs.step_wait)
            return
        got = self.envs.step_wait()
        self.phase, actions = "idle", self.pending_actions
        self.replaced()
        self.check_step(got, self.model.step(actions))

    @rule(actions=actions_st)
    def send(self, actions: np.ndarray) -> None:
        if self.refused(self.envs.send, actions):
            return
        self.envs.send(actions)
        self.phase, self.pending_actions = "in flight", actions

    @rule()
    def recv(self) -> None:
        if self.phase in ("idle", "pending"):
            with pytest.raises(NoAsyncCallError):
                self.envs.recv(timeout=STEP_TIMEOUT)
            return
        if self.phase != "in flight":
            self.refused(self.envs.recv)
            return
        obs, rewards, terms, truncs, _, ids = self.envs.recv(NUM_ENVS, timeout=STEP_TIMEOUT)
        assert ids.tolist() == list(range(NUM_ENVS))
        self.phase, actions = "idle", self.pending_actions
        self.replaced()
        self.check_step((obs, rewards, terms, truncs), self.model.step(actions))

    @rule(how=st.sampled_from(["get_attr", "call"]))
    def read_state(self, how: str) -> None:
        read = (
            (lambda: self.envs.get_attr("state"))
            if how == "get_attr"
            else (lambda: self.envs.call("get_wrapper_attr", "state"))
        )
        if self.refused(read):
            return
        if self.lost:  # a per-env call does not replace a lost group: it breaks the manager
            with pytest.raises(WorkerDiedError) as failed:
                read()
            self.phase, self.breaker = "broken", failed.value
            return
        got, want = read(), self.model.get_attr("state")
        for i in self.followed():
            np.testing.assert_array_equal(got[i], want[i], err_msg=f"env {i}'s state")

    @rule()
    def close(self) -> None:
        if self.phase == "pending":  # as AsyncVectorEnv does
            with pytest.warns(UserWarning, match="while waiting for a pending call"):
                self.envs.close()
        else:
            self.envs.close()
        self.phase = "closed"
        assert self.envs.closed

    # ------------------------------------------------------------------ faults

    @precondition(lambda self: self.phase == "idle" and not self.lost)
    @rule(data=st.data())
    def kill_a_worker(self, data: st.DataObject) -> None:
        g = data.draw(st.sampled_from(self.workers), label="group")
        self.backend.kill(self.envs, g)
        self.lost.add(g)

    @precondition(lambda self: self.phase == "idle" and not self.lost)
    @rule(data=st.data(), actions=actions_st)
    def a_step_overruns_its_timeout(self, data: st.DataObject, actions: np.ndarray) -> None:
        g = data.draw(st.sampled_from(self.workers), label="group")
        self.envs.call("block_next_step", env_ids=[g * PER_GROUP])
        # The blocked worker is killed at the timeout and replaced (restarts are on).
        got = self.envs.step(actions)
        self.model_step_with(got, actions, g)

    def model_step_with(self, got: Any, actions: np.ndarray, g: int) -> None:
        self.diverged |= self.group_envs(g)
        self.replaced()
        self.check_step(got, self.model.step(actions))

    # Not on Ray: a signal handler raising inside Ray's own waits is pinned by
    # on_ray/test_ray.py's Ctrl-C test, not drawn at random.
    @precondition(lambda self: self.phase == "idle" and self.backend.name != "ray")
    @rule(
        delay=st.floats(0.0, 2e-3),
        what=st.sampled_from(["step", "reset"]),
        actions=actions_st,
    )
    def ctrl_c(self, delay: float, what: str, actions: np.ndarray) -> None:
        """Whether or not the interrupt lands, the rule ends with a step that must work
        (a loop that catches Ctrl-C steps on): the rules drawn next never depend on
        where it landed, which hypothesis needs to replay an example."""
        if what == "step":
            got = OneInterrupt().run(delay, self.envs.step, actions)
            want = self.model.step(actions)
        else:
            got = OneInterrupt().run(delay, self.envs.reset, seed=0)
            want = self.model.reset(seed=0)
        if isinstance(got, CtrlC):
            # The workers may have run the call, the model did: nothing is followed.
            assert not self.envs.closed, "an interrupt closed the manager"
            self.diverged = set(range(NUM_ENVS))
        elif what == "reset":
            self.replaced()
            self.diverged.clear()
            _same(got[0], want[0], self.followed(), "reset observations")
        else:
            self.replaced()
            self.check_step(got, want)
        self.step(actions)  # redoes any restart the interrupt cut off

    @invariant()
    def state_is_as_the_model_says(self) -> None:
        if self.envs is None:
            return
        assert self.envs.closed == (self.phase in ("closed", "broken")), self.phase


def machine_for(backend: Backend) -> type[ApiMachine]:
    return type(f"ApiMachine_{backend.name}", (ApiMachine,), {"backend": backend})


@on_backends()
def test_the_api_against_its_model(backend: Backend) -> None:
    """Every rule on every backend, but the Ctrl-C rule on Ray (see the rule)."""
    run_state_machine_as_test(
        machine_for(backend),
        settings=settings(
            max_examples=_examples(backend.name),
            stateful_step_count=STEPS,
            deadline=None,
            database=None,
            # The same examples on every run, CI's included, so that a landing does not
            # hang on which sequences a run happened to draw; ENVMGR_STATEFUL_RANDOM=1
            # explores new ones (a known failing one is in tests/README.md).
            derandomize=not os.environ.get("ENVMGR_STATEFUL_RANDOM"),
            suppress_health_check=list(HealthCheck),
            # No "explain" phase: it reruns the failing example under a tracer, minutes
            # with real processes, to say what the shrunk sequence already says.
            phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
        ),
    )
