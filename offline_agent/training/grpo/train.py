"""The online GRPO loop: sample groups with the adapter being trained, update it, repeat.

Rollouts run on the weights just updated. On the hf backend the policy is the training
model itself (HFPolicy wraps the PEFT model as it is, no reload); its prefix cache is cleared
after each update, since the KV it holds was computed by the old weights. On vLLM (GPU) the
adapter is saved after each update and served under a new LoRA id (`HFSync`, `VLLMSync`). Which tasks and seeds step s samples is a function of (seed, s) alone
(`step_tasks`, rollouts.member_seeds), so a run resumed from the checkpoint of step s
samples the same next rollouts as the uninterrupted run, and with the restored adapter,
optimizer and RNG computes the same next loss.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import torch
from tqdm.auto import tqdm

from offline_agent.envs.base import Env
from offline_agent.types import Task

from .. import checkpoint
from ..trainer import data_order
from .config import GRPOConfig
from .objective import tied_groups
from .rollouts import Rollout, member_seeds, sample_groups
from .update import make_batch, rewards, turn_advantages, update


def after_step(step: int) -> None:
    """Called right after GRPO step `step` (and its checkpoint, if one was due). A no-op;
    crash tests replace it to SIGKILL a real run at a known step."""


class HFSync:
    """Before a step's rollouts: forget the KV the previous weights computed."""

    def __init__(self, policy):
        self.policy = policy

    def __call__(self, model, step: int) -> None:
        self.policy.clear_cache()


class VLLMSync:
    """Before a step's rollouts: save the adapter and have vLLM serve it under a new id
    (folder/serving/step-<n>; only the newest is kept)."""

    def __init__(self, policy, folder: Path):
        self.policy, self.folder = policy, Path(folder) / "serving"

    def __call__(self, model, step: int) -> None:
        target = self.folder / f"step-{step}"
        checkpoint.write_atomic(target, model.save_pretrained)
        self.policy.use_adapter(str(target))
        for old in self.folder.glob("step-*"):
            if old != target:
                shutil.rmtree(old, ignore_errors=True)


def step_tasks(tasks: list[Task], cfg: GRPOConfig, seed: int, step: int) -> list[Task]:
    """The tasks of step `step`: consecutive slices of seeded permutations of the train
    tasks (every task once per pass)."""
    passes = math.ceil(cfg.steps * cfg.tasks_per_step / len(tasks)) + 1
    order = data_order(len(tasks), passes, seed)
    return [tasks[i] for i in order[step * cfg.tasks_per_step:(step + 1) * cfg.tasks_per_step]]


def collect(policy, make_env: Callable[[], Env], tasks: list[Task], cfg: GRPOConfig, seed: int,
            step: int, batch_size: int, grammars=None) -> tuple[list[Rollout], dict]:
    """The step's groups; a group whose rewards all tie is sampled again with new seeds, up
    to max_resample times, then dropped (DAPO dynamic sampling). Returns the kept rollouts
    (groups renumbered) and counts."""
    began, kept, counts = time.perf_counter(), [], {"tied_groups": 0, "resampled_groups": 0}
    pending, all_rollouts = list(range(len(tasks))), []
    for attempt in range(cfg.max_resample + 1):
        seeds = [member_seeds(seed, step, attempt, cfg.group_size) for _ in pending]
        rollouts = sample_groups(policy, make_env, [tasks[g] for g in pending], cfg.group_size,
                                 cfg.temperature, seeds, batch_size, grammars)
        all_rollouts += rollouts
        reward = rewards(rollouts, cfg)
        tied = tied_groups(reward, torch.tensor([r.group for r in rollouts])).tolist()
        counts["tied_groups"] += sum(tied) if attempt == 0 else 0
        kept += [(pending[r.group], r) for r in rollouts if not tied[r.group]]
        pending = [g for g, t in zip(pending, tied) if t]
        if not pending or attempt == cfg.max_resample:
            break
        counts["resampled_groups"] += len(pending)
    counts["dropped_groups"] = len(pending)
    renumber = {g: i for i, g in enumerate(sorted({g for g, _ in kept}))}
    for g, r in kept:
        r.group = renumber[g]
    sampled = sum(len(t.action) for r in all_rollouts for t in r.turns)
    trajs = [r.trajectory for r in all_rollouts[:len(tasks) * cfg.group_size]]
    counts.update(reward_mean=sum(t.reward for t in trajs) / len(trajs),
                  success=sum(t.success for t in trajs) / len(trajs),
                  rollouts=len(all_rollouts),
                  rollout_tokens_per_s=sampled / max(time.perf_counter() - began, 1e-9))
    return [r for _, r in kept], counts


