"""A stored child's value Q for step-pair mining: Agent Q's eq. 10, the one definition.

The SQL pass (storage/step_pairs.py, `valued` CTE) computes this same expression over every node
at once; tests/test_mining.py checks the two agree row for row (the Python oracle calls this).

    terminal child:     Q = its env reward (0 if none was recorded)
    visited child:      Q = alpha * Q_mcts + (1 - alpha) * critic,  Q_mcts = value_sum / visits
    unvisited child:    Q = alpha * ending + (1 - alpha) * critic   (ending: 0 if none; such a
                        child counts only with mine.min_visits 0)

`critic` is the child's critic score, or 1/(number of siblings) without one, as in selection.
With a learned critic fitted (search.critic: learned, stage `critic`), `critic` is its value
V(state, action) of the child instead (offline_agent/value/; the stage predicts every node of
the round's trees, and mining passes those predictions in place of the stored scores).

Why a terminal child is worth its reward alone: eq. 10 mixes an estimate of the return
(Q_mcts, a mean over a few rollouts) with the critic's guess because the return is unknown.
A terminal child's return is known exactly: the env scored the episode's end. Mixing the
critic in would rank a `buy` the env paid 1 below a half-explored sibling the critic liked,
and a failed `submit` above 0. Search values terminal children the same way
(offline_agent/search/mcts.py `child_value`), so the tree's selection and its mined pairs
agree on what a finished episode is worth. Unvisited children differ on purpose: search
orders first visits by the critic (or the ending) alone; mining, where such a child counts
at all, weighs the one return it knows (its ending) against the critic like any other.

`alpha` comes from `mine.alpha`, not `search.alpha`: the two are separate keys on purpose.
search.alpha steers which tree is grown; mine.alpha values a tree already stored, so a
changed mine.alpha re-mines with `--force` without searching again. Both default to 0.5,
Agent Q's single alpha.
"""

from __future__ import annotations

from typing import Protocol


class Child(Protocol):
    """What eq. 10 reads of a stored child (a storage NodeRow has these fields)."""

    terminal: bool
    reward: float | None
    visits: int
    value_sum: float
    ending: float | None
    critic_score: float | None


def child_value(child: Child, siblings: int, alpha: float, learned: float | None = None) -> float:
    """Q of one child of a node with `siblings` children (itself included); `learned`: the
    learned critic's value of it, which replaces the stored score; see the module."""
    if child.terminal:
        return child.reward if child.reward is not None else 0.0
    critic = next((c for c in (learned, child.critic_score) if c is not None), 1.0 / siblings)
    if child.visits > 0:
        q_mcts = child.value_sum / child.visits
    else:
        q_mcts = child.ending if child.ending is not None else 0.0
    return alpha * q_mcts + (1 - alpha) * critic
