"""GRPO settings (the `grpo` stage, docs/training.md). Lives beside the trainers so
`offline_agent` never imports `pipelines`; the pure parts they configure are in objective.py."""

from __future__ import annotations

from dataclasses import dataclass

from offline_agent.config_fields import config_field

INITS = ("dpo_step", "rft", "dpo_outcome", "dpo_step_outcome", "base")
LOSS_TYPES = ("grpo", "dapo", "dr_grpo")
SCALES = ("group", "batch", "none")


@dataclass
class GRPOConfig:
    enabled: bool = config_field(False, "run the online GRPO stage between train and eval (off: "
                                        "the run is unchanged)")
    init: str = config_field("dpo_step", "adapter GRPO starts from: dpo_step, rft, dpo_outcome (a "
                                         "policy of train.policies) or base (a fresh adapter on "
                                         "the base model)")
    steps: int = config_field(20, "GRPO steps: each samples fresh groups and makes num_iterations "
                                  "optimizer updates on them")
    group_size: int = config_field(4, "G: episodes per task that form one group (>= 2: a group of "
                                      "one carries no signal)")
    tasks_per_step: int = config_field(4, "train tasks per rollout batch, G episodes each")
    lr: float = config_field(1e-5, "learning rate (AdamW) of the adapter")
    temperature: float = config_field(1.0, "sampling temperature of the rollouts; the ratio's "
                                           "log-probs use the same temperature")
    epsilon: float = config_field(0.2, "PPO clip: the ratio is clipped below at 1 - epsilon")
    epsilon_high: float = config_field(0.28, "PPO clip above at 1 + epsilon_high (DAPO "
                                             "clip-higher; equal to epsilon: symmetric PPO clip)")
    beta: float = config_field(0.0, "weight of the per-token K3 KL to the reference (the adapter "
                                    "disabled); 0: no KL and no reference forward at all")
    loss_type: str = config_field("dapo", "grpo: mean over an episode's agent tokens, then over "
                                          "episodes; dapo: mean over the step's agent tokens; "
                                          "dr_grpo: constant normaliser")
    scale_rewards: str = config_field("group", "advantage = reward - group mean, divided by the "
                                               "group's std (group), the batch's std (batch) or "
                                               "nothing (none, Dr. GRPO)")
    num_iterations: int = config_field(1, "mu: updates per batch of rollouts; pi_old is one "
                                          "forward per batch, so the first update's ratio is "
                                          "exactly 1")
    max_resample: int = config_field(2, "times a group whose rewards all tie (no gradient) is "
                                        "dropped and sampled again (DAPO dynamic sampling); 0: "
                                        "dropped, not resampled")
    format_weight: float = config_field(0.0, "reward penalty per invalid action (shaping; 0: off)")
    format_cap: float = config_field(0.2, "most an episode loses to format_weight; with "
                                          "length_cap < 1 in all, so a success (1) always "
                                          "outranks a failure (0)")
    length_penalty: float = config_field(0.0, "reward penalty per step past step_budget (shaping; "
                                              "0: off)")
    step_budget: int = config_field(6, "steps an episode may take before length_penalty applies")
    length_cap: float = config_field(0.2, "most an episode loses to length_penalty")
    step_groups: bool = config_field(False, "also group steps whose env state before the action "
                                            "is identical (hashed snapshot JSON) within a task's "
                                            "group and add their normalised returns (GiGPO-style)")
    step_weight: float = config_field(1.0, "omega: A = A_episode + omega * A_step (with "
                                           "step_groups)")
    save_every: int = config_field(5, "checkpoint (adapter, optimizer, RNG, the step whose "
                                      "rollouts come next) every this many steps; the final "
                                      "adapter is always saved")
    gamma: float = config_field(0.95, "discount of the per-step return a step group normalises")
    dtype: str = config_field("auto", "dtype GRPO samples and trains in: auto (train.dtype), "
                                      "float32 or bfloat16 (its rollouts are most of a step)")
    select: str = config_field("last", "GRPO's final adapter: last (its last step's) or val (the "
                                       "step checkpoint best on the validation tasks)")

    def __post_init__(self):
        checks = {"init": (self.init, INITS), "loss_type": (self.loss_type, LOSS_TYPES),
                  "scale_rewards": (self.scale_rewards, SCALES),
                  "select": (self.select, ("last", "val")),
                  "dtype": (self.dtype, ("auto", "float32", "bfloat16"))}
        for name, (value, allowed) in checks.items():
            if value not in allowed:
                raise ValueError(f"grpo.{name} must be one of {', '.join(allowed)}, got {value!r}")
        for name in ("steps", "tasks_per_step", "num_iterations", "step_budget", "save_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"grpo.{name} must be >= 1, got {getattr(self, name)}")
        if self.group_size < 2:
            raise ValueError(f"grpo.group_size must be >= 2 (a group of one has no advantage), "
                             f"got {self.group_size}")
        if self.lr <= 0 or self.temperature <= 0:
            raise ValueError("grpo.lr and grpo.temperature must be > 0")
        if not 0 < self.epsilon < 1 or self.epsilon_high < self.epsilon:
            raise ValueError(f"grpo.epsilon must be in (0, 1) and grpo.epsilon_high >= "
                             f"grpo.epsilon, got {self.epsilon} and {self.epsilon_high}")
        for name in ("beta", "max_resample", "format_weight", "format_cap", "length_penalty",
                     "length_cap", "step_weight"):
            if getattr(self, name) < 0:
                raise ValueError(f"grpo.{name} must be >= 0, got {getattr(self, name)}")
        if self.format_cap + self.length_cap >= 1:
            raise ValueError("grpo.format_cap + grpo.length_cap must be < 1, so the outcome "
                             "reward dominates the shaping")
        if not 0 <= self.gamma <= 1:
            raise ValueError(f"grpo.gamma must be in [0, 1], got {self.gamma}")
