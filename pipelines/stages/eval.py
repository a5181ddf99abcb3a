"""Stage `eval`: greedy episodes on the held-out test tasks, for the base model and for every
policy the train and grpo stages finished.

Trained policies are found in the store (checkpoints `train/<policy>/final` and `grpo/final`, written once
the adapter folder is complete; pipelines/artifacts.py eval_policies), so the stage needs no
list of them. Each episode is committed as it ends; a resumed stage skips the (policy, task)
rows it already has. The statistics are left to the report, which recomputes them from the
rows. Round k >= 2's stage (eval@k) plays the policies train@k finished (named `<policy>@k`),
each on top of round k's model; base is played once, by round 1's. Search at inference
(eval.mcts) is the mcts stage's, after the last round's eval.
"""

from __future__ import annotations

from offline_agent.evaluation import BASE, MODE
from pipelines.artifacts import eval_policies, round_model
from pipelines.play import play_stored, played_summary
from pipelines.runner import StageContext


def run_eval(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    tasks = store.tasks("test")
    policies = eval_policies(store, ctx.run_dir, ctx.round)
    count = {"all": len(tasks) * len(policies),
             "done": sum(len(store.eval_tasks(p, MODE)) for p in policies)}
    for name, adapter in policies.items():
        have = store.eval_tasks(name, MODE)
        todo = [t for t in tasks if t.id not in have]
        if not todo:
            continue
        print(f"eval: {name}: {len(todo)} of {len(tasks)} test tasks to play", flush=True)
        model = cfg.model if name == BASE else round_model(cfg, store, ctx.run_dir, ctx.round)
        play_stored(ctx, name, model, adapter, MODE, todo, count)
    stats = {name: played_summary(store, cfg.eval, name, MODE) for name in policies}
    with store.transaction():
        ctx.mark_done(stats)
    return stats
