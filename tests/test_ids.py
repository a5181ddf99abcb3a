"""storage/ids.py: node and trajectory ids round-trip, stay apart, and refuse out-of-range slots."""

from __future__ import annotations

import pytest

from storage import (
    GREEDY_SLOT,
    NODES_PER_TREE,
    greedy_traj_id,
    make_node_id,
    rollout_traj_id,
    split_node_id,
)


def test_node_ids_round_trip_and_never_collide_across_trees():
    ids = {make_node_id(tree, local): (tree, local)
           for tree in (0, 1, 7, 1 << 30) for local in (0, 1, NODES_PER_TREE - 1)}
    assert len(ids) == 12
    assert all(split_node_id(node_id) == where for node_id, where in ids.items())


@pytest.mark.parametrize("tree, local", [(0, NODES_PER_TREE), (0, -1), (-1, 0), (1 << 38, 0)])
def test_node_id_out_of_range_raises(tree, local):
    with pytest.raises(ValueError, match="out of range"):
        make_node_id(tree, local)


def test_split_node_id_refuses_a_negative_id():
    with pytest.raises(ValueError, match="node id -1 out of range"):
        split_node_id(-1)


def test_rollout_and_greedy_trajectory_ids_stay_apart():
    """Every simulation slot of a tree sits below its greedy slot, and both below the next
    tree's first id."""
    last = rollout_traj_id(3, GREEDY_SLOT - 1)
    assert rollout_traj_id(3, 0) < last < greedy_traj_id(3) < rollout_traj_id(4, 0)
    assert greedy_traj_id(3) - rollout_traj_id(3, 0) == GREEDY_SLOT


def test_a_simulation_in_the_greedy_slot_or_beyond_raises():
    with pytest.raises(ValueError, match=f"simulation {GREEDY_SLOT} out of range"):
        rollout_traj_id(0, GREEDY_SLOT)
    with pytest.raises(ValueError, match="simulation -1"):
        rollout_traj_id(0, -1)
    with pytest.raises(ValueError, match="tree id -2"):
        greedy_traj_id(-2)
