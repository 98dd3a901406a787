"""The front end's hand-inlined shortcuts, each run beside its general path on the same input.

A shortcut copies its general path for the usual case, to save a call on the per-step hot
path (docs/architecture.md, "Hand-inlined shortcuts"). Each test here drives both with the
same input and asserts the same result, so that a fix made to one and not the other fails:

* the action check's shortcut (``ActionChecks.check_batch`` / ``check``) and a fresh
  ``ActionChecker``'s full check;
* ``Session.start_step``'s sequence number and ``Session.next_seq``;
* ``Session.finish_step``'s read straight from the arrays and the collector's wait (a step
  with a timeout), both against ``SyncVectorEnv``;
* first-ready's ``recv`` through ``Backend.ready`` and through the general wait;
* ``Session.require_usable``'s look at the state and ``State.check_usable``;
* the phases bound as module globals and the ``Phase`` members.

These tests reach internals (the session, the checkers) on purpose: a twin is an internal.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Iterator
from copy import deepcopy
from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import SyncVectorEnv
from gymnasium.vector.utils import batch_space
from support.envs import assert_same

import envmgr
from envmgr import timers
from envmgr.errors import WorkerDiedError
from envmgr.frontend import state as state_module
from envmgr.frontend.action_checks import ActionChecks
from envmgr.frontend.state import CLOSED, IDLE, CallKind, PendingCall, Phase, State
from envmgr.frontend.validation import ActionChecker
from envmgr.protocol.layout import Layout

pytestmark = pytest.mark.timeout(120)

PACKAGE = Path(envmgr.__file__).parent

# ================================================================ the action check

LAYOUT = Layout.of([2, 2, 2])  # envs 0-1 on worker 0, 2-3 on worker 1, 4-5 on worker 2
#: ``send``'s rows: the envs of worker 1.
IDS = np.arange(2, 4)

CHECKED_SPACES: dict[str, gym.Space[Any]] = {
    "Discrete": spaces.Discrete(3),
    "Box": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "Box-int": spaces.Box(0, 10, (2,), np.int8),
    "MultiDiscrete": spaces.MultiDiscrete([2, 3]),
    "Dict": spaces.Dict({"aim": spaces.Box(-1.0, 1.0, (2,)), "pick": spaces.Discrete(3)}),
    "Tuple": spaces.Tuple((spaces.Discrete(2), spaces.Box(0.0, 1.0, (1,)))),
}


def array_batches(space: gym.Space[Any], n: int) -> dict[str, Any]:
    """Batches of ``n`` actions for an array space: fitting ones in several dtypes, and ones
    the check refuses (or lets through, by mode) for their dtype, shape or values."""
    batched = batch_space(space, n)
    batched.seed(7)
    good = np.asarray(batched.sample())
    shape = good.shape
    return {
        "sampled": good,
        "int32": good.astype(np.int32),
        "int64": good.astype(np.int64),
        "uint8": good.astype(np.uint8),
        "float64": good.astype(np.float64),
        "float32": good.astype(np.float32),
        "bool": good.astype(bool),
        "list": good.tolist(),
        "fractional": np.full(shape, 1.5),
        "nan": np.full(shape, np.nan),
        "out-of-bounds": np.full(shape, 7, dtype=good.dtype),
        "huge": np.full(shape, 2**40, dtype=np.int64),
        "uint64-huge": np.full(shape, 2**63, dtype=np.uint64),
        "str": np.full(shape, "a"),
        "object": np.full(shape, None, dtype=object),
        "one-row-more": np.concatenate([good, good[:1]]),
        "one-row-less": good[:-1],
        "no-trailing-dim": good[..., 0] if good.ndim > 1 else good[:, None],
        "scalar": good.reshape(-1)[0],
        "none": None,
    }


def batches(space: gym.Space[Any], n: int) -> dict[str, Any]:
    """Every batch of the table for ``space``: the array cases per leaf, and the Dict/Tuple
    structure cases (missing, extra and misnamed keys; wrong length; a list for a tuple)."""
    if isinstance(space, spaces.Dict):
        leaves = {k: array_batches(s, n) for k, s in space.spaces.items()}
        good = {k: cases["sampled"] for k, cases in leaves.items()}
        out: dict[str, Any] = {"sampled": good}
        for k, cases in leaves.items():
            for case, leaf in cases.items():
                out[f"{k}={case}"] = {**good, k: leaf}
        first = next(iter(good))
        out["missing-key"] = {k: v for k, v in good.items() if k != first}
        out["extra-key"] = {**good, "other": good[first]}
        out["not-a-dict"] = list(good.values())
        return out
    if isinstance(space, spaces.Tuple):
        items = [array_batches(s, n) for s in space.spaces]
        tuple_good = tuple(cases["sampled"] for cases in items)
        out = {"sampled": tuple_good, "as-list": list(tuple_good)}
        for i, cases in enumerate(items):
            for case, leaf in cases.items():
                out[f"{i}={case}"] = tuple_good[:i] + (leaf,) + tuple_good[i + 1 :]
        out["one-item-short"] = tuple_good[:-1]
        out["not-a-tuple"] = tuple_good[0]
        return out
    return array_batches(space, n)


def outcome(check: Callable[[Any], None], actions: Any) -> tuple[str, str] | None:
    """``None`` if ``check`` accepts ``actions``, else the error's type and message."""
    try:
        check(actions)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def full_check(
    space: gym.Space[Any], n: int, where: Callable[[int], str], mode: str
) -> Callable[[Any, Any], None]:
    """The general path: a checker that has seen no batch, so its own shortcut cannot
    fire (it remembers only dtypes it accepted) and the compiled check runs."""

    def check(actions: Any, ids: Any = None) -> None:
        ActionChecker(space, n, where, mode).check(actions, ids)

    return check


