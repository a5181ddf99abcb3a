"""DuckDB storage: the schema (with migrations) and the Store, the only code that writes SQL."""

from storage.schema import SCHEMA_VERSION
from storage.store import (
    NODES_PER_TREE,
    MergeConflict,
    Store,
    StoreError,
    StoreInUse,
    make_node_id,
)

__all__ = [
    "NODES_PER_TREE",
    "SCHEMA_VERSION",
    "MergeConflict",
    "Store",
    "StoreError",
    "StoreInUse",
    "make_node_id",
]
