"""Pickled env snapshots of stores made before schema v5, turned into JSON data once.

Loading a pickle can run any code, so this is the one place that loads one, and only for the
user's own run: the runner calls it when `offline-agent run` opens its run directory, whose
pickles this user's earlier runs wrote. Shard stores from other machines are never unpickled:
merge refuses one that still holds pickles (Store.merge_from).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable

from offline_agent.envs.base import Env
from storage import Store, StoreError


def convert_pickled_snapshots(store: Store, make_env: Callable[[], Env]) -> int:
    """Re-store every pickled snapshot as `Env.snapshot()` data, in one transaction; returns
    how many. A pickle was `(task, num_steps, state)`, as Env.snapshot wrote it then."""
    rows = store.pickled_snapshots()
    if not rows:
        return 0
    env = make_env()
    updates = []
    for row in rows:
        try:  # the user's own run: see the module docstring
            env.task, env.num_steps, env.state = pickle.loads(row["pickled_snapshot"])  # noqa: S301
        except (pickle.UnpicklingError, ImportError, AttributeError, EOFError,
                TypeError, ValueError) as e:
            raise StoreError(f"{store.path}: node {row['node_id']}'s pickled env snapshot "
                             f"cannot be read by this offline-agent ({e!r})") from None
        updates.append({"node_id": row["node_id"], "snapshot": env.snapshot(),
                        "pickled_snapshot": None})
    store.update_nodes(updates)
    return len(updates)
