"""Stage `baseline`: the base policy's greedy episodes on this shard's train tasks.

It is the number search must beat (tasks solved greedily vs. tasks search solves at
least once), and its failures are material for outcome pairs and hindsight later. Each
episode is committed as it ends, so a crash or a merged set of shards redoes nothing.
"""

from __future__ import annotations

from offline_agent.evaluation import Episode, rates
from offline_agent.types import Task, Trajectory, step_from_dict, step_to_dict
from pipelines.config import make_env
from pipelines.runner import StageContext
from storage import TrajectoryRow, greedy_traj_id


def run_baseline(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    i, n = cfg.search.shard_index
    tasks = store.tasks("train")[i::n]
    index = store.task_index()
    have = store.trajectory_tasks("greedy")
    todo = [t for t in tasks if t.id not in have]
    if todo:
        from offline_agent.policy import load_policy
        from offline_agent.rollout import run_episodes

        policy = load_policy(**vars(cfg.model), seed=cfg.run.seed)
        done = len(tasks) - len(todo)

        def on_done(t: Trajectory) -> None:
            nonlocal done
            store.insert_trajectories([TrajectoryRow(
                traj_id=greedy_traj_id(index[t.task_id]),
                task_id=t.task_id, source="greedy",
                steps=[step_to_dict(s) for s in t.steps], reward=t.reward,
                success=t.success, achieved=t.achieved,
            )], ctx.stage)
            done += 1
            ctx.progress.update(episodes_done=done, episodes=len(tasks))

        run_episodes(policy, lambda: make_env(cfg), todo, temperature=0.0, seed=cfg.run.seed,
                     batch_size=cfg.model.max_batch, on_done=on_done)
    wanted = {t.id: t for t in tasks}
    stored = [stored_trajectory(r, wanted[r.task_id]) for r in store.trajectories("greedy")
              if r.task_id in wanted]
    episodes = [Episode.from_trajectory(t) for t in stored]
    stats = {f"greedy_{k}": v for k, v in rates(episodes).items()}
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def stored_trajectory(row: TrajectoryRow, task: Task) -> Trajectory:
    """A stored episode as a Trajectory, for `rates` (which reads steps and reward; the
    first observation is not stored)."""
    return Trajectory(task_id=task.id, env=task.env, instruction=task.instruction,
                      first_observation="", steps=[step_from_dict(s) for s in row.steps],
                      reward=row.reward, achieved=row.achieved)
