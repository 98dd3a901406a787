"""The layout of Sequence/Graph leaves: capacities, writing rows, spilling, reading back."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector.utils import concatenate, create_empty_array
from support.envs import assert_same

from envmgr.protocol.ragged import RaggedStore
from envmgr.protocol.ragged_layout import capacities_for, fits_ragged, grown
from envmgr.protocol.ragged_read import read_stores


def mixed_space() -> spaces.Dict:
    return spaces.Dict(
        {
            "global": spaces.Box(-1, 1, (3,), np.float32),
            "entities": spaces.Dict(
                {
                    "a": spaces.Sequence(spaces.Box(-1, 1, (4,), np.float32), stack=True),
                    "b": spaces.Sequence(spaces.Discrete(5), stack=False),
                }
            ),
            "graph": spaces.Graph(spaces.Box(0, 1, (2,), np.float32), spaces.Discrete(3)),
        }
    )


def samples(space: spaces.Space[Any], n: int, seed: int = 0) -> list[Any]:
    space.seed(seed)
    return [space.sample() for _ in range(n)]


def sync_batch(space: spaces.Space[Any], items: list[Any]) -> Any:
    return concatenate(space, items, create_empty_array(space, len(items)))


@pytest.mark.parametrize(
    ("space", "fits"),
    [
        (mixed_space(), True),
        (spaces.Box(0, 1, (2,)), False),  # fixed: the batch arrays hold it
        (spaces.Sequence(spaces.Dict({"x": spaces.Discrete(2)}), stack=True), False),
        (spaces.Tuple((spaces.Text(4), spaces.Sequence(spaces.Discrete(2)))), False),
    ],
)
def test_which_spaces_get_a_store(space: spaces.Space[Any], fits: bool) -> None:
    assert fits_ragged(space) is fits


def test_capacity_hints_by_path_the_longest_key_winning() -> None:
    space = mixed_space()
    assert capacities_for(space, None) == (0, 0, 0, 0)
    assert capacities_for(space, 5) == (5, 5, 5, 5)
    hint = {"entities": 8, "entities/b": 2, "graph/edges": 30}
    assert capacities_for(space, hint) == (8, 2, 0, 30)
    with pytest.raises(ValueError, match="'entities/c'.*entities/a"):
        capacities_for(space, {"entities/c": 1})


def test_a_grown_capacity_is_a_power_of_two_at_least_twice_the_old() -> None:
    assert grown(0, 3) == 4
    assert grown(8, 9) == 16
    assert grown(8, 45) == 64


def test_rows_read_back_as_sync_vector_env_batches_them() -> None:
    space = mixed_space()
    items = samples(space, 5)
    store = RaggedStore.private(space, 5, capacities_for(space, 0))
    assert store.write_rows(items)  # a private store grows: nothing spills
    assert_same(read_stores(space, [(store, range(5), {})], False), sync_batch(space, items))
    # Pickled (a Ray actor's answer), it reads the same.
    again = pickle.loads(pickle.dumps(store))
    assert_same(read_stores(space, [(again, range(5), {})], False), sync_batch(space, items))


def test_a_fixed_capacity_store_spills_rows_and_says_what_they_need() -> None:
    space = mixed_space()
    items = samples(space, 4, seed=3)
    store = RaggedStore.private(space, 4, capacities_for(space, 3), growable=False)
    assert not store.write_rows(items)
    spilled = dict(store.spilled)
    lengths = [len(x["entities"]["a"]) for x in items]
    assert max(lengths) > 3, "the sample must overflow"
    assert {i for i, n in enumerate(lengths) if n > 3} <= spilled.keys()
    assert store.wants[0] == max(lengths)
    # The spilled rows, taken from the answer, make the batch whole again; so does the
    # padded form, row by row.
    assert_same(read_stores(space, [(store, range(4), spilled)], False), sync_batch(space, items))
    data, counts = read_stores(space, [(store, range(4), spilled)], True)["entities"]["a"]
    for i, x in enumerate(items):
        assert_same(data[i, : counts[i]], x["entities"]["a"])


def test_two_groups_read_as_one_batch() -> None:
    space = mixed_space()
    items = samples(space, 5, seed=1)
    first = RaggedStore.private(space, 2, capacities_for(space, 0))
    second = RaggedStore.private(space, 3, capacities_for(space, 50))
    first.write_rows(items[:2])
    second.write_rows(items[2:], first_env=2)
    parts = [(first, range(2), {}), (second, range(3), {})]
    assert_same(read_stores(space, parts, False), sync_batch(space, items))


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ({"a": np.zeros((2, 5), np.float32)}, "['entities']['a'] has shape (2, 5)"),
        ({"a": np.zeros((2, 4), np.complex64)}, "has dtype complex64"),
        ({"b": "xyz"}, "['entities']['b']"),
    ],
)
def test_a_bad_element_names_the_env_and_the_path(bad: dict[str, Any], says: str) -> None:
    space = mixed_space()
    items = samples(space, 3)
    items[2]["entities"].update(bad)
    store = RaggedStore.private(space, 3, capacities_for(space, 8))
    with pytest.raises(ValueError) as info:
        store.write_rows(items, first_env=10)
    assert str(info.value).startswith("env 12: observations")
    assert says in str(info.value)
    assert store.failed_row == 2
