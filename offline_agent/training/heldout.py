"""Held-out pair accuracy: does a trained policy prefer the chosen action on mined pairs it
never trained on?

On a few test tasks success rarely moves; this figure does. The pairs are the ones mining
found but the train stage's seeded sample (train.max_pairs) left out (pipelines/stages/
train.py picks them). Each is scored by the training's own packed forward (dpo.pair_logps:
summed log-probs of the action tokens, the masks the loss uses) under the trained adapter
and under the reference, the same network with the adapter disabled (the model training
started from).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from offline_agent.evaluation import wilson

from .checkpoint import load_adapter_weights
from .config import TrainConfig
from .dpo import pair_logps, reference_logps
from .logprobs import encode_pair
from .model import add_lora, load_base

FIGURES = ("pair_accuracy", "reward_accuracy", "base_pair_accuracy")


def pair_accuracies(policy: torch.Tensor, reference: torch.Tensor) -> dict:
    """From (N, 2) summed log-probs of (chosen, rejected) under the trained policy and the
    reference: the share of pairs where
    - pair_accuracy: the policy's log-prob of the chosen exceeds the rejected's;
    - reward_accuracy: DPO's implicit reward of the chosen exceeds the rejected's,
      log pi(c) - log pi_ref(c) > log pi(r) - log pi_ref(r) (TRL's rewards/accuracies):
      training moved the policy toward the chosen action;
    - base_pair_accuracy: pair_accuracy of the reference itself, for comparison;
    each with its Wilson 95% interval (`<figure>_ci95`). A tie counts as wrong. With no pair:
    n 0 and every figure None."""
    if policy.shape != reference.shape or policy.shape[1:] != (2,):
        raise ValueError(f"log-probs of shapes {tuple(policy.shape)} and "
                         f"{tuple(reference.shape)}; both must be (N, 2)")
    hits = {"pair_accuracy": policy[:, 0] > policy[:, 1],
            "reward_accuracy": policy[:, 0] - reference[:, 0] > policy[:, 1] - reference[:, 1],
            "base_pair_accuracy": reference[:, 0] > reference[:, 1]}
    n = len(policy)
    out: dict = {"n": n}
    for name in FIGURES:
        k = int(hits[name].sum())
        interval = wilson(k, n)
        out[name] = round(k / n, 4) if n else None
        out[f"{name}_ci95"] = None if interval is None else [round(x, 4) for x in interval]
    return out


def score_pairs(rows: list[dict], model_id: str, adapter_folder: str, cfg: TrainConfig,
                base_adapter: str | None = None,
                on_scored: Callable[[int, int], None] | None = None) -> dict:
    """`pair_accuracies` of the adapter in `adapter_folder` (trained on `model_id` with
    `base_adapter` merged in, as fit_policy trained it) on these pair rows; the model is
    loaded only when there is a pair to score. on_scored: as scored_logps."""
    if not rows:
        return pair_accuracies(torch.zeros(0, 2), torch.zeros(0, 2))
    return pair_accuracies(*scored_logps(rows, model_id, adapter_folder, cfg, base_adapter,
                                         on_scored))


@torch.no_grad()
def scored_logps(rows: list[dict], model_id: str, adapter_folder: str, cfg: TrainConfig,
                 base_adapter: str | None = None,
                 on_scored: Callable[[int, int], None] | None = None
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """(policy, reference) (N, 2) summed action log-probs of the pairs' (chosen, rejected),
    the model built as training builds it (on a GPU when there is one), so the reference is
    the very one training computed for the pairs it trained on. Each pair is scored twice,
    under the policy and the reference: a progress bar counts the 2N scorings, and
    on_scored(done, 2N) hears each packed forward (minutes on a CPU for a few hundred)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model, tokenizer = load_base(model_id, cfg, device, base_adapter)
    model = add_lora(model, cfg)  # the network training ran (QLoRA's float32 norms too)
    load_adapter_weights(model, adapter_folder)
    model.eval()
    items = [list(encode_pair(tokenizer, r)) for r in rows]
    bar = tqdm(total=2 * len(items), desc="held-out pairs", unit="pair")

    def scored(k: int) -> None:
        bar.update(k)
        if on_scored:
            on_scored(bar.n, bar.total)

    out = (pair_logps(model, items, cfg.pack_tokens, on_group=scored),
           reference_logps(model, items, cfg.pack_tokens, on_group=scored))
    bar.close()
    return out