@pytest.mark.parametrize("mode", ["safe", "strict"])
@pytest.mark.parametrize("name", CHECKED_SPACES)
def test_the_action_check_shortcut_refuses_and_accepts_what_the_full_check_does(
    name: str, mode: str
) -> None:
    space = CHECKED_SPACES[name]
    checks = ActionChecks(space, LAYOUT, "worker", mode)
    whole, part = batches(space, LAYOUT.num_envs), batches(space, len(IDS))
    # Every batch once first: the shortcut then knows every dtype the full check accepted,
    # and the comparisons below are made where it fires.
    for actions in whole.values():
        outcome(checks.check_batch, actions)
    for actions in part.values():
        outcome(lambda a: checks.check(a, IDS), actions)
    general = full_check(space, LAYOUT.num_envs, checks.where, mode)
    general_part = full_check(space, len(IDS), checks.where, mode)
    accepted = 0
    for case, actions in whole.items():
        expected = outcome(general, actions)
        accepted += expected is None
        assert outcome(checks.check_batch, actions) == expected, f"step, {case}"
        assert outcome(lambda a: checks.check(a, None), actions) == expected, f"send, {case}"
    for case, actions in part.items():
        expected = outcome(lambda a: general_part(a, IDS), actions)
        assert outcome(lambda a: checks.check(a, IDS), actions) == expected, f"send ids, {case}"
    # The table holds batches of both verdicts, or the comparison would prove little.
    assert 0 < accepted < len(whole)


# ================================================================ managers


class ChattyEnv(gym.Env):  # type: ignore[type-arg]
    """A deterministic env whose steps say ``says`` besides their rows of the arrays:
    ``"nothing"``, ``"numbers"`` (a numeric info: the info columns), ``"text"`` (a string
    info on every other step: a pipe message) or ``"error"`` (an env exception at its third step).
    Episodes end every 4 steps (autoreset)."""

    observation_space = spaces.Box(-np.inf, np.inf, (2,), np.float64)
    action_space = spaces.Discrete(2)

    def __init__(self, says: str = "nothing") -> None:
        self.says = says
        self.t = 0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        self.t = 0
        return self.np_random.standard_normal(2), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        self.t += 1
        if self.says == "error" and self.t == 3:
            raise RuntimeError(f"env failed at step {self.t}")
        info: dict[str, Any] = {}
        if self.says == "numbers":
            info["t"] = self.t
        elif self.says == "text" and self.t % 2 == 0:
            info["note"] = f"step {self.t}"
        obs = self.np_random.standard_normal(2)
        return obs, float(action) + self.t, self.t % 4 == 0, False, info


N_ENVS, STEPS = 4, 9


def chatty_fns(says: str) -> list[Callable[[], gym.Env]]:  # type: ignore[type-arg]
    return [lambda: ChattyEnv(says)] * N_ENVS


