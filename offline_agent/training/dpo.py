"""Action-masked DPO on step or trajectory pairs: the objective the training loop runs.

Reference log-probs are computed once, before training, by the same packed forward with the
LoRA adapter disabled (the base model), and kept in a file beside the checkpoints, so a
resumed run does not recompute them and training holds one model.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch

from .config import TrainConfig
from .logprobs import Encoded, groups, pack, sequence_logps
from .losses import dpo_loss

REFERENCE = "reference.pt"


@torch.no_grad()
def pair_logps(model, items: list[list[Encoded]], budget: int,
               share: tuple[int, int] = (0, 1),
               on_group: Callable[[int], None] | None = None) -> torch.Tensor:
    """(N, 2) summed action log-probs of (chosen, rejected) under `model` as it is, packed
    like training's forwards. share=(i, n): only every n-th packed group from the i-th (the
    rest stay 0), so n processes each compute a share of the same forwards and their results
    sum to the whole. on_group(k): after each packed forward, the k pairs it scored."""
    out = torch.zeros(len(items), 2)
    for group in groups(items, budget)[share[0]::share[1]]:
        seqs = [s for i in group for s in items[i]]
        out[group] = sequence_logps(model, pack(seqs)).view(-1, 2).cpu()
        if on_group:
            on_group(len(group))
    return out


def reference_logps(model, items: list[list[Encoded]], budget: int,
                    share: tuple[int, int] = (0, 1),
                    on_group: Callable[[int], None] | None = None) -> torch.Tensor:
    """`pair_logps` under the adapter-disabled model: the reference."""
    with model.disable_adapter():
        return pair_logps(model, items, budget, share, on_group)


def load_or_compute_reference(model, items, keys: list, budget: int, folder: Path,
                              accelerator) -> torch.Tensor:
    """The stored reference of exactly these pairs (keys in order), else computed (shared
    among the processes) and stored by the main process."""
    path = Path(folder) / REFERENCE
    if path.exists():
        saved = torch.load(path, weights_only=True)
        if saved["keys"] == keys:
            return saved["logps"]
    share = (accelerator.process_index, accelerator.num_processes)
    logps = reference_logps(model, items, budget, share)
    if accelerator.num_processes > 1:
        logps = accelerator.reduce(logps.to(accelerator.device), "sum").cpu()
    if accelerator.is_main_process:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save({"keys": keys, "logps": logps}, tmp)
        os.replace(tmp, path)
    return logps


class DPOObjective:
    """Each item is (chosen, rejected); the step's loss is the mean per-pair DPO loss."""

    def __init__(self, items: list[list[Encoded]], reference: torch.Tensor, cfg: TrainConfig):
        if reference.shape != (len(items), 2):
            raise ValueError(f"reference log-probs of shape {tuple(reference.shape)} for "
                             f"{len(items)} pairs")
        self.items, self.reference, self.cfg = items, reference, cfg
        self.chosen_tokens = torch.tensor([float(c.action_tokens) for c, _ in items])

    def group_loss(self, model, group: list[int], step: list[int]):
        """Loss of these pairs scaled so the step's groups sum to its mean; summed stats."""
        seqs = [s for i in group for s in self.items[i]]
        logps = sequence_logps(model, pack(seqs)).view(-1, 2)
        ref = self.reference[group].to(logps.device)
        out = dpo_loss(logps[:, 0], logps[:, 1], ref[:, 0], ref[:, 1], beta=self.cfg.beta,
                       kind=self.cfg.loss, rpo_alpha=self.cfg.rpo_alpha,
                       chosen_tokens=self.chosen_tokens[group].to(logps.device))
        margin = out.chosen_rewards - out.rejected_rewards
        sums = {"loss": out.losses.sum().item(), "margin": margin.sum().item(),
                "accuracy": (margin > 0).sum().item(),
                "chosen_reward": out.chosen_rewards.sum().item(),
                "rejected_reward": out.rejected_rewards.sum().item()}
        return out.losses.sum() / len(step), sums

    def metrics(self, sums: dict, step: list[int]) -> dict:
        return {k: v / len(step) for k, v in sums.items()}
