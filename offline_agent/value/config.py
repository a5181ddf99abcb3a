"""Settings of the learned critic's fit (stage `critic`). Lives beside the algorithm so
`offline_agent` never imports `pipelines`."""

from __future__ import annotations

from dataclasses import dataclass, field

from offline_agent.config_fields import config_field

STATES = ("conversation", "page")  # critic.state: how a state is read (value_model.state_prompt)


@dataclass
class CriticConfig:
    lora_r: int = config_field(0, "LoRA rank on the base under the value head; 0: base frozen, "
                                  "only the head learns (as good on MiniShop at a fifth of the "
                                  "fit time; docs/architecture.md)")
    target_modules: list[str] = field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
        metadata={"help": "linear layers that get LoRA adapters (with critic.lora_r > 0)"})
    lr: float = config_field(1e-3, "learning rate (AdamW) of the head and the LoRA weights")
    weight_decay: float = config_field(0.01, "AdamW weight decay")
    epochs: int = config_field(200, "most passes over the training trees; validation stops it "
                                    "earlier")
    patience: int = config_field(20, "stop after this many epochs without a lower validation "
                                     "loss; the best epoch's weights are kept")
    holdout: float = config_field(0.25, "share of the train tasks whose trees are held out (by "
                                        "task) for validation, early stopping and the concordance "
                                        "figure")
    state: str = config_field("conversation", "a state to the critic: conversation (every step so "
                                              "far) or page (goal + latest observation, for envs "
                                              "whose pages show the whole state)")
    layer_share: float = config_field(0.6, "share of the base's decoder layers V runs before its "
                                           "head (1: all); 0.6 ranked MiniShop's item pages "
                                           "better than 1 (docs/architecture.md)")
    pack_tokens: int = config_field(8192, "most tokens in one forward: states and their actions "
                                          "are packed into prefix tries of at most this size")
    seed: int = config_field(0, "seed of the task split, data order and initialisation")

    def __post_init__(self):
        if self.state not in STATES:
            raise ValueError(f"critic.state must be one of {STATES}, got {self.state!r}")
        if self.lora_r < 0:
            raise ValueError(f"critic.lora_r must be >= 0, got {self.lora_r}")
        if not 0 <= self.holdout < 1:
            raise ValueError(f"critic.holdout must be in [0, 1), got {self.holdout}")
        for name in ("epochs", "patience", "pack_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"critic.{name} must be >= 1")
        if not 0 < self.layer_share <= 1:
            raise ValueError(f"critic.layer_share must be in (0, 1], got {self.layer_share}")
        if self.lr <= 0 or self.weight_decay < 0:
            raise ValueError("critic.lr must be > 0 and critic.weight_decay >= 0")