def manager(says: str, **options: Any) -> envmgr.SubprocessEnvManager:
    return envmgr.SubprocessEnvManager(chatty_fns(says), n_workers=2, context="fork", **options)


def step_actions() -> list[np.ndarray]:
    return [np.arange(N_ENVS, dtype=np.int64) % 2 ^ (t % 2) for t in range(STEPS)]


def rollout(envs: gym.vector.VectorEnv, step: Callable[[Any], Any]) -> list[Any]:
    """Reset, then ``step`` every action; each result deep-copied (views are reused), an
    error recorded by its type and message."""
    results: list[Any] = [deepcopy(envs.reset(seed=3))]
    for actions in step_actions():
        try:
            results.append(deepcopy(step(actions)))
        except Exception as exc:
            results.append((type(exc).__name__, str(exc).splitlines()[0]))
            break
    return results


def counts(node: timers.TimerNode) -> dict[str, Any]:
    """A timer tree's shape and call counts (times differ from run to run)."""
    return {name: (child.count, counts(child)) for name, child in node.children.items()}


def shortcut_step(envs: Any) -> Callable[[Any], Any]:
    """``step()`` waits with no deadline: ``Session.finish_step`` may take its shortcut."""
    return envs.step  # type: ignore[no-any-return]


def general_step(envs: Any) -> Callable[[Any], Any]:
    """A step waited for with a deadline: the collector's wait, then ``Session.resolve_answers`` and
    ``BatchReader.read_answers``, whatever the answers say."""

    def step(actions: Any) -> Any:
        envs.step_async(actions)
        return envs.step_wait(timeout=600.0)

    return step


def run(says: str, path: Callable[[Any], Callable[[Any], Any]], **options: Any) -> Any:
    """A rollout on a fresh manager through ``path``, and the parent's timer counts."""
    timers.reset_timers()
    with manager(says, **options) as envs:
        results = rollout(envs, path(envs))
        tree = counts(timers.get_timer_root())
    return results, tree


@pytest.mark.parametrize("timer_interval", [1e6, 0.0], ids=["timers-kept", "timers-every-step"])
@pytest.mark.parametrize("says", ["nothing", "numbers", "text", "error"])
def test_wait_steps_shortcut_gives_the_collectors_batch_and_sync_vector_envs(
    says: str, timer_interval: float
) -> None:
    sync = SyncVectorEnv(chatty_fns(says))
    expected = rollout(sync, sync.step)
    sync.close()
    fast, fast_tree = run(says, shortcut_step, timer_interval=timer_interval)
    slow, slow_tree = run(says, general_step, timer_interval=timer_interval)
    calls = len(fast)  # the reset and every step, the one that raised too
    if says == "error":
        # SyncVectorEnv raises the env's error itself; envmgr raises it as its own type.
        raised = [r[-1][0] if isinstance(r[-1][0], str) else "no error" for r in (fast, slow)]
        assert raised == [expected[-1][0]] * 2 == ["RuntimeError"] * 2
        assert fast[-1] == slow[-1]
        expected, fast, slow = expected[:-1], fast[:-1], slow[:-1]
    assert_same(fast, expected, "step()")
    assert_same(slow, expected, "step_wait(timeout)")
    # Every step counted once under "workers" on both paths, worker trees merged alike.
    assert fast_tree == slow_tree
    assert fast_tree["workers"][0] == calls


def first_ready_rollout(envs: Any, timeout: float | None) -> dict[tuple[int, ...], list[Any]]:
    """``send`` every group, then ``recv`` one group at a time (as they finish) and send it
    its next step; each group's results in its own order (the order groups finish in is
    the scheduler's, so each group's actions follow its own step count)."""
    envs.reset(seed=3)
    actions = step_actions()
    results: dict[tuple[int, ...], list[Any]] = {}
    envs.send(actions[0])
    while envs._session.state.in_flight:
        got = deepcopy(envs.recv(timeout=timeout))
        ids = got[5]
        done = results.setdefault(tuple(ids.tolist()), [])
        done.append(got[:5])
        if len(done) < STEPS:
            envs.send(actions[len(done)][ids], ids)
    return results


