"""Id schemes of stored rows: node and trajectory ids made from (tree, position in the tree).

Derived, not counted, so a resumed tree re-creates the same ids and shards never collide.
A tree is the search tree of one task (tree id = the task's index in the run). Each scheme
splits an id into the tree and a slot; a slot outside its range raises instead of silently
landing in the next tree's ids.
"""

from __future__ import annotations

NODES_PER_TREE = 1 << 24  # node ids are tree_id * NODES_PER_TREE + local id
TRAJS_PER_TREE = 1 << 20  # trajectory ids are tree_id * TRAJS_PER_TREE + slot
TREES_PER_ROUND = 1 << 24  # round k's tree ids are (k - 1) * TREES_PER_ROUND + the task's idx
IDS_PER_ROUND = 1 << 32  # round k's pair and example ids start at (k - 1) * IDS_PER_ROUND
GREEDY_SLOT = TRAJS_PER_TREE - 1  # the slot of a task's greedy (baseline) episode; simulations
# take the slots below it


def _check(what: str, value: int, limit: int) -> None:
    if not 0 <= value < limit:
        raise ValueError(f"{what} {value} out of range [0, {limit})")


def make_node_id(tree_id: int, local_id: int) -> int:
    """Node `local_id` (its index in the tree, root 0) of tree `tree_id`."""
    _check("tree id", tree_id, 1 << 38)  # the product stays a DuckDB BIGINT
    _check("local node id", local_id, NODES_PER_TREE)
    return tree_id * NODES_PER_TREE + local_id


def split_node_id(node_id: int) -> tuple[int, int]:
    """(tree id, local id) of a stored node id: the inverse of make_node_id."""
    _check("node id", node_id, (1 << 38) * NODES_PER_TREE)
    return divmod(node_id, NODES_PER_TREE)


def rollout_traj_id(tree_id: int, simulation: int) -> int:
    """The trajectory of simulation `simulation` of tree `tree_id`."""
    _check("tree id", tree_id, 1 << 38)
    _check("simulation", simulation, GREEDY_SLOT)
    return tree_id * TRAJS_PER_TREE + simulation


def greedy_traj_id(tree_id: int) -> int:
    """The greedy episode of the task of tree `tree_id`."""
    _check("tree id", tree_id, 1 << 38)
    return tree_id * TRAJS_PER_TREE + GREEDY_SLOT
