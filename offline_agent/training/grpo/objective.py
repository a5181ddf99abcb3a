"""The pure core of GRPO (the `grpo` stage): advantages of episode groups and of
state-grouped steps, reward shaping, zero-signal groups, the clipped token loss (log-probs
under a grammar's mask are training/logprobs.py's). Tensors in, tensors out: no model, no store, no env, so a hand
computation checks each one (tests/test_grpo_core.py). docs/training.md says what is used
where; the stage that samples episodes and runs forwards is built on these.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch

from offline_agent.training.grpo.config import LOSS_TYPES, SCALES, GRPOConfig


def tied_groups(rewards: torch.Tensor, group: torch.Tensor) -> torch.Tensor:
    """(K,) bool: True for each group whose rewards all tie (a group of one ties): it carries
    no policy gradient, so the driver drops or resamples it (DAPO dynamic sampling) and counts
    `tied.sum()`. `group[i]` in 0..K-1 names reward i's group."""
    k = int(group.max()) + 1 if group.numel() else 0
    values = rewards.double()
    high = torch.zeros(k, dtype=torch.float64).scatter_reduce(0, group, values, "amax",
                                                              include_self=False)
    low = torch.zeros(k, dtype=torch.float64).scatter_reduce(0, group, values, "amin",
                                                             include_self=False)
    return high == low


def _group_stats(values: torch.Tensor, group: torch.Tensor):
    """Per element (float64): its group's mean, its group's unbiased std, whether it ties."""
    k = int(group.max()) + 1
    count = torch.zeros(k, dtype=torch.float64).index_add(0, group, torch.ones_like(values))
    mean = torch.zeros(k, dtype=torch.float64).index_add(0, group, values) / count
    centred = values - mean[group]
    var = torch.zeros(k, dtype=torch.float64).index_add(0, group, centred**2)
    std = (var / (count - 1).clamp(min=1)).sqrt()
    return mean[group], std[group], tied_groups(values, group)[group]


