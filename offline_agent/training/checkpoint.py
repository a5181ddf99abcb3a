"""Training checkpoints: PEFT adapter + optimizer, scheduler, data order and RNG state.

A checkpoint is written to `<folder>.tmp` and renamed when complete, so a folder that exists
is whole; the caller records it (the store's checkpoints table) only after that.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file

from offline_agent.policy.adapters import import_peft

STATE = "trainer_state.pt"


def write_atomic(folder: Path, fill) -> Path:
    """Call fill(tmp) on an empty temporary folder, then rename it to `folder` (replacing it)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    fill(tmp)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(tmp, folder)
    return folder


def rng_state() -> dict:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])


def save(folder: Path, model, optimizer, scheduler, step: int, order: list[int]) -> Path:
    """Adapter (PEFT format, loadable by `PeftModel.from_pretrained`) and the trainer state."""
    def fill(tmp: Path) -> None:
        model.save_pretrained(tmp)
        torch.save({"step": step, "order": order, "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "rng": rng_state()}, tmp / STATE)
    return write_atomic(folder, fill)


def load(folder: Path, model, optimizer, scheduler) -> tuple[int, list[int]]:
    """Restore a checkpoint written by `save` into a freshly built model/optimizer/scheduler;
    returns (steps done, data order)."""
    folder = Path(folder)
    if not (folder / STATE).exists():
        raise FileNotFoundError(f"{folder} is not a complete training checkpoint (no {STATE})")
    load_adapter_weights(model, folder)
    state = torch.load(folder / STATE, weights_only=False)  # our own file: RNG state is a tuple
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    set_rng_state(state["rng"])
    return state["step"], state["order"]


def load_adapter_weights(model, folder: Path) -> None:
    """The adapter weights saved in `folder` (a checkpoint or a final adapter) into `model`,
    a PEFT model built as training builds it (model.add_lora)."""
    weights = load_file(Path(folder) / "adapter_model.safetensors")
    import_peft().set_peft_model_state_dict(model, weights)
