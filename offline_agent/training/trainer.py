"""The one training loop, shared by DPO and RFT (the objective says what a loss is).

Under `accelerate launch` the same loop runs in every process (distributed.py): each takes
every num_processes-th item of a step, runs its own packed forwards, and the adapter
gradients and the step's summed statistics are added across processes before the optimizer
step, so processes may run different numbers of forwards (or none) and the step's loss and
gradient are those of one process taking the whole step. Every process starts from the same
seeded adapter and applies the same summed gradient, so the adapters stay equal without
DDP; only the main process calls on_metrics / on_checkpoint and writes folders.

Checkpoints (see checkpoint.py) hold everything a resume needs to give the same next loss as
an uninterrupted run: adapter, optimizer, scheduler, data order, RNG state.
"""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from . import checkpoint
from .config import TrainConfig
from .logprobs import groups


def after_step(step: int) -> None:
    """Called right after optimizer step `step` (and its checkpoint, if one was due). A no-op;
    crash tests replace it to SIGKILL a real run at a known step (tests/test_train_stage.py)."""


def data_order(n: int, epochs: int, seed: int) -> list[int]:
    """Item indices for the whole run: one seeded permutation per epoch, concatenated."""
    g = torch.Generator().manual_seed(seed)
    return [i for _ in range(epochs) for i in torch.randperm(n, generator=g).tolist()]


def num_steps(n: int, cfg: TrainConfig) -> int:
    steps = math.ceil(n * cfg.epochs / cfg.batch_size)
    return min(steps, cfg.max_steps) if cfg.max_steps else steps


def schedule(warmup: int, total: int) -> Callable[[int], float]:
    """LR factor of step s: linear warmup over `warmup` steps, then linear decay to 0."""
    return lambda s: min(1.0, (s + 1) / (warmup + 1)) * max(0.0, (total - s) / total)


def train(model, objective, cfg: TrainConfig, folder: Path, accelerator, *,
          resume: str | None = None, on_metrics: Callable[[int, dict], None] = lambda s, m: None,
          on_checkpoint: Callable[[int, Path], None] = lambda s, f: None,
          desc: str = "train") -> dict:
    """Train `model` (a PEFT model) on `objective.items`; returns the last step's metrics and
    the number of steps done (key "step").

    Checkpoints go to folder/step-<n> (the previous one is deleted once the new one is
    recorded by on_checkpoint); the final adapter to folder/final. The main process shows a
    progress bar named `desc` on stderr (step of total, loss, elapsed and remaining), as
    search shows its simulations.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    order = data_order(len(objective.items), cfg.epochs, cfg.seed)
    total = num_steps(len(objective.items), cfg)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule(cfg.warmup_steps, total))
    start = 0
    if resume:
        start, order = checkpoint.load(Path(resume), model, optimizer, scheduler)
    model.train()
    metrics: dict = {}
    bar = tqdm(total=total, initial=start, desc=desc, unit="step",
               disable=not accelerator.is_main_process)
    for step in range(start, total):
        indices = order[step * cfg.batch_size:(step + 1) * cfg.batch_size]
        metrics = run_step(model, objective, indices, params, optimizer, scheduler, cfg,
                           accelerator)
        bar.update(1)
        bar.set_postfix(loss=f"{metrics['loss']:.4f}")
        if accelerator.is_main_process:
            on_metrics(step + 1, metrics)
        if (step + 1) % cfg.save_every == 0 and step + 1 < total:
            _save_step(folder, model, optimizer, scheduler, step + 1, order, accelerator,
                       on_checkpoint)
        after_step(step + 1)
    bar.close()
    if accelerator.is_main_process:
        checkpoint.write_atomic(folder / "final", model.save_pretrained)
    return {**metrics, "step": total}


def _save_step(folder, model, optimizer, scheduler, step, order, accelerator, on_checkpoint):
    if not accelerator.is_main_process:
        return
    previous = sorted(folder.glob("step-*"))
    saved = checkpoint.save(folder / f"step-{step}", model, optimizer, scheduler, step, order)
    on_checkpoint(step, saved)
    for old in previous:  # keep only the checkpoint the store points at
        if old != saved:
            shutil.rmtree(old, ignore_errors=True)


def run_step(model, objective, indices: list[int], params, optimizer, scheduler,
             cfg: TrainConfig, accelerator) -> dict:
    """One optimizer step over `indices`: this process's share, packed into forwards of at
    most cfg.pack_tokens tokens, gradients accumulated; returns the step's metrics."""
    began = time.perf_counter()
    mine = indices[accelerator.process_index::accelerator.num_processes]
    items = [objective.items[i] for i in mine]
    sums: dict = {}
    tokens = 0
    for group in groups(items, cfg.pack_tokens):
        group = [mine[g] for g in group]
        loss, stats = objective.group_loss(model, group, indices)
        loss.backward()
        for k, v in stats.items():
            sums[k] = sums.get(k, 0.0) + v
        tokens += sum(len(s.ids) for i in group for s in objective.items[i])
    if accelerator.num_processes > 1:
        _sum_gradients(params, accelerator)
        sums, tokens = _sum_stats(sums, tokens)
    lr = scheduler.get_last_lr()[0]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    seconds = time.perf_counter() - began
    return {**objective.metrics(sums, indices), "lr": lr, "tokens": tokens,
            "tokens_per_s": tokens / seconds, "seconds": seconds}


def _sum_gradients(params, accelerator) -> None:
    """Each adapter gradient := its sum over processes (one all-reduce of them all); a process
    that had no item this step adds zeros."""
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten()
                      for p in params])
    flat = accelerator.reduce(flat, "sum")
    for p, g in zip(params, flat.split([p.numel() for p in params])):
        p.grad = g.view_as(p)


def _sum_stats(sums: dict, tokens: int) -> tuple[dict, int]:
    """The step's summed statistics and token count over processes, added in process order
    (a process without items sent no keys)."""
    from accelerate.utils import gather_object

    shares = gather_object([(sums, tokens)])
    total: dict = {}
    for part, _ in shares:
        for k, v in part.items():
            total[k] = total.get(k, 0.0) + v
    return total, sum(n for _, n in shares)
