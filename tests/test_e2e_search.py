"""Search on MiniShop with the real embedded model: generation, critique, env and store together."""

from __future__ import annotations

import pytest

from storage import Store

pytestmark = pytest.mark.e2e

CONFIG = """\
run: {name: e2e}
model: {device: cpu}
env: {name: minishop, kwargs: {max_steps: 3}, train_tasks: 1, test_tasks: 1}
search: {simulations: 2, k: 3, max_depth: 3}
"""


def test_search_with_embedded_model(tmp_path):
    from pipelines.cli import main

    config = tmp_path / "e2e.yaml"
    config.write_text(CONFIG)
    # the stages after search (mining, training, eval) are tested on the tiny model
    assert main(["run", str(config), "--run-dir", str(tmp_path / "r"), "--until", "search"]) == 0
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        assert [t.simulations_done for t in s.trees()] == [2]
        nodes = [n for t in s.trees() for n in s.load_tree(t.tree_id)]
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
        assert len(s.trajectories("mcts_rollout")) == 2
        stats = s.stage("search", "0/1")["stats"]
        assert {"tasks_solved_by_search", "tasks_solved_greedy"} <= set(stats)
