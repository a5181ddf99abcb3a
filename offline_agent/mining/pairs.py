"""Step-level pairs (Agent Q eq. 10) and outcome pairs, as plain Python.

Step pairs: at an expanded node every child is valued by eq. 10 (`value.child_value`: a
terminal child is worth its env reward, others alpha*Q_mcts + (1-alpha)*critic score).
Siblings whose Q differ by at least theta make a pair, the higher one chosen; an invalid
action is never chosen and is rejected only if `invalid_rejected`. The store runs the same
rules in SQL over all nodes at once (storage/step_pairs.py); `step_pairs` here is the oracle it is
tested against. Both take their settings as one StepPairParams (`step_params`).
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Protocol, TypeVar

from offline_agent.mining.balance import margin_bin, pair_key, round_robin
from offline_agent.mining.config import MineConfig
from offline_agent.mining.value import Child, child_value
from offline_agent.types import SUCCESS, StepPair, StepPairParams


class StoredChild(Child, Protocol):
    """A stored node as the oracle reads it (a storage NodeRow)."""

    node_id: int
    tree_id: int
    parent_id: int | None
    invalid: bool


class StoredEpisode(Protocol):
    """A stored episode as outcome pairs read it (a storage TrajectoryRow)."""

    traj_id: int
    task_id: str
    steps: list[dict]
    reward: float


E = TypeVar("E", bound=StoredEpisode)


def step_params(cfg: MineConfig) -> StepPairParams:
    """The step-pair settings of a MineConfig, as the SQL pass and the oracle take them."""
    return StepPairParams(
        alpha=cfg.alpha, theta=cfg.theta, min_visits=cfg.min_visits,
        invalid_rejected=cfg.invalid_rejected, max_pairs_per_node=cfg.max_pairs_per_node,
        max_pairs_per_task=cfg.max_pairs_per_task, max_pairs=cfg.max_pairs,
        margin_bins=tuple(cfg.margin_bins), seed=cfg.seed)


def step_candidates(nodes: Sequence[StoredChild], tasks: Mapping[int, tuple[str, str]],
                    params: StepPairParams,
                    critic: Mapping[int, float] | None = None) -> list[StepPair]:
    """Every sibling pair whose Q differs by >= theta. `tasks`: tree id -> (task id, env);
    `critic`: node id -> the learned critic's value (value.child_value's `learned`)."""
    critic = critic or {}
    children = defaultdict(list)
    for row in nodes:
        if row.parent_id is not None:
            children[row.parent_id].append(row)
    out = []
    for parent, kids in children.items():
        valued = [(row, child_value(row, len(kids), params.alpha, critic.get(row.node_id)))
                  for row in kids
                  if (row.terminal or row.visits >= params.min_visits)
                  and (params.invalid_rejected or not row.invalid)]
        for c, qc in valued:
            if c.invalid:
                continue
            task_id, env = tasks[c.tree_id]
            for r, qr in valued:
                if r is not c and qc - qr >= params.theta:
                    out.append(StepPair(task_id, env, parent, c.node_id, r.node_id, qc, qr,
                                        qc - qr, margin_bin(qc - qr, params.margin_bins)))
    return out


def balance_step_pairs(pairs: list[StepPair], params: StepPairParams) -> list[StepPair]:
    """Caps per node, per task, then in all (across envs), round-robin over margin bins."""
    def key(p: StepPair) -> str:
        return pair_key(params.seed, p.chosen_id, p.rejected_id)

    pairs = round_robin(pairs, lambda p: p.node_id, lambda p: (p.bin,), key,
                        params.max_pairs_per_node)
    pairs = round_robin(pairs, lambda p: p.task_id, lambda p: (p.bin,), key,
                        params.max_pairs_per_task)
    if params.max_pairs:
        pairs = round_robin(pairs, lambda p: None, lambda p: (p.env, p.bin), key,
                            params.max_pairs)
    return sorted(pairs, key=lambda p: (p.task_id, p.node_id, p.chosen_id, p.rejected_id))


def step_pairs(nodes: Sequence[StoredChild], tasks: Mapping[int, tuple[str, str]],
               params: StepPairParams,
               critic: Mapping[int, float] | None = None) -> list[StepPair]:
    return balance_step_pairs(step_candidates(nodes, tasks, params, critic), params)


def action_sequence(steps: list[dict]) -> str:
    """What makes two episodes the same for deduplication: their actions, in order."""
    return json.dumps([s["action"] for s in steps])


def _order(seed: int, traj: StoredEpisode) -> str:
    return hashlib.md5(f"{seed}:{traj.traj_id}".encode()).hexdigest()


def distinct_episodes(trajs: Sequence[E]) -> list[E]:
    """One trajectory per (task, action sequence): the one with the lowest id."""
    seen, out = set(), []
    for t in sorted(trajs, key=lambda t: t.traj_id):
        k = (t.task_id, action_sequence(t.steps))
        if k not in seen:
            seen.add(k)
            out.append(t)
    return out


def outcome_pairs(trajs: Sequence[E], per_task: int, seed: int) -> list[tuple[E, E]]:
    """(success, failure) trajectory pairs of one task each, distinct episodes only.

    Failures in seeded order, each used once; successes shortest first (the paper prefers
    efficient solutions), reused in turn when a task has fewer successes than failures."""
    by_task = defaultdict(list)
    for t in distinct_episodes(trajs):
        by_task[t.task_id].append(t)
    out = []
    for task_id in sorted(by_task):
        group = by_task[task_id]
        wins = sorted((t for t in group if t.reward >= SUCCESS),
                      key=lambda t: (len(t.steps), _order(seed, t)))
        losses = sorted((t for t in group if t.reward < SUCCESS), key=lambda t: _order(seed, t))
        if wins:
            out += [(wins[i % len(wins)], loss) for i, loss in enumerate(losses[:per_task])]
    return out
