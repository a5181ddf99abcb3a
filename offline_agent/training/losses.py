"""Preference and SFT losses as pure functions of summed masked log-probs (one value per sequence).

Everything model-specific (templates, masks, packing) happens before; these take tensors of
per-pair sums and return per-pair losses, so a hand computation can check them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class DPOOut:
    losses: torch.Tensor            # per pair
    chosen_rewards: torch.Tensor    # beta * (log pi(c) - log pi_ref(c)), detached
    rejected_rewards: torch.Tensor  # beta * (log pi(r) - log pi_ref(r)), detached


def dpo_loss(policy_chosen: torch.Tensor, policy_rejected: torch.Tensor,
             ref_chosen: torch.Tensor, ref_rejected: torch.Tensor, *, beta: float,
             kind: str = "sigmoid", chosen_tokens: torch.Tensor | None = None,
             rpo_alpha: float = 1.0) -> DPOOut:
    """Per-pair DPO loss on summed action log-probs.

    h = (log pi(c) - log pi_ref(c)) - (log pi(r) - log pi_ref(r))
    sigmoid: -log sigmoid(beta * h)                       (DPO, Rafailov et al. 2023)
    ipo:     (h - 1 / (2 * beta))^2                       (IPO, Azar et al. 2023, summed log-probs)
    rpo:     sigmoid + rpo_alpha * (-log pi(c) / |c|)     (DPO + per-token NLL of the chosen)
    """
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    if kind == "sigmoid" or kind == "rpo":
        losses = -F.logsigmoid(beta * h)
        if kind == "rpo":
            if chosen_tokens is None:
                raise ValueError("the rpo loss needs chosen_tokens (action tokens per chosen)")
            losses = losses + rpo_alpha * (-policy_chosen / chosen_tokens.clamp(min=1))
    elif kind == "ipo":
        losses = (h - 1 / (2 * beta)) ** 2
    else:
        raise ValueError(f"unknown DPO loss {kind!r}; known: sigmoid, ipo, rpo")
    return DPOOut(losses, beta * (policy_chosen - ref_chosen).detach(),
                  beta * (policy_rejected - ref_rejected).detach())


def sft_loss(logps: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """RFT: summed NLL of these sequences' action tokens over `total_tokens`, the action tokens
    of the whole optimizer step, so the accumulated loss is the step's per-token mean however
    the step is split into forwards."""
    return -logps.sum() / max(total_tokens, 1)