def train_grpo(model, policy, make_env: Callable[[], Env], tasks: list[Task], cfg: GRPOConfig,
               folder: Path, *, seed: int, batch_size: int, pack_tokens: int, max_tokens: int,
               sync=None, resume: str | None = None, grammars=None,
               on_metrics: Callable[[int, dict], None] = lambda s, m: None,
               on_checkpoint: Callable[[int, Path], None] = lambda s, f: None) -> dict:
    """cfg.steps GRPO steps on `tasks` with `model` (a trainable PEFT model) sampled through
    `policy`, which `sync(model, step)` brings up to date before each step's rollouts
    (default HFSync: `policy` is an HFPolicy on that same model); the final adapter goes to
    folder/final. `grammars`: the decoder's GrammarMasks where it decodes constrained
    (HFPolicy.grammars), which rebuild each action's masks for the ratio. A progress bar on
    stderr shows the step of cfg.steps, the rollouts' mean reward and the loss, elapsed and
    remaining, as the train stage's does."""
    sync = sync or HFSync(policy)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    start = 0
    if resume:
        start, _ = checkpoint.load(Path(resume), model, optimizer, scheduler)
    metrics: dict = {}
    bar = tqdm(total=cfg.steps, initial=start, desc="grpo", unit="step")
    for step in range(start, cfg.steps):
        model.eval()
        sync(model, step)
        rollouts, metrics = collect(policy, make_env, step_tasks(tasks, cfg, seed, step), cfg,
                                    seed, step, batch_size, grammars)
        model.train()
        if rollouts:
            batch = make_batch(rollouts, turn_advantages(rollouts, rewards(rollouts, cfg), cfg))
            if batch.seqs:
                metrics.update(update(model, optimizer, batch, cfg, pack_tokens, max_tokens))
                scheduler.step()
        bar.update(1)
        bar.set_postfix(_shown(metrics))
        on_metrics(step + 1, metrics)
        if (step + 1) % cfg.save_every == 0 and step + 1 < cfg.steps:
            previous = sorted(folder.glob("step-*"))
            saved = checkpoint.save(folder / f"step-{step + 1}", model, optimizer, scheduler,
                                    step + 1, [])
            on_checkpoint(step + 1, saved)
            for old in previous:
                if old != saved:
                    shutil.rmtree(old, ignore_errors=True)
        after_step(step + 1)
    bar.close()
    model.eval()
    checkpoint.write_atomic(folder / "final", model.save_pretrained)
    return {**metrics, "step": cfg.steps}


def _shown(metrics: dict) -> dict[str, str]:
    """A step's figures on the progress bar: the rollouts' mean reward, and the loss where the
    step updated (a step whose groups all tied has none)."""
    shown = {"reward": f"{metrics['reward_mean']:.3f}"}
    if "loss" in metrics:
        shown["loss"] = f"{metrics['loss']:.4f}"
    return shown


def fit_grpo(model_id: str, init: str | None, make_env: Callable[[], Env], tasks: list[Task],
             cfg: GRPOConfig, train_cfg, folder: Path, *, seed: int, max_batch: int,
             backend: str = "hf", base_adapter: str | None = None, constrain: str = "none",
             resume: str | None = None, on_metrics=lambda s, m: None,
             on_checkpoint=lambda s, f: None) -> dict:
    """Build the model (the base, `base_adapter` merged in; then the adapter folder `init`
    trainable, or a fresh LoRA when None), its rollout policy on `backend` (hf: the model
    itself; vllm: the base on vLLM, serving the adapter; `constrain` as model.constrain, hf
    only), and run train_grpo."""
    from offline_agent.policy.adapters import import_peft

    from ..model import add_lora, load_base

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if cfg.dtype != "auto":  # grpo.dtype: its own, where rollouts call for another than DPO's
        train_cfg = replace(train_cfg, dtype=cfg.dtype)
    model, tokenizer = load_base(model_id, train_cfg, device, base_adapter)
    if init is None:
        model = add_lora(model, train_cfg)
    else:
        model = import_peft().PeftModel.from_pretrained(model, init, is_trainable=True)
    policy, sync = rollout_policy(model, tokenizer, model_id, backend, Path(folder), seed,
                                  max_batch, base_adapter, constrain)
    env = make_env()
    return train_grpo(model, policy, make_env, tasks, cfg, Path(folder), seed=seed,
                      batch_size=max_batch, pack_tokens=train_cfg.pack_tokens,
                      max_tokens=env.max_action_tokens * env.max_steps, sync=sync,
                      resume=resume, grammars=policy.grammars if backend == "hf" else None,
                      on_metrics=on_metrics,
                      on_checkpoint=on_checkpoint)


def rollout_policy(model, tokenizer, model_id: str, backend: str, folder: Path, seed: int,
                   max_batch: int, base_adapter: str | None, constrain: str = "none"):
    """(policy, sync) the rollouts sample through."""
    if backend == "hf":
        from offline_agent.policy.hf import HFPolicy

        policy = HFPolicy(model, tokenizer, max_batch=max_batch, seed=seed, constrain=constrain)
        return policy, HFSync(policy)
    if constrain != "none":
        raise ValueError("grpo with model.constrain=tools runs on the hf backend: its ratio "
                         "replays the hf decoder's masks, and vLLM's structured outputs mask "
                         "without its closing steer (docs/training.md)")
    if base_adapter:
        raise ValueError("grpo on vLLM serves the base model.id and the adapter trained; merge "
                         "model.adapter into a full model first (train.merge) and use that")
    from offline_agent.policy.vllm import VLLMPolicy

    first = folder / "serving" / "initial"
    checkpoint.write_atomic(first, model.save_pretrained)  # enables LoRA at the adapter's rank
    policy = VLLMPolicy(model_id, max_batch=max_batch, adapter=str(first), seed=seed,
                        gpu_memory_utilization=0.5)
    return policy, VLLMSync(policy, folder)
