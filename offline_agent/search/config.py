"""Search settings. Lives beside the algorithm so `offline_agent` never imports `pipelines`."""

from __future__ import annotations

from dataclasses import dataclass

from offline_agent.config_fields import config_field
from offline_agent.search.requests import MAX_ACTIONS

CRITICS = ("frozen", "learned", "none")


@dataclass
class SearchConfig:
    simulations: int = config_field(8, "MCTS simulations per task (select, expand, rollout, "
                                       "backup)")
    k: int = config_field(4, "children of an expanded node: the first k distinct proposals, valid "
                             "ones first, at most one invalid")
    oversample: int = config_field(2, "an expansion samples k*oversample actions (the greedy one "
                                      "first), so duplicates and invalid draws still leave k "
                                      "distinct children")
    listed: int = config_field(2, "children an expansion takes from Env.available_actions that no "
                                  "sample proposed (docs/architecture.md); 0: sampled proposals "
                                  "only")
    c: float = config_field(1.0, "exploration constant in UCB1 / PUCT")
    selection: str = config_field("ucb1", "ucb1 (Agent Q eq. 7) or puct (critic score as prior)")
    max_depth: int = config_field(8, "deepest node (agent steps) a tree or rollout may reach")
    expand_temperature: float = config_field(1.0, "sampling temperature for the K proposals")
    expand_greedy: bool = config_field(True, "the first of the K proposals is the greedy action, "
                                             "so the tree always holds the step greedy decoding "
                                             "would take")
    rollout_temperature: float = config_field(0.7, "sampling temperature for rollouts to a "
                                                   "terminal state")
    alpha: float = config_field(0.5, "MCTS weight in the value alpha*Q_mcts + (1-alpha)*Q_critic "
                                     "(Agent Q eq. 10) that selection uses; mining has mine.alpha")
    finish: bool = config_field(True, "try the listed endings on snapshots, no model call; "
                                      "verifier-free: the learned critic values them, never run "
                                      "(docs/architecture.md)")
    step_cost: float = config_field(0.0, "reward subtracted per agent step of a rollout")
    critic: str = config_field("frozen", "frozen: the base model ranks the proposals (old name "
                                         "logprob, still accepted); learned: stage critic's value "
                                         "model (round 1: frozen); none: uniform")
    leaf_value: str = config_field("rollout", "a new leaf's value: rollout (to a terminal state), "
                                              "critic (its score, no rollout; changes the trees) "
                                              "or mix (their mean); docs/architecture.md")
    verifier: bool = config_field(True, "read the env's reward; false: verifier-free, as "
                                        "eval.mcts runs it (needs leaf_value critic, and with "
                                        "finish the learned critic; docs/architecture.md)")
    trees_per_batch: int = config_field(16, "trees advanced together; one generate call serves "
                                            "them all")
    seed: int = config_field(0, "base seed; sampling is seeded per (task, simulation)")
    shard: str = config_field("0/1", "i/n: search tasks[i::n] only (scale-out over "
                                     "machines)", hashed=False)

    def __post_init__(self):
        if self.critic == "logprob":  # the frozen critic's name before issue 23
            self.critic = "frozen"
        if self.selection not in ("ucb1", "puct"):
            raise ValueError(f"search.selection must be ucb1 or puct, got {self.selection!r}")
        if self.critic not in CRITICS:
            raise ValueError(f"search.critic must be one of {', '.join(CRITICS)} (or logprob, "
                             f"frozen's old name), got {self.critic!r}")
        self._check_leaf_value()
        i, _, n = self.shard.partition("/")
        if not (i.isdigit() and n.isdigit() and int(i) < int(n)):
            raise ValueError(f"search.shard must look like i/n with 0 <= i < n, got {self.shard!r}")
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"search.alpha must be in [0, 1], got {self.alpha}")
        if not 0 <= self.listed <= self.k:
            raise ValueError(f"search.listed must be in [0, k={self.k}], got {self.listed}")
        for name in ("simulations", "k", "oversample", "max_depth", "trees_per_batch"):
            if getattr(self, name) < 1:
                raise ValueError(f"search.{name} must be >= 1")
        if self.critic != "none" and self.k > MAX_ACTIONS:
            raise ValueError(f"search.k is {self.k}, but the frozen critic (also round 1's with "
                             f"search.critic=learned) ranks at most "
                             f"{MAX_ACTIONS} actions (one letter each); lower search.k or "
                             "set search.critic: none")

    def _check_leaf_value(self) -> None:
        if self.leaf_value not in ("rollout", "critic", "mix"):
            raise ValueError("search.leaf_value must be rollout, critic or mix, got "
                             f"{self.leaf_value!r}")
        if self.leaf_value != "rollout" and self.critic == "none":
            raise ValueError(f"search.leaf_value {self.leaf_value} needs a critic: "
                             "search.critic is none")
        if not self.verifier and self.leaf_value != "critic":
            raise ValueError("search.verifier false (verifier-free search) needs "
                             "search.leaf_value critic: rollouts read the env's reward")
        if not self.verifier and self.finish and self.critic != "learned":
            raise ValueError("search.verifier false with search.finish needs search.critic "
                             "learned: the endings are valued by the critic, and the frozen "
                             "one only ranks siblings")

    @property
    def shard_index(self) -> tuple[int, int]:
        i, _, n = self.shard.partition("/")
        return int(i), int(n)
