"""The search stage for real: a DuckDB file, MiniShop, a tiny random model, SIGKILL and resume.
Runs stop after search (`--until search`): the later stages have tests of their own."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from storage import Store

pytestmark = pytest.mark.slow  # a long file: collected first (tests/conftest.py)

CONFIG = """\
run: {{name: resume, seed: 0}}
model: {{id: {model}, device: cpu, max_batch: 64, prefix_cache_gb: {cache}}}
env:
  name: tests.fakes:ShortMiniShop
  kwargs: {{max_steps: 3}}
  train_tasks: {trees}
  test_tasks: 1
search: {{simulations: {sims}, k: 3, max_depth: 3, trees_per_batch: 3, seed: 1}}
"""


def write_config(tmp_path: Path, model: str, trees: int, sims: int, cache: float = 2) -> Path:
    path = tmp_path / "cfg.yaml"
    path.write_text(CONFIG.format(model=model, trees=trees, sims=sims, cache=cache))
    return path


def run_search(config: Path, run_dir: Path) -> int:
    from pipelines.cli import main

    return main(["run", str(config), "--run-dir", str(run_dir), "--until", "search"])


def launch(config: Path, run_dir: Path, kill_after_commits: int) -> subprocess.Popen:
    """`offline-agent run` in a child process that kills itself after that many commits
    (tests/kill_after_commit.py installs the search stage's after_commit hook)."""
    return subprocess.Popen(
        [sys.executable, "-m", "tests.kill_after_commit", str(kill_after_commits), "run",
         str(config), "--run-dir", str(run_dir), "--until", "search"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        cwd=Path(__file__).parents[1],
    )


def snapshot(run_dir: Path) -> dict:
    with Store(run_dir / "store.duckdb", read_only=True) as s:
        trees = {t.tree_id: t.simulations_done for t in s.trees()}
        nodes = {}
        for tid in trees:
            for n in s.load_tree(tid):
                nodes[n.node_id] = (n.parent_id, n.action, n.observation, n.critic_rank,
                                    n.terminal, n.snapshot, n.visits, n.value_sum, n.token_ids)
        trajs = {t.traj_id: (t.steps, t.reward) for t in s.trajectories("mcts_rollout")}
        stage = s.stage("search", "0/1")
    return {"trees": trees, "nodes": nodes, "trajs": trajs, "stage": stage}


def test_search_stage_stores_trees_and_reruns_as_noop(tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    config = write_config(tmp_path, tiny_model_dir, trees=3, sims=3)
    assert run_search(config, tmp_path / "r") == 0
    snap = snapshot(tmp_path / "r")
    assert snap["stage"].status == "done"
    assert snap["trees"] == {0: 3, 1: 3, 2: 3}
    assert len(snap["trajs"]) == 9
    # every root's visits equal the tree's simulations; children's visits sum to at most that
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        for tid in range(3):
            rows = s.load_tree(tid)
            assert rows[0].parent_id is None and rows[0].visits == 3
            kids = [r for r in rows if r.parent_id == rows[0].node_id]
            assert 1 <= len(kids) <= 3 and sum(k.visits for k in kids) == 3
            assert all(r.snapshot for r in rows)
        greedy = s.trajectories("greedy")
        assert len(greedy) == 3
        # sampled actions keep the ids the policy generated: they decode to the stored text
        actions = [(r.action, r.token_ids) for tid in range(3) for r in s.load_tree(tid)]
        actions += [(st["action"], st["token_ids"]) for t in s.trajectories()
                    for st in t.steps]
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    generated = [(a, ids) for a, ids in actions if ids is not None]
    assert len(generated) > len(actions) / 2
    assert all(tok.decode(ids, clean_up_tokenization_spaces=False) == a for a, ids in generated)
    assert run_search(config, tmp_path / "r") == 0
    assert snapshot(tmp_path / "r") == snap


def test_search_stage_stats_hold_the_critic_concordance(tmp_path, tiny_model_dir):
    """On an env that lists its moves, search visits siblings: the stage's stats count each
    pair of visited, scored siblings of the stored trees once (concordant, discordant or
    tied), per depth and env as in all."""
    from offline_agent.search.concordance import concordance

    config = tmp_path / "cfg.yaml"
    config.write_text(
        f"run: {{name: conc, seed: 0}}\nmodel: {{id: {tiny_model_dir}, device: cpu}}\n"
        "env: {name: tests.fakes:ListedCorridor, kwargs: {max_steps: 2}, train_tasks: 2, "
        "test_tasks: 0}\nsearch: {simulations: 6, k: 3, max_depth: 2, trees_per_batch: 2}\n")
    assert run_search(config, tmp_path / "r") == 0
    with Store(tmp_path / "r" / "store.duckdb", read_only=True) as s:
        agreement = s.stage("search", "0/1").stats["critic_concordance"]
        assert agreement == concordance(s.tree_statistics("search"))
        pairs = 0
        for tree in s.trees("search"):
            rows = s.load_tree(tree.tree_id)
            for parent in rows:
                kids = [r for r in rows if r.parent_id == parent.node_id and r.visits >= 1
                        and r.critic_score is not None]
                pairs += len(kids) * (len(kids) - 1) // 2
    overall = agreement["overall"]
    ties = overall["tied_q"] + overall["tied_score"] + overall["tied_both"]
    assert overall["n"] + ties == pairs > 0
    assert overall["n"] == overall["concordant"] + overall["discordant"]
    assert sum(d["n"] for d in agreement["by_depth"].values()) == overall["n"]
    assert agreement["by_env"] == {"corridor": overall}  # the env its tasks name


@pytest.mark.parametrize("prefix_cache_gb", [2, 0])
def test_sigkill_mid_search_then_resume_matches_uninterrupted(tmp_path, tiny_model_dir,
                                                              prefix_cache_gb):
    """A child run SIGKILLs itself right after its 2nd search commit (a real hard kill at a
    known point, no clock). With the prefix cache (the default), the resumed tree is complete
    and keeps every committed row; without it, it is also bit-identical to an uninterrupted
    run. (Reused KV differs from recomputed KV in the last bits, which can flip a near-tie
    sample after the crash point.)"""
    trees, sims = 4, 4  # 3 trees search at once: the 4th starts when one is done
    config = write_config(tmp_path, tiny_model_dir, trees, sims, prefix_cache_gb)
    killed_dir, clean_dir = tmp_path / "killed", tmp_path / "clean"

    proc = launch(config, killed_dir, kill_after_commits=2)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == -signal.SIGKILL, out

    before = snapshot(killed_dir)
    done_before = sum(before["trees"].values())
    assert 0 < done_before < trees * sims, before["trees"]
    assert len(before["trajs"]) == done_before  # the 2 commits, whole
    assert before["stage"].status == "running"

    assert run_search(config, killed_dir) == 0  # resume, in this process
    after = snapshot(killed_dir)
    assert after["stage"].status == "done"
    assert set(after["trees"].values()) == {sims}
    assert len(after["trajs"]) == trees * sims  # none lost, none duplicated
    for tid, row in before["trajs"].items():  # committed rows survive unchanged
        assert after["trajs"][tid] == row
    for nid, row in before["nodes"].items():
        assert after["nodes"][nid][:6] == row[:6]  # visits/value may grow, content may not

    if prefix_cache_gb:
        return
    assert run_search(config, clean_dir) == 0
    reference = snapshot(clean_dir)
    assert len(reference["nodes"]) == len(after["nodes"])
    # per-(task, simulation) seeds: the resumed search grew the very same trees
    assert after["nodes"] == reference["nodes"]
    assert after["trajs"] == reference["trajs"]
