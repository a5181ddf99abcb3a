"""Stage `search`: Agent Q MCTS over this shard's train tasks; trees land in the store.

Every tick of the batched driver commits the simulations that finished in it, their new
nodes, the visit/value updates along their paths, their rollout trajectories and the
trees' counters, in one transaction. A crash loses only simulations in flight; on
re-run each tree is rebuilt from its stored nodes (env snapshots included: JSON data, which
restoring can never turn into code) and continues from its stored simulation count; a tree
marked done is never searched again. The rows and the trees rebuilt from them are
offline_agent/search/persist.py's; the stage reads, writes and commits. Its stats end with
the stored critic's concordance with the trees' returns (offline_agent/search/concordance.py),
counted over every tree of the stage as stored, resumed or skipped ones included.
"""

from __future__ import annotations

from offline_agent.search.concordance import concordance
from offline_agent.search.mcts import SimulationResult, Tree
from offline_agent.search.persist import (
    finished_rows,
    node_row,
    resume_trees,
    round_tree_ids,
    search_summary,
    tree_row,
)
from pipelines.artifacts import CONCORDANCE, iterate_record, load_learned_critic, round_model
from pipelines.config import make_env
from pipelines.runner import StageContext
from storage import Store


def after_commit(commits: int) -> None:
    """Called right after each TreeWriter commit with the number of commits so far. A no-op;
    crash tests replace it (tests/kill_after_commit.py) to kill a real run at a known point
    instead of racing a clock."""


class TreeWriter:
    """Writes finished simulations (offline_agent/search/persist.py builds the rows) in one
    transaction per commit."""

    def __init__(self, store: Store, stage: str, tree_ids: dict[str, int], simulations: int,
                 best: dict[str, float]):
        self.store, self.stage, self.tree_ids, self.simulations = store, stage, tree_ids, simulations
        self.best = best  # task id -> best rollout reward so far
        self.commits = 0

    def create(self, trees: list[Tree]) -> None:
        """Store new trees with their root nodes."""
        ids = [self.tree_ids[t.task.id] for t in trees]
        with self.store.transaction():
            self.store.insert_nodes([node_row(i, t.root) for i, t in zip(ids, trees)])
            self.store.upsert_trees([tree_row(i, t, self.simulations, self.best.get(t.task.id))
                                     for i, t in zip(ids, trees)], self.stage)

    def commit(self, finished: list[tuple[Tree, SimulationResult]]) -> None:
        rows = finished_rows(finished, self.tree_ids, self.simulations, self.best)
        with self.store.transaction():
            self.store.insert_nodes(rows.nodes)
            self.store.update_visits(rows.visits)
            self.store.insert_trajectories(rows.trajectories, self.stage)
            self.store.upsert_trees(rows.trees, self.stage)
        self.commits += 1
        after_commit(self.commits)


def make_critic(ctx: StageContext, policy):
    """The critic search.critic names: FrozenCritic on the policy, round k's learned one
    (fitted by critic@(k-1) on the trees so far; round 1 has none and uses the frozen), or
    None."""
    from offline_agent.search.frozen_critic import FrozenCritic

    cfg = ctx.cfg
    if cfg.search.critic == "none":
        return None
    if cfg.search.critic == "learned" and ctx.round > 1:
        return load_learned_critic(cfg, ctx.store, ctx.run_dir, ctx.round - 1)
    return FrozenCritic(policy, make_env(cfg))


def run_search(ctx: StageContext) -> dict:
    from offline_agent.policy import load_policy
    from offline_agent.search.searcher import Searcher

    cfg, store = ctx.cfg, ctx.store
    if not cfg.search.verifier:
        raise ValueError("search.verifier is false: the search stage's trees feed mining, which "
                         "needs the env's rewards; verifier-free search is eval.mcts's")
    i, n = cfg.search.shard_index if ctx.round == 1 else (0, 1)
    tasks = store.tasks("train")[i::n]
    tree_ids = round_tree_ids(store.task_index(), ctx.round)
    stored = {t.task_id: t for t in store.trees(ctx.stage)}

    todo = [t for t in tasks if t.id not in stored or stored[t.id].status != "done"]
    stats: dict = {"trees": len(tasks), "trees_resumed": 0, "trees_skipped": len(tasks) - len(todo)}
    if ctx.round > 1:
        # round k's model, which train@(k-1) wrote (or, for a run raised to more rounds after
        # it finished, written now, before any tree: a resume reuses it)
        stats["iterate"] = iterate_record(cfg, store, ctx.run_dir, ctx.round)
    if todo:
        rows = {t.id: store.load_tree(tree_ids[t.id]) for t in todo if t.id in stored}
        trees, fresh, best = resume_trees(todo, stored, rows, make_env(cfg))
        writer = TreeWriter(store, ctx.stage, tree_ids, cfg.search.simulations, best)
        stats["trees_resumed"] = len(trees) - len(fresh)
        model = round_model(cfg, store, ctx.run_dir, ctx.round)
        policy = load_policy(**vars(model), seed=cfg.run.seed)
        critic = make_critic(ctx, policy)
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
    solved = store.solved_tasks("mcts_rollout", ctx.stage)
    stats.update(search_summary([t.id for t in tasks], solved, store.solved_tasks("greedy")))
    stats[CONCORDANCE] = concordance(store.tree_statistics(ctx.stage))  # the stored critic's
    with store.transaction():
        ctx.mark_done(stats)
    return stats

