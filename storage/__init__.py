"""DuckDB storage: the schema (with migrations) and the Store, the only code that writes SQL."""

from storage.ids import (
    GREEDY_SLOT,
    IDS_PER_ROUND,
    NODES_PER_TREE,
    TRAJS_PER_TREE,
    TREES_PER_ROUND,
    greedy_traj_id,
    make_node_id,
    rollout_traj_id,
    split_node_id,
)
from storage.schema import SCHEMA_VERSION
from storage.store import MergeConflict, Store, StoreError, StoreInUse

__all__ = [
    "GREEDY_SLOT",
    "IDS_PER_ROUND",
    "NODES_PER_TREE",
    "SCHEMA_VERSION",
    "TRAJS_PER_TREE",
    "TREES_PER_ROUND",
    "MergeConflict",
    "Store",
    "StoreError",
    "StoreInUse",
    "greedy_traj_id",
    "make_node_id",
    "rollout_traj_id",
    "split_node_id",
]
