"""Search at inference (eval.mcts, the paper's "+MCTS" rows): MCTS on a test task with the
policy being evaluated and a critic, never reading the env's reward, then one episode played
for real.

The search is verifier-free (`SearchConfig.verifier` false): the env's ending tools are never
executed, leaves are valued by the critic, no rollout runs; with a learned critic and
`search.finish`, a state's listed endings are valued by the critic in place of the reward
`finish` reads in training search. How the agent commits
(`eval.mcts_commit`):

- `path`: one search of `simulations` per task, then the most-visited path from the root;
- `step`: `simulations` from the current state, commit the most-visited action, and search
  again from the state it leads to, keeping the subtree (Agent Q's live search: each choice
  is made at the root of a fresh search, where a critic ranks best), until an action ends
  the episode or the depth limit.

The committed actions are played once in a fresh env, and the policy continues greedily from
their end if they did not end the episode. Only that episode's reward counts, so the env's
verifier runs once per task (an env that declares its `ending_tools`; docs/architecture.md).
Trees are searched `trees_per_batch` at a time by the batched Searcher, and each group's
committed episodes are played together.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from offline_agent.envs.base import Env
from offline_agent.evaluation import MCTS_COMMITS
from offline_agent.policy.base import Policy
from offline_agent.rollout import run_episodes
from offline_agent.search.config import SearchConfig
from offline_agent.search.mcts import Node, Tree
from offline_agent.search.searcher import Searcher
from offline_agent.types import Task, Trajectory

FROZEN = "frozen"  # the frozen critic's search.critic name, used when the run has none


def inference_config(search: SearchConfig, simulations: int) -> SearchConfig:
    """The run's search settings, verifier-free: leaves valued by the critic (the frozen one
    where search.critic is none), `simulations` per task. With a learned critic, `finish` stays
    as the run set it: the endings a state lists are valued by the critic, never run; the
    frozen critic only ranks siblings, so it has no value of ending to give."""
    critic = FROZEN if search.critic == "none" else search.critic
    return replace(search, simulations=simulations, verifier=False, leaf_value="critic",
                   critic=critic, finish=search.finish and critic == "learned")


def most_visited_child(tree: Tree, node: Node) -> Node | None:
    """The child of `node` visited most (ties: the higher Q, then the earlier child); None if
    no child was visited."""
    children = [tree.nodes[i] for i in node.children]
    best = max(children, key=lambda c: (c.visits, c.q), default=None)
    return best if best is not None and best.visits else None


def most_visited_path(tree: Tree) -> list[Node]:
    """From the tree's base (left out), the most-visited child at each step, down to a node
    with no visited child."""
    path, node = [], tree.nodes[tree.base]
    while (child := most_visited_child(tree, node)) is not None:
        path.append(child)
        node = child
    return path


def committed(tree: Tree) -> list[Node]:
    """The actions the agent plays: those committed step by step (root to base, root left
    out), then the most-visited path on from the base."""
    return tree.path(tree.nodes[tree.base])[1:] + most_visited_path(tree)


def search_by_step(searcher: Searcher, trees: list[Tree], progress: bool) -> dict[str, float]:
    """Commit one action per round: `searcher.cfg.simulations` more from each tree's base, then
    its most-visited child becomes the base, until every base is terminal. Returns totals."""
    totals = {"seconds": 0.0, "nodes": 0, "simulations": 0}
    per_step, live = searcher.cfg.simulations, list(trees)
    while live:
        budget = replace(searcher.cfg, simulations=live[0].simulations_done + per_step)
        stepper = Searcher(searcher.policy, searcher.make_env, budget, searcher.critic)
        stats = stepper.run(live, lambda finished: None, progress=progress)
        for key in totals:
            totals[key] += stats[key]
        going = []
        for tree in live:
            child = most_visited_child(tree, tree.nodes[tree.base])
            if child is None:
                continue
            tree.base = child.id
            if not child.terminal:
                going.append(tree)
        live = going
    return totals


def search_and_commit(policy: Policy, make_env: Callable[[], Env], tasks: list[Task],
                      searcher: Searcher, batch_size: int,
                      on_done: Callable[[Trajectory], None], *, commit: str,
                      progress: bool = True) -> dict[str, float]:
    """Search each task (verifier-free: `searcher.cfg.verifier` must be false), committing by
    `commit` (MCTS_COMMITS), and play its committed episode; `on_done` gets each episode as it
    ends. Returns the searches' totals."""
    if searcher.cfg.verifier:
        raise ValueError("inference search must be verifier-free (SearchConfig.verifier false)")
    if commit not in MCTS_COMMITS:
        raise ValueError(f"commit must be one of {MCTS_COMMITS}, got {commit!r}")
    totals = {"seconds": 0.0, "nodes": 0, "simulations": 0}
    group = searcher.cfg.trees_per_batch
    for start in range(0, len(tasks), group):
        chunk = tasks[start:start + group]
        trees = [Tree.new(t, make_env()) for t in chunk]
        if commit == "step":
            stats = search_by_step(searcher, trees, progress)
        else:
            stats = searcher.run(trees, lambda finished: None, progress=progress)
        for key in totals:
            totals[key] += stats[key]
        prefixes = [[(n.action, n.token_ids) for n in committed(t)] for t in trees]
        run_episodes(policy, make_env, chunk, temperature=0.0, seed=0, batch_size=batch_size,
                     on_done=on_done, prefixes=prefixes)
    return totals
