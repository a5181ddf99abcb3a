"""Training settings. Lives beside the trainers so `offline_agent` never imports `pipelines`."""

from __future__ import annotations

from dataclasses import dataclass, field

from offline_agent.config_fields import config_field

POLICIES = ("rft", "dpo_outcome", "dpo_step", "dpo_step_outcome")
LOSSES = ("sigmoid", "ipo", "rpo")


@dataclass
class TrainConfig:
    policies: list[str] = field(
        default_factory=lambda: ["rft", "dpo_outcome", "dpo_step"],
        metadata={"help": "policies to train, of rft, dpo_outcome, dpo_step, dpo_step_outcome "
                          "(docs/training.md)"})
    iterate: str | None = config_field(None, "with run.iterations > 1: the policy whose final "
                                             "adapter the next round searches with; null: the "
                                             "last of train.policies")
    loss: str = config_field("sigmoid", "DPO loss: sigmoid (DPO), ipo, or rpo (DPO + rpo_alpha * "
                                        "NLL of the chosen actions)")
    beta: float = config_field(0.1, "DPO temperature: how far the policy may move from the "
                                    "reference")
    rpo_alpha: float = config_field(1.0, "weight of the chosen-action NLL in the rpo loss")
    lr: float = config_field(1e-4, "peak learning rate (AdamW), reached after warmup_steps")
    warmup_steps: int = config_field(2, "linear warmup steps; the rate then decays linearly to 0")
    weight_decay: float = config_field(0.0, "AdamW weight decay of the adapter weights")
    epochs: int = config_field(2, "passes over a policy's pairs (or RFT examples)")
    max_steps: int = config_field(0, "stop after this many optimizer steps; 0: epochs decide")
    batch_size: int = config_field(8, "pairs (RFT: examples) per optimizer step")
    pack_tokens: int = config_field(3072, "most tokens in one forward: a step's sequences are "
                                          "packed into prefix tries of at most this size, "
                                          "gradients accumulated")
    max_pairs: int = config_field(0, "cap on a policy's pairs (RFT: examples), a seeded sample; "
                                     "0: all")
    lora_r: int = config_field(16, "LoRA rank")
    lora_alpha: int = config_field(32, "LoRA scaling numerator (scale = alpha / r)")
    lora_dropout: float = config_field(0.0, "dropout on the LoRA input")
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                 "gate_proj", "up_proj", "down_proj"],
        metadata={"help": "linear layers that get LoRA adapters"})
    quantization: str = config_field("none", "none, or 4bit: QLoRA, the base in NF4 via "
                                             "bitsandbytes")
    gradient_checkpointing: bool = config_field(False, "recompute activations in backward: less "
                                                       "memory, one more forward of time")
    dtype: str = config_field("auto", "auto (bfloat16 on a GPU that supports it, else float32), "
                                      "float32 or bfloat16 (on CPU opt-in: it changes the losses)")
    save_every: int = config_field(10, "checkpoint (adapter, optimizer, scheduler, data order, "
                                       "RNG) every this many steps; the final adapter is always "
                                       "saved")
    select: str = config_field("last", "a policy's final adapter: last (its last step's) or val "
                                       "(the checkpoint best on the validation tasks; changes "
                                       "what eval plays)")
    seed: int = config_field(0, "seed of data order, pair sampling, LoRA init and dropout")
    merge: bool = config_field(False, "also write the policy's final adapter (the selected "
                                      "one with select: val) merged into a full model, to "
                                      "RUN_DIR/checkpoints/train/<policy>/merged")

    def __post_init__(self):
        for p in self.policies:
            if p not in POLICIES:
                raise ValueError(f"train.policies: unknown policy {p!r}; known: {', '.join(POLICIES)}")
        if self.iterate is not None and self.iterate not in self.policies:
            raise ValueError(f"train.iterate must be one of train.policies {self.policies}, "
                             f"got {self.iterate!r}")
        if len(set(self.policies)) != len(self.policies):
            raise ValueError(f"train.policies lists a policy twice: {self.policies}")
        checks = {"loss": (self.loss, LOSSES), "quantization": (self.quantization, ("none", "4bit")),
                  "dtype": (self.dtype, ("auto", "float32", "bfloat16")),
                  "select": (self.select, ("last", "val"))}
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"train.{name} must be one of {', '.join(allowed)}, got {value!r}")
        for name in ("epochs", "batch_size", "pack_tokens", "lora_r", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"train.{name} must be >= 1")
        for name in ("max_steps", "max_pairs", "warmup_steps"):
            if getattr(self, name) < 0:
                raise ValueError(f"train.{name} must be >= 0")
        if self.beta <= 0 or self.lr <= 0:
            raise ValueError("train.beta and train.lr must be > 0")
