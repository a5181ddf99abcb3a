"""Search trees <-> stored rows: what stage `search` writes and resumes from, without a Store.

A tree's nodes become NodeRows (ids from storage/ids.py: derived from the tree and the
node's index, so a resumed tree re-creates the same ids), each finished simulation its new
nodes, the visit/value updates along its path, its rollout trajectory and its tree's
counters (`finished_rows`), which the stage commits in one transaction. A stored tree comes
back as the same in-memory Tree (`tree_from_rows`), its env snapshots restored once to
check them before the model loads (`resume_trees`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from offline_agent.envs.base import Env
from offline_agent.search.mcts import Node, SimulationResult, Tree
from offline_agent.types import Task, ToolCall, step_to_dict
from storage.ids import TREES_PER_ROUND, make_node_id, rollout_traj_id, split_node_id
from storage.rows import NodeRow, NodeVisits, TrajectoryRow, TreeRow


def round_tree_ids(task_index: dict[str, int], r: int) -> dict[str, int]:
    """task_id -> the id of its tree in round r: rounds never share a tree, node or
    trajectory id."""
    if len(task_index) > TREES_PER_ROUND:
        raise ValueError(f"{len(task_index)} tasks: tree ids allow {TREES_PER_ROUND} per round")
    return {task: (r - 1) * TREES_PER_ROUND + idx for task, idx in task_index.items()}


def node_row(tree_id: int, node: Node) -> NodeRow:
    return NodeRow(
        node_id=make_node_id(tree_id, node.id),
        tree_id=tree_id,
        parent_id=None if node.parent is None else make_node_id(tree_id, node.parent),
        depth=node.depth,
        action=node.action,
        token_ids=node.token_ids,
        tool_call=None if node.tool_call is None else vars(node.tool_call),
        observation=node.observation,
        visits=node.visits,
        value_sum=node.value_sum,
        realized_sum=node.realized_sum,
        critic_rank=node.critic_rank,
        critic_score=node.critic_score,
        ending=node.ending,
        reward=node.reward,
        terminal=node.terminal,
        invalid=node.invalid,
        snapshot=node.snapshot,
        info=node.info or None,
        created_sim=node.created_sim,
    )


def tree_from_rows(task: Task, rows: list[NodeRow], simulations_done: int) -> Tree:
    """Rebuild an in-memory tree from its stored nodes (ordered by id: parents first)."""
    nodes: list[Node] = []
    for r in rows:
        local = split_node_id(r.node_id)[1]
        if local != len(nodes):
            raise ValueError(f"tree of {task.id}: node ids are not contiguous at {local}")
        if not r.snapshot:
            raise ValueError(f"tree of {task.id}: node {local} has no env snapshot")
        parent = None if r.parent_id is None else split_node_id(r.parent_id)[1]
        nodes.append(Node(
            id=local, parent=parent, depth=r.depth, action=r.action or "",
            token_ids=r.token_ids,
            tool_call=ToolCall(**r.tool_call) if r.tool_call else None,
            observation=r.observation or "", reward=r.reward or 0.0,
            terminal=r.terminal, invalid=r.invalid, visits=r.visits,
            value_sum=r.value_sum, realized_sum=r.realized_sum, critic_rank=r.critic_rank,
            critic_score=r.critic_score, ending=r.ending, snapshot=r.snapshot,
            created_sim=r.created_sim or 0, info=r.info or {},
        ))
        if parent is not None:
            nodes[parent].children.append(local)
    return Tree(task=task, nodes=nodes, simulations_done=simulations_done)


def tree_row(tree_id: int, tree: Tree, simulations: int, best: float | None) -> TreeRow:
    """The trees row of `tree`: done once it ran `simulations`; `best` rollout reward."""
    return TreeRow(
        tree_id=tree_id, task_id=tree.task.id,
        status="done" if tree.simulations_done >= simulations else "running",
        simulations_done=tree.simulations_done, best_reward=best)


@dataclass
class Finished:
    """The rows one commit of finished simulations writes."""

    nodes: list[NodeRow]  # nodes the simulations added
    visits: list[NodeVisits]  # new statistics of the older nodes along their paths
    trajectories: list[TrajectoryRow]  # their rollouts
    trees: list[TreeRow]  # their trees' counters


def finished_rows(finished: list[tuple[Tree, SimulationResult]], tree_ids: dict[str, int],
                  simulations: int, best: dict[str, float]) -> Finished:
    """The rows of `finished`, read from the in-memory trees (the truth); `best` (task id ->
    best rollout reward so far) takes in the finished rollouts' rewards."""
    new: dict[int, tuple[int, Node]] = {}
    touched: dict[int, Node] = {}
    trajectories, trees = [], {}
    for tree, result in finished:
        tid = tree_ids[tree.task.id]
        trees[tid] = tree
        for i in result.new_nodes:
            new[make_node_id(tid, i)] = (tid, tree.nodes[i])
        for i in result.path:
            touched[make_node_id(tid, i)] = tree.nodes[i]
        traj = result.trajectory
        trajectories.append(TrajectoryRow(
            traj_id=rollout_traj_id(tid, result.simulation), task_id=tree.task.id,
            tree_id=tid, source="mcts_rollout", simulation=result.simulation,
            steps=[step_to_dict(s) for s in traj.steps], reward=traj.reward,
            success=traj.success, achieved=traj.achieved,
        ))
        best[tree.task.id] = max(best.get(tree.task.id, float("-inf")), traj.reward)
    return Finished(
        nodes=[node_row(tid, n) for tid, n in new.values()],
        visits=[NodeVisits(nid, n.visits, n.value_sum, n.realized_sum)
                for nid, n in touched.items() if nid not in new],
        trajectories=trajectories,
        trees=[tree_row(tid, t, simulations, best.get(t.task.id)) for tid, t in trees.items()])


def resume_trees(todo: list[Task], stored: Mapping[str, TreeRow],
                 rows: Mapping[str, list[NodeRow]], env: Env
                 ) -> tuple[list[Tree], list[Tree], dict[str, float]]:
    """(the trees of `todo`, which of them are new, task id -> best reward of the stored
    ones). A stored tree (`stored`, its nodes in `rows`) is rebuilt and each of its snapshots
    restored once, so a snapshot the env cannot take fails here, before the model loads; a
    new tree's root snapshot checks the env's state round trip."""
    trees, fresh, best = [], [], {}
    for task in todo:
        if task.id in stored:
            row = stored[task.id]
            tree = tree_from_rows(task, rows[task.id], row.simulations_done)
            for node in tree.nodes:
                env.restore(node.snapshot)
            best[task.id] = row.best_reward if row.best_reward is not None else 0.0
        else:
            tree = Tree.new(task, env)
            fresh.append(tree)
        trees.append(tree)
    return trees, fresh, best


def search_summary(task_ids: list[str], solved: set[str], greedy: set[str]) -> dict:
    """Of `task_ids`: how many search solved at least once (`solved`), next to how many the
    greedy base policy solved (`greedy`)."""
    wanted = set(task_ids)
    solved, greedy = solved & wanted, greedy & wanted
    return {"tasks_solved_by_search": len(solved), "tasks_solved_greedy": len(greedy),
            "search_success_rate": round(len(solved) / max(len(wanted), 1), 3),
            "greedy_success_rate": round(len(greedy) / max(len(wanted), 1), 3)}
