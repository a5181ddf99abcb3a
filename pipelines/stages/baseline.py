"""Stage `baseline`: the base policy's greedy episodes on this shard's train tasks.

It is the number search must beat (tasks solved greedily vs. tasks search solves at
least once), and its failures are material for outcome pairs and hindsight later.
"""

from __future__ import annotations

from offline_agent.types import step_to_dict
from pipelines.runner import StageContext
from pipelines.stages.search import TRAJS_PER_TREE

GREEDY_SLOT = TRAJS_PER_TREE - 1  # trajectory id offset of a task's greedy episode


def run_baseline(ctx: StageContext) -> dict:
    from offline_agent.envs.base import load_env
    from offline_agent.policy import load_policy
    from offline_agent.rollout import run_episodes, summarize

    cfg, store = ctx.cfg, ctx.store
    i, n = cfg.search.shard_index
    tasks = store.tasks("train")[i::n]
    index = store.task_index()
    policy = load_policy(**vars(cfg.model), seed=cfg.run.seed)
    done = 0

    def on_done(_):
        nonlocal done
        done += 1
        ctx.progress.update(episodes_done=done, episodes=len(tasks))

    trajs = run_episodes(
        policy, lambda: load_env(cfg.env.name, seed=cfg.run.seed, **cfg.env.kwargs), tasks,
        temperature=0.0, seed=cfg.run.seed, batch_size=cfg.model.max_batch, on_done=on_done)
    rows = [{
        "traj_id": index[t.task_id] * TRAJS_PER_TREE + GREEDY_SLOT, "task_id": t.task_id,
        "source": "greedy", "steps": [step_to_dict(s) for s in t.steps], "reward": t.reward,
        "success": t.success, "achieved": t.achieved,
    } for t in trajs]
    stats = {f"greedy_{k}": round(v, 4) for k, v in summarize(trajs).items()}
    with store.transaction():
        store.insert_trajectories(rows, ctx.stage)
        ctx.finish(stats)
    return stats
