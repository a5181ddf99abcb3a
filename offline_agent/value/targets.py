"""What the value model learns from a stored tree: one target and weight per child, pure.

A child is the action taken at its parent's state. Its target is the return search measured
for it: a terminal child's reward (exact: the env scored the episode's end), a visited
child's realized_sum / visits (a Monte Carlo mean of that many returns, so weighted by its
visit count). Realized: each return the policy's own playout earned, not the best listed
ending search.finish backs up, which would teach the critic that going on is as good as the
best ending reachable from there (docs/architecture.md). An unvisited
non-terminal child has no return yet: no target. A terminal child weighs max(visits, 1): its
value is known even when never selected.

Endings: at every stored state, each action the env lists that would end the episode there
has an exact return too, its reward (value/endings.py reads them on the stored snapshots).
Search tried them (`search.finish`) but keeps only the best as a number, not as a child, so
without them the critic saw "buy" only where a proposal happened to write it: a few hundred
targets for the decision inference search most needs, whether to end now. Each is a target of
weight 1 for (state, ending action), a `Target` without a node (`action` its text); an ending
whose text a terminal child of that state already has (up to whitespace, search's
`action_key` of the text) is left to the child.

Children are grouped by parent (a `Family`): one forward of the parent's prompt with every
child's action as a branch scores them all (value_model.py). Validation holds out whole
tasks (`split_tasks`), so no held-out target shares a prompt with a trained one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from offline_agent.search.mcts import action_key


class StoredChild(Protocol):
    """What targets read of a stored node (a storage NodeRow has these fields)."""

    node_id: int
    parent_id: int | None
    action: str | None
    visits: int
    realized_sum: float
    terminal: bool
    reward: float | None


@dataclass(frozen=True)
class Target:
    node_id: int | None  # None: an ending no node holds (`action` is its text)
    value: float  # the return to predict
    weight: float  # how many returns it stands for
    action: str | None = None  # an ending's text; None: the node's own action


@dataclass(frozen=True)
class Family:
    """The children with a target of one expanded node (`parent_id`), in node id order."""

    parent_id: int
    children: list[Target]


def target(child: StoredChild) -> Target | None:
    """The child's target and weight, or None (an unvisited non-terminal child)."""
    if child.terminal:
        reward = child.reward if child.reward is not None else 0.0
        return Target(child.node_id, reward, float(max(child.visits, 1)))
    if child.visits < 1:
        return None
    return Target(child.node_id, child.realized_sum / child.visits, float(child.visits))


def families(nodes: Sequence[StoredChild],
             endings: Mapping[int, Sequence[tuple[str, float]]] | None = None) -> list[Family]:
    """Every node of a tree with a target: its children's, then the (action text, reward) of
    each ending `endings` lists at its state that no terminal child of it took."""
    by_parent: dict[int, list[Target]] = {}
    taken: dict[int, set[str]] = {}
    for node in sorted(nodes, key=lambda n: n.node_id):
        if node.parent_id is not None and (t := target(node)) is not None:
            by_parent.setdefault(node.parent_id, []).append(t)
            if node.terminal:
                taken.setdefault(node.parent_id, set()).add(action_key(node.action or "", None))
    for node_id, found in (endings or {}).items():
        for text, reward in found:
            if action_key(text, None) not in taken.get(node_id, set()):
                by_parent.setdefault(node_id, []).append(Target(None, reward, 1.0, text))
    return [Family(p, kids) for p, kids in sorted(by_parent.items())]


def seeded_order(task_ids: Sequence[str], seed: int) -> list[str]:
    """The distinct task ids in a seeded hash order (stable across processes)."""
    return sorted(set(task_ids), key=lambda t: hashlib.md5(f"{seed}:{t}".encode()).hexdigest())


def split_tasks(task_ids: Sequence[str], holdout: float, seed: int) -> tuple[list[str], list[str]]:
    """(train, validation) task ids: a seeded hash order, its last round(holdout * n) held out
    (at least one when holdout > 0 and there are two tasks or more)."""
    order = seeded_order(task_ids, seed)
    n_val = round(holdout * len(order))
    if holdout > 0 and len(order) > 1:
        n_val = min(max(n_val, 1), len(order) - 1)
    cut = len(order) - n_val
    return sorted(order[:cut]), sorted(order[cut:])


def weighted_mse(pred: Sequence[float], targets: Sequence[Target]) -> float:
    """sum w (v - t)^2 / sum w: the loss the fit minimises, in plain Python for reports."""
    total = sum(t.weight for t in targets)
    return sum(t.weight * (p - t.value) ** 2 for p, t in zip(pred, targets)) / max(total, 1e-12)