@pytest.mark.parametrize("says", ["nothing", "numbers", "text"])
def test_recvs_shortcut_through_ready_gives_the_general_waits_rows(says: str) -> None:
    with manager(says) as envs:
        fast = first_ready_rollout(envs, None)
    with manager(says) as envs:
        slow = first_ready_rollout(envs, 600.0)
    assert sorted(fast) == [(0, 1), (2, 3)]
    assert_same(fast, slow, "recv() vs recv(timeout)")


# ================================================================ post_step and next_seq


def changed_by(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in after.items() if before.get(k, object()) is not v}


def test_post_step_numbers_a_step_as_next_seq_would() -> None:
    with manager("nothing") as envs:
        session = envs._session
        envs.reset(seed=3)
        for t, actions in enumerate(step_actions()):
            # The general path on a copy of the same session: what next_seq changes.
            twin = copy.copy(session)
            before = dict(vars(twin))
            expected = twin.next_seq()
            wanted = changed_by(before, vars(twin))
            envs.step_async(actions)
            assert session.state.phase is Phase.PENDING
            assert session.state.call is not None
            assert dict(session.state.call.seqs) == dict.fromkeys(session.groups, expected)
            for k, v in wanted.items():
                assert getattr(session, k) == v, f"step {t}: post_step left {k} unlike next_seq"
            envs.step_wait()
            assert session.state is IDLE
            if t % 3 == 2:  # the seqs of other commands come from next_seq itself
                envs.reset(seed=t)


def test_a_batch_step_and_a_send_to_every_group_number_and_land_alike() -> None:
    # The same steps through step() (post_step's own seq) and through send() of every
    # group (next_seq's): the same seqs, the same states, the same rows.
    seen: list[list[Any]] = []
    for through in ("step", "send"):
        with manager("nothing") as envs:
            session = envs._session
            envs.reset(seed=3)
            record: list[Any] = [session.seq]
            for actions in step_actions():
                if through == "step":
                    got = envs.step(actions)
                else:
                    envs.send(actions)
                    assert session.state.phase is Phase.IN_FLIGHT
                    assert dict(session.state.in_flight) == dict.fromkeys(
                        session.groups, session.seq
                    )
                    got = envs.recv(batch_size=N_ENVS)[:5]
                record.append((session.seq, session.state is IDLE, deepcopy(got)))
            seen.append(record)
    assert_same(seen[0], seen[1], "step() vs send()+recv()")


# ================================================================ usable and check_usable


def states() -> Iterator[tuple[str, State]]:
    call = PendingCall(CallKind.STEP, {0: 1, 1: 1})
    failure = WorkerDiedError("worker 1 died", 1, range(2, 4))
    yield "idle", IDLE
    yield "pending", State.pending(call)
    yield "in flight", State.flying({0: 4})
    yield "broken", State.broken(failure)
    yield "broken by an interrupt", State.broken(KeyboardInterrupt())
    yield "closed", CLOSED
    yield "forked copy", State.forked_copy("SubprocessEnvManager", 1)


def test_usables_look_at_the_state_refuses_what_check_usable_refuses() -> None:
    with manager("nothing") as envs:
        session = envs._session
        try:
            for name, state in states():
                session.state = state
                general = outcome(lambda s: s.check_usable(session.owner, "recv"), state)
                shortcut = outcome(lambda _: session.require_usable("recv"), None)
                assert shortcut == general, name
        finally:
            session.state = IDLE


# ================================================================ the phase globals


def test_each_phase_global_is_its_enum_member() -> None:
    globals_ = [n for n in state_module.__all__ if n.endswith("_PHASE")]
    assert globals_
    for name in globals_:
        assert getattr(state_module, name) is Phase[name.removesuffix("_PHASE")], name


def test_the_phase_globals_cover_every_phase_the_package_compares_with_by_name() -> None:
    used: dict[str, list[str]] = {}
    for path in PACKAGE.rglob("*.py"):
        for name in re.findall(r"\b([A-Z][A-Z_]*)_PHASE\b", path.read_text()):
            used.setdefault(name, []).append(str(path.relative_to(PACKAGE)))
    assert used, "no module compares with a phase global: the twin is gone, drop this test"
    for name, where in used.items():
        assert f"{name}_PHASE" in state_module.__all__, (name, where)
        assert getattr(state_module, f"{name}_PHASE") is Phase[name], (name, where)
