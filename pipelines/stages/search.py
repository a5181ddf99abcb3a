"""Stage `search`: Agent Q MCTS over this shard's train tasks; trees land in the store.

Every tick of the batched driver commits the simulations that finished in it, their new
nodes, the visit/value updates along their paths, their rollout trajectories and the
trees' counters, in one transaction. A crash loses only simulations in flight; on
re-run each tree is rebuilt from its stored nodes (env snapshots included: JSON data, which
restoring can never turn into code) and continues from its stored simulation count; a tree
marked done is never searched again.
"""

from __future__ import annotations

from offline_agent.envs.base import Env
from offline_agent.search.mcts import Node, SimulationResult, Tree
from offline_agent.types import Task, ToolCall, step_to_dict
from pipelines.config import make_env
from pipelines.runner import StageContext
from pipelines.stages.rounds import make_iterate, round_model
from storage import (
    TREES_PER_ROUND,
    NodeRow,
    NodeVisits,
    Store,
    TrajectoryRow,
    TreeRow,
    make_node_id,
    rollout_traj_id,
    split_node_id,
)


def after_commit(commits: int) -> None:
    """Called right after each TreeWriter commit with the number of commits so far. A no-op;
    crash tests replace it (tests/kill_after_commit.py) to kill a real run at a known point
    instead of racing a clock."""


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
            value_sum=r.value_sum, critic_rank=r.critic_rank,
            critic_score=r.critic_score, ending=r.ending, snapshot=r.snapshot,
            created_sim=r.created_sim or 0, info=r.info or {},
        ))
        if parent is not None:
            nodes[parent].children.append(local)
    return Tree(task=task, nodes=nodes, simulations_done=simulations_done)


class TreeWriter:
    """Turns finished simulations into one transaction of bulk inserts and updates."""

    def __init__(self, store: Store, stage: str, tree_ids: dict[str, int], simulations: int):
        self.store, self.stage, self.tree_ids, self.simulations = store, stage, tree_ids, simulations
        self.best: dict[str, float] = {}
        self.commits = 0

    def create(self, trees: list[Tree]) -> None:
        """Store new trees with their root nodes."""
        with self.store.transaction():
            self.store.insert_nodes([node_row(self.tree_ids[t.task.id], t.root) for t in trees])
            self.store.upsert_trees([self._tree_row(t) for t in trees], self.stage)

    def commit(self, finished: list[tuple[Tree, SimulationResult]]) -> None:
        new: dict[int, tuple[int, Node]] = {}
        touched: dict[int, tuple[int, Node]] = {}
        trajectories, trees = [], {}
        for tree, result in finished:
            tid = self.tree_ids[tree.task.id]
            trees[tid] = tree
            for i in result.new_nodes:
                new[make_node_id(tid, i)] = (tid, tree.nodes[i])
            for i in result.path:
                touched[make_node_id(tid, i)] = (tid, tree.nodes[i])
            traj = result.trajectory
            trajectories.append(TrajectoryRow(
                traj_id=rollout_traj_id(tid, result.simulation), task_id=tree.task.id,
                tree_id=tid, source="mcts_rollout", simulation=result.simulation,
                steps=[step_to_dict(s) for s in traj.steps], reward=traj.reward,
                success=traj.success, achieved=traj.achieved,
            ))
            key = tree.task.id
            self.best[key] = max(self.best.get(key, float("-inf")), traj.reward)
        updates = [  # rows read at commit time: the in-memory tree is the truth
            NodeVisits(nid, n.visits, n.value_sum)
            for nid, (_, n) in touched.items() if nid not in new
        ]
        with self.store.transaction():
            self.store.insert_nodes([node_row(tid, n) for tid, n in new.values()])
            self.store.update_visits(updates)
            self.store.insert_trajectories(trajectories, self.stage)
            self.store.upsert_trees([self._tree_row(t) for t in trees.values()], self.stage)
        self.commits += 1
        after_commit(self.commits)

    def _tree_row(self, tree: Tree) -> TreeRow:
        return TreeRow(
            tree_id=self.tree_ids[tree.task.id], task_id=tree.task.id,
            status="done" if tree.simulations_done >= self.simulations else "running",
            simulations_done=tree.simulations_done, best_reward=self.best.get(tree.task.id))


