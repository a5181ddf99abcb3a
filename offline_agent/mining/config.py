"""Mining settings. Lives beside the algorithm so `offline_agent` never imports `pipelines`."""

from __future__ import annotations

from dataclasses import dataclass, field

from offline_agent.config_fields import config_field


@dataclass
class MineConfig:
    alpha: float = config_field(0.5, "MCTS weight in a child's value Q = alpha*Q_mcts + "
                                     "(1-alpha)*critic score (Agent Q eq. 10); a terminal child "
                                     "is worth its reward")
    theta: float = config_field(0.1, "least Q difference between the chosen and the rejected "
                                     "sibling")
    min_visits: int = config_field(1, "visits a non-terminal child needs to count; 0 also counts "
                                      "unvisited children (their Q_mcts is their ending, else 0)")
    invalid_rejected: bool = config_field(True, "invalid actions may be rejected examples (never "
                                                "chosen)")
    max_pairs_per_node: int = config_field(4, "most step pairs taken at one expanded node")
    max_pairs_per_task: int = config_field(16, "most step pairs taken from one task's tree")
    max_pairs: int = config_field(0, "most step pairs in all, balanced across envs and margin "
                                     "bins; 0: no limit")
    margin_bins: list = field(default_factory=lambda: [0.25, 0.5], metadata={
        "help": "inner edges of the margin bins; every cap takes pairs round-robin across "
                "bins, so near-ties and clear wins are both kept"})
    trajectory_pairs_per_task: int = config_field(2, "most (success, failure) outcome pairs per "
                                                     "task")
    hindsight: bool = config_field(True, "relabel failed episodes with the goal they reached "
                                         "(Env.achieved_task), kept only if a replay scores 1")
    rft_hindsight: bool = config_field(True, "relabeled successes join the RFT set")
    seed: int = config_field(0, "seed of every random choice in mining (which pairs a cap keeps)")

    def __post_init__(self):
        if not 0 <= self.alpha <= 1:
            raise ValueError(f"mine.alpha must be in [0, 1], got {self.alpha}")
        if self.theta < 0:
            raise ValueError(f"mine.theta must be >= 0, got {self.theta}")
        for name in ("min_visits", "max_pairs", "trajectory_pairs_per_task"):
            if getattr(self, name) < 0:
                raise ValueError(f"mine.{name} must be >= 0")
        for name in ("max_pairs_per_node", "max_pairs_per_task"):
            if getattr(self, name) < 1:
                raise ValueError(f"mine.{name} must be >= 1")
        edges = self.margin_bins
        if not all(isinstance(e, (int, float)) for e in edges) or sorted(edges) != edges:
            raise ValueError(f"mine.margin_bins must be increasing numbers, got {edges}")
