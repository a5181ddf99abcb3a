"""Train one policy from its data: build the model, encode the data, run the loop, save."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from offline_agent.policy.models import copy_note, public_id

from . import distributed
from .card import Provenance, publish
from .config import TrainConfig
from .dpo import DPOObjective, load_or_compute_reference
from .logprobs import encode_example, encode_pair
from .mask_check import count_agent_tokens
from .model import add_lora, load_base
from .rft import RFTObjective
from .trainer import train


def fit_policy(policy: str, rows: list[dict], model_id: str, cfg: TrainConfig, folder: Path, *,
               adapter: str | None = None, resume: str | None = None,
               provenance: Provenance | None = None,
               on_metrics: Callable[[int, dict], None] = lambda s, m: None,
               on_checkpoint: Callable[[int, Path], None] = lambda s, f: None) -> dict:
    """Train `policy` (rft: rows are examples; dpo_*: rows are pairs) into folder/final, whose
    adapter_config.json names the base by its public name and whose README.md is its card.

    `adapter`: a previous policy merged into the base first, so it is the reference.
    `provenance`: for the card (the stage knows the run); default: `model_id` and `adapter`.
    Returns the last step's metrics plus the data counts. Launched on several processes,
    the main process's call is repeated by the others (`follow`), without the callbacks.
    """
    if not rows:
        raise ValueError(f"policy {policy!r}: no training data")
    accelerator = distributed.make_accelerator()
    distributed.share_job(accelerator, {"policy": policy, "rows": rows, "model_id": model_id,
                                        "cfg": cfg, "folder": folder, "adapter": adapter,
                                        "resume": resume})
    model, tokenizer = load_base(model_id, cfg, str(accelerator.device), adapter)
    model = add_lora(model, cfg)
    folder = Path(folder)
    if policy == "rft":
        items = [[encode_example(tokenizer, r)] for r in rows]
        objective = RFTObjective(items)
    else:
        items = [list(encode_pair(tokenizer, r)) for r in rows]
        reference = load_or_compute_reference(model, items, [r["pair_id"] for r in rows],
                                              cfg.pack_tokens, folder, accelerator)
        objective = DPOObjective(items, reference, cfg)
    metrics = train(model, objective, cfg, folder, accelerator, resume=resume,
                    on_metrics=on_metrics, on_checkpoint=on_checkpoint, desc=f"train {policy}")
    out = {**metrics, "items": len(items),
           "action_tokens": sum(s.action_tokens for seqs in items for s in seqs),
           "agent_tokens": count_agent_tokens(tokenizer, policy, rows, items)}
    if accelerator.is_main_process:
        provenance = provenance or Provenance(public_id(model_id), [adapter] if adapter else [],
                                              copy_note(model_id))
        publish(folder / "final", public_id(model_id), policy, provenance, cfg, out)
    return out


def follow() -> None:
    """A process other than the main one of a multi-process launch: train each policy the
    main process trains, until it is done (distributed.py)."""
    while (job := distributed.next_job()) is not None:
        fit_policy(**job)
    distributed.leave()
