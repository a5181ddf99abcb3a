"""DuckDB storage: the schema (with migrations), the row types, the Store, shard merge and the
step-pair query; the only code that writes SQL."""

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
from storage.merge import MergeConflict, merge_shards
from storage.rows import (
    EvalEpisodeRow,
    ExampleRow,
    MetricRow,
    NodeRow,
    NodeVisits,
    PairRow,
    StageRow,
    TrajectoryRow,
    TreeRow,
)
from storage.schema import SCHEMA_VERSION
from storage.step_pairs import select_step_pairs, sibling_gaps, step_pair_inputs
from storage.store import Store, StoreError, StoreInUse

__all__ = [
    "GREEDY_SLOT",
    "IDS_PER_ROUND",
    "NODES_PER_TREE",
    "SCHEMA_VERSION",
    "TRAJS_PER_TREE",
    "TREES_PER_ROUND",
    "EvalEpisodeRow",
    "ExampleRow",
    "MergeConflict",
    "MetricRow",
    "NodeRow",
    "NodeVisits",
    "PairRow",
    "StageRow",
    "Store",
    "StoreError",
    "StoreInUse",
    "TrajectoryRow",
    "TreeRow",
    "greedy_traj_id",
    "make_node_id",
    "merge_shards",
    "rollout_traj_id",
    "select_step_pairs",
    "sibling_gaps",
    "split_node_id",
    "step_pair_inputs",
]
