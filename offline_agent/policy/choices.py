"""The layout that scores every choice of a prompt in one row after its cached KV.

Scoring n continuations of a ~1,000-token prompt the plain way costs n copies of the prompt's
KV (one batch row per continuation), then a forward of each. Here a prompt's choices share one
row instead, as a tree (as in speculative decoding's tree attention): the row is the prompt's
last token, then each choice's tokens but its last, one choice after another. Each token
attends to the prompt (the cache), the last token and the earlier tokens of its own choice, and
its position id counts from the prompt's end within its choice, so it computes exactly what it
would right after the prompt. The last token's logits predict every choice's first token, so
single-token choices (the critic's labels "A", "B", ...) cost one query token per prompt.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ChoiceTree:
    """Rows [batch, width]: `tokens`, `depth` (position past the prompt's last token), `mask`
    [batch, width, width] (query attends to key, among the row's new tokens). Per predicted
    token n (all rows, choices in order): `predictor` (flat index row * width + column whose
    logits predict it), `target` (its id) and `choice` (flat index of its choice)."""

    tokens: torch.Tensor
    depth: torch.Tensor
    mask: torch.Tensor
    predictor: torch.Tensor
    target: torch.Tensor
    choice: torch.Tensor
    num_choices: int

    @property
    def width(self) -> int:
        return self.tokens.shape[1]


def choice_tree(lasts: list[int], choices: list[list[tuple[int, ...]]], pad: int) -> ChoiceTree:
    """The tree of each row's choices after its prompt's last token `lasts[b]`. An empty
    choice predicts nothing (its score is 0); pad columns attend to themselves only."""
    width = 1 + max(sum(max(len(c) - 1, 0) for c in cs) for cs in choices)
    batch = len(lasts)
    tokens = torch.full((batch, width), pad, dtype=torch.long)
    depth = torch.zeros(batch, width, dtype=torch.long)
    mask = torch.eye(width, dtype=torch.bool).repeat(batch, 1, 1)
    predictor, target, choice = [], [], []
    k = 0
    for b, (last, cs) in enumerate(zip(lasts, choices)):
        tokens[b, 0] = last
        at = 1  # next free column of the row
        for c in cs:
            span = len(c) - 1
            if span > 0:
                tokens[b, at:at + span] = torch.tensor(c[:-1])
                depth[b, at:at + span] = torch.arange(1, span + 1)
                mask[b, at:at + span, 0] = True
                mask[b, at:at + span, at:at + span] = torch.ones(span, span).tril().bool()
            for j, t in enumerate(c):  # c[0] after the last prompt token, c[j] after c[j - 1]
                predictor.append(b * width + (0 if j == 0 else at + j - 1))
                target.append(t)
                choice.append(k)
            at += max(span, 0)
            k += 1
    return ChoiceTree(tokens, depth, mask, torch.tensor(predictor, dtype=torch.long),
                      torch.tensor(target, dtype=torch.long),
                      torch.tensor(choice, dtype=torch.long), k)
