"""Reward balancing: caps that keep pairs round-robin across margin bins, seeded.

The same rules run as SQL window functions in storage (storage/step_pairs.py); this module is
their plain-Python statement, the oracle the tests and benchmarks/mining.py compare with.
At each level (an expanded node, a task, everything) a group keeps at most `cap` items: the
first of each bin, then the second of each, ... (so near-ties and clear wins both stay when
the trees hold them); inside a bin the order is a seeded hash, never input order.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

T = TypeVar("T")


def pair_key(seed: int, chosen: int, rejected: int) -> str:
    """Seeded order of a pair, equal to storage's md5(concat(seed, ':', chosen, ':', rejected))."""
    return hashlib.md5(f"{seed}:{chosen}:{rejected}".encode()).hexdigest()


def margin_bin(margin: float, edges: Sequence[float]) -> int:
    """0 below the first edge, 1 from it to the next, ...; an edge belongs to the bin above."""
    return bisect_right(list(edges), margin)


def round_robin(items: list[T], group: Callable[[T], Hashable], bucket: Callable[[T], tuple],
                key: Callable[[T], str], cap: int) -> list[T]:
    """Keep at most `cap` items per group: bucket by bucket in turn, `key` order inside one."""
    rank: dict[tuple, int] = {}
    ranked = []
    for item in sorted(items, key=key):
        slot = (group(item), bucket(item))
        rank[slot] = rank.get(slot, 0) + 1
        ranked.append((rank[slot], item))
    ranked.sort(key=lambda r: (r[0], bucket(r[1]), key(r[1])))
    kept: dict[Hashable, int] = {}
    out = []
    for _, item in ranked:
        g = group(item)
        if kept.get(g, 0) < cap:
            kept[g] = kept.get(g, 0) + 1
            out.append(item)
    return out
