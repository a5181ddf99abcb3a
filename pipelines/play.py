"""Play one policy on tasks: load it (an adapter on a round's model), play its greedy
episodes and its searches at inference, then free it before the next policy loads. The eval
stage plays the test tasks greedily with it, the mcts stage with search at inference, and
train.select / grpo.select: val the validation tasks (pipelines/selection.py)."""

from __future__ import annotations

import gc

from offline_agent.evaluation import (
    MCTS_MODE,
    MODE,
    Episode,
    episode_row,
    greedy_episodes,
    summarize,
)
from offline_agent.types import Task, Trajectory
from pipelines.artifacts import load_learned_critic
from pipelines.config import make_env
from pipelines.runner import StageContext


def play(ctx: StageContext, model, adapter: str | None, todo: dict[str, list[Task]],
         on_done) -> dict:
    """Load one policy (`adapter` on `model`), play its tasks in each mode, free it before the
    next policy loads. Returns the totals of its searches at inference (if any ran)."""
    from offline_agent.policy import load_policy

    cfg = ctx.cfg
    policy = load_policy(**{**vars(model), "adapter": adapter or model.adapter},
                         seed=cfg.run.seed)
    try:
        greedy_episodes(policy, lambda: make_env(cfg), todo.get(MODE, []),
                        batch_size=cfg.model.max_batch, on_done=lambda t: on_done(t, MODE))
        return _search(ctx, policy, todo.get(MCTS_MODE, []), lambda t: on_done(t, MCTS_MODE))
    finally:
        del policy
        gc.collect()


def play_stored(ctx: StageContext, name: str, model, adapter: str | None, mode: str,
                tasks: list[Task], count: dict[str, int]) -> dict:
    """Play policy `name` on `tasks` in `mode`, each episode committed as it ends (so a
    resumed stage plays only the tasks it lacks) and counted in count["done"] of
    count["all"], which `offline-agent status` shows from before the first episode on.
    Returns play()'s search totals."""
    ctx.progress.update(policy=name, episodes_done=count["done"], episodes=count["all"])

    def on_done(t: Trajectory, played: str) -> None:
        ctx.store.insert_eval_episodes([episode_row(t, name, played)], ctx.stage)
        count["done"] += 1
        ctx.progress.update(policy=name, episodes_done=count["done"], episodes=count["all"])
    return play(ctx, model, adapter, {mode: tasks}, on_done)


def played_summary(store, eval_cfg, name: str, mode: str) -> dict:
    """A policy's stored episodes in one mode, in a stage's stats: n, success and mean reward
    with their 95% intervals (the report recomputes everything from the rows)."""
    summary = summarize([Episode.from_row(r) for r in store.eval_episodes(name, mode)], eval_cfg)
    return {k: summary[k] for k in ("n_tasks", "success_rate", "ci95", "mean_reward",
                                    "mean_reward_ci95")}


def inference_critic(ctx: StageContext, policy, env):
    """The critic search at inference values leaves with: with search.critic learned, the
    value model the stage's round's critic stage fitted on the train tasks' trees (the mcts
    stage's round is the last one, whose critic was fitted on every round's trees); else the
    frozen critic (the policy scoring its own candidates)."""
    from offline_agent.search.frozen_critic import FrozenCritic

    if ctx.cfg.search.critic != "learned":
        return FrozenCritic(policy, env)
    return load_learned_critic(ctx.cfg, ctx.store, ctx.run_dir, ctx.round)


def _search(ctx: StageContext, policy, tasks: list[Task], on_done) -> dict:
    """Search at inference on `tasks` (offline_agent/search/inference.py); {} for none."""
    from offline_agent.search.inference import inference_config, search_and_commit
    from offline_agent.search.searcher import Searcher

    if not tasks:
        return {}
    cfg = ctx.cfg
    search = inference_config(cfg.search, cfg.eval.mcts_simulations)
    critic = inference_critic(ctx, policy, make_env(cfg))
    searcher = Searcher(policy, lambda: make_env(cfg), search, critic)
    totals = search_and_commit(policy, lambda: make_env(cfg), tasks, searcher,
                               cfg.model.max_batch, on_done, commit=cfg.eval.mcts_commit)
    return {k: round(v, 3) for k, v in totals.items()}
