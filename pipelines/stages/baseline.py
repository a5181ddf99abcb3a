"""Stage `baseline`: the base policy's greedy episodes on this shard's train tasks.

It is the number search must beat (tasks solved greedily vs. tasks search solves at
least once), and its failures are material for outcome pairs and hindsight later. Each
episode is committed as it ends, so a crash or a merged set of shards redoes nothing.
"""

from __future__ import annotations

from offline_agent.types import Trajectory, step_to_dict
from pipelines.runner import StageContext
from pipelines.stages.search import TRAJS_PER_TREE

GREEDY_SLOT = TRAJS_PER_TREE - 1  # trajectory id offset of a task's greedy episode


def run_baseline(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    i, n = cfg.search.shard_index
    tasks = store.tasks("train")[i::n]
    index = store.task_index()
    have = store.trajectory_tasks("greedy")
    todo = [t for t in tasks if t.id not in have]
    if todo:
        from offline_agent.envs.base import load_env
        from offline_agent.policy import load_policy
        from offline_agent.rollout import run_episodes

        policy = load_policy(**vars(cfg.model), seed=cfg.run.seed)
        done = len(tasks) - len(todo)

        def on_done(t: Trajectory) -> None:
            nonlocal done
            store.insert_trajectories([{
                "traj_id": index[t.task_id] * TRAJS_PER_TREE + GREEDY_SLOT,
                "task_id": t.task_id, "source": "greedy",
                "steps": [step_to_dict(s) for s in t.steps], "reward": t.reward,
                "success": t.success, "achieved": t.achieved,
            }], ctx.stage)
            done += 1
            ctx.progress.update(episodes_done=done, episodes=len(tasks))

        run_episodes(policy, lambda: load_env(cfg.env.name, seed=cfg.run.seed, **cfg.env.kwargs),
                     todo, temperature=0.0, seed=cfg.run.seed, batch_size=cfg.model.max_batch,
                     on_done=on_done)
    wanted = {t.id for t in tasks}
    rows = [r for r in store.trajectories("greedy") if r["task_id"] in wanted]
    steps = [s for r in rows for s in r["steps"]]
    stats = {
        "greedy_episodes": len(rows),
        "greedy_success_rate": round(sum(r["success"] for r in rows) / max(len(rows), 1), 4),
        "greedy_mean_reward": round(sum(r["reward"] for r in rows) / max(len(rows), 1), 4),
        "greedy_invalid_rate": round(sum(s["invalid"] for s in steps) / max(len(steps), 1), 4),
    }
    with store.transaction():
        ctx.finish(stats)
    return stats
