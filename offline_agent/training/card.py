"""What a trained adapter says about itself: adapter_config.json's base and its README.md.

PEFT records the base as the folder it was loaded from (for the embedded model, a cache path
on this machine) and writes its empty card template. `publish` records the base's public name
instead and writes a card in the form PEFT and the Hub read: YAML front matter with
base_model, library_name: peft and tags, then what trained the adapter.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from .config import TrainConfig

POLICY_TEXT = {  # policy -> (its tags, what it trains)
    "rft": (["sft", "rft"], "masked SFT on successful (and hindsight-relabeled) episodes: "
                            "only the agent's own tokens are trained on"),
    "dpo_outcome": (["dpo"], "action-masked DPO on trajectory pairs: a success against a "
                             "failure of one task"),
    "dpo_step": (["dpo"], "action-masked DPO on Agent Q step pairs: two sibling actions after "
                          "the same history, ranked by search"),
    "dpo_step_outcome": (["dpo"], "action-masked DPO on step pairs and trajectory pairs"),
}
EVAL_TEXT = ("The run's `eval` stage plays every trained policy greedily on the held-out test "
             "tasks after training, so the result is not in this card: `offline-agent report "
             "RUN_DIR` prints it and writes RUN_DIR/report/index.html.")


@dataclass
class Provenance:
    """Where an adapter comes from. base: the public name of the model everything started from
    (the card's base_model); merged: what was merged into that base before this training, in
    order (an earlier round's adapter, model.adapter); note: how the weights trained on
    differ from the base's (policy.models.copy_note); run_id and round: the offline-agent run
    whose data trained it."""

    base: str
    merged: list[str] = field(default_factory=list)
    note: str = ""
    run_id: str | None = None
    round: int = 1


def publish(folder: Path, applies_to: str, policy: str, provenance: Provenance,
            cfg: TrainConfig, stats: dict) -> None:
    """Record `applies_to` (the public name of the model the adapter's weights apply to) as
    the adapter's base, and replace PEFT's card template with this adapter's card."""
    folder = Path(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    config["base_model_name_or_path"] = applies_to
    _write(folder / "adapter_config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    _write(folder / "README.md", card(applies_to, policy, provenance, cfg, stats))


def card(applies_to: str, policy: str, provenance: Provenance, cfg: TrainConfig,
         stats: dict) -> str:
    """The README.md of an adapter; stats: fit_policy's (step, loss, items, action_tokens)."""
    kinds, how = POLICY_TEXT[policy]
    base = provenance.base
    tags = [f"base_model:adapter:{base}", "lora", "transformers", *kinds, "agent",
            "offline-agent"]
    header = {"base_model": base, "library_name": "peft", "pipeline_tag": "text-generation",
              "tags": tags + (["qlora"] if cfg.quantization == "4bit" else [])}
    run = (f"offline-agent run `{provenance.run_id}`" if provenance.run_id
           else "data given to offline-agent's fit_policy")
    title = f"# `{policy}` LoRA adapter of {base}, trained on {run}"
    if provenance.round > 1:
        title += f", round {provenance.round}"
    return f"""---
{yaml.safe_dump(header, sort_keys=False)}---

{title}

Trained by offline-agent (Agent Q: tree search, preference mining, training) with policy
`{policy}`: {how}.

## Base

{_base_text(applies_to, provenance)}

```python
from peft import PeftModel
from transformers import AutoModelForCausalLM

base = AutoModelForCausalLM.from_pretrained("{applies_to}")
model = PeftModel.from_pretrained(base, "PATH_OR_REPO_OF_THIS_ADAPTER")
```

## Training

{_training_text(run, policy, cfg, stats)}

```yaml
{yaml.safe_dump(asdict(cfg), sort_keys=False)}```

## Evaluation

{EVAL_TEXT}
"""


def _training_text(run: str, policy: str, cfg: TrainConfig, stats: dict) -> str:
    rows = "examples" if policy == "rft" else "pairs"
    text = (f"Data: {run}, {stats['items']} {rows} ({stats['action_tokens']} action tokens "
            f"trained on). {stats['step']} optimizer steps; last loss {stats['loss']:.4f}.")
    if cfg.quantization == "4bit":
        text += " The base was in 4 bits (NF4, QLoRA) while it trained."
    return text + " The `train` settings:"


def _base_text(applies_to: str, provenance: Provenance) -> str:
    if not provenance.merged:
        return f"The adapter applies to `{applies_to}`. {provenance.note}".strip()
    steps = "\n".join(f"{i}. {m}" for i, m in enumerate(provenance.merged, 1))
    where = ("" if applies_to == provenance.base else
             f" This machine holds that model as `{applies_to}`, which adapter_config.json "
             "names; elsewhere, merge the adapters above into the base first.")
    return (f"The adapter applies to `{provenance.base}` with these adapters merged into it "
            f"first, in order (not to the base alone):\n\n{steps}\n\n"
            f"{where.strip()} {provenance.note}").strip()


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
