"""offline_agent/search/persist.py without a store: a tree survives rows both ways, a commit
writes the new nodes once and the older ones on its path as visit updates."""

from __future__ import annotations

import pytest

from offline_agent.search.mcts import Node, SimulationResult, Tree
from offline_agent.search.persist import (
    finished_rows,
    node_row,
    round_tree_ids,
    search_summary,
    tree_from_rows,
)
from offline_agent.types import Task, ToolCall, Trajectory
from storage import TREES_PER_ROUND, make_node_id, rollout_traj_id

TASK = Task("t0", "minishop", "buy a lamp")


def _tree() -> Tree:
    root = Node(id=0, parent=None, depth=0, observation="home", snapshot={"s": 0}, visits=2,
                value_sum=1.0, realized_sum=0.5, children=[1, 2])
    a = Node(id=1, parent=0, depth=1, action="search lamp", token_ids=[5, 6],
             tool_call=ToolCall("search", {"q": "lamp"}), observation="results",
             visits=1, value_sum=1.0, realized_sum=0.5, critic_rank=0, critic_score=0.7,
             snapshot={"s": 1}, created_sim=0, info={"page": "results"})
    b = Node(id=2, parent=0, depth=1, action="buy", observation="bought", reward=0.25,
             terminal=True, invalid=False, ending=0.25, snapshot={"s": 2}, created_sim=1)
    return Tree(task=TASK, nodes=[root, a, b], simulations_done=2)


def test_a_tree_survives_rows_both_ways():
    tree = _tree()
    rows = [node_row(7, n) for n in tree.nodes]
    assert [r.node_id for r in rows] == [make_node_id(7, i) for i in range(3)]
    assert rows[1].parent_id == make_node_id(7, 0) and rows[0].parent_id is None
    assert rows[1].tool_call == {"name": "search", "arguments": {"q": "lamp"}}
    assert rows[2].info is None  # an empty info is stored as NULL
    back = tree_from_rows(TASK, rows, 2)
    assert back == tree


def test_rebuilding_refuses_a_gap_or_a_missing_snapshot():
    rows = [node_row(7, n) for n in _tree().nodes]
    with pytest.raises(ValueError, match="not contiguous at 2"):
        tree_from_rows(TASK, [rows[0], rows[2]], 2)
    nodes = _tree().nodes
    nodes[1].snapshot = {}
    with pytest.raises(ValueError, match="node 1 has no env snapshot"):
        tree_from_rows(TASK, [node_row(7, n) for n in nodes], 2)


def test_a_commit_writes_new_nodes_once_and_updates_the_rest():
    tree = _tree()
    traj = Trajectory(task_id="t0", env="minishop", instruction=TASK.instruction,
                      first_observation="home", steps=[], reward=0.25)
    result = SimulationResult(simulation=1, trajectory=traj, reward=0.25, new_nodes=[2],
                              path=[0, 2])
    best = {"t0": 0.1}
    rows = finished_rows([(tree, result)], {"t0": 7}, simulations=2, best=best)
    assert [r.node_id for r in rows.nodes] == [make_node_id(7, 2)]
    assert [(v.node_id, v.visits, v.value_sum) for v in rows.visits] == [
        (make_node_id(7, 0), 2, 1.0)]
    assert [t.traj_id for t in rows.trajectories] == [rollout_traj_id(7, 1)]
    assert best == {"t0": 0.25}
    (row,) = rows.trees
    assert (row.tree_id, row.status, row.simulations_done, row.best_reward) == (
        7, "done", 2, 0.25)


def test_round_ids_and_summary():
    assert round_tree_ids({"a": 0, "b": 1}, 2) == {"a": TREES_PER_ROUND, "b": TREES_PER_ROUND + 1}
    assert search_summary(["a", "b", "c", "d"], {"a", "b", "x"}, {"a"}) == {
        "tasks_solved_by_search": 2, "tasks_solved_greedy": 1,
        "search_success_rate": 0.5, "greedy_success_rate": 0.25}
