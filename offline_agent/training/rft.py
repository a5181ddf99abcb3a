"""RFT: SFT on successful (and hindsight-relabeled) conversations, with the action mask."""

from __future__ import annotations

from .logprobs import Encoded, pack, sequence_logps
from .losses import sft_loss


class RFTObjective:
    """Each item is one conversation; the step's loss is the per-action-token mean NLL."""

    def __init__(self, items: list[list[Encoded]]):
        self.items = items
        self.tokens = [sum(s.action_tokens for s in seqs) for seqs in items]

    def group_loss(self, model, group: list[int], step: list[int]):
        seqs = [s for i in group for s in self.items[i]]
        logps = sequence_logps(model, pack(seqs))
        loss = sft_loss(logps, sum(self.tokens[i] for i in step))
        return loss, {"loss": -logps.sum().item()}

    def metrics(self, sums: dict, step: list[int]) -> dict:
        return {"loss": sums["loss"] / max(sum(self.tokens[i] for i in step), 1)}
