"""``envmgr.make_parallel`` against the serial reference (``support.agents_reference``),
bit for bit: observations, rewards, flags, infos (action masks, ``active`` and
``_active``, ``final_obs`` / ``final_info``), and rows / group names / spaces.

The envs (``support.agent_envs``) die, arrive, are truncated and end their episodes
within the steps taken (each case checks, through the reference, that what it is meant
to exercise did happen). Every case runs in each autoreset mode where that adds
something; the layout varies by backend (``on_backends``): local workers (2 workers for
3 envs: an uneven split), the caller case (1 worker and ``caller_envs=1``), and Ray.

How a backend is asked for (``build``) is this module's one guess at the API beyond the
``make_parallel(..., ray=True)`` for Ray.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from conftest import Backend, on_backends
from gymnasium.vector import AutoresetMode
from support.agent_envs import (
    GENERATED_SPACES,
    CheapAgentsEnv,
    connect_four_env,
    generated_env,
    kaz_env,
    kaz_sequence_env,
    masked_env,
    one_group_env,
    spread_env,
    tag_env,
    two_group_env,
    undeclared_env,
)
from support.agents_reference import ReferenceAgents
from support.envs import assert_same

from envmgr import make_parallel

pytestmark = pytest.mark.timeout(60)

NUM_ENVS = 3
SEED = 11
NEXT, SAME, DISABLED = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP, AutoresetMode.DISABLED

#: case -> (env factory, make_parallel / reference options, steps, what must happen)
CASES: dict[str, tuple[Callable[[], Any], dict[str, Any], int, tuple[str, ...]]] = {
    "synthetic": (one_group_env, {}, 30, ("death", "arrival", "end")),
    "two_groups": (two_group_env, {}, 30, ("death", "arrival", "end")),
    "masked": (masked_env, {}, 20, ("death", "end")),
    "undeclared": (undeclared_env, {"max_agents": 4}, 30, ("death", "arrival", "end")),
    "cheap": (
        functools.partial(CheapAgentsEnv, max_steps=20, death_p=0.05),
        {},
        45,
        ("death", "arrival", "end"),
    ),
    "spread": (spread_env, {}, 30, ("end",)),
    "tag": (tag_env, {}, 30, ("end",)),
    "kaz": (kaz_env, {}, 150, ("death",)),
    "kaz_sequence": (kaz_sequence_env, {}, 150, ("death",)),
    "generated": (
        generated_env,
        {
            "max_agents": 40,
            "pad": True,
            "observation_space": GENERATED_SPACES[0],
            "action_space": GENERATED_SPACES[1],
        },
        30,
        ("arrival",),
    ),
    "connect_four": (connect_four_env, {}, 50, ("end",)),
}

LOCAL_CASES = [
    *[
        pytest.param(c, m, id=f"{c}-{m.value}")
        for c in ("synthetic", "two_groups", "undeclared", "connect_four", "kaz_sequence")
        for m in (NEXT, SAME, DISABLED)
    ],
    *[pytest.param(c, NEXT, id=f"{c}-{NEXT.value}") for c in ("masked", "cheap", "tag")],
    *[pytest.param(c, NEXT, id=f"{c}-{NEXT.value}") for c in ("kaz", "generated")],
    pytest.param("spread", SAME, id="spread-SameStep"),
]
CALLER_CASES = [
    pytest.param("synthetic", NEXT, id="synthetic-NextStep"),
    pytest.param("kaz_sequence", NEXT, id="kaz_sequence-NextStep"),
    pytest.param("two_groups", SAME, id="two_groups-SameStep"),
]
RAY_CASES = [pytest.param("synthetic", SAME, id="synthetic-SameStep")]


def build(backend: Backend, env_fn: Callable[[], Any], **options: Any) -> Any:
    """``make_parallel`` over ``NUM_ENVS`` envs with the backend's layout."""
    if backend.name == "local":
        return make_parallel(env_fn, NUM_ENVS, n_workers=2, context="fork", **options)
    if backend.name == "caller":
        return make_parallel(env_fn, NUM_ENVS, n_workers=1, caller_envs=1, **options)
    return make_parallel(
        env_fn, NUM_ENVS, n_workers=2, ray=True, num_cpus_per_actor=0.25, **options
    )


