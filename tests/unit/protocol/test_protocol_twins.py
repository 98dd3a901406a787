"""``Layout.group_with_ids`` is ``send``'s shortcut past ``Layout.whole_groups`` for ids
that ``recv`` returned (one whole group, in order); wherever it names a group, the general
check must name that group alone, with the same ids (docs/architecture.md,
"Hand-inlined shortcuts")."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from envmgr.protocol.layout import Layout


def candidate_ids(layout: Layout) -> list[Any]:
    """Each group's ids as recv returns them, and near misses in every form send takes."""
    out: list[Any] = []
    for g in range(layout.n_groups):
        r = layout.range(g)
        ids = np.arange(r.start, r.stop, dtype=np.int64)
        out += [ids, ids[::-1].copy(), ids.astype(np.int32), list(r), ids[:-1], ids + 1]
        out += [ids.reshape(1, -1), np.concatenate([ids, ids])]
    out += [np.arange(layout.num_envs, dtype=np.int64), np.array([], dtype=np.int64)]
    return out


@pytest.mark.parametrize("sizes", [(2, 2, 2), (3, 2, 2), (1, 4), (5,)])
def test_group_with_ids_names_only_what_whole_groups_names_alike(sizes: tuple[int, ...]) -> None:
    layout = Layout.of(sizes)
    for ids in candidate_ids(layout):
        g = layout.group_with_ids(ids)
        if g is None:
            continue  # the general check decides: no promise to compare
        checked, groups = layout.whole_groups(ids, "workers")
        assert groups == [g], ids
        assert np.array_equal(checked, ids), ids
        # What the shortcut lets post_step assume: the group's envs, in order.
        r = layout.range(g)
        assert np.array_equal(ids, np.arange(r.start, r.stop)), ids
    # The shortcut fires for recv's ids of every group, or the comparison proves little.
    for g in range(layout.n_groups):
        r = layout.range(g)
        assert layout.group_with_ids(np.arange(r.start, r.stop, dtype=np.int64)) == g
