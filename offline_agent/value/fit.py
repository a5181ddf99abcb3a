"""Fit the value model on stored trees: encode every family (targets.py), hold out whole
tasks, minimise the visit-weighted squared error, stop on the held-out loss, keep the best.

With critic.lora_r = 0 the base is frozen, so each action's features (the hidden state the
head reads, value_model.py) are computed once, in packed no-grad forwards, and the head is fitted
on them full-batch: the epochs cost microseconds. With LoRA every epoch runs packed forwards
and backwards, one optimizer step per pack of critic.pack_tokens tokens, trees in a seeded
order. Seeded throughout: the same trees and config give the same critic.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from offline_agent.mining.build import StoredNode, path_steps
from offline_agent.training.logprobs import Encoded, groups
from offline_agent.types import Message, Task
from offline_agent.value.config import CriticConfig
from offline_agent.value.targets import Target, families, split_tasks
from offline_agent.value.value_model import (
    ValueModel,
    encode_actions,
    pack_values,
    state_prompt,
    values_of,
)


class TreeNode(StoredNode, Protocol):
    """A stored node as the fit reads it (a storage NodeRow): targets.StoredChild's fields and
    the texts of mining.build.StoredNode."""

    node_id: int
    visits: int
    realized_sum: float


@dataclass
class Item:
    """One expanded node: its prompt + each child's action, and the children's targets."""

    task_id: str
    seqs: list[list[int]]
    targets: list[Target]
    base_features: torch.Tensor | None = None  # the frozen base's, once computed (lora_r 0)


@dataclass
class Fitted:
    model: ValueModel
    metrics: dict
    val_tasks: list[str]


def encode_tree(tokenizer, system: str, demo: list[Message], task: Task,
                nodes: Sequence[TreeNode], endings: Mapping[int, Sequence[tuple[str, float]]] | None,
                state: str) -> list[Item]:
    """Every family of one tree (with the `endings` value/endings.py read at its states) as
    an Item, each state read as `state` says (value_model.state_prompt)."""
    by_id: Mapping[int, TreeNode] = {n.node_id: n for n in nodes}
    items = []
    for fam in families(nodes, endings):
        first, steps = path_steps(by_id, fam.parent_id)
        prompt = state_prompt(state, system, demo, task.instruction, first, steps)
        actions = [t.action if t.node_id is None else by_id[t.node_id].action or ""
                   for t in fam.children]
        items.append(Item(task.id, encode_actions(tokenizer, prompt, actions), fam.children))
    return items


def packs(items: list[Item], budget: int) -> list[list[Item]]:
    """Consecutive items in tries of at most `budget` tokens (an item bigger goes alone)."""
    cut = groups([[Encoded(ids, []) for ids in item.seqs] for item in items], budget)
    return [[items[i] for i in group] for group in cut]


def predict(model: ValueModel, items: list[Item], budget: int) -> dict[int, float]:
    """node id -> V of every target of `items` that is a node (endings are not; no grad).
    Items with no node (a state with ending targets only) are not run; where the fit kept the
    frozen base's features (lora_r 0), only the head runs on them."""
    items = [i for i in items if any(t.node_id is not None for t in i.targets)]
    todo = [i for i in items if i.base_features is None]
    fresh = iter(values_of(model, [i.seqs for i in todo], budget))
    with torch.no_grad():
        values = [next(fresh) if i.base_features is None else
                  model.head(i.base_features).squeeze(-1).tolist() for i in items]
    return {t.node_id: v for item, vs in zip(items, values) for t, v in zip(item.targets, vs)
            if t.node_id is not None}


def _arrays(items: list[Item]) -> tuple[torch.Tensor, torch.Tensor]:
    """(targets, weights) of `items`' children, in order, float32."""
    flat = [t for item in items for t in item.targets]
    return (torch.tensor([t.value for t in flat], dtype=torch.float32),
            torch.tensor([t.weight for t in flat], dtype=torch.float32))