def _normalise(centred: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """centred / scale, exactly 0 where `zero` or scale is 0 (never NaN or inf)."""
    zero = zero | (scale <= 0)
    return torch.where(zero, 0.0, centred / torch.where(zero, 1.0, scale)).float()


def episode_advantages(rewards: torch.Tensor, group: torch.Tensor, scale: str) -> torch.Tensor:
    """(N,) float32: reward - its group's mean, over the group's unbiased std (`group`), the
    whole batch's (`batch`) or 1 (`none`, Dr. GRPO). Exactly 0 for a group that ties (which
    includes a group of one) and wherever the std is 0."""
    if scale not in SCALES:
        raise ValueError(f"scale_rewards must be one of {', '.join(SCALES)}, got {scale!r}")
    if rewards.numel() == 0:
        return torch.zeros(0)
    values = rewards.double()
    mean, std, tied = _group_stats(values, group)
    if scale == "batch":
        std = (values.std() if values.numel() > 1 else values.new_zeros(())).expand_as(values)
    elif scale == "none":
        std = torch.ones_like(values)
    return _normalise(values - mean, std, tied)


def shaped_rewards(outcome: torch.Tensor, invalid: torch.Tensor, steps: torch.Tensor,
                   cfg: GRPOConfig) -> torch.Tensor:
    """Outcome reward less two capped penalties: format_weight per invalid action (at most
    format_cap) and length_penalty per step past step_budget (at most length_cap). The caps
    sum below 1 (GRPOConfig checks), so a success (1) always outranks a failure (0)."""
    fmt = (cfg.format_weight * invalid.double()).clamp(max=cfg.format_cap)
    over = (steps.double() - cfg.step_budget).clamp(min=0)
    length = (cfg.length_penalty * over).clamp(max=cfg.length_cap)
    return (outcome.double() - fmt - length).float()


def state_hash(snapshot: dict[str, Any]) -> str:
    """sha256 of an `Env.snapshot()`'s JSON (sorted keys), without its `num_steps`: the state
    is the task and the env's state, so a state reached again after an invalid action (which
    changes nothing but the step count) is the same state, as GiGPO's anchor states are.
    Exact JSON: two pages with the same text and another cart differ."""
    data = {k: v for k, v in snapshot.items() if k != "num_steps"}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class EpisodeSteps:
    """One episode as step grouping sees it."""

    group: int             # its task group (the G episodes of one task)
    states: list[str]      # state_hash of the env before each step's action
    rewards: list[float]   # each step's reward (the outcome usually on the last step)


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """G_t = r_t + gamma * G_{t+1}, from each step to the episode's end."""
    out, running = [0.0] * len(rewards), 0.0
    for t in reversed(range(len(rewards))):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def step_advantages(episodes: list[EpisodeSteps], gamma: float) -> list[torch.Tensor]:
    """Per episode, (steps,) float32: each step's discounted return, normalised within its
    step group (the steps of one task group whose state before the action is the same): minus
    the group's mean, over its unbiased std. Exactly 0 where the step group has one member or
    its returns tie (GiGPO's step advantage, with exact states)."""
    index: dict[tuple[int, str], int] = {}
    keys, returns = [], []
    for ep in episodes:
        if len(ep.states) != len(ep.rewards):
            raise ValueError(f"an episode has {len(ep.states)} states and {len(ep.rewards)} "
                             "step rewards; it needs one state per step")
        keys += [index.setdefault((ep.group, s), len(index)) for s in ep.states]
        returns += discounted_returns(ep.rewards, gamma)
    if not keys:
        return [torch.zeros(0) for _ in episodes]
    values = torch.tensor(returns, dtype=torch.float64)
    mean, std, tied = _group_stats(values, torch.tensor(keys))
    adv = _normalise(values - mean, std, tied)
    return list(torch.split(adv, [len(ep.states) for ep in episodes]))


def combined_advantages(episode: torch.Tensor, steps: list[torch.Tensor],
                        step_weight: float) -> list[torch.Tensor]:
    """Per episode, (steps,): A = A_episode + step_weight * A_step (GiGPO)."""
    return [episode[i] + step_weight * s for i, s in enumerate(steps)]


def step_normaliser(loss_type: str, agent_tokens: list[int], max_tokens: int) -> float:
    """What `token_loss` divides by, from the whole optimizer step (all its forwards), so the
    losses of a step's forwards sum to the step's loss however the step is split:
    grpo: its sequences; dapo: its agent tokens; dr_grpo: max_tokens x its sequences (a
    constant, Dr. GRPO). Never below 1."""
    if loss_type not in LOSS_TYPES:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    count = {"grpo": len(agent_tokens), "dapo": sum(agent_tokens),
             "dr_grpo": max_tokens * len(agent_tokens)}[loss_type]
    return float(max(count, 1))


@dataclass
class LossOut:
    loss: torch.Tensor           # scalar: this forward's share of the step's loss
    clip_fraction: torch.Tensor  # share of agent tokens whose clipped term is the one taken
    kl: torch.Tensor             # mean K3 KL over agent tokens (0 when beta = 0)
    ratio: torch.Tensor          # mean ratio over agent tokens
    tokens: int                  # agent tokens in this forward (to weight the means)


def token_loss(logp_new: torch.Tensor, logp_old: torch.Tensor, mask: torch.Tensor,
               advantages: torch.Tensor, *, epsilon: float, epsilon_high: float,
               loss_type: str, normaliser: float, beta: float = 0.0,
               logp_ref: torch.Tensor | None = None) -> LossOut:
    """The clipped GRPO loss of (B, T) per-token log-probs; `advantages` (B,) per sequence or
    (B, T) per token. Only agent tokens (mask 1) count: every input is replaced by 0 elsewhere
    with torch.where before any arithmetic, so a masked token contributes exactly 0 and gets
    exactly 0 gradient whatever its log-probs hold (inf, NaN). Per agent token:
    rho = exp(new - old); -min(rho A, clip(rho, 1 - epsilon, 1 + epsilon_high) A)
    + beta (exp(ref - new) - (ref - new) - 1) (K3). Reduced by `loss_type` over
    `normaliser` (step_normaliser: the whole step's count, for gradient accumulation)."""
    if beta > 0 and logp_ref is None:
        raise ValueError("beta > 0 needs logp_ref (the reference model's log-probs)")
    m = mask.bool()
    zero = logp_new.new_zeros(())
    new = torch.where(m, logp_new, zero)
    old = torch.where(m, logp_old.detach(), zero)
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    adv = torch.where(m, adv.detach().to(new.dtype).expand_as(new), zero)
    ratio = torch.exp(new - old)
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - epsilon, 1 + epsilon_high) * adv)
    kl = torch.zeros_like(new)
    if beta > 0:
        d = torch.where(m, logp_ref.detach(), zero) - new
        kl = torch.exp(d) - d - 1
        per_token = per_token + beta * kl
    per_token = torch.where(m, per_token, zero)
    if loss_type == "grpo":
        loss = (per_token.sum(-1) / m.sum(-1).clamp(min=1)).sum() / normaliser
    elif loss_type in LOSS_TYPES:
        loss = per_token.sum() / normaliser
    else:
        raise ValueError(f"loss_type must be one of {', '.join(LOSS_TYPES)}, got {loss_type!r}")
    return LossOut(loss, *_token_means(ratio, adv, kl, m, epsilon, epsilon_high), int(m.sum()))


@torch.no_grad()
def _token_means(ratio, adv, kl, m, epsilon, epsilon_high):
    """Clip fraction, KL and ratio, each a mean over agent tokens (0 without any)."""
    clipped = ((ratio < 1 - epsilon) & (adv < 0)) | ((ratio > 1 + epsilon_high) & (adv > 0))
    n = m.sum().clamp(min=1)
    return [torch.where(m, x, 0).sum() / n for x in (clipped.to(ratio.dtype), kl, ratio)]
