"""Reading ragged stores back: the rows of a batch in SyncVectorEnv's form, or padded.

The parent reads its groups' stores (:mod:`envmgr.protocol.ragged`) into one batch, taking
the rows that travelled pickled on an overflow step from the answers::

    [(store, rows, {row: pickled value})]  --read_stores-->  tuples of per-env arrays,
                                                             GraphInstances  (default)
                                                             (data, lengths) ... (padded:
                                                             views of a whole block, or copies)
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from envmgr.protocol.ragged import RaggedStore, StoreLeaf
from envmgr.protocol.ragged_layout import LeafPath

__all__ = [
    "read_store",
    "read_stores",
]


def read_stores(
    space: gym.Space[Any],
    parts: list[tuple[RaggedStore, range, dict[int, Any]]],
    padded: bool,
    views: bool = False,
) -> Any:
    """The rows of ``parts`` as one batch: SyncVectorEnv's form, or padded.

    Args:
        space: The single-env observation space.
        parts: ``(store, its rows to read, {row: observation that travelled pickled})``
            for each group, in env order.
        padded: Each Sequence leaf as ``(data, lengths)``, each Graph leaf as
            ``(nodes, n_nodes, edges, edge_links, n_edges)`` (``n_edges`` -1: none),
            instead of tuples of per-env items.
        views: When ``parts`` are every row of one block and none travelled pickled, the
            padded arrays are views of the block (else fresh arrays, as always).
    """
    leaves = [leaf for leaf in parts[0][0].leaves]
    whole = _whole_block(parts) if padded else None
    if whole is not None:
        take = (lambda a: a) if views else np.ndarray.copy
        return _nest(
            space, (_padded_view(leaf, a, take) for leaf, a in zip(leaves, whole, strict=True))
        )
    values = []
    for k, leaf in enumerate(leaves):
        pieces = [(store.leaves[k], rows, over) for store, rows, over in parts]
        values.append(_padded(leaf, pieces) if padded and leaf.slots else _gym(leaf, pieces))
    return _nest(space, iter(values))


def read_store(store: RaggedStore) -> Any:
    """Every row of one store in Gymnasium's batch form, as fresh arrays (a reader's side)."""
    return read_stores(store.layout.space, [(store, range(store.layout.rows), {})], False)


def _whole_block(
    parts: list[tuple[RaggedStore, range, dict[int, Any]]],
) -> list[dict[str, np.ndarray]] | None:
    """The arrays of the block ``parts`` cover row by row, whole and in order, else ``None``."""
    first = parts[0][0]
    at = 0
    for store, rows, over in parts:
        layout = store.layout
        if over or store.block != first.block or layout.first != at:
            return None
        if rows != range(layout.rows):
            return None
        at += layout.rows
    return first.block_arrays if at == first.layout.all_rows else None


def _padded_view(leaf: StoreLeaf, arrays: dict[str, np.ndarray], take: Any) -> Any:
    """One leaf of a whole block in the padded form, through ``take`` (a view, or a copy)."""
    if leaf.slots == 0:
        return take(arrays["values"])
    if leaf.slots == 1:
        return take(arrays["data"]), take(arrays["lengths"])
    counts = arrays["counts"]
    edges, links = arrays.get("edges"), arrays.get("links")
    return (
        take(arrays["nodes"]),
        take(counts[:, 0]),
        None if edges is None else take(edges),
        None if links is None else take(links),
        take(counts[:, 1]),
    )


def _gym(leaf: StoreLeaf, pieces: list[tuple[StoreLeaf, range, dict[int, Any]]]) -> Any:
    if leaf.slots == 0:
        out = np.concatenate([p.arrays["values"][rows.start : rows.stop] for p, rows, _ in pieces])
        at = 0
        for _, rows, over in pieces:
            for i, value in over.items():
                out[at + i - rows.start] = _part(value, leaf.path)
            at += len(rows)
        return out
    items: list[Any] = []
    for p, rows, over in pieces:
        got = list(p.items(rows))
        for i, value in over.items():
            got[i - rows.start] = _part(value, leaf.path)
        items += got
    return tuple(items)


def _padded(leaf: StoreLeaf, pieces: list[tuple[StoreLeaf, range, dict[int, Any]]]) -> Any:
    n = sum(len(rows) for _, rows, _ in pieces)
    keys = ("data",) if leaf.slots == 1 else ("nodes", "edges", "links")
    present = [k for k in keys if k in leaf.arrays]
    caps = {k: max(p.arrays[k].shape[1] for p, _, _ in pieces) for k in present}
    over_rows = [(at, _part(v, leaf.path)) for at, v in _overrides(pieces)]
    if over_rows:
        for _, v in over_rows:
            for k, length in _lengths(leaf, v).items():
                caps[k] = max(caps[k], length)
    out = {
        k: np.zeros((n, caps[k], *leaf.arrays[k].shape[2:]), leaf.arrays[k].dtype) for k in present
    }
    counts_key = "lengths" if leaf.slots == 1 else "counts"
    counts = np.concatenate([p.arrays[counts_key][rows.start : rows.stop] for p, rows, _ in pieces])
    at = 0
    for p, rows, _ in pieces:
        for k in present:
            src = p.arrays[k][rows.start : rows.stop]
            out[k][at : at + len(rows), : src.shape[1]] = src
        at += len(rows)
    for at, v in over_rows:
        if leaf.slots == 1:
            a = leaf.elements(v, leaf.shape, leaf.dtype, "")
            out["data"][at, : len(a)] = a
            counts[at] = len(a)
            continue
        nodes = leaf.elements(v.nodes, leaf.shape, leaf.dtype, ".nodes")
        out["nodes"][at, : len(nodes)] = nodes
        counts[at, :2] = (len(nodes), -1 if v.edges is None else len(v.edges))
        if v.edges is not None:
            out["edges"][at, : len(v.edges)] = v.edges
            out["links"][at, : len(v.edges)] = v.edge_links
    if leaf.slots == 1:
        return out["data"], counts
    edges = out.get("edges")
    return out["nodes"], counts[:, 0].copy(), edges, out.get("links"), counts[:, 1].copy()


def _overrides(pieces: list[tuple[StoreLeaf, range, dict[int, Any]]]) -> list[tuple[int, Any]]:
    at, out = 0, []
    for _, rows, over in pieces:
        out += [(at + i - rows.start, v) for i, v in sorted(over.items())]
        at += len(rows)
    return out


def _lengths(leaf: StoreLeaf, value: Any) -> dict[str, int]:
    if leaf.slots == 1:
        return {"data": len(value)}
    got = {"nodes": len(value.nodes)}
    if value.edges is not None:
        got["edges"] = got["links"] = len(value.edges)
    return got


def _part(value: Any, path: LeafPath) -> Any:
    for k in path:
        value = value[k]
    return value


def _nest(space: gym.Space[Any], values: Any) -> Any:
    if isinstance(space, gym.spaces.Dict):
        return {k: _nest(s, values) for k, s in space.spaces.items()}
    if isinstance(space, gym.spaces.Tuple):
        return tuple(_nest(s, values) for s in space.spaces)
    return next(values)
