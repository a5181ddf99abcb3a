"""Search at inference (eval.mcts, the paper's "+MCTS" rows): MCTS on a test task with the
policy being evaluated and a critic, never reading the env's reward, then one episode played
for real.

The search is verifier-free (`SearchConfig.verifier` false): the env's ending tools are never
executed, leaves are valued by the critic, no rollout runs. After the simulation budget the
agent commits: the most-visited path from the root is played once in a fresh env, and the
policy continues greedily from its end if that did not end the episode. Only that episode's
reward counts, so the env's verifier runs once per task (an env that declares its
`ending_tools`; docs/architecture.md). Trees are searched `trees_per_batch` at a time by the
batched Searcher, and each group's committed episodes are played together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from offline_agent.envs.base import Env
from offline_agent.policy.base import Policy
from offline_agent.rollout import run_episodes
from offline_agent.search.config import SearchConfig
from offline_agent.search.mcts import Node, Tree
from offline_agent.search.searcher import Searcher
from offline_agent.types import Task, Trajectory

FROZEN = "frozen"  # the frozen critic's search.critic name, used when the run has none


def inference_config(search: SearchConfig, simulations: int) -> SearchConfig:
    """The run's search settings, verifier-free: leaves valued by the critic (the frozen one
    where search.critic is none), no ending tried on snapshots, `simulations` per task."""
    critic = FROZEN if search.critic == "none" else search.critic
    return replace(search, simulations=simulations, verifier=False, finish=False,
                   leaf_value="critic", critic=critic)


def most_visited_path(tree: Tree) -> list[Node]:
    """From the root (left out), the most-visited child at each step (ties: the earlier
    child), down to a node with no visited child."""
    path, node = [], tree.root
    while node.children:
        child = max((tree.nodes[i] for i in node.children), key=lambda c: c.visits)
        if not child.visits:
            break
        path.append(child)
        node = child
    return path


def search_and_commit(policy: Policy, make_env: Callable[[], Env], tasks: list[Task],
                      searcher: Searcher, batch_size: int,
                      on_done: Callable[[Trajectory], None],
                      progress: bool = True) -> dict[str, float]:
    """Search each task (verifier-free: `searcher.cfg.verifier` must be false) and play its
    committed episode; `on_done` gets each episode as it ends. Returns the searches' totals."""
    if searcher.cfg.verifier:
        raise ValueError("inference search must be verifier-free (SearchConfig.verifier false)")
    totals = {"seconds": 0.0, "nodes": 0, "simulations": 0}
    group = searcher.cfg.trees_per_batch
    for start in range(0, len(tasks), group):
        chunk = tasks[start:start + group]
        trees = [Tree.new(t, make_env()) for t in chunk]
        stats = searcher.run(trees, lambda finished: None, progress=progress)
        for key in totals:
            totals[key] += stats[key]
        prefixes = [[(n.action, n.token_ids) for n in most_visited_path(t)] for t in trees]
        run_episodes(policy, make_env, chunk, temperature=0.0, seed=0, batch_size=batch_size,
                     on_done=on_done, prefixes=prefixes)
    return totals
