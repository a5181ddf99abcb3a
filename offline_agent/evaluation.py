"""Evaluation: a policy's greedy episodes on held-out tasks, and the statistics that say how
sure a comparison is.

The statistics are pure functions over per-task numbers. Rates over tasks get a Wilson
interval (right at 0 or 1 and for small n, where the normal one is not); means and ratios
get a percentile bootstrap over tasks; a policy against base gets a *paired* bootstrap of
the per-task differences, because both ran the same tasks and most of the variance is in
the tasks (an easy task is solved by both), which an unpaired interval would count twice.

numpy and the rollout (jinja2) are imported where used: the config imports EvalConfig, and
`offline-agent status` should stay quick.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from offline_agent.config_fields import HELP, config_field
from offline_agent.policy.base import Policy
from offline_agent.types import Task, Trajectory, step_to_dict
from storage.rows import EvalEpisodeRow

MODE = "greedy"  # the mode evaluation always plays (greedy_episodes): eval_episodes.mode
MCTS_MODE = "mcts"  # eval.mcts: verifier-free search, then the committed episode (search/inference.py)
MCTS_COMMITS = ("path", "step")  # eval.mcts_commit: how search at inference commits
BASE = "base"  # the policy name of the untrained model, which every other is compared to
TEST = "test"  # the split of the held-out tasks: the only one the report's tables read
VAL = "val"  # the split of validation tasks (env.val_tasks): never in the test table
Z95 = 1.959963984540054  # two-sided 95% normal quantile
LEVEL = 0.95


@dataclass
class EvalConfig:
    # both only shape the intervals the report computes from the episodes: not hashed
    bootstrap: int = config_field(2000, "bootstrap resamples of the tasks for the "
                                        "95% intervals of means and of paired "
                                        "differences", hashed=False)
    seed: int = config_field(0, "seed of the bootstrap resampling (same seed, same "
                                "intervals)", hashed=False)
    configs_tried: int = config_field(1, "configurations tried to reach this one "
                                         "(e.g. on validation), shown beside every "
                                         "p-value", hashed=False)
    mcts: bool = config_field(False, "also play policies with verifier-free search at "
                                     "inference, the +MCTS rows: the mcts stage, after the last "
                                     "round's eval (docs/evaluation.md)")
    mcts_policies: list[str] = field(default_factory=list, metadata={
        HELP: "policies eval.mcts searches with, as the report names them (base, grpo, "
              "dpo_step@2, ...), or best: the one best on validation; []: every one"})
    mcts_simulations: int = config_field(1, "simulations of eval.mcts's search: per step (commit "
                                            "step), or per test task (commit path)")
    mcts_commit: str = config_field("step", "how eval.mcts commits: step (search again before "
                                            "every action, commit the most-visited one) or path "
                                            "(search once, play the most-visited path)")
    mcts_tasks: int = config_field(0, "eval.mcts searches only the first N test tasks (0: all); "
                                      "its rows are paired with greedy on those tasks")

    def __post_init__(self):
        if self.bootstrap < 100:
            raise ValueError("eval.bootstrap must be >= 100 (fewer resamples give noisy "
                             "interval ends)")
        if self.configs_tried < 1:
            raise ValueError("eval.configs_tried must be >= 1 (this run's config counts)")
        if self.mcts_simulations < 1 or self.mcts_tasks < 0:
            raise ValueError("eval.mcts_simulations must be >= 1 and eval.mcts_tasks >= 0")
        if self.mcts_commit not in MCTS_COMMITS:
            raise ValueError(f"eval.mcts_commit must be one of {MCTS_COMMITS}, got "
                             f"{self.mcts_commit!r}")

    def mcts_test_tasks(self, tasks: list[Task]) -> list[Task]:
        """The test tasks search at inference plays: the first `mcts_tasks` (all where 0)."""
        return tasks[:self.mcts_tasks] if self.mcts_tasks else tasks


# ---- statistics (pure) -----------------------------------------------------------------------
def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """Wilson score interval of a binomial rate; None when there are no trials."""
    if n == 0:
        return None
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes out of {n} trials")
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_ci(values: Sequence[float], weights: Sequence[float] | None = None,
                 samples: int = 2000, seed: int = 0) -> tuple[float, float] | None:
    """Percentile 95% interval of sum(values) / sum(weights) (weights None: the mean) over
    the tasks resampled with replacement. Per-task pairs keep a ratio's clustering: the
    invalid-action rate resamples episodes, not the correlated steps inside them."""
    import numpy as np

    num = np.asarray(values, dtype=float)
    if num.size == 0:
        return None
    den = np.ones_like(num) if weights is None else np.asarray(weights, dtype=float)
    if den.shape != num.shape or (den <= 0).any():
        raise ValueError("weights must be positive, one per value")
    idx = np.random.default_rng(seed).integers(0, num.size, size=(samples, num.size))
    stats = num[idx].sum(axis=1) / den[idx].sum(axis=1)
    lo, hi = np.quantile(stats, [(1 - LEVEL) / 2, (1 + LEVEL) / 2])
    return float(lo), float(hi)


def paired_difference(a: Sequence[float], b: Sequence[float], samples: int = 2000,
                      seed: int = 0) -> tuple[float, tuple[float, float] | None]:
    """Mean of a - b over the same tasks (index i of both is task i) and its paired
    bootstrap 95% interval."""
    import numpy as np

    if len(a) != len(b):
        raise ValueError(f"paired values differ in length: {len(a)} vs {len(b)}")
    diff = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if diff.size == 0:
        return float("nan"), None
    return float(diff.mean()), bootstrap_ci(diff, samples=samples, seed=seed)


def mcnemar_exact(wins: int, losses: int) -> float:
    """Two-sided exact McNemar test (a sign test on the discordant tasks): `wins` tasks only
    the policy solved, `losses` only the other; under no difference each discordant task is a
    fair coin, so p = P(Binomial(wins + losses, 1/2) at least as far from the middle), capped
    at 1. Tasks both solved or both failed say nothing about the difference; none
    discordant: 1.0."""
    if wins < 0 or losses < 0:
        raise ValueError(f"negative counts: {wins} wins, {losses} losses")
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1))
    return min(1.0, 2 * tail / 2 ** n)


# ---- summaries ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Episode:
    """What the statistics need of one evaluation episode."""

    task_id: str
    reward: float
    success: bool
    steps: int
    invalid: int
    actions: tuple[str, ...] = ()  # what the policy wrote, step by step

    @classmethod
    def from_row(cls, row: EvalEpisodeRow) -> Episode:
        """From a stored eval_episodes row (steps as step dicts)."""
        return cls(row.task_id, float(row.reward), bool(row.success),
                   len(row.steps), sum(bool(s["invalid"]) for s in row.steps),
                   tuple(s["action"] for s in row.steps))

    @classmethod
    def from_trajectory(cls, trajectory: Trajectory) -> Episode:
        return cls(trajectory.task_id, float(trajectory.reward), trajectory.success,
                   len(trajectory.steps), sum(s.invalid for s in trajectory.steps),
                   tuple(s.action for s in trajectory.steps))


def _ci(interval: tuple[float, float] | None) -> list[float] | None:
    return None if interval is None else [round(interval[0], 4), round(interval[1], 4)]


def rates(episodes: Sequence[Episode]) -> dict:
    """Tasks, success rate, mean reward, invalid-action rate (invalid steps over all steps)
    and mean steps; None where there is nothing to divide by. The one place these are
    computed: the evaluation summary adds intervals, the baseline stage stores them as is."""
    n = len(episodes)
    total_steps = sum(e.steps for e in episodes)
    return {
        "n_tasks": n,
        "success_rate": round(sum(e.success for e in episodes) / n, 4) if n else None,
        "mean_reward": round(sum(e.reward for e in episodes) / n, 4) if n else None,
        "invalid_rate": round(sum(e.invalid for e in episodes) / total_steps, 4)
        if total_steps else None,
        "mean_steps": round(total_steps / n, 3) if n else None,
    }


def summarize(episodes: Sequence[Episode], cfg: EvalConfig) -> dict:
    """`rates`, each with its 95% interval (`ci95` is the success rate's)."""
    point = rates(episodes)
    boot = dict(samples=cfg.bootstrap, seed=cfg.seed)
    wins = sum(e.success for e in episodes)
    return {
        "n_tasks": point["n_tasks"],
        "success_rate": point["success_rate"],
        "ci95": _ci(wilson(wins, len(episodes))),
        "mean_reward": point["mean_reward"],
        "mean_reward_ci95": _ci(bootstrap_ci([e.reward for e in episodes], **boot)),
        "invalid_rate": point["invalid_rate"],
        "invalid_rate_ci95": _ci(bootstrap_ci([e.invalid for e in episodes],
                                              [e.steps for e in episodes], **boot)),
        "mean_steps": point["mean_steps"],
        "mean_steps_ci95": _ci(bootstrap_ci([e.steps for e in episodes], **boot)),
    }


def compare(policy: Sequence[Episode], base: Sequence[Episode], cfg: EvalConfig) -> dict:
    """Policy minus base on the tasks both ran: success rate and mean reward, each with a
    paired bootstrap 95% interval; the discordant tasks (wins: only the policy solved it,
    losses: only base) and their exact McNemar p-value, with eval.configs_tried beside it."""
    mine = {e.task_id: e for e in policy}
    theirs = {e.task_id: e for e in base}
    common = sorted(mine.keys() & theirs.keys())
    boot = dict(samples=cfg.bootstrap, seed=cfg.seed)
    success, success_ci = paired_difference([mine[t].success for t in common],
                                            [theirs[t].success for t in common], **boot)
    reward, reward_ci = paired_difference([mine[t].reward for t in common],
                                          [theirs[t].reward for t in common], **boot)
    return {
        "n_tasks": len(common),
        "success_rate": round(success, 4) if common else None,
        "ci95": _ci(success_ci),
        "mean_reward": round(reward, 4) if common else None,
        "mean_reward_ci95": _ci(reward_ci),
        **discordance([mine[t].success for t in common], [theirs[t].success for t in common]),
        "configs_tried": cfg.configs_tried,
        **changed_episodes([mine[t].actions for t in common], [theirs[t].actions for t in common]),
    }


def changed_episodes(a: Sequence[tuple[str, ...]], b: Sequence[tuple[str, ...]]) -> dict:
    """The tasks whose greedy episode differs from base's in any action, with a Wilson interval.

    Success moves only when a changed action changes the outcome; on a few tasks and a few
    optimizer steps this says whether training changed the agent's behaviour at all. Greedy
    play in a deterministic env takes both to the same states up to the first difference, so
    each changed episode is one state where the two policies choose differently."""
    changed = sum(x != y for x, y in zip(a, b))
    n = len(a)
    return {"changed": changed, "changed_rate": round(changed / n, 4) if n else None,
            "changed_ci95": _ci(wilson(changed, n))}


def discordance(a: Sequence[bool], b: Sequence[bool]) -> dict:
    """Wins (a solved, b not), losses (b solved, a not) over paired tasks, and McNemar's p."""
    wins = sum(x and not y for x, y in zip(a, b))
    losses = sum(y and not x for x, y in zip(a, b))
    return {"wins": wins, "losses": losses, "mcnemar_p": mcnemar_exact(wins, losses)}


# ---- running -----------------------------------------------------------------------------------
def episode_row(trajectory: Trajectory, policy: str, mode: str) -> EvalEpisodeRow:
    """A finished episode of `policy` played in `mode`, as its eval_episodes row."""
    return EvalEpisodeRow(policy=policy, mode=mode, task_id=trajectory.task_id,
                          steps=[step_to_dict(s) for s in trajectory.steps],
                          reward=trajectory.reward, success=trajectory.success)


def greedy_episodes(policy: Policy, make_env: Callable, tasks: list[Task], batch_size: int,
                    on_done: Callable[[Trajectory], None]) -> list[Trajectory]:
    """Play every task greedily (temperature 0), `batch_size` episodes in play at once
    (run_episodes); `on_done` gets each episode as it ends, so a caller can commit it at once."""
    from offline_agent.rollout import run_episodes

    return run_episodes(policy, make_env, tasks, temperature=0.0, seed=0,
                        batch_size=batch_size, on_done=on_done)
