"""ActionChecker in its three modes, and check_env_fns.

Most tests here pin the strict mode's messages (every per-env check, the env and worker
named); the safe mode's own section checks that it lets through what AsyncVectorEnv lets
through and refuses only what cannot be placed, with AsyncVectorEnv's exception types.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

import envmgr
from envmgr.frontend.validation import ActionChecker

N, EPW = 6, 2  # envs 0-1 on worker 0, 2-3 on worker 1, 4-5 on worker 2


def where(i: int) -> str:
    return f"env {i} (worker {i // EPW})"


def check(space: spaces.Space, actions: Any, mode: str = "strict") -> None:  # type: ignore[type-arg]
    ActionChecker(space, N, where, mode).check(actions)


def rejects(
    space: spaces.Space,  # type: ignore[type-arg]
    actions: Any,
    *patterns: str,
    mode: str = "strict",
    error: type[Exception] = ValueError,
) -> str:
    with pytest.raises(error) as ei:
        check(space, actions, mode)
    message = str(ei.value)
    for p in patterns:
        assert re.search(p, message), f"{p!r} not in {message!r}"
    return message


ALL_SPACES = {
    "Discrete": spaces.Discrete(3),
    "Discrete-start": spaces.Discrete(3, start=-1),
    "MultiDiscrete": spaces.MultiDiscrete([2, 5, 3]),
    "MultiDiscrete-2d-start": spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [0, -2]]),
    "MultiBinary": spaces.MultiBinary(4),
    "MultiBinary-2d": spaces.MultiBinary([2, 2]),
    "Box": spaces.Box(-1.0, 1.0, (2,), np.float32),
    "Box-halfbounded": spaces.Box(
        np.array([0.0, -np.inf]), np.array([np.inf, 2.0]), dtype=np.float64
    ),
    "Box-unbounded": spaces.Box(-np.inf, np.inf, (3,), np.float64),
    "Box-int": spaces.Box(0, 10, (2,), np.int64),
    "Dict": spaces.Dict({"move": spaces.Discrete(4), "aim": spaces.Box(-1, 1, (2,), np.float32)}),
    "Tuple": spaces.Tuple((spaces.MultiBinary(2), spaces.Discrete(2))),
    "nested": spaces.Dict(
        {"a": spaces.Tuple((spaces.Discrete(2), spaces.Dict({"b": spaces.MultiDiscrete([3, 3])})))}
    ),
    "Text": spaces.Text(4, charset="ab"),
}


@pytest.mark.parametrize("mode", ["strict", "safe", "off"])
@pytest.mark.parametrize("name", sorted(ALL_SPACES))
def test_sampled_batches_are_accepted(name: str, mode: str) -> None:
    batched = batch_space(ALL_SPACES[name], N)
    batched.seed(0)
    for _ in range(20):
        check(ALL_SPACES[name], batched.sample(), mode)


# ------------------------------------------------------------------ Discrete


def test_discrete_out_of_range_names_env_and_worker() -> None:
    space = spaces.Discrete(3)
    rejects(space, np.array([0, 1, 2, 0, 3, 1]), r"env 4 \(worker 2\)", r"\b3\b", r"Discrete\(3\)")
    rejects(space, np.array([0, -1, 2, 0, 0, 1]), r"env 1 \(worker 0\)", r"-1")


def test_discrete_with_start() -> None:
    space = spaces.Discrete(3, start=-1)
    check(space, np.array([-1, 0, 1, 1, 0, -1]))
    rejects(space, np.array([-1, 0, 2, 1, 0, -1]), r"env 2 \(worker 1\)")
    rejects(space, np.array([-1, 0, 1, 1, 0, -2]), r"env 5 \(worker 2\)")


def test_discrete_wrong_shape() -> None:
    rejects(spaces.Discrete(3), np.zeros(5, dtype=np.int64), r"shape \(5,\)", r"expected \(6,\)")
    rejects(spaces.Discrete(3), np.zeros((6, 1), dtype=np.int64), r"shape \(6, 1\)")
    rejects(spaces.Discrete(3), 1, r"single value \(1\)", r"\(6,\)", error=TypeError)


def test_discrete_float_actions_are_rejected_naming_the_env() -> None:
    message = rejects(spaces.Discrete(3), np.array([0, 1, 2, 0.5, 1, 1]), "float64")
    assert re.search(r"env 3 \(worker 1\)", message), message


def test_discrete_accepts_python_lists_and_any_integer_dtype() -> None:
    check(spaces.Discrete(3), [0, 1, 2, 0, 1, 2])
    check(spaces.Discrete(3), np.array([0, 1, 2, 0, 1, 2], dtype=np.uint8))


# ------------------------------------------------------------------ MultiDiscrete / MultiBinary


def test_multidiscrete_checks_each_dimension() -> None:
    space = spaces.MultiDiscrete([2, 5, 3])
    a = np.zeros((N, 3), dtype=np.int64)
    a[3, 1] = 5  # dimension 1 allows 0..4
    rejects(space, a, r"env 3 \(worker 1\)", r"\[0, 5, 0\]", "MultiDiscrete")
    a[3, 1] = 4
    check(space, a)
    a[0, 0] = 2  # dimension 0 allows 0..1
    rejects(space, a, r"env 0 \(worker 0\)")


def test_multidiscrete_with_start() -> None:
    space = spaces.MultiDiscrete([[2, 3], [4, 5]], start=[[1, 0], [0, -2]])
    a = np.broadcast_to(space.start, (N, 2, 2)).copy()
    check(space, a)
    a[5, 1, 1] = -3
    rejects(space, a, r"env 5 \(worker 2\)")


def test_multidiscrete_wrong_shape() -> None:
    rejects(
        spaces.MultiDiscrete([2, 5, 3]),
        np.zeros((N, 2), dtype=np.int64),
        r"shape \(6, 2\)",
        r"\(6, 3\)",
    )


def test_multibinary_only_zero_and_one() -> None:
    space = spaces.MultiBinary(4)
    a = np.zeros((N, 4), dtype=np.int8)
    a[2, 3] = 2
    rejects(space, a, r"env 2 \(worker 1\)", "MultiBinary")
    a[2, 3] = 1
    check(space, a)
    check(space, a.astype(bool))
    rejects(space, a.astype(np.float32), "float32")


# ------------------------------------------------------------------ Box


def test_box_nan_and_inf_name_the_env() -> None:
    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    a = np.zeros((N, 2), dtype=np.float32)
    a[4, 0] = np.nan
    rejects(space, a, r"env 4 \(worker 2\)", "not finite")
    a[4, 0] = 0
    a[1, 1] = -np.inf
    rejects(space, a, r"env 1 \(worker 0\)", "not finite")


def test_box_out_of_bounds_names_the_env() -> None:
    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    a = np.zeros((N, 2), dtype=np.float32)
    a[2, 1] = 1.5
    rejects(space, a, r"env 2 \(worker 1\)", "outside", "check_actions='safe'")


def test_box_half_bounded() -> None:
    space = ALL_SPACES["Box-halfbounded"]
    a = np.zeros((N, 2))
    a[:, 0] = 1e300  # no upper bound on dimension 0
    a[:, 1] = -1e300  # no lower bound on dimension 1
    check(space, a)
    a[3, 0] = -0.5
    rejects(space, a, r"env 3 \(worker 1\)", "outside")


def test_unbounded_box_accepts_any_finite_value_but_not_nan() -> None:
    space = ALL_SPACES["Box-unbounded"]
    check(space, np.full((N, 3), 1e300))
    a = np.zeros((N, 3))
    a[5, 2] = np.nan
    rejects(space, a, r"env 5 \(worker 2\)", "not finite")


def test_box_wrong_shape_and_dtype() -> None:
    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    rejects(space, np.zeros((N, 3), dtype=np.float32), r"shape \(6, 3\)", r"\(6, 2\)")
    rejects(space, np.array([["a", "b"]] * N), "dtype")


def test_integer_box() -> None:
    space = spaces.Box(0, 10, (2,), np.int64)
    a = np.full((N, 2), 5, dtype=np.int64)
    check(space, a)
    a[1, 0] = 11
    rejects(space, a, r"env 1 \(worker 0\)", "outside")


def test_integer_box_rejects_fractional_and_nan_floats() -> None:
    # gymnasium's Box(dtype=int64).contains() refuses float actions; written into
    # the int64 action array, 2.5 would silently become 2 and NaN a huge negative.
    space = spaces.Box(0, 10, (2,), np.int64)
    assert not space.contains(np.array([2.5, 1.0]))
    a = np.full((N, 2), 5.0)
    a[1, 0] = 2.5
    rejects(space, a, r"dtype float64", r"env 1 \(worker 0\) is \[2\.5, 5\.0\]", "not an integer")
    a[1, 0] = 5.0
    a[2, 1] = np.nan
    rejects(space, a, r"dtype float64", r"env 2 \(worker 1\) is \[5\.0, nan\]", "not an integer")


# ------------------------------------------------------------------ Dict / Tuple


def test_dict_messages_carry_the_key_path() -> None:
    space = ALL_SPACES["Dict"]
    good = {"move": np.zeros(N, dtype=np.int64), "aim": np.zeros((N, 2), dtype=np.float32)}
    check(space, good)
    bad = dict(good, move=np.array([0, 0, 0, 0, 0, 4]))
    rejects(space, bad, r"actions\['move'\]", r"env 5 \(worker 2\)")
    aim = np.zeros((N, 2), dtype=np.float32)
    aim[0, 1] = np.nan
    rejects(space, dict(good, aim=aim), r"actions\['aim'\]", r"env 0 \(worker 0\)")
    rejects(space, {"move": good["move"]}, r"dict with keys \['aim', 'move'\]", r"\['move'\]")
    rejects(space, {"move": good["move"]}, r": actions\['aim'\] missing$")
    rejects(space, dict(good, extra=1), "dict with keys", r": actions\['extra'\] not in the space$")
    rejects(space, np.zeros(N), "dict with keys", "ndarray")


def test_tuple_messages_carry_the_index_path() -> None:
    space = ALL_SPACES["Tuple"]
    good = (np.zeros((N, 2), dtype=np.int8), np.zeros(N, dtype=np.int64))
    check(space, good)
    check(space, list(good))
    rejects(space, (good[0], np.array([0, 0, 2, 0, 0, 0])), r"actions\[1\]", r"env 2 \(worker 1\)")
    rejects(space, (good[0],), "tuple of 2")
    rejects(space, good[0], "tuple of 2")


def test_nested_dict_tuple_path() -> None:
    space = ALL_SPACES["nested"]
    actions = batch_space(space, N).sample()
    check(space, actions)
    b = actions["a"][1]["b"].copy()
    b[4, 1] = 3
    bad = {"a": (actions["a"][0], {"b": b})}
    rejects(space, bad, r"actions\['a'\]\[1\]\['b'\]", r"env 4 \(worker 2\)")


# ------------------------------------------------------------------ spaces without fixed shape


def test_text_actions_are_checked_per_env() -> None:
    space = ALL_SPACES["Text"]
    check(space, ("a", "ab", "b", "", "aa", "bbbb") if space.min_length == 0 else ("a",) * N)
    rejects(space, ("a", "a", "a", "c", "a", "a"), r"env 3 \(worker 1\)", "'c'")
    rejects(space, ("a",) * 5, "5 entries", "num_envs=6")
    # A string of num_envs characters, or a dict of num_envs keys, is one value, not a batch.
    for mode in ("safe", "strict"):
        rejects(space, "ab" * 3, "is a single str, not a batch", mode=mode, error=TypeError)
        rejects(space, dict.fromkeys("abcdef"), "single dict", mode=mode, error=TypeError)


def test_where_names_the_env_and_send_ids_map_rows_to_envs() -> None:
    checker = ActionChecker(spaces.Discrete(2), 2, lambda i: f"env {i} (worker {i - 7})", "strict")
    with pytest.raises(ValueError, match=r"the action for env 9 \(worker 2\) is 5,"):
        checker.check(np.array([0, 5]), env_ids=np.array([8, 9]))


@pytest.mark.parametrize("dtype", ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"])
@pytest.mark.parametrize("start", [0, -1, 2, -40000])
def test_discrete_range_check_for_every_integer_dtype(dtype: str, start: int) -> None:
    space = spaces.Discrete(3, start=start)
    info = np.iinfo(dtype)
    inside = [v for v in range(start, start + 3) if info.min <= v <= info.max]
    filler = inside[0] if inside else None
    if inside:
        check(space, np.array([inside[k % len(inside)] for k in range(N)], dtype=dtype))
    # Offenders just outside the range, and far outside: 256 + v shares its low
    # byte with v, 65536 + v its two low bytes.
    offenders = [
        start - 1,
        start + 3,
        256 + start,
        256 + start + 1,
        65536 + start,
        65536 + start + 1,
    ]
    for bad in offenders:
        if not info.min <= bad <= info.max:
            continue
        a = np.full(N, bad if filler is None else filler, dtype=dtype)
        a[3] = bad
        first = 0 if filler is None else 3
        with pytest.raises(ValueError, match=rf"env {first} \(worker {first // EPW}\)"):
            check(space, a)


def test_whole_groups_accepts_whole_groups_in_any_order() -> None:
    from envmgr.protocol.layout import Layout

    layout = Layout.split(6, 3)
    ids, groups = layout.whole_groups([5, 4, 0, 1], "workers")
    assert ids.tolist() == [5, 4, 0, 1] and groups == [0, 2]
    ids, groups = layout.whole_groups(None, "workers")
    assert ids.tolist() == list(range(6)) and groups == [0, 1, 2]
    # Uneven groups (3, 2): whole means each group's own size.
    ids, groups = Layout.split(5, 2).whole_groups([3, 4], "workers")
    assert groups == [1]


@pytest.mark.parametrize(
    ("env_ids", "pattern"),
    [
        ([6, 7], r"in \[0, 6\)"),
        ([-2, -1], r"in \[0, 6\)"),
        ([], r"non-empty"),
        ([1, 2], r"whole workers \(2 consecutive"),
        ([0, 0], r"whole workers"),
    ],
)
def test_whole_groups_rejects_ids_naming_the_problem(env_ids: list[int], pattern: str) -> None:
    from envmgr.protocol.layout import Layout

    with pytest.raises(ValueError, match=pattern):
        Layout.split(6, 3).whole_groups(env_ids, "workers")


# ------------------------------------------------------------------ safe mode (the default)


def test_safe_is_the_default_mode_and_modes_are_checked() -> None:
    assert ActionChecker(spaces.Discrete(2), N, where).mode == "safe"
    assert ActionChecker(spaces.Discrete(2), N, where, False).mode == "off"
    assert ActionChecker(spaces.Discrete(2), N, where, True).mode == "safe"
    with pytest.raises(ValueError, match=r"check_actions must be one of 'safe', 'strict', 'off'"):
        ActionChecker(spaces.Discrete(2), N, where, "loose")


def test_safe_passes_values_outside_the_space_on_as_async_vector_env_does() -> None:
    # Gymnasium leaves bounds to the env (Pendulum clips, CartPole asserts); so does "safe".
    box = spaces.Box(-2.0, 2.0, (1,), np.float32)
    wild = np.array([[5.0], [-9.0], [np.nan], [np.inf], [0.0], [1e30]])
    check(box, wild, "safe")
    check(box, wild.astype(np.float64), "safe")
    check(spaces.Discrete(3), np.array([0, 1, 7, -1, 2, 3]), "safe")
    check(spaces.Discrete(3), [0, 1, 7, -1, 2, 3], "safe")
    check(spaces.MultiBinary(2), np.full((N, 2), 3), "safe")
    check(spaces.MultiDiscrete([2, 2]), np.full((N, 2), 9, dtype=np.uint8), "safe")
    check(spaces.Box(0, 10, (2,), np.int64), np.full((N, 2), -50), "safe")
    # Whole-number floats survive the cast to an integer space.
    check(spaces.Discrete(3), np.array([0.0, 1.0, 2.0, 2.0, 1.0, 0.0]), "safe")


@pytest.mark.parametrize("mode", ["safe", "strict"])
def test_safe_and_strict_refuse_what_cannot_be_placed(mode: str) -> None:
    disc, box = spaces.Discrete(3), spaces.Box(-1.0, 1.0, (2,), np.float32)
    rejects(disc, np.zeros(5, dtype=np.int64), r"shape \(5,\), expected \(6,\)", mode=mode)
    rejects(disc, np.zeros((N, 1), dtype=np.int64), r"shape \(6, 1\)", mode=mode)
    rejects(box, np.zeros((N, 3)), r"shape \(6, 3\), expected \(6, 2\)", mode=mode)
    rejects(box, np.array([["a", "b"]] * N), r"dtype <U1", mode=mode)
    rejects(disc, np.array(["a"] * N), r"dtype <U1", mode=mode)
    rejects(box, [[0.0, 1.0], [0.0]] * 3, "not a rectangular batch", mode=mode)
    rejects(disc, np.array([0, 1, 2, 0.5, 1, 1]), r"float64", r"env 3 \(worker 1\)", mode=mode)
    rejects(ALL_SPACES["Tuple"], (np.zeros((N, 2), np.int8),), "tuple of 2", mode=mode)
    rejects(
        ALL_SPACES["Dict"], {"move": np.zeros(N, np.int64)}, r"keys \['aim', 'move'\]", mode=mode
    )


def test_safe_refuses_values_the_integer_dtype_would_change() -> None:
    rejects(
        spaces.Discrete(3),
        np.array([0, 1, 2, 0, np.nan, 1]),
        r"dtype float64: the action for env 4 \(worker 2\) is nan",
        r"Discrete\(3\) \(dtype int64\) cannot hold unchanged",
        mode="safe",
    )
    rejects(spaces.MultiBinary(2), np.full((N, 2), 300), r"env 0 \(worker 0\) is \[300, 300\]",
            mode="safe")  # fmt: skip
    big = np.zeros(N, dtype=np.uint64)
    big[5] = 2**63
    rejects(spaces.Discrete(3), big, r"env 5 \(worker 2\) is 9223372036854775808", mode="safe")
    rejects(spaces.Box(0, 10, (2,), np.int64), np.full((N, 2), 0.5), r"env 0", mode="safe")


def test_safe_dict_ignores_extra_keys_strict_refuses_them() -> None:
    space = ALL_SPACES["Dict"]
    good = {"move": np.zeros(N, dtype=np.int64), "aim": np.zeros((N, 2), dtype=np.float32)}
    check(space, dict(good, extra=1), "safe")
    rejects(space, dict(good, extra=1), "dict with keys", mode="strict")
    rejects(space, np.zeros(N), "dict with keys", "ndarray", mode="safe")


def test_safe_generic_space_checks_the_count_only() -> None:
    space = ALL_SPACES["Text"]
    check(space, ("a", "a", "a", "c", "a", "a"), "safe")  # 'c' is outside the charset
    rejects(space, ("a",) * 5, "5 entries", "num_envs=6", mode="safe")
    rejects(space, 3, "single int", mode="safe", error=TypeError)


def test_off_checks_nothing() -> None:
    ActionChecker(spaces.Discrete(3), N, where, "off").check(None)
    ActionChecker(spaces.Discrete(3), N, where, "off").check(np.zeros(2))


def test_safe_mode_reuses_its_dtype_verdict() -> None:
    # The per-step cost: after the first batch of a dtype, an exact cast is one dict lookup.
    checker = ActionChecker(spaces.Discrete(3), N, where)
    checker.check(np.zeros(N, dtype=np.int32))
    checker.check(np.zeros(N, dtype=np.int32))
    with pytest.raises(ValueError, match="env 2"):
        checker.check(np.array([0, 0, 0.5, 0, 0, 0]))  # a new dtype gets its own verdict


def _async_error(actions: Any) -> type[BaseException] | None:
    import gymnasium as gym
    from gymnasium.vector import AsyncVectorEnv

    envs = AsyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2, context="fork")
    try:
        envs.reset(seed=0)
        envs.step_async(actions)
    except Exception as exc:
        return type(exc)
    finally:
        envs.close(terminate=True)
    return None


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "actions",
    [np.array([0]), np.array([0, 1, 1]), [0], np.int64(1), 1, None],
    ids=["one-of-two", "three-of-two", "list-of-one", "np-scalar", "int", "None"],
)
def test_wrong_count_and_scalars_raise_what_async_vector_env_raises(actions: Any) -> None:
    expected = _async_error(actions)
    assert expected in (ValueError, TypeError)
    for mode in ("safe", "strict"):
        with pytest.raises(expected):
            ActionChecker(spaces.Discrete(2), 2, where, mode).check(actions)


# ------------------------------------------------------------------ check_env_fns


def test_check_env_fns_accepts_factories() -> None:
    import functools

    import gymnasium as gym

    from envmgr.managers.arguments import check_env_fns

    def factory() -> gym.Env:  # type: ignore[type-arg]
        return gym.make("CartPole-v1")

    assert check_env_fns(factory) is factory
    partial = functools.partial(gym.make, "CartPole-v1")
    assert check_env_fns([factory, partial]) == [factory, partial]
    assert check_env_fns(iter([factory])) == [factory]  # an iterator is read once, here
    assert check_env_fns((factory,)) == [factory]


def test_check_env_fns_refuses_instances_with_a_factory_hint() -> None:
    import gymnasium as gym

    from envmgr.managers.arguments import check_env_fns

    env = gym.make("CartPole-v1")
    try:
        with pytest.raises(TypeError, match=r"env_fns is an env instance \(<TimeLimit") as ei:
            check_env_fns(env)
        assert "lambda: gym.make('CartPole-v1')" in str(ei.value)
        with pytest.raises(TypeError, match=r"env_fns\[1\] is an env instance") as ei:
            check_env_fns([lambda: env, env])
        assert "lambda: gym.make('CartPole-v1')" in str(ei.value)
        with pytest.raises(TypeError, match=r"\(<CartPoleEnv<CartPole-v1>>\)"):
            check_env_fns([env.unwrapped])

        class Bare(gym.Env):  # type: ignore[type-arg]
            pass

        with pytest.raises(TypeError, match=r"e\.g\. lambda: Bare\(\.\.\.\)"):
            check_env_fns(Bare())
    finally:
        env.close()
    with pytest.raises(TypeError, match=r"the string 'CartPole-v1'.*envmgr\.make"):
        check_env_fns("CartPole-v1")
    with pytest.raises(TypeError, match=r"env_fns\[0\] is 42, not a zero-argument callable"):
        check_env_fns([42])
    with pytest.raises(TypeError, match="env_fns must be a zero-argument env factory"):
        check_env_fns(42)
    with pytest.raises(ValueError, match="empty sequence"):
        check_env_fns([])


# The managers must call check_env_fns on their env_fns argument first; until some module of
# the package does, the end-to-end test cannot pass and says so.
MANAGER_WIRED = any(
    "check_env_fns(" in path.read_text()
    for path in Path(envmgr.__file__).parent.rglob("*.py")
    if path.name != "validation.py"
)


@pytest.mark.skipif(
    not MANAGER_WIRED,
    reason="SubprocessEnvManager does not call envmgr.frontend.validation.check_env_fns yet "
    "(wired in at the merge with the refactor branch)",
)
@pytest.mark.timeout(60)
def test_manager_refuses_an_env_instance_with_a_factory_hint() -> None:
    import gymnasium as gym

    from envmgr import SubprocessEnvManager

    env = gym.make("CartPole-v1")
    try:
        for env_fns in (env, [env, env]):
            with pytest.raises(TypeError, match=r"not an env factory.*lambda: gym\.make\("):
                SubprocessEnvManager(env_fns, context="fork")
    finally:
        env.close()


# ------------------------------------------------------------------ the per-step shortcut


@pytest.mark.parametrize(
    "space",
    [spaces.Discrete(3), spaces.MultiDiscrete([2, 5]), spaces.Box(-1.0, 1.0, (2,), np.float32)],
    ids=["Discrete", "MultiDiscrete", "Box"],
)
def test_a_checker_that_accepted_a_dtype_still_checks_every_later_batch(space: Any) -> None:
    """Safe mode passes a plain array of a dtype it already accepted at once (the usual
    step): the shortcut must not let a later batch of that dtype through with the wrong
    shape, a later batch of another dtype past its own check, or (strict mode) a value
    out of range."""
    shape = (N, *space.shape)
    safe = ActionChecker(space, N, where, "safe")
    good = np.zeros(shape, dtype=space.dtype)
    safe.check(good)
    safe.check(good)  # the shortcut
    with pytest.raises(ValueError, match=r"shape"):
        safe.check(np.zeros((N + 1, *space.shape), dtype=space.dtype))
    with pytest.raises(TypeError, match=r"single value"):
        safe.check(np.zeros((), dtype=space.dtype))
    if space.dtype.kind == "i":
        # Floats are not castable unchanged: that dtype was never accepted, so the
        # values are looked at.
        fractional = good.astype(np.float64)
        fractional.reshape(N, -1)[1, 0] = 0.5
        with pytest.raises(ValueError, match=r"env 1 \(worker 0\)"):
            safe.check(fractional)
    strict = ActionChecker(space, N, where, "strict")
    strict.check(good)
    bad = good.copy()
    bad.reshape(N, -1)[4, 0] = 7
    with pytest.raises(ValueError, match=r"env 4 \(worker 2\)"):
        strict.check(bad)
