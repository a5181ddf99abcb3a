"""The exact returns of ending the episode at stored states and one listed step past them: the
critic's ending targets.

At a stored node's state (its snapshot), each action the env lists that ends the episode is
tried and undone (search.mcts.finishing_steps: env steps, no model call) and its reward kept.
One step further (`lookahead_endings`): from every state search visited, each listed action
that no child took and that neither ends the episode nor is refused is stepped, and the
endings the state it leads to lists are tried there. The stored children cover the few
actions the policy proposed; the listed steps cover what the page offered beside them (each
MiniShop result, each option), so the critic sees the reward of buying after choices the
policy rarely makes, which is what verifier-free search must judge (`search.finish` at
inference values a child by the critic's value of ending after it). The critic fits them as
targets of (state, ending action) (critic/targets.py). The env's reward is read here, at
training time, as search's `finish` reads it; a critic fitted on them never reads it at
inference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from offline_agent.envs.base import Env
from offline_agent.rollout import make_step
from offline_agent.search.mcts import action_key, finishing_steps
from offline_agent.types import Step


class SnapshotNode(Protocol):
    """What is read of a stored node (a storage NodeRow loaded with its snapshot)."""

    node_id: int
    parent_id: int | None
    action: str | None
    visits: int
    terminal: bool
    snapshot: dict | None


@dataclass(frozen=True)
class Lookahead:
    """A state one listed step past a stored node, and the endings' (text, reward) there."""

    node_id: int  # the stored node the step leaves
    step: Step  # the listed action and what the env answered
    endings: list[tuple[str, float]]


def endings_here(env: Env) -> list[tuple[str, float]]:
    """(text, reward) of each listed ending at the env's current state (tried and undone)."""
    return [(step.action, step.reward) for step, _ in finishing_steps(env)]


def stored_endings(env: Env, nodes: Sequence[SnapshotNode]) -> dict[int, list[tuple[str, float]]]:
    """node id -> (action text, reward) of each listed ending at that node's state, for every
    non-terminal node with a snapshot; a node where nothing ends the episode is left out."""
    out: dict[int, list[tuple[str, float]]] = {}
    for node in nodes:
        if node.terminal or node.snapshot is None:
            continue
        env.restore(node.snapshot)
        if found := endings_here(env):
            out[node.node_id] = found
    return out


def lookahead_endings(env: Env, nodes: Sequence[SnapshotNode]) -> list[Lookahead]:
    """From every visited non-terminal node with a snapshot, each listed action no child of it
    took that leads, without ending or being refused, to a state listing endings: that step
    and the endings' rewards there, in node then listed order."""
    taken: dict[int, set[str]] = {}
    for node in nodes:
        if node.parent_id is not None:
            taken.setdefault(node.parent_id, set()).add(action_key(node.action or "", None))
    out = []
    for node in nodes:
        if node.terminal or node.snapshot is None or node.visits < 1:
            continue
        env.restore(node.snapshot)
        for text in env.available_actions():
            if action_key(text, None) in taken.get(node.node_id, set()):
                continue
            env.restore(node.snapshot)
            call, result = env.act(text)
            if not (result.done or result.invalid) and (found := endings_here(env)):
                out.append(Lookahead(node.node_id, make_step(text, call, result), found))
    return out
