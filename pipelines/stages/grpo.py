"""Stage `grpo`: online GRPO refinement of a trained policy (off unless grpo.enabled).

Starts from the final adapter of grpo.init (a policy the train stage finished; base: a fresh
adapter), samples groups on the train tasks and updates the adapter online
(offline_agent/training/grpo/train.py), with a progress bar on stderr and the step of
grpo.steps in progress.json. Every step's metrics land in the metrics table (series "grpo")
and in run.report_to's trackers; a step checkpoint (adapter, optimizer, scheduler, RNG) is
recorded under "grpo" and an interrupted stage resumes from it with the same next rollouts;
the final adapter under "grpo/final", which the eval stage plays as policy "grpo". With
grpo.select: val the step checkpoints are kept and the one best on the validation tasks
becomes that final adapter (as train.select), so the step count is chosen there.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.artifacts import keep_candidate
from pipelines.config import make_env
from pipelines.errors import RunError
from pipelines.runner import StageContext
from pipelines.selection import select_checkpoint

POLICY = "grpo"


def init_adapter(ctx: StageContext) -> str | None:
    """The adapter folder GRPO starts from (None: a fresh one on the base)."""
    init = ctx.cfg.grpo.init
    if init == "base":
        return None
    final = ctx.store.checkpoint("train", "", f"{init}/final")
    if final is None:
        raise RunError(f"grpo.init={init}: the train stage has no final adapter of {init!r} "
                       f"(is it in train.policies, and did train finish?)")
    return str(ctx.run_dir / final["folder"])


def run_grpo(ctx: StageContext) -> dict:
    cfg, store = ctx.cfg, ctx.store
    if not cfg.grpo.enabled:
        stats = {"skipped": "grpo.enabled is false"}
    else:
        stats = store.checkpoint(ctx.stage, ctx.shard, f"{POLICY}/final") or _train(ctx)
        if cfg.grpo.select == "val" and "selected" not in stats:
            stats = select_checkpoint(ctx, POLICY, stats)
    with store.transaction():
        ctx.mark_done(stats)
    return stats


def _train(ctx: StageContext) -> dict:
    from offline_agent.training.grpo.train import fit_grpo

    cfg, store = ctx.cfg, ctx.store
    folder = ctx.checkpoint_dir / POLICY
    saved = store.checkpoint(ctx.stage, ctx.shard, POLICY)
    ctx.progress.update(policy=POLICY, steps=cfg.grpo.steps)

    def on_metrics(step: int, metrics: dict) -> None:
        ctx.log_metrics(POLICY, step, metrics)
        ctx.progress.update(policy=POLICY, step=step, reward=round(metrics["reward_mean"], 3))

    def on_checkpoint(step: int, path: Path) -> None:
        if cfg.grpo.select == "val":  # kept before the store points past it
            keep_candidate(folder, step, path)
        store.set_checkpoint(ctx.stage, ctx.shard, POLICY,
                             {"step": step, "folder": str(path.relative_to(ctx.run_dir))})

    metrics = fit_grpo(cfg.model.id, init_adapter(ctx), lambda: make_env(cfg),
                       store.tasks("train"), cfg.grpo, cfg.train, folder, seed=cfg.run.seed,
                       max_batch=cfg.model.max_batch, backend=cfg.model.backend,
                       base_adapter=cfg.model.adapter, constrain=cfg.model.constrain,
                       resume=str(ctx.run_dir / saved["folder"]) if saved else None,
                       on_metrics=on_metrics, on_checkpoint=on_checkpoint)
    final = {"folder": str((folder / "final").relative_to(ctx.run_dir)), "step": metrics["step"],
             "reward_mean": metrics.get("reward_mean")}
    store.set_checkpoint(ctx.stage, ctx.shard, f"{POLICY}/final", final)
    return final
