"""Stage `eval`: greedy episodes on the held-out test tasks, for the base model and for every
policy the train stage finished.

Trained policies are found in the store (checkpoints `train/<policy>/final`, written once
the adapter folder is complete), so the stage needs no list of them. Each episode is
committed as it ends; a resumed stage skips the (policy, mode, task) rows it already has.
The statistics are left to the report, which recomputes them from the rows.
Round k >= 2's stage (eval@k) plays the policies train@k finished (named `<policy>@k`), each
on top of round k's model; base is played once, by round 1's.
"""

from __future__ import annotations

import gc
from pathlib import Path

from offline_agent.evaluation import (
    BASE,
    MODE,
    Episode,
    episode_row,
    greedy_episodes,
    summarize,
)
from offline_agent.types import Trajectory
from pipelines.config import make_env
from pipelines.rounds import round_model, round_name
from pipelines.runner import StageContext


def eval_policies(store, run_dir: Path, r: int = 1) -> dict[str, str | None]:
    """{policy: adapter folder}: base (no adapter; round 1 only), then each policy round r
    trained, named for its round. A relative folder is relative to the run directory."""
    out: dict[str, str | None] = {BASE: None} if r == 1 else {}
    finals = store.final_checkpoints(round_name("train", r))
    if r == 1:  # GRPO refines round 1's policy (stage grpo)
        finals.update(store.final_checkpoints("grpo"))
    for name, value in finals.items():
        name = round_name(name, r)
        folder = Path(value["folder"])
        folder = folder if folder.is_absolute() else run_dir / folder
        if not (folder / "adapter_config.json").is_file():
            raise FileNotFoundError(f"policy {name!r}: the train stage recorded adapter folder "
                                    f"{folder}, which holds no adapter_config.json")
        out[name] = str(folder)
    return out


def run_eval(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    tasks = store.tasks("test")
    policies = eval_policies(store, ctx.run_dir, ctx.round)
    total = len(tasks) * len(policies)
    done = sum(len(store.eval_tasks(p, MODE)) for p in policies)
    for name, adapter in policies.items():
        have = store.eval_tasks(name, MODE)
        todo = [t for t in tasks if t.id not in have]
        if not todo:
            continue
        print(f"eval: {name}: {len(todo)} of {len(tasks)} test tasks to play", flush=True)

        def on_done(t: Trajectory, name: str = name) -> None:
            nonlocal done
            store.insert_eval_episodes([episode_row(t, name, MODE)], ctx.stage)
            done += 1
            ctx.progress.update(policy=name, episodes_done=done, episodes=total)

        model = cfg.model if name == BASE else round_model(cfg, store, ctx.run_dir, ctx.round)
        _play(ctx, model, adapter, todo, on_done)
    stats = {}
    for name in policies:
        summary = summarize([Episode.from_row(r) for r in store.eval_episodes(name, MODE)],
                            cfg.eval)
        stats[name] = {k: summary[k] for k in ("n_tasks", "success_rate", "ci95", "mean_reward")}
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def _play(ctx: StageContext, model, adapter: str | None, tasks, on_done) -> None:
    """Load one policy (`adapter` on `model`), play its tasks, free it before the next
    policy loads."""
    from offline_agent.policy import load_policy

    cfg = ctx.cfg
    policy = load_policy(**{**vars(model), "adapter": adapter or model.adapter},
                         seed=cfg.run.seed)
    try:
        greedy_episodes(policy, lambda: make_env(cfg), tasks, batch_size=cfg.model.max_batch,
                        on_done=on_done)
    finally:
        del policy
        gc.collect()