def loss_of(values: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Visit-weighted mean squared error (targets.weighted_mse, in torch)."""
    weights = weights.to(values.device)
    return (weights * (values - targets.to(values.device)) ** 2).sum() / weights.sum()


def fit(model: ValueModel, items: list[Item], cfg: CriticConfig) -> Fitted:
    """Train `model` (value_model.build) on `items`, validating on the held-out tasks'."""
    train_ids, val_ids = split_tasks([i.task_id for i in items], cfg.holdout, cfg.seed)
    train = [i for i in items if i.task_id in set(train_ids)]
    val = [i for i in items if i.task_id in set(val_ids)]
    with torch.no_grad():  # start at the weighted mean return
        model.head.bias.fill_(weighted_mean(train))
    step = _head_epoch(model, train, cfg) if not cfg.lora_r else _lora_epoch(model, train, cfg)
    metrics = _early_stopped(model, step, val, cfg)
    metrics.update(train_tasks=len(train_ids), val_tasks=len(val_ids),
                   train_targets=sum(len(i.targets) for i in train), val_targets=sum(len(i.targets) for i in val),
                   train_families=len(train), val_families=len(val))
    return Fitted(model, metrics, val_ids)


def weighted_mean(items: list[Item]) -> float:
    y, w = _arrays(items)
    return float((y * w).sum() / w.sum()) if len(y) else 0.0


def _early_stopped(model: ValueModel, step, val: list[Item], cfg: CriticConfig) -> dict:
    """Run `step()` (one epoch; returns its training loss) until the held-out loss has not
    improved for cfg.patience epochs; the best epoch's weights are restored."""
    params = {k: p for k, p in model.named_parameters() if p.requires_grad}
    evaluate = _val_loss(model, val, cfg)
    best, best_epoch, best_state, train_loss = evaluate(), 0, _copy(params), None
    first = best
    for epoch in range(1, cfg.epochs + 1):
        train_loss = step()
        loss = evaluate()
        if loss is None or loss < best - 1e-9:
            best, best_epoch, best_state = loss, epoch, _copy(params)
        elif epoch - best_epoch >= cfg.patience:
            break
    with torch.no_grad():
        for k, p in params.items():
            p.copy_(best_state[k])
    return {"epochs": epoch, "best_epoch": best_epoch, "train_loss": _round(train_loss),
            "val_loss": _round(best), "val_loss_at_start": _round(first)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 5)


def _copy(params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: p.detach().clone() for k, p in params.items()}


def _val_loss(model: ValueModel, val: list[Item], cfg: CriticConfig):
    """A function -> the held-out loss now (None without held-out targets). Frozen base: the
    features are computed once and only the head runs."""
    if not val:
        return lambda: None
    y, w = _arrays(val)
    feats = None if cfg.lora_r else _features(model, val, cfg.pack_tokens)

    @torch.no_grad()
    def evaluate() -> float:
        if feats is not None:
            return float(loss_of(model.head(feats).squeeze(-1), y, w))
        values = values_of(model, [item.seqs for item in val], cfg.pack_tokens)
        return float(loss_of(torch.tensor([v for vs in values for v in vs]), y, w))
    return evaluate


def _features(model: ValueModel, items: list[Item], budget: int) -> torch.Tensor:
    """The frozen base's features of `items`' actions, each item's computed once (kept on the
    item, so refits on the same items, e.g. cross-validation folds, reuse them)."""
    todo = [i for i in items if i.base_features is None]
    with torch.no_grad():
        for pack in packs(todo, budget):
            feats = model.features(pack_values([s for i in pack for s in i.seqs]))
            for item, f in zip(pack, feats.split([len(i.seqs) for i in pack])):
                item.base_features = f
    return torch.cat([i.base_features for i in items])


def _optimizer(model: ValueModel, cfg: CriticConfig) -> torch.optim.Optimizer:
    params = [p for p in model.parameters() if p.requires_grad]
    return torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)


def _head_epoch(model: ValueModel, train: list[Item], cfg: CriticConfig):
    """One full-batch step of the head on the frozen base's features, as an epoch."""
    feats, (y, w) = _features(model, train, cfg.pack_tokens), _arrays(train)
    opt = _optimizer(model, cfg)

    def step() -> float:
        opt.zero_grad()
        loss = loss_of(model.head(feats).squeeze(-1), y, w)
        loss.backward()
        opt.step()
        return float(loss.detach())
    return step


def _lora_epoch(model: ValueModel, train: list[Item], cfg: CriticConfig):
    """One pass over the training trees in a seeded order, one optimizer step per pack."""
    opt, g = _optimizer(model, cfg), torch.Generator().manual_seed(cfg.seed)
    tasks = sorted({i.task_id for i in train})

    def step() -> float:
        order = [tasks[j] for j in torch.randperm(len(tasks), generator=g).tolist()]
        shuffled = [i for t in order for i in train if i.task_id == t]
        total, weight = 0.0, 0.0
        for pack in packs(shuffled, cfg.pack_tokens):
            y, w = _arrays(pack)
            opt.zero_grad()
            loss = loss_of(model(pack_values([s for i in pack for s in i.seqs])), y, w)
            loss.backward()
            opt.step()
            total, weight = total + float(loss.detach()) * float(w.sum()), weight + float(w.sum())
        return total / max(weight, 1e-12)
    return step