def by_group(ref: ReferenceAgents, value: Any) -> dict[str, Any]:
    """A result part as a dict by group name, for one group or several alike."""
    if len(ref.group_names) == 1:
        return {ref.group_names[0]: value}
    return dict(value)


def choose_actions(ref: ReferenceAgents, obs: Any, rng: np.random.Generator) -> Any:
    """Seeded actions for every row; legal ones where the observation carries a mask."""
    out = {}
    for name, group_obs in by_group(ref, obs).items():
        space = ref.single_action_spaces[name]
        n = next(g.n for g in ref.groups if g.name == name)
        acts = rng.integers(space.n, size=n)
        if isinstance(group_obs, dict) and "action_mask" in group_obs:
            for r, mask in enumerate(group_obs["action_mask"]):
                if mask.any():
                    acts[r] = rng.choice(np.flatnonzero(mask))
        out[name] = acts
    return out if len(out) > 1 else next(iter(out.values()))


def rows_of(value: Any, rows: np.ndarray) -> Any:
    if isinstance(value, dict):
        return {k: rows_of(v, rows) for k, v in value.items()}
    if isinstance(value, tuple):  # a Sequence's rows, Gymnasium's batch form
        return tuple(v for v, keep in zip(value, rows, strict=True) if keep)
    return value[rows]


def assert_masked_reset_matches(
    ref: ReferenceAgents, got: tuple[Any, Any], want: tuple[Any, Any], envs: np.ndarray
) -> None:
    """A reset of the envs in ``envs`` (bool per env): their rows and all infos but the
    unreset rows' ``active``, which the spec leaves open."""
    got_obs, got_infos = by_group(ref, got[0]), by_group(ref, got[1])
    want_obs, want_infos = by_group(ref, want[0]), by_group(ref, want[1])
    for group in ref.groups:
        rows = np.repeat(envs, group.slots)
        name = group.name
        assert_same(rows_of(got_obs[name], rows), rows_of(want_obs[name], rows), f"{name} obs")
        g, w = dict(got_infos[name]), dict(want_infos[name])
        assert_same(g.pop("active")[rows], w.pop("active")[rows], f"{name} active")
        assert_same(g, w, f"{name} infos")


class Seen:
    """What the reference's results showed: deaths, arrivals, episode ends."""

    def __init__(self, ref: ReferenceAgents, infos: Any) -> None:
        self.ref = ref
        self.things: set[str] = set()
        self.active = {k: v["active"].copy() for k, v in by_group(ref, infos).items()}

    def note(self, result: tuple[Any, ...]) -> None:
        terms = by_group(self.ref, result[2])
        infos = by_group(self.ref, result[4])
        ended = [s.ended for s in self.ref.envs]
        if any(t.any() for t in terms.values()):
            self.things.add("death")
        for name, info in infos.items():
            if (info["active"] & ~self.active[name]).any():
                self.things.add("arrival")  # or a new episode's agents: both are first obs
            self.active[name] = info["active"].copy()
        if any(ended) or "_final_obs" in next(iter(infos.values())):
            self.things.add("end")


