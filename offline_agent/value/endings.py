"""The exact returns of ending the episode at every stored state: the critic's ending targets.

At a stored node's state (its snapshot), each action the env lists that ends the episode is
tried and undone (search.mcts.finishing_steps: env steps, no model call) and its reward kept.
The critic fits them as targets of (state, ending action) (value/targets.py). The env's
reward is read here, at training time, as search's `finish` reads it; a critic fitted on them
never reads it at inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from offline_agent.envs.base import Env
from offline_agent.search.mcts import finishing_steps


class SnapshotNode(Protocol):
    """What is read of a stored node (a storage NodeRow loaded with its snapshot)."""

    node_id: int
    terminal: bool
    snapshot: dict | None


def stored_endings(env: Env, nodes: Sequence[SnapshotNode]) -> dict[int, list[tuple[str, float]]]:
    """node id -> (action text, reward) of each listed ending at that node's state, for every
    non-terminal node with a snapshot; a node where nothing ends the episode is left out."""
    out: dict[int, list[tuple[str, float]]] = {}
    for node in nodes:
        if node.terminal or node.snapshot is None:
            continue
        env.restore(node.snapshot)
        found = [(step.action, step.reward) for step, _ in finishing_steps(env)]
        if found:
            out[node.node_id] = found
    return out
