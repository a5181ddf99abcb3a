"""Search on MiniShop with the real embedded model: generation, critique, env and store together.

Besides the shape of what is stored, it checks what a broken search would get wrong: every
simulation ends its path at one node and its return reaches the root's and one root child's
value; every node is the state its path's actions reach when replayed in a fresh env; every
rollout's stored reward is the reward replaying its actions earns."""

from __future__ import annotations

import pytest

from storage import NodeRow, Store, TrajectoryRow

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CONFIG = """\
run: {name: e2e}
model: {device: cpu}
env: {name: minishop, kwargs: {max_steps: 3}, train_tasks: 1, test_tasks: 1}
search: {simulations: 2, k: 3, max_depth: 3}
"""
SIMULATIONS, MAX_DEPTH = 2, 3


def replay(env, task, actions: list[str]) -> list:
    """The StepResults of `actions` played from the task's start in `env`."""
    env.reset(task)
    return [env.act(a)[1] for a in actions]


def test_search_with_embedded_model(tmp_path):
    from pipelines.cli import main
    from pipelines.config import RunConfig, make_env

    config = tmp_path / "e2e.yaml"
    config.write_text(CONFIG)
    # the stages after search (mining, training, eval) are tested on the tiny model
    assert main(["run", str(config), "--run-dir", str(tmp_path / "r"), "--until", "search"]) == 0
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        assert [t.simulations_done for t in s.trees()] == [SIMULATIONS]
        nodes = [n for t in s.trees() for n in s.load_tree(t.tree_id)]
        (task,) = s.tasks("train")
        rollouts = s.trajectories("mcts_rollout")
        stats = s.stage("search", "0/1").stats
    children = [n for n in nodes if n.parent_id is not None]
    assert children and all(n.action for n in children)
    # the real model writes parseable actions at least sometimes
    assert any(not n.invalid for n in children)
    # critic scores of each sibling group form a distribution
    groups: dict[int, list[float]] = {}
    for n in children:
        groups.setdefault(n.parent_id, []).append(n.critic_score)
    for scores in groups.values():
        assert sum(scores) == pytest.approx(1.0, abs=1e-6)
    assert len(rollouts) == SIMULATIONS
    assert {"tasks_solved_by_search", "tasks_solved_greedy"} <= set(stats)

    check_visits_and_values(nodes, rollouts)
    env = make_env(RunConfig.load(config))
    check_nodes_replay(nodes, env, task)
    for traj in rollouts:  # each stored reward is what its actions earn, replayed
        results = replay(env, task, [st["action"] for st in traj.steps])
        assert [r.observation for r in results] == [st["observation"] for st in traj.steps]
        assert traj.reward == (results[-1].reward if results[-1].done else 0.0)


def check_visits_and_values(nodes: list[NodeRow], rollouts: list[TrajectoryRow]) -> None:
    """Backup along root -> the node a simulation ended at: the root counts every simulation,
    each simulation's path ends at exactly one node, a non-terminal node ends at most one path
    (the one that created it; later ones go on to its children), and the root and each of its
    children hold the sum of the returns (step_cost 0: the rewards) of the rollouts through
    them."""
    kids: dict[int | None, list[NodeRow]] = {}
    for n in nodes:
        kids.setdefault(n.parent_id, []).append(n)
    root = kids[None][0]
    ended = {n.node_id: n.visits - sum(c.visits for c in kids.get(n.node_id, []))
             for n in nodes}
    assert root.visits == SIMULATIONS and ended[root.node_id] == 0
    assert sum(ended.values()) == SIMULATIONS
    assert all(ended[n.node_id] in (0, 1) for n in nodes if not n.terminal)
    assert all(0.0 <= n.value_sum <= n.visits for n in nodes)  # returns in [0, 1]
    assert root.value_sum == pytest.approx(sum(t.reward for t in rollouts))
    for child in kids[root.node_id]:
        through = [t for t in rollouts if t.steps[0]["action"] == child.action]
        assert child.visits == len(through)
        assert child.value_sum == pytest.approx(sum(t.reward for t in through))


def check_nodes_replay(nodes: list[NodeRow], env, task) -> None:
    """Each node is what its path's actions reach from the task's start in a fresh env."""
    by_id = {n.node_id: n for n in nodes}
    for n in nodes:
        path = []
        at = n
        while at.parent_id is not None:
            path.append(at)
            at = by_id[at.parent_id]
        path.reverse()
        assert n.depth == len(path) <= MAX_DEPTH
        if not path:
            continue
        last = replay(env, task, [p.action for p in path])[-1]
        assert (last.observation, last.reward, last.invalid) == (
            n.observation, n.reward, n.invalid)
        assert n.terminal == (last.done or n.depth == MAX_DEPTH)