def run_against_reference(
    backend: Backend, case: str, mode: AutoresetMode, **more: Any
) -> set[str]:
    env_fn, options, steps, _ = CASES[case]
    options = {**options, **more}
    ref = ReferenceAgents([env_fn] * NUM_ENVS, autoreset_mode=mode, **options)
    rng = np.random.default_rng(0)
    with build(backend, env_fn, autoreset_mode=mode, **options) as envs:
        want = ref.reset(seed=SEED)
        got = envs.reset(seed=SEED)
        assert_same(got, want, f"{case}: reset")
        if len(ref.group_names) == 1:
            assert envs.single_observation_space == ref.single_observation_space
            assert envs.single_action_space == ref.single_action_space
            assert envs.num_envs == ref.num_envs and envs.num_parallel_envs == NUM_ENVS
            assert envs.slots == ref.slots
        else:
            assert envs.group_names == ref.group_names
            assert envs.single_observation_spaces == ref.single_observation_spaces
            assert envs.single_action_spaces == ref.single_action_spaces
        if getattr(ref.envs[0].env, "possible_agents", None) is not None:
            assert envs.rows == ref.rows
        seen = Seen(ref, want[1])
        obs = want[0]
        for t in range(steps):
            ended = np.array([s.ended for s in ref.envs])
            if mode is DISABLED and ended.any():
                opts = {"reset_mask": ended}
                want = ref.reset(options=dict(opts))
                got = envs.reset(options={"reset_mask": ended.copy()})
                assert_masked_reset_matches(ref, got, want, ended)
                obs = want[0]
            actions = choose_actions(ref, obs, rng)
            want_step = ref.step(actions)
            got_step = envs.step(actions)
            assert_same(got_step, want_step, f"{case}, {mode.value}: step {t + 1}")
            seen.note(want_step)
            obs = want_step[0]
    ref.close()
    return seen.things


@on_backends("case, mode", local=LOCAL_CASES, caller=CALLER_CASES, ray=RAY_CASES)
def test_make_parallel_matches_the_serial_reference(
    backend: Backend, case: str, mode: AutoresetMode
) -> None:
    things = run_against_reference(backend, case, mode)
    missing = set(CASES[case][3]) - things
    assert not missing, f"{case} showed no {sorted(missing)} in {CASES[case][2]} steps"


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=lambda m: m.value)
def test_done_on_any_truncates_the_survivors_like_the_reference(mode: AutoresetMode) -> None:
    things = run_against_reference(Backend("local"), "synthetic", mode, done_on="any")
    assert {"death", "end"} <= things


def test_one_worker_and_per_env_seeds_match_the_reference() -> None:
    env_fn = functools.partial(CheapAgentsEnv, max_steps=15, death_p=0.05)
    ref = ReferenceAgents([env_fn] * 2, autoreset_mode=SAME)
    with make_parallel(env_fn, 2, n_workers=1, autoreset_mode=SAME, context="fork") as envs:
        assert_same(envs.reset(seed=[5, 9]), ref.reset(seed=[5, 9]))
        rng = np.random.default_rng(1)
        for t in range(20):
            a = rng.integers(4, size=32)
            assert_same(envs.step(a), ref.step(a), f"step {t + 1}")
        assert_same(envs.reset(), ref.reset(), "the unseeded reset")  # generators go on
    ref.close()


def test_padded_sequence_rows_equal_the_default_form_row_by_row() -> None:
    """``ragged="padded"`` over KAZ vector-sequence: one ``(data, lengths)`` pair over the
    agent rows, each row's first ``lengths[r]`` elements the default form's row."""
    options = {"n_workers": 2, "context": "fork"}
    with (
        make_parallel(kaz_sequence_env, NUM_ENVS, **options) as default,
        make_parallel(kaz_sequence_env, NUM_ENVS, ragged="padded", **options) as padded,
    ):
        want, _ = default.reset(seed=SEED)
        got, _ = padded.reset(seed=SEED)
        rng = np.random.default_rng(0)
        for t in range(80):
            (data, lengths), n = got, default.num_envs
            assert data.shape[0] == n and lengths.shape == (n,), t
            for r in range(n):
                assert lengths[r] == len(want[r]), (t, r)
                np.testing.assert_array_equal(data[r, : lengths[r]], want[r], f"step {t} row {r}")
            actions = rng.integers(default.single_action_space.n, size=n)
            want = default.step(actions)[0]
            got = padded.step(actions)[0]
