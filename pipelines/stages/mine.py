"""Stage `mine`: the stored trees and episodes -> preference pairs and SFT examples.

The stage reads what round k mines from the store and hands it to one library call,
offline_agent.mining.mine.mine: the step pairs mined and balanced in one SQL pass over every
node (storage/step_pairs.py) with the nodes of their trees, and the stored episodes (search
rollouts and greedy baseline) of the train tasks. Its pairs and examples land in one
transaction with the stage's done mark; `--force` after a change of `mine.*` re-mines from
the stored trees without searching again.

With search.critic learned, Q_critic of eq. 10 is the learned critic's value of each child,
which the round's critic stage (critic@k) predicted for every node it fitted on
(pipelines/stages/critic.py; loaded by pipelines/artifacts.py), in place of the stored frozen
scores.

Round k's mine stage reads only round k's trees and episodes: round 1's search and the
greedy baseline, round k >= 2 its own search@k (pipelines/rounds.py); its pair and
example ids start at (k - 1) * IDS_PER_ROUND.
"""

from __future__ import annotations

from offline_agent.mining.advice import NO_STEP_PAIRS, no_step_pairs_why
from offline_agent.mining.mine import MineInputs, mine
from offline_agent.mining.pairs import step_params
from pipelines.artifacts import learned_values
from pipelines.config import RunConfig, make_env
from pipelines.rounds import round_name
from pipelines.runner import StageContext
from storage import IDS_PER_ROUND, Store, select_step_pairs, sibling_gaps


def sources(r: int) -> list[tuple[str, str]]:
    """(source, stage) of the stored episodes round r mines."""
    search = [("mcts_rollout", round_name("search", r))]
    return search + [("greedy", "baseline")] if r == 1 else search


def mine_inputs(store: Store, cfg: RunConfig, r: int,
                critic: dict[int, float] | None = None) -> MineInputs:
    """What round r mines, read from the store; `critic`: the learned critic's values."""
    search = round_name("search", r)
    tasks = {t.id: t for t in store.tasks("train")}
    kept, counts = select_step_pairs(store, step_params(cfg.mine), stage=search, critic=critic)
    trees = {t.task_id: t.tree_id for t in store.trees(search)}
    nodes = {n.node_id: n for n in store.tree_edges(sorted({trees[p.task_id] for p in kept}))}
    trajs = [t for src, stage in sources(r)
             for t in store.trajectories(src, stage) if t.task_id in tasks]
    return MineInputs(tasks=tasks, step_pairs=kept, step_counts=counts, nodes=nodes,
                      trajectories=trajs, first_id=(r - 1) * IDS_PER_ROUND)


def run_mine(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    learned = (learned_values(store, ctx.run_dir, ctx.round)
               if cfg.search.critic == "learned" else None)
    mined = mine(mine_inputs(store, cfg, ctx.round, learned), cfg.mine, lambda: make_env(cfg),
                 ctx.progress.update)
    if learned is not None:
        mined.stats["q_critic"] = f"learned ({len(learned)} nodes)"
    if not mined.stats["step_pairs"]:
        gaps = sibling_gaps(store, step_params(cfg.mine), round_name("search", ctx.round), learned)
        mined.stats[NO_STEP_PAIRS] = no_step_pairs_why(gaps, cfg.mine)
        print(f"{ctx.stage}: no step pairs: {mined.stats[NO_STEP_PAIRS]}", flush=True)
    with store.transaction():
        store.insert_pairs(mined.pairs, ctx.stage)
        store.insert_examples(mined.examples, ctx.stage)
        ctx.mark_done(mined.stats)
    return mined.stats
