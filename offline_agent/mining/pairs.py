"""Step-level pairs (Agent Q eq. 10) and outcome pairs, as plain Python.

Step pairs: at an expanded node every child is valued Q = alpha*Q_mcts + (1-alpha)*critic
score, where Q_mcts is a terminal child's reward, else the mean return of a visited child,
else (counted only with min_visits 0) its ending one listed step on, or 0. A child without a
critic score gets 1/(number of siblings), as in selection. Siblings whose Q differ by at
least theta make a pair, the higher one chosen; an invalid action is never chosen and is
rejected only if `invalid_rejected`. The store runs the same rules in SQL over all nodes at
once (Store.step_pairs); `step_pairs` here is the oracle it is tested against.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from dataclasses import dataclass

from offline_agent.mining.balance import margin_bin, pair_key, round_robin
from offline_agent.mining.config import MineConfig
from offline_agent.types import SUCCESS


@dataclass(frozen=True)
class StepPair:
    task_id: str
    env: str
    node_id: int  # the expanded node (the state both actions start from)
    chosen_id: int
    rejected_id: int
    chosen_q: float
    rejected_q: float
    margin: float
    bin: int


def child_q(row: dict, siblings: int, cfg: MineConfig) -> float:
    """Eq. 10 for one stored child row (see the module doc for Q_mcts)."""
    if row["terminal"]:
        q_mcts = row["reward"] or 0.0
    elif row["visits"] > 0:
        q_mcts = row["value_sum"] / row["visits"]
    else:
        q_mcts = row["ending"] if row["ending"] is not None else 0.0
    critic = row["critic_score"] if row["critic_score"] is not None else 1.0 / siblings
    return cfg.alpha * q_mcts + (1 - cfg.alpha) * critic


def step_candidates(rows: list[dict], cfg: MineConfig) -> list[StepPair]:
    """Every sibling pair whose Q differs by >= theta. `rows`: node rows with task_id, env."""
    children = defaultdict(list)
    for row in rows:
        if row["parent_id"] is not None:
            children[row["parent_id"]].append(row)
    out = []
    for parent, kids in children.items():
        valued = [(row, child_q(row, len(kids), cfg)) for row in kids
                  if (row["terminal"] or row["visits"] >= cfg.min_visits)
                  and (cfg.invalid_rejected or not row["invalid"])]
        for c, qc in valued:
            if c["invalid"]:
                continue
            for r, qr in valued:
                if r is not c and qc - qr >= cfg.theta:
                    out.append(StepPair(c["task_id"], c["env"], parent, c["node_id"],
                                        r["node_id"], qc, qr, qc - qr,
                                        margin_bin(qc - qr, cfg.margin_bins)))
    return out


def balance_step_pairs(pairs: list[StepPair], cfg: MineConfig) -> list[StepPair]:
    """Caps per node, per task, then in all (across envs), round-robin over margin bins."""
    def key(p: StepPair) -> str:
        return pair_key(cfg.seed, p.chosen_id, p.rejected_id)

    pairs = round_robin(pairs, lambda p: p.node_id, lambda p: (p.bin,), key,
                        cfg.max_pairs_per_node)
    pairs = round_robin(pairs, lambda p: p.task_id, lambda p: (p.bin,), key,
                        cfg.max_pairs_per_task)
    if cfg.max_pairs:
        pairs = round_robin(pairs, lambda p: None, lambda p: (p.env, p.bin), key, cfg.max_pairs)
    return sorted(pairs, key=lambda p: (p.task_id, p.node_id, p.chosen_id, p.rejected_id))


def step_pairs(rows: list[dict], cfg: MineConfig) -> list[StepPair]:
    return balance_step_pairs(step_candidates(rows, cfg), cfg)


def action_sequence(steps: list[dict]) -> str:
    """What makes two episodes the same for deduplication: their actions, in order."""
    return json.dumps([s["action"] for s in steps])


def _order(seed: int, traj: dict) -> str:
    return hashlib.md5(f"{seed}:{traj['traj_id']}".encode()).hexdigest()


def distinct_episodes(trajs: list[dict]) -> list[dict]:
    """One trajectory per (task, action sequence): the one with the lowest id."""
    seen, out = set(), []
    for t in sorted(trajs, key=lambda t: t["traj_id"]):
        k = (t["task_id"], action_sequence(t["steps"]))
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


def outcome_pairs(trajs: list[dict], per_task: int, seed: int) -> list[tuple[dict, dict]]:
    """(success, failure) trajectory pairs of one task each, distinct episodes only.

    Failures in seeded order, each used once; successes shortest first (the paper prefers
    efficient solutions), reused in turn when a task has fewer successes than failures."""
    by_task = defaultdict(list)
    for t in distinct_episodes(trajs):
        by_task[t["task_id"]].append(t)
    out = []
    for task_id in sorted(by_task):
        group = by_task[task_id]
        wins = sorted((t for t in group if t["reward"] >= SUCCESS),
                      key=lambda t: (len(t["steps"]), _order(seed, t)))
        losses = sorted((t for t in group if t["reward"] < SUCCESS), key=lambda t: _order(seed, t))
        if wins:
            out += [(wins[i % len(wins)], loss) for i, loss in enumerate(losses[:per_task])]
    return out