def load_trees(store: Store, todo: list[Task], stored: dict[str, TreeRow],
               tree_ids: dict[str, int],
               env: Env, writer: TreeWriter) -> tuple[list[Tree], list[Tree]]:
    """The trees of `todo`, and which of them are new. A stored tree is rebuilt from its rows
    and each of its snapshots restored once, so a snapshot the env cannot take fails here,
    before the model loads; a new tree's root snapshot checks the env's state round trip."""
    trees, fresh = [], []
    for task in todo:
        if task.id in stored:
            row = stored[task.id]
            tree = tree_from_rows(task, store.load_tree(tree_ids[task.id]), row.simulations_done)
            for node in tree.nodes:
                env.restore(node.snapshot)
            writer.best[task.id] = row.best_reward if row.best_reward is not None else 0.0
        else:
            tree = Tree.new(task, env)
            fresh.append(tree)
        trees.append(tree)
    return trees, fresh


def run_search(ctx: StageContext) -> dict:
    from offline_agent.policy import load_policy
    from offline_agent.search.critic import Critic
    from offline_agent.search.searcher import Searcher

    cfg, store = ctx.cfg, ctx.store
    i, n = cfg.search.shard_index if ctx.round == 1 else (0, 1)
    tasks = store.tasks("train")[i::n]
    tree_ids = round_tree_ids(store.task_index(), ctx.round)
    stored = {t.task_id: t for t in store.trees(ctx.stage)}

    todo = [t for t in tasks if t.id not in stored or stored[t.id].status != "done"]
    stats: dict = {"trees": len(tasks), "trees_resumed": 0, "trees_skipped": len(tasks) - len(todo)}
    if ctx.round > 1:
        stats["iterate"] = make_iterate(ctx)  # before any tree: a resume reuses it
    if todo:
        writer = TreeWriter(store, ctx.stage, tree_ids, cfg.search.simulations)
        trees, fresh = load_trees(store, todo, stored, tree_ids, make_env(cfg), writer)
        stats["trees_resumed"] = len(trees) - len(fresh)
        model = round_model(cfg, store, ctx.run_dir, ctx.round)
        policy = load_policy(**vars(model), seed=cfg.run.seed)
        critic = Critic(policy, make_env(cfg)) if cfg.search.critic == "logprob" else None
        writer.create(fresh)

        def commit(finished):
            writer.commit(finished)
            ctx.progress.update(trees_done=sum(t.simulations_done >= cfg.search.simulations
                                               for t in trees),
                                trees=len(trees), simulations_done=sum(t.simulations_done
                                                                       for t in trees))

        searcher = Searcher(policy, lambda: make_env(cfg), cfg.search, critic)
        run_stats = searcher.run(trees, commit)
        stats.update({k: round(v, 3) for k, v in run_stats.items() if k != "tasks_solved"})
    stats.update(search_summary(store, [t.id for t in tasks], ctx.stage))
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def round_tree_ids(task_index: dict[str, int], r: int) -> dict[str, int]:
    """task_id -> the id of its tree in round r: rounds never share a tree, node or
    trajectory id."""
    if len(task_index) > TREES_PER_ROUND:
        raise ValueError(f"{len(task_index)} tasks: tree ids allow {TREES_PER_ROUND} per round")
    return {task: (r - 1) * TREES_PER_ROUND + idx for task, idx in task_index.items()}


def search_summary(store: Store, task_ids: list[str], stage: str) -> dict:
    """Tasks this search stage solved at least once, next to those the greedy base policy
    solved."""
    wanted = set(task_ids)
    solved = store.solved_tasks("mcts_rollout", stage) & wanted
    greedy = store.solved_tasks("greedy") & wanted
    return {"tasks_solved_by_search": len(solved), "tasks_solved_greedy": len(greedy),
            "search_success_rate": round(len(solved) / max(len(wanted), 1), 3),
            "greedy_success_rate": round(len(greedy) / max(len(wanted), 1), 3)}
